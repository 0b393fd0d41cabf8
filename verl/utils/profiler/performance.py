"""Timers and device-memory logging (upstream ``verl.utils.profiler.performance``).

* ``simple_timer(name, timing_raw)`` adds the wall time of a block to ``timing_raw[name]`` (seconds);
  ``marked_timer`` does the same and also marks the block as a named range (``torch.profiler.record_function``),
  so the trainer's phases (``gen``, ``reward``, ``old_log_prob``, ...) show up in a ``tool=torch`` trace on any
  device, the CPU included.
* ``log_gpu_memory_usage`` / ``GPUMemoryLogger`` report device memory. The numbers come from the platform
  (``verl.utils.device.get_platform()``): allocated / reserved by torch's caching allocator, and used / total
  of the device. On the CPU there is no caching allocator, so allocated and reserved read 0 and used / total
  are the host's.
* ``reduce_timing`` / ``gather_timing`` combine ``timing_raw`` over the ranks of the default process group.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, Optional

import torch
import torch.distributed as dist

__all__ = [
    "GPUMemoryLogger",
    "gather_timing",
    "log_gpu_memory_usage",
    "marked_timer",
    "reduce_timing",
    "simple_timer",
]

_UNITS = {"GB": 1024**3, "MB": 1024**2, "KB": 1024}


def _get_current_mem_info(unit: str = "GB", precision: int = 2) -> tuple[str, str, str, str]:
    """(allocated, reserved, used, total) memory of the current device as strings in ``unit``."""
    from verl.utils.device import get_platform

    if unit not in _UNITS:
        raise ValueError(f"unit must be one of {list(_UNITS)}, got {unit!r}")
    platform = get_platform()
    free, total = platform.mem_get_info()
    values = (platform.memory_allocated(), platform.memory_reserved(), total - free, total)
    return tuple(f"{v / _UNITS[unit]:.{precision}f}" for v in values)


def _memory_message(head: str) -> str:
    allocated, reserved, used, total = _get_current_mem_info()
    return (
        f"{head}, memory allocated (GB): {allocated}, memory reserved (GB): {reserved}, "
        f"device memory used/total (GB): {used}/{total}"
    )


def log_gpu_memory_usage(
    head: str, logger: Optional[logging.Logger] = None, level: int = logging.DEBUG, rank: Optional[int] = 0
) -> None:
    """Log (``logger`` given) or print the device memory, on rank ``rank`` only (None: every rank)."""
    if dist.is_initialized() and rank is not None and dist.get_rank() != rank:
        return
    message = _memory_message(head)
    if logger is None:
        print(message)
    else:
        logger.log(level, message)


class GPUMemoryLogger:
    """Decorator logging the device memory before and after each call of the decorated function::

    @GPUMemoryLogger(role="actor", logger=logger)
    def update_actor(self, batch): ...
    """

    def __init__(
        self,
        role: str,
        logger: Optional[logging.Logger] = None,
        level: int = logging.DEBUG,
        log_only_rank_0: bool = True,
    ) -> None:
        self.role = role
        self.logger = logger
        self.level = level
        self.log_only_rank_0 = log_only_rank_0

    def __call__(self, decorated_function: Callable) -> Callable:
        @functools.wraps(decorated_function)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            return self.log(decorated_function, *args, **kwargs)

        return wrapper

    def log(self, func: Callable, *args: Any, **kwargs: Any) -> Any:
        """Run ``func`` between a "Before" and an "After" memory line."""
        self._emit(f"[{self.role}] Before {func.__name__}")
        output = func(*args, **kwargs)
        self._emit(f"[{self.role}] After {func.__name__}")
        return output

    def _emit(self, head: str) -> None:
        if self.log_only_rank_0 and dist.is_initialized() and dist.get_rank() != 0:
            return
        message = _memory_message(head)
        if self.logger is None:
            print(message)
        else:
            self.logger.log(self.level, message)


def _add_time(name: str, timing_raw: dict[str, float], start: float) -> None:
    timing_raw[name] = timing_raw.get(name, 0.0) + time.perf_counter() - start


@contextmanager
def simple_timer(name: str, timing_raw: dict[str, float]) -> Iterator[None]:
    """Add the wall time of the block to ``timing_raw[name]`` (seconds; accumulates over repeated blocks)."""
    start = time.perf_counter()
    try:
        yield
    finally:
        _add_time(name, timing_raw, start)


@contextmanager
def marked_timer(
    name: str,
    timing_raw: dict[str, float],
    color: Optional[str] = None,
    domain: Optional[str] = None,
    category: Optional[str] = None,
) -> Iterator[None]:
    """:func:`simple_timer` plus a named profiler range ``name`` (``color``/``domain``/``category`` are upstream's
    NVTX/mstx marker options; the range here is ``torch.profiler.record_function``, which every device has)."""
    start = time.perf_counter()
    try:
        with torch.profiler.record_function(name):
            yield
    finally:
        _add_time(name, timing_raw, start)


def _timing_tensor(values: list[float]) -> torch.Tensor:
    from verl.utils.device import get_device_name

    # The default group may be NCCL/HCCL, which only reduce device tensors.
    device = "cpu" if dist.get_backend() == "gloo" else get_device_name()
    return torch.tensor(values, dtype=torch.float32, device=device)


def reduce_timing(timing_raw: dict[str, float], reduce_op: dist.ReduceOp = dist.ReduceOp.AVG) -> dict[str, float]:
    """``timing_raw`` reduced over the ranks (default: mean); unchanged without a process group.

    Every rank must hold the same keys. AVG is computed as SUM / world size on gloo, which lacks AVG.
    """
    if not dist.is_initialized():
        return timing_raw
    keys = sorted(timing_raw)
    values = _timing_tensor([timing_raw[k] for k in keys])
    if reduce_op == dist.ReduceOp.AVG and dist.get_backend() == "gloo":
        dist.all_reduce(values, op=dist.ReduceOp.SUM)
        values /= dist.get_world_size()
    else:
        dist.all_reduce(values, op=reduce_op)
    return dict(zip(keys, values.cpu().tolist(), strict=True))


def gather_timing(timing_raw: dict[str, float]) -> dict[str, list[float]]:
    """``{name: [rank 0 value, rank 1 value, ...]}``; one-element lists without a process group."""
    if not dist.is_initialized():
        return {k: [v] for k, v in timing_raw.items()}
    keys = sorted(timing_raw)
    gathered: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, [timing_raw[k] for k in keys])
    return {key: [values[i] for values in gathered] for i, key in enumerate(keys)}
