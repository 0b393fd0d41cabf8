"""CPU platform: gloo collectives, Ray resource ``CPU``, no caching allocator (memory stats read 0)."""

from __future__ import annotations

import os
from typing import Any

import torch

from verl.utils.platform.base import Platform, module_like


def _host_memory() -> tuple[int, int]:
    # (available, total) physical memory of the host; the CPU "device" is the host.
    page = os.sysconf("SC_PAGE_SIZE")
    return os.sysconf("SC_AVPHYS_PAGES") * page, os.sysconf("SC_PHYS_PAGES") * page


def _zero() -> int:
    return 0


def _noop(*args: Any, **kwargs: Any) -> None:
    return None


def _make_cpu_module() -> Any:
    """``torch.cpu`` completed with the ``torch.cuda``-style functions framework code calls on any device.

    ``torch.cpu`` has no ``empty_cache``/``memory_allocated``/``manual_seed``; code written against
    ``get_torch_device()`` must still run on the CPU, so these are no-ops, zeros or the global torch RNG.
    ``current_device()`` returns 0 (an index, like the accelerator modules) instead of ``"cpu"``.
    """
    return module_like(
        "verl.utils.platform.cpu.torch_cpu",
        torch.cpu,
        current_device=lambda: 0,
        device_count=lambda: 1,
        set_device=_noop,
        synchronize=_noop,
        empty_cache=_noop,
        memory_allocated=_zero,
        max_memory_allocated=_zero,
        memory_reserved=_zero,
        max_memory_reserved=_zero,
        reset_peak_memory_stats=_noop,
        mem_get_info=_host_memory,
        manual_seed=torch.manual_seed,
        manual_seed_all=torch.manual_seed,
        get_rng_state=torch.get_rng_state,
        set_rng_state=torch.set_rng_state,
        is_available=lambda: True,
    )


class CpuPlatform(Platform):
    device_name = "cpu"
    vendor = "intel"
    comm_backend = "gloo"
    visible_devices_envvar = None
    ray_resource_name = "CPU"
    ray_noset_envvars = ()
    # torch's CPU flash-attention kernel (chosen by sdpa for is_causal without a mask) saves out + log-sum-exp only
    long_segment_attention = "sdpa"

    def __init__(self) -> None:
        self._module: Any = None

    def is_available(self) -> bool:
        return True

    def torch_module(self) -> Any:
        if self._module is None:
            self._module = _make_cpu_module()
        return self._module

    def device(self, index: int | None = None) -> torch.device:
        # CPU tensors report device "cpu" without an index; "cpu:0" would compare unequal to them.
        return torch.device("cpu")

    def ray_actor_options(self, count: float) -> dict[str, Any]:
        # A CPU worker needs no accelerator; its CPU share is set by the caller's num_cpus.
        return {}
