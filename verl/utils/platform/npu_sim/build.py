"""Compile and load the simulated Ascend's C++ backend (``csrc/npu_sim.cpp``), once per source and torch version.

The backend has no Python bindings (it registers kernels and ``torch.ops.npu_sim.*`` through the dispatcher),
so it needs only torch's C++ headers and a C++20 compiler — no pybind, no ninja; a build takes ~10 s and is
cached under ``$VERL_NPU_SIM_CACHE`` (default ``~/.cache/verl/npu_sim``), keyed by a hash of the source, the
torch version and the compiler command, so concurrent test processes reuse one build.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import torch

SOURCE = Path(__file__).parent / "csrc" / "npu_sim.cpp"
CACHE_ENV = "VERL_NPU_SIM_CACHE"
_loaded_path: Path | None = None


def _compiler() -> str:
    for candidate in (os.environ.get("CXX"), "c++", "g++", "clang++"):
        if candidate and shutil.which(candidate):
            return candidate
    raise RuntimeError(
        "the simulated Ascend needs a C++ compiler to build its PrivateUse1 backend (tried $CXX, c++, g++, "
        "clang++); install one (e.g. `apt-get install g++`) or set CXX"
    )


def _compile_command(compiler: str, output: Path) -> list[str]:
    torch_dir = Path(torch.__file__).parent
    abi = int(torch._C._GLIBCXX_USE_CXX11_ABI)
    return [
        compiler,
        "-O1",
        "-shared",
        "-fPIC",
        "-std=c++20",
        "-w",
        f"-D_GLIBCXX_USE_CXX11_ABI={abi}",
        f"-I{torch_dir / 'include'}",
        f"-I{torch_dir / 'include' / 'torch' / 'csrc' / 'api' / 'include'}",
        str(SOURCE),
        f"-L{torch_dir / 'lib'}",
        "-lc10",
        "-ltorch_cpu",
        f"-Wl,-rpath,{torch_dir / 'lib'}",
        "-o",
        str(output),
    ]


def _cache_dir() -> Path:
    preferred = Path(os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "verl" / "npu_sim")
    try:
        preferred.mkdir(parents=True, exist_ok=True)
        return preferred
    except OSError:  # read-only home (some CI runners): build per machine under the temp dir instead
        return Path(tempfile.gettempdir()) / "verl_npu_sim"


def library_path() -> Path:
    """Where the compiled backend for this source/torch/compiler lives (built if missing)."""
    compiler = _compiler()
    key = hashlib.sha256()
    key.update(SOURCE.read_bytes())
    key.update(torch.__version__.encode())
    key.update(" ".join(_compile_command(compiler, Path("out"))).encode())
    target = _cache_dir() / f"libnpu_sim_{key.hexdigest()[:16]}.so"
    if not target.exists():
        _build(compiler, target)
    return target


def _build(compiler: str, target: Path) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    # Build under a private name, then rename: concurrent builders never load a half-written library.
    fd, tmp = tempfile.mkstemp(prefix=target.stem, suffix=".so.tmp", dir=target.parent)
    os.close(fd)
    try:
        result = subprocess.run(_compile_command(compiler, Path(tmp)), capture_output=True, text=True)
        if result.returncode != 0:
            raise RuntimeError(f"building the simulated Ascend backend failed:\n{result.stderr[-4000:]}")
        os.replace(tmp, target)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def load_backend() -> Path:
    """Load the backend into this process (idempotent); returns the library path."""
    global _loaded_path
    if _loaded_path is None:
        path = library_path()
        torch.ops.load_library(str(path))
        _loaded_path = path
    return _loaded_path
