"""Which platform this process uses: explicit choice first, then detection (cuda → npu → cpu).

Selection order:

1. :func:`set_platform` (the trainer calls it with ``trainer.device``; tests use :func:`use_platform`);
2. the ``VERL_PLATFORM`` environment variable (``cpu | cuda | npu`` or upstream's vendor names), which lets
   worker processes follow the driver's choice;
3. detection: CUDA if available, else NPU if ``torch_npu`` loads and sees a device, else CPU. Unlike upstream
   HEAD (which falls back to ``cuda``), a machine with neither accelerator runs on the CPU.

The detected platform is cached; :func:`reset_platform` forgets it (tests, or after installing a simulator).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator

from verl.utils.platform.base import Platform
from verl.utils.platform.cpu import CpuPlatform
from verl.utils.platform.cuda import CudaPlatform
from verl.utils.platform.npu import NpuPlatform, forget_torch_npu_import

PLATFORM_ENV = "VERL_PLATFORM"
DETECTION_ORDER = ("cuda", "npu", "cpu")
_VENDOR_ALIASES = {"nvidia": "cuda", "huawei": "npu", "ascend": "npu", "gpu": "cuda", "intel": "cpu"}


class PlatformRegistry:
    """Name → platform class (upstream's ``@PlatformRegistry.register`` name, kept as a thin adapter)."""

    _classes: dict[str, type[Platform]] = {"cpu": CpuPlatform, "cuda": CudaPlatform, "npu": NpuPlatform}

    @classmethod
    def register(cls, name: str) -> Callable[[type[Platform]], type[Platform]]:
        def decorator(platform_cls: type[Platform]) -> type[Platform]:
            cls._classes[name] = platform_cls
            return platform_cls

        return decorator

    @classmethod
    def names(cls) -> tuple[str, ...]:
        return tuple(cls._classes)

    @classmethod
    def platform_class(cls, name: str) -> type[Platform]:
        """The class registered under ``name`` (its class attributes describe the device without creating it)."""
        return cls._classes[normalize_platform_name(name)]

    @classmethod
    def create(cls, name: str) -> Platform:
        return cls._classes[normalize_platform_name(name)]()


_selected: Platform | None = None


def normalize_platform_name(name: str) -> str:
    """``"NPU"``/``"huawei"``/``"npu:0"`` → ``"npu"``; an unknown name raises ValueError listing valid ones."""
    key = str(name).strip().lower().split(":")[0]
    key = _VENDOR_ALIASES.get(key, key)
    if key not in PlatformRegistry.names():
        raise ValueError(
            f"unknown device {name!r}; trainer.device (or {PLATFORM_ENV}) must be one of {PlatformRegistry.names()}"
        )
    return key


def detect_platform_name() -> str:
    """The platform this machine would use without an explicit choice."""
    env = os.environ.get(PLATFORM_ENV)
    if env:
        return normalize_platform_name(env)
    for name in DETECTION_ORDER:
        if PlatformRegistry.create(name).is_available():
            return name
    return "cpu"


def get_platform() -> Platform:
    """The platform of this process (selected or detected once, then cached)."""
    global _selected
    if _selected is None:
        _selected = PlatformRegistry.create(detect_platform_name())
    return _selected


def platform_of_device_type(device_type: str) -> Platform | None:
    """The platform that owns tensors whose ``device.type`` is ``device_type`` (the selected platform object when
    it matches), or None for a type no platform owns (``meta``, ``mps``): the caller then takes its portable path.

    Kernel choices are made per tensor, not per process: a CPU tensor in an NPU run takes the CPU's kernels.
    """
    selected = get_platform()
    if selected.device_name == device_type:
        return selected
    cls = PlatformRegistry._classes.get(str(device_type))
    return None if cls is None else cls()


def validate_platform(name: str) -> Platform:
    """A usable platform object for ``name``, or one RuntimeError naming what is missing and the fix."""
    platform = PlatformRegistry.create(name)
    reason = platform.missing_reason()
    if reason is not None:
        raise RuntimeError(f"trainer.device={platform.device_name} cannot be used on this machine: {reason}")
    return platform


def set_platform(name: str, *, validate: bool = True) -> Platform:
    """Select the platform explicitly (``trainer.device``); validates it unless ``validate=False``."""
    global _selected
    _selected = validate_platform(name) if validate else PlatformRegistry.create(name)
    return _selected


def reset_platform() -> None:
    """Forget the selected/detected platform (and a failed torch_npu import); the next :func:`get_platform`
    detects again."""
    global _selected
    _selected = None
    forget_torch_npu_import()


@contextlib.contextmanager
def use_platform(name: str, *, validate: bool = True) -> Iterator[Platform]:
    """Select ``name`` inside the block and restore the previous selection afterwards (tests, tools)."""
    global _selected
    previous = _selected
    try:
        yield set_platform(name, validate=validate)
    finally:
        _selected = previous
