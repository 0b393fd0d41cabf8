"""Regenerate the locks (`make lock`): one `uv pip compile` per environment of envs/locks/spec.py.

    python envs/locks/compile.py [--uv PATH] [--upgrade] [NAME ...]

Why uv's `pip compile`: it resolves for a target machine without being on it (`--python-platform
aarch64-manylinux_2_28 --python-version 3.11`), which the Ascend and CUDA image locks need; it writes the sha256 of
every file it pins (`--generate-hashes`), so `pip install --require-hashes` installs exactly the bytes that were
locked; and it is one wheel pinned in the Makefile's tools venv. pip-tools resolves only for the machine it runs on.

A lock keeps the versions of the lock it is regenerated over (uv prefers the pins of an existing output file), so
an edit of setup.py moves only what it must; `--upgrade` resolves every package afresh to the newest allowed.
tf54 and vllm prefer the main lock's versions, so the three CPU environments share every version they can.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from spec import (  # noqa: E402
    CUDA_ONLY_OF_PYPI_TORCH,
    FINGERPRINT_KEY,
    REPO,
    SPECS,
    SPECS_BY_NAME,
    UV_VERSION,
    LockSpec,
    canonical,
    fingerprint,
    lock_inputs,
    parse_lock,
)

# The CPU build of torch for the CPU environments: the local wheel directory where the machine has one (CI's),
# else the torch page of PyTorch's CPU index, read as a find-links page (not reachable here, so not tried here).
LOCAL_WHEELS = Path("/opt/wheels")
PYTORCH_CPU_TORCH_PAGE = "https://download.pytorch.org/whl/cpu/torch/"


def torch_find_links() -> str:
    return str(LOCAL_WHEELS) if LOCAL_WHEELS.is_dir() else PYTORCH_CPU_TORCH_PAGE


def uv_compile(uv: str, spec: LockSpec, workdir: Path, no_emit: list[str], overrides: list[str]) -> Path:
    """Run uv for `spec` in `workdir` (the inputs are written there so uv's `# via` annotations name them)."""
    inputs = lock_inputs(spec)
    (workdir / "requirements.in").write_text("\n".join(inputs.requirements) + "\n")
    args = [uv, "pip", "compile", "requirements.in", "-o", "out.lock", "--quiet", "--no-config", "--no-header"]
    args += ["--generate-hashes", "--python-version", spec.python, "--python-platform", spec.platform]
    if inputs.constraints:
        (workdir / "constraints.txt").write_text("\n".join(inputs.constraints) + "\n")
        args += ["-c", "constraints.txt"]
    if overrides:
        (workdir / "overrides.txt").write_text("\n".join(overrides) + "\n")
        args += ["--overrides", "overrides.txt"]
    for name in no_emit:
        args += ["--no-emit-package", name]
    if spec.torch_find_links:
        args += ["--find-links", torch_find_links()]
    # Never download a managed Python for the image's 3.12: the local interpreter serves to read an sdist's metadata.
    env = {**os.environ, "UV_PYTHON_DOWNLOADS": "never"}
    done = subprocess.run(args, cwd=workdir, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"{spec.lock}: uv pip compile failed:\n{done.stderr.strip()}")
    return workdir / "out.lock"


def seed_preferences(spec: LockSpec, workdir: Path, upgrade: bool) -> None:
    """Put the lock whose versions `spec` should keep where uv reads preferences from (its output file)."""
    if spec.seed is not None:
        seed = SPECS_BY_NAME[spec.seed].path
    else:
        seed = None if upgrade else spec.path
    if seed is not None and seed.exists():
        shutil.copy(seed, workdir / "out.lock")


def cuda_only_packages(resolved: Path, spec: LockSpec) -> list[str]:
    """CUDA runtime packages of the resolution that only PyPI's CUDA torch / torchvision / torchaudio need.

    A candidate (CUDA_ONLY_OF_PYPI_TORCH) stays in the lock when anything else requires it (e.g. nvidia-ml-py, asked
    for by swanlab); the fixed point handles CUDA wheels that require each other.
    """
    packages = parse_lock(resolved)
    torch_trio = {canonical(n) for n in spec.cpu_torch_from_pytorch_index}
    cuda_only = {key for key in packages if CUDA_ONLY_OF_PYPI_TORCH.match(key)}
    while True:
        askers = {key: {canonical(v.split("[")[0]) for v in packages[key].via} for key in cuda_only}
        kept = {key for key in cuda_only if not askers[key] <= torch_trio | cuda_only}
        if not kept:
            return [packages[key].name for key in sorted(cuda_only)]
        cuda_only -= kept


def compile_lock(uv: str, spec: LockSpec, upgrade: bool) -> None:
    inputs = lock_inputs(spec)
    no_emit = list(spec.no_emit)
    overrides = list(inputs.overrides)
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        if spec.cpu_torch_from_pytorch_index:
            # PyPI has no `+cpu` builds: resolve against PyPI's releases of the same versions (same dependencies but
            # the CUDA wheels), then keep the CUDA-only ones and the three torch packages out of the lock.
            pins = {canonical(r.split("==")[0]): r for r in inputs.requirements if "==" in r}
            overrides += [pins[canonical(n)] for n in spec.cpu_torch_from_pytorch_index]
            seed_preferences(spec, workdir, upgrade)
            first = uv_compile(uv, spec, workdir, no_emit, overrides)
            no_emit += list(spec.cpu_torch_from_pytorch_index) + cuda_only_packages(first, spec)
            write_outside_lock_pins(spec, [pins[canonical(n)] for n in spec.cpu_torch_from_pytorch_index])
        seed_preferences(spec, workdir, upgrade)
        resolved = uv_compile(uv, spec, workdir, no_emit, overrides)
        body = resolved.read_text()
    spec.path.parent.mkdir(parents=True, exist_ok=True)
    spec.path.write_text(header(spec, no_emit, overrides) + body)
    print(f"{spec.lock}: {len(parse_lock(spec.path))} packages")


def header(spec: LockSpec, no_emit: list[str], overrides: list[str]) -> str:
    sources = ["setup.py install_requires" + "".join(f" + [{e}]" for e in spec.setup_extras)]
    sources += ["pyproject.toml build-system requires", *spec.requirement_files, *spec.constraint_files]
    sources += [f"pin {p}" for p in spec.pins]
    lines = [
        f"{spec.lock}: generated by `make lock` (envs/locks/compile.py); do not edit by hand.",
        f"For: {spec.purpose}.",
        f"Inputs: {', '.join(sources)}.",
        f"Resolved by uv {UV_VERSION} pip compile --generate-hashes --python-version {spec.python}"
        f" --python-platform {spec.platform}"
        + (f", preferring the versions of {spec.seed}" if spec.seed else "")
        + ".",
    ]
    if overrides:
        lines.append(f"Overrides (the row's pin wins over a component's metadata): {', '.join(overrides)}.")
    if no_emit:
        lines.append(f"Left out (resolved, never installed): {', '.join(no_emit)}.")
    if spec.cpu_torch_from_pytorch_index:
        lines.append(
            f"The CPU builds of {', '.join(spec.cpu_torch_from_pytorch_index)}: {spec.outside_lock_path.name}."
        )
    lines.append(f"{FINGERPRINT_KEY}: {fingerprint(spec)}")
    return "".join(f"# {line}\n" for line in lines)


def write_outside_lock_pins(spec: LockSpec, pins: list[str]) -> None:
    text = (
        f"# {spec.outside_lock_path.relative_to(REPO)}: generated by `make lock` with {spec.lock}.\n"
        "# The CPU builds (`+cpu`) exist only on PyTorch's CPU index, which the machine that wrote the lock could not\n"
        "# reach: pinned by exact version, without hashes, installed with --no-deps from that index (docs/dependencies.md).\n"
    )
    spec.outside_lock_path.write_text(text + "".join(f"{p.split('+')[0]}+cpu\n" for p in pins))


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="*", help=f"locks to regenerate (default: all): {', '.join(SPECS_BY_NAME)}")
    parser.add_argument("--uv", default="uv", help="the uv executable (the Makefile passes .venv-tools/bin/uv)")
    parser.add_argument("--upgrade", action="store_true", help="resolve afresh instead of keeping existing pins")
    args = parser.parse_args(argv)
    unknown = set(args.names) - set(SPECS_BY_NAME)
    if unknown:
        parser.error(f"unknown lock(s) {sorted(unknown)}; known: {', '.join(SPECS_BY_NAME)}")
    uv = shutil.which(args.uv) or args.uv
    uv = str(Path(uv).resolve()) if Path(uv).exists() else uv  # uv runs with the temporary input dir as cwd
    version = subprocess.run([uv, "--version"], capture_output=True, text=True).stdout.split()
    if version[1:2] != [UV_VERSION]:
        raise SystemExit(
            f"{args.uv} is {' '.join(version) or 'missing'}, the locks are made with uv {UV_VERSION}: run `make lock`"
        )
    # A seed is compiled before the locks that prefer its versions (SPECS lists them in that order).
    for spec in SPECS:
        if not args.names or spec.name in args.names:
            compile_lock(uv, spec, args.upgrade)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
