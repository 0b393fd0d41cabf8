"""Upstream verl's device functions, as thin adapters onto the selected platform (``verl.utils.platform``).

Code outside ``verl/utils/platform/`` asks this module — never ``torch.<accelerator>`` — for the device name,
the ``torch.<device>`` module, the collective backend, the visible-devices variable and the Ray resource.

``is_cuda_available`` and ``is_npu_available`` are module attributes as upstream, but computed on first access
(PEP 562 ``__getattr__``), so importing this module never imports ``torch_npu``.
"""

from __future__ import annotations

import logging
from typing import Any

import torch

from verl.utils.platform import cann as _cann
from verl.utils.platform.base import Platform
from verl.utils.platform.npu import import_torch_npu
from verl.utils.platform.registry import (
    PlatformRegistry,
    detect_platform_name,
    get_platform,
    normalize_platform_name,
    set_platform,
    validate_platform,
)

logger = logging.getLogger(__name__)

__all__ = [
    "auto_set_device",
    "check_ipc_version_support",
    "get_cann_version",
    "get_device_capability",
    "get_device_id",
    "get_device_name",
    "get_local_device_index",
    "get_nccl_backend",
    "get_npu_versions",
    "get_platform",
    "get_resource_name",
    "get_torch_device",
    "get_vendor",
    "get_visible_devices_keyword",
    "is_cuda_available",  # noqa: F822 (lazy, see __getattr__)
    "is_device_available",
    "is_npu_available",  # noqa: F822 (lazy, see __getattr__)
    "is_support_ipc",
    "is_torch_npu_available",
    "manual_seed",
    "manual_seed_all",
    "set_expandable_segments",
    "set_platform",
    "validate_device",
]

# Re-exported CANN helpers (upstream keeps get_npu_versions / check_ipc_version_support here).
get_cann_version = _cann.get_cann_version
get_npu_versions = _cann.get_npu_versions
check_ipc_version_support = _cann.check_ipc_version_support


def __getattr__(name: str) -> Any:
    # Upstream's module-level flags, evaluated lazily (importing torch_npu at import time is a side effect).
    if name == "is_cuda_available":
        return PlatformRegistry.create("cuda").is_available()
    if name == "is_npu_available":
        return is_torch_npu_available(check_device=True)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def is_torch_npu_available(check_device: bool = True) -> bool:
    """True when ``torch_npu`` imports (and, with ``check_device``, an NPU is visible)."""
    if not check_device:
        return import_torch_npu()[0] is not None
    return PlatformRegistry.create("npu").is_available()


def get_device_name() -> str:
    """``"cpu" | "cuda" | "npu"`` of the selected platform."""
    return get_platform().device_name


def get_vendor() -> str:
    return get_platform().vendor


def get_torch_device() -> Any:
    """The ``torch.<device>`` module of the selected platform (a completed ``torch.cpu`` on the CPU)."""
    return get_platform().torch_module()


def get_device_id() -> int:
    """Index of the current device (0 on the CPU)."""
    return get_platform().current_device_id()


def get_local_device_index(local_rank: int) -> int:
    """The device a worker of local rank ``local_rank`` binds to (``Platform.local_device_index``): 0 when Ray gave
    the process its own device, ``local_rank`` when the process sees the whole node."""
    return get_platform().local_device_index(local_rank)


def get_nccl_backend() -> str:
    """``torch.distributed`` backend of the selected platform (``Platform.comm_backend``; gloo on the CPU)."""
    return get_platform().comm_backend


def get_visible_devices_keyword() -> str:
    """The env var restricting visible devices. On the CPU it has no effect; the CUDA name is returned so code
    that exports it (as upstream workers do) keeps working."""
    return get_platform().visible_devices_envvar or PlatformRegistry.create("cuda").visible_devices_envvar


def get_resource_name() -> str:
    """Ray resource that counts this platform's devices: ``"CPU" | "GPU" | "NPU"``."""
    return get_platform().ray_resource_name


def is_device_available() -> bool:
    return get_platform().is_available()


def set_expandable_segments(enable: bool) -> None:
    """Expandable segments in the caching allocator (CUDA and NPU; no-op on the CPU)."""
    get_platform().set_expandable_segments(enable)


def get_device_capability(device_id: int = 0) -> tuple[int | None, int | None]:
    """(major, minor) compute capability on CUDA; (None, None) elsewhere, as upstream."""
    capability = get_platform().get_device_capability(device_id)
    return (None, None) if capability is None else capability


def is_support_ipc() -> bool:
    """Whether device IPC weight sharing works here (``Platform.supports_ipc``: on NPU it needs driver >= 25.3.rc1
    and CANN >= 8.3.rc1; True elsewhere)."""
    return get_platform().supports_ipc()


def manual_seed(seed: int) -> None:
    """Seed the current device's RNG (and the CPU RNG, which every platform also uses)."""
    torch.manual_seed(seed)
    get_platform().manual_seed(seed)


def manual_seed_all(seed: int) -> None:
    """Seed the RNG of every device of the platform (and the CPU RNG)."""
    torch.manual_seed(seed)
    get_platform().manual_seed_all(seed)


def validate_device(device_name: str) -> None:
    """Fail early, with one message naming what is missing and the fix, if ``device_name`` cannot run here.

    The trainer calls this for ``trainer.device`` before building any model. Raises ValueError for an unknown
    name and RuntimeError when the device family is unusable (e.g. ``npu`` without a loadable ``torch_npu``).
    """
    validate_platform(device_name)


def _trainer_node(config: Any) -> Any:
    trainer = getattr(config, "trainer", None)
    if trainer is None:
        raise ValueError("auto_set_device: the config has no `trainer` section (expected trainer.device)")
    return trainer


def _resolve_device(requested: str | None) -> str:
    """Upstream's default ``trainer.device=cuda`` follows the machine; ``cpu``/``npu`` are explicit choices."""
    if requested is None or str(requested).strip().lower() in ("", "auto"):
        return detect_platform_name()
    name = normalize_platform_name(requested)
    platform = PlatformRegistry.create(name)
    if not platform.fallback_when_missing or platform.is_available():
        return name
    detected = detect_platform_name()
    logger.warning("trainer.device=%s but no %s device is available; using %r (detected)", name, name, detected)
    return detected


def auto_set_device(config: Any) -> str:
    """Resolve ``config.trainer.device``, validate it, select its platform and write the result back.

    ``cpu`` and ``npu`` are taken as explicit (and fail with a clear error when unusable); ``cuda`` — upstream's
    default — or ``auto``/null follows the machine (cuda → npu → cpu), as upstream does for NPU machines.
    Returns the device name.
    """
    trainer = _trainer_node(config)
    device = _resolve_device(getattr(trainer, "device", None))
    platform: Platform = set_platform(device)
    if getattr(trainer, "device", None) != device:
        trainer.device = device
    return platform.device_name
