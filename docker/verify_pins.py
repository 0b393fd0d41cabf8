"""Fail an image build when an installed distribution does not match its pin.

    python3 docker/verify_pins.py "torch==2.9.0" "torch-npu==2.9.0" "numpy<2.0.0"
    python3 docker/verify_pins.py --lock docker/ascend/aarch64.lock "vllm==0.18.0" "verl"

`--lock FILE` adds every `name==version` line of a lock (or of a plain pin list) as a requirement. Versions are read from the installed metadata (nothing is imported, so torch_npu is checked without CANN or a
driver). A local label is ignored as PEP 440 says (``torch==2.9.0`` accepts ``2.9.0+cpu``). Prints one line per
requirement and exits 1 when any is missing or out of range: pip resolves later installs one command at a time,
so a later step can silently replace a pinned torch, transformers or numpy.
"""

from __future__ import annotations

import re
import sys
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

from packaging.requirements import Requirement


def check(requirement: str) -> tuple[bool, str]:
    """(ok, report line) for one PEP 508 requirement string."""
    req = Requirement(requirement)
    try:
        installed = version(req.name)
    except PackageNotFoundError:
        return False, f"MISSING  {req.name} (wanted {req.specifier})"
    ok = req.specifier.contains(installed, prereleases=True)
    return ok, f"{'ok' if ok else 'WRONG':<8} {req.name} {installed} (wanted {req.specifier})"


def lock_pins(path: str) -> list[str]:
    """`name==version` of every pinned line of a lock (hash and annotation lines skipped)."""
    return re.findall(r"^([A-Za-z0-9][A-Za-z0-9._-]*==\S+)", Path(path).read_text(), flags=re.MULTILINE)


def main(argv: list[str]) -> int:
    requirements = []
    while argv[:1] == ["--lock"] and len(argv) > 1:
        requirements += lock_pins(argv[1])
        argv = argv[2:]
    requirements += argv
    if not requirements:
        print(__doc__.strip().splitlines()[0], file=sys.stderr)
        return 2
    results = [check(r) for r in requirements]
    for _, line in results:
        print(line)
    return 0 if all(ok for ok, _ in results) else 1


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
