"""The locks agree with what they are generated from (envs/locks/spec.py; no network, no uv).

Invariants, for every lock (the three CPU environments and the image locks):
* its `inputs-sha256` header equals the fingerprint of the current inputs (setup.py, pyproject.toml's build
  requirements, constraints-cpu.txt, the image's requirements.in, the environment's pins), so an input edited without
  `make lock` fails here;
* every requirement those inputs state for the lock's machine is pinned in it at a version the specifier accepts, and
  what the environment leaves out on purpose is absent.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
from packaging.markers import Marker
from packaging.requirements import Requirement

REPO = Path(__file__).resolve().parents[1]


def _load_spec_module():
    path = REPO / "envs" / "locks" / "spec.py"
    module_spec = importlib.util.spec_from_file_location("verl_lock_spec", path)
    module = importlib.util.module_from_spec(module_spec)
    sys.modules[module_spec.name] = module  # dataclasses resolve their annotations through sys.modules
    module_spec.loader.exec_module(module)
    return module


locks = _load_spec_module()
SPEC_IDS = [s.name for s in locks.SPECS]


def unsatisfied(spec) -> list[str]:
    """Requirements and constraints of `spec`'s inputs that its lock does not satisfy (markers for its machine)."""
    inputs = locks.lock_inputs(spec)
    pinned = {key: p.version for key, p in locks.parse_lock(spec.path).items()}
    pinned.update(locks.read_outside_lock_pins(spec))
    overridden = {locks.canonical(Requirement(o).name) for o in inputs.overrides}
    left_out = {locks.canonical(n) for n in spec.no_emit}
    environment = locks.marker_environment(spec)
    problems = []
    checks = [(r, True) for r in inputs.requirements] + [(c, False) for c in inputs.constraints]
    for text, required in checks:
        req = Requirement(text)
        key = locks.canonical(req.name)
        if req.marker is not None and not Marker(str(req.marker)).evaluate(environment):
            continue
        if key in overridden and text not in inputs.overrides:
            continue  # the row's override replaces this requirement; the override itself is checked
        if key in left_out:
            if key in pinned:
                problems.append(f"{req.name} is pinned although the lock leaves it out")
            continue
        if key not in pinned:
            if required:
                problems.append(f"{text}: not in the lock")
            continue
        if not req.specifier.contains(pinned[key], prereleases=True):
            problems.append(f"{text}: the lock pins {pinned[key]}")
    return problems


@pytest.mark.parametrize("name", SPEC_IDS)
def test_lock_fingerprint_matches_its_inputs(name):
    """A lock records the fingerprint of its inputs; an input changed without relocking makes it stale."""
    spec = locks.SPECS_BY_NAME[name]
    assert spec.path.exists(), f"{spec.lock} is missing: run `make lock`"
    recorded = locks.read_header_fingerprint(spec.path)
    assert recorded == locks.fingerprint(spec), (
        f"{spec.lock} was generated from other inputs than the current setup.py / pyproject.toml / constraints / "
        f"{', '.join(spec.requirement_files) or 'pins'}: run `make lock` and commit the lock"
    )


@pytest.mark.parametrize("name", SPEC_IDS)
def test_lock_satisfies_every_requirement_of_its_inputs(name):
    """Every requirement setup.py (and the row / pins / constraints) states for the lock's machine is pinned in range."""
    spec = locks.SPECS_BY_NAME[name]
    problems = unsatisfied(spec)
    assert not problems, f"{spec.lock} does not satisfy its inputs (run `make lock`):\n  " + "\n  ".join(problems)


def test_every_lock_pins_hashes_and_keeps_cuda_wheels_out_of_cpu_torch_locks():
    """Every pin carries a hash (pip --require-hashes); the x86_64 Ascend lock holds no part of PyPI's CUDA torch."""
    for spec in locks.SPECS:
        packages = locks.parse_lock(spec.path)
        assert packages, f"{spec.lock} pins nothing"
        unhashed = [p.pin for p in packages.values() if not p.hashes]
        assert not unhashed, f"{spec.lock}: pins without a hash: {unhashed}"
        if spec.cpu_torch_from_pytorch_index:
            trio = {locks.canonical(n) for n in spec.cpu_torch_from_pytorch_index}
            cuda = {key for key in packages if locks.CUDA_ONLY_OF_PYPI_TORCH.match(key)}
            # A CUDA-named package may stay only when something else asks for it (nvidia-ml-py: swanlab).
            torch_only = [
                packages[key].pin
                for key in cuda
                if {locks.canonical(v.split("[")[0]) for v in packages[key].via} <= trio | cuda
            ]
            assert not torch_only and not trio & set(packages), f"{spec.lock} holds PyPI's CUDA torch: {torch_only}"
            assert set(locks.read_outside_lock_pins(spec)) == set(spec.cpu_torch_from_pytorch_index)
    cpu_torch = locks.parse_lock(locks.SPECS_BY_NAME["main"].path)["torch"].version
    assert cpu_torch.endswith("+cpu"), f"envs/locks/main.lock pins torch {cpu_torch}, not the CPU build"


def test_a_changed_requirement_is_caught_by_both_checks(tmp_path, monkeypatch):
    """Mutation: setup.py with transformers raised above the locked version fails the fingerprint and the range check."""
    setup_py = (REPO / "setup.py").read_text()
    assert '"transformers>=5.4.0"' in setup_py
    mutated = tmp_path / "setup.py"
    mutated.write_text(setup_py.replace('"transformers>=5.4.0"', '"transformers>=99"'))
    original = locks.read_setup_requirements
    monkeypatch.setattr(locks, "read_setup_requirements", lambda setup_py=mutated: original(setup_py))
    spec = locks.SPECS_BY_NAME["main"]
    assert locks.read_header_fingerprint(spec.path) != locks.fingerprint(spec)
    assert any(p.startswith("transformers>=99") for p in unsatisfied(spec))
