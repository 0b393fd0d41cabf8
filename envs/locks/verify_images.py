"""Prove the images' Python layer without building them (`make verify-image-locks`).

    python envs/locks/verify_images.py [NAME ...]

For every image lock (docker/*/<arch>.lock) pip downloads every pinned file for the image's platform and Python,
with the lock's hashes required: `pip download --no-deps --only-binary :all: --platform manylinux_2_17.._2_28_<arch>
--python-version 3.11 --require-hashes`. A line that has no wheel for the platform is tried once more as an sdist
(platform-independent; the image builds it), and reported as such. Exit status 1 when any line resolves neither way.
The `+cpu` torch pins of the x86_64 Ascend image (outside the lock) are downloaded from PyTorch's CPU index when it
is reachable, else reported as not checked. Downloads go to a temporary directory, one lock at a time.
"""

from __future__ import annotations

import argparse
import hashlib
import re
import subprocess
import sys
import tempfile
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from spec import SPECS, LockSpec, canonical, parse_lock, read_outside_lock_pins  # noqa: E402

PYTORCH_CPU_INDEX = "https://download.pytorch.org/whl/cpu"
PYPI_SIMPLE = "https://pypi.org/simple"
IMAGE_SPECS = [s for s in SPECS if s.lock.startswith("docker/")]
_NOT_FOUND = re.compile(r"(?:satisfies the requirement|No matching distribution found for) ([A-Za-z0-9._-]+)==")


def platform_tags(spec: LockSpec) -> list[str]:
    """pip's --platform does not expand manylinux versions: every glibc tag up to the lock's target, and linux_*."""
    arch = spec.machine
    newest = int(re.search(r"manylinux_2_(\d+)", spec.platform).group(1))
    tags = [f"manylinux_2_{minor}_{arch}" for minor in range(newest, 16, -1)]
    return [*tags, f"manylinux2014_{arch}", f"linux_{arch}"]


@dataclass
class Result:
    lock: str
    resolved: list[str] = field(default_factory=list)
    sdists: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)
    unverified: list[str] = field(default_factory=list)

    def summary(self) -> str:
        text = f"{self.lock}: {len(self.resolved)} resolved / {len(self.failed)} failed"
        if self.sdists:
            text += f" ({len(self.sdists)} as sdist, built in the image: {', '.join(self.sdists)})"
        if self.failed:
            text += f"\n    FAILED: {', '.join(self.failed)}"
        if self.unverified:
            text += f"\n    not checked here: {', '.join(self.unverified)}"
        return text


def pip_download(args: list[str], dest: Path) -> subprocess.CompletedProcess:
    """pip download into dest/files; pip's cache (index pages, GBs of wheels) lives and dies with dest."""
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check"]
    command += ["--cache-dir", str(dest / "cache"), "-d", str(dest / "files")]
    return subprocess.run([*command, *args], capture_output=True, text=True)


def binary_args(spec: LockSpec) -> list[str]:
    args = ["--only-binary", ":all:", "--python-version", spec.python, "--implementation", "cp"]
    for tag in platform_tags(spec):
        args += ["--platform", tag]
    return args


def requirement_file(packages: list, path: Path) -> Path:
    lines = [" ".join([p.pin, *(f"--hash={h}" for h in p.hashes)]) for p in packages]
    path.write_text("\n".join(lines) + "\n")
    return path


def verify_lock(spec: LockSpec, dest: Path) -> Result:
    """All of the lock's wheels in one pip call; a line pip cannot find is set aside (sdist check) and pip re-run."""
    result = Result(f"{spec.lock} ({spec.machine}, cp{spec.python.replace('.', '')})")
    pending = dict(parse_lock(spec.path))
    while pending:
        done = pip_download(
            ["--require-hashes", "-r", str(requirement_file(list(pending.values()), dest / "req.txt"))]
            + binary_args(spec),
            dest,
        )
        if done.returncode == 0:
            result.resolved += [p.pin for p in pending.values()]
            break
        missing = _NOT_FOUND.search(done.stderr + done.stdout)
        if not missing or canonical(missing.group(1)) not in pending:
            # Not a missing file (a hash mismatch, a network error): pip stops at the first, so each line alone.
            print(done.stderr.strip()[-2000:], file=sys.stderr)
            for package in pending.values():
                alone = pip_download(
                    ["--require-hashes", "-r", str(requirement_file([package], dest / "one.txt"))] + binary_args(spec),
                    dest,
                )
                (result.resolved if alone.returncode == 0 else result.failed).append(package.pin)
            break
        package = pending.pop(canonical(missing.group(1)))
        if download_sdist(package, dest):
            result.resolved.append(package.pin)
            result.sdists.append(package.pin)
        else:
            result.failed.append(package.pin)
    verify_outside_lock(spec, dest, result)
    return result


def download_sdist(package, dest: Path) -> bool:
    """The package's sdist from PyPI's simple index, downloaded and checked against the lock's hashes.

    Not through pip: pip would build the sdist's metadata (compiling e.g. Cython first), which proves nothing here.
    """
    try:
        with urllib.request.urlopen(f"{PYPI_SIMPLE}/{canonical(package.name)}/", timeout=60) as page:
            html = page.read().decode()
    except OSError:
        return False
    for url, digest in re.findall(r'href="([^"#]+)#sha256=([0-9a-f]{64})"', html):
        # The locked hash names the file; an sdist among the locked files is what the image builds from.
        if f"sha256:{digest}" in package.hashes and url.endswith((".tar.gz", ".zip")):
            try:
                with urllib.request.urlopen(urllib.parse.urljoin(f"{PYPI_SIMPLE}/", url), timeout=300) as response:
                    return hashlib.sha256(response.read()).hexdigest() == digest
            except OSError:
                return False
    return False


def index_reachable(url: str) -> bool:
    try:
        with urllib.request.urlopen(url + "/torch/", timeout=10):
            return True
    except OSError:
        return False


def verify_outside_lock(spec: LockSpec, dest: Path, result: Result) -> None:
    pins = [f"{name}=={version}" for name, version in read_outside_lock_pins(spec).items()]
    if not pins:
        return
    if not index_reachable(PYTORCH_CPU_INDEX):
        result.unverified += [f"{p} (PyTorch's CPU index is not reachable from this machine)" for p in pins]
        return
    for pin in pins:
        done = pip_download(["--index-url", PYTORCH_CPU_INDEX, pin, *binary_args(spec)], dest)
        (result.resolved if done.returncode == 0 else result.failed).append(pin)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "names", nargs="*", help=f"image locks (default: all): {', '.join(s.name for s in IMAGE_SPECS)}"
    )
    args = parser.parse_args(argv)
    results = []
    for spec in IMAGE_SPECS:
        if args.names and spec.name not in args.names:
            continue
        with tempfile.TemporaryDirectory(prefix=f"verify-{spec.name}-") as tmp:
            print(f"{spec.lock}: downloading for {spec.machine}, Python {spec.python} ...", flush=True)
            results.append(verify_lock(spec, Path(tmp)))
            print(results[-1].summary(), flush=True)
    print("\nsummary")
    for result in results:
        print(result.summary())
    return 1 if any(r.failed for r in results) else 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
