"""Which implementation of a numerical kernel runs on which device.

Every op in ``verl.ops`` has a pure-torch implementation that runs everywhere (CPU included) and is the
reference, and may have a fused implementation from the flash-linear-attention package (``fla``): Triton kernels
on CUDA, and triton-ascend kernels on Ascend NPUs (fla ships both). The choice is made per call from the device of
the inputs:

* CPU: always torch. fla is never imported on CPU: with triton installed, transformers >= 5.15 and fla itself
  crash on a CPU-only machine (docs/qwen3_5.md, "fla on a CPU-only machine").
* CUDA / NPU: fla when importable, else torch with a one-time warning (correct, slower).
* ``backend="torch"`` forces the reference; ``backend="fla"`` demands fla and fails loudly without it.
"""

from __future__ import annotations

import functools
import importlib
import logging
from collections.abc import Callable

logger = logging.getLogger(__name__)

__all__ = ["BACKENDS", "select_backend", "fla_available", "has_fla_kernels"]

BACKENDS = ("auto", "torch", "fla")
# The fla modules our fla backends import; all must import for the backend to be usable.
_FLA_MODULES = ("fla.ops.gated_delta_rule", "fla.modules.causal_conv1d")


@functools.cache
def fla_available() -> bool:
    """True when fla's gated-delta-rule and causal-conv1d kernels import (needs triton or triton-ascend)."""
    try:
        for name in _FLA_MODULES:
            importlib.import_module(name)
    except Exception as e:  # ImportError, or triton failing to find a driver at import
        logger.info("fla kernels unavailable (%s: %s)", type(e).__name__, e)
        return False
    return True


def has_fla_kernels(device_type: str) -> bool:
    """Whether fla has kernels for tensors on ``device_type`` (``Platform.fla_kernels``; False for a device type
    no platform owns, such as ``meta``)."""
    from verl.utils.platform import platform_of_device_type

    platform = platform_of_device_type(device_type)
    return platform is not None and platform.fla_kernels


@functools.cache
def _warn_fallback(op: str, device_type: str) -> None:
    logger.warning(
        "%s on %s: flash-linear-attention (fla) kernels are not importable, using the pure-torch implementation "
        "(exact, but slower). Install fla-core with triton (CUDA) or triton-ascend (NPU) for the fused kernels.",
        op,
        device_type,
    )


def select_backend(
    op: str,
    device_type: str,
    requested: str = "auto",
    *,
    is_fla_available: Callable[[], bool] = fla_available,
) -> str:
    """Pick ``"torch"`` or ``"fla"`` for ``op`` on ``device_type`` (``"cpu" | "cuda" | "npu" | ...``).

    ``is_fla_available`` is only called on CUDA/NPU, so fla is never imported on CPU.

    Raises:
        ValueError: unknown ``requested`` name, or ``"fla"`` requested on a device fla does not support.
        RuntimeError: ``"fla"`` requested on CUDA/NPU but not importable.
    """
    if requested not in BACKENDS:
        raise ValueError(f"{op}: unknown backend {requested!r}; valid: {BACKENDS}")
    if requested == "torch":
        return "torch"
    if not has_fla_kernels(device_type):
        if requested == "fla":
            raise ValueError(
                f"{op}: the fla backend needs a CUDA GPU or an Ascend NPU, got device {device_type!r}; "
                "use backend='torch'"
            )
        return "torch"
    if is_fla_available():
        return "fla"
    if requested == "fla":
        raise RuntimeError(
            f"{op}: backend='fla' was requested on {device_type} but fla's kernels do not import; "
            "install fla-core with triton (CUDA) or triton-ascend (NPU), or use backend='auto'"
        )
    _warn_fallback(op, device_type)
    return "torch"
