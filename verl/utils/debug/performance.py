"""Memory numbers a run reports per step (upstream's ``perf/max_memory_*_gb`` and ``perf/cpu_memory_used_gb``)."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator

import psutil

from verl.utils.platform import get_platform

_GIB = 1024**3


def memory_metrics() -> dict[str, float]:
    """Peak device memory of this process since its start (allocated by tensors, reserved by the caching
    allocator) and the host's used RAM, in GiB.

    The device numbers come from the Platform, so they are the NPU's (torch_npu) or the GPU's allocator; the CPU
    platform has no caching allocator and reports 0 for them. ``cpu_memory_used_gb`` is the whole host's
    (``psutil.virtual_memory().used``): with optimizer/parameter offload this is where the Adam state lives.
    """
    platform = get_platform()
    return {
        "perf/max_memory_allocated_gb": platform.max_memory_allocated() / _GIB,
        "perf/max_memory_reserved_gb": platform.max_memory_reserved() / _GIB,
        "perf/cpu_memory_used_gb": psutil.virtual_memory().used / _GIB,
    }


@contextlib.contextmanager
def timed(seconds: dict[str, float], name: str) -> Iterator[None]:
    """Add the wall time of the block to ``seconds[name]`` (worker-side timings returned to the trainer)."""
    start = time.perf_counter()
    try:
        yield
    finally:
        seconds[name] = seconds.get(name, 0.0) + time.perf_counter() - start
