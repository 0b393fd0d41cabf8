"""Varlen causal depthwise 1-D convolution (the short conv of Gated DeltaNet layers).

For a sequence ``x_0 .. x_{L-1}`` and a kernel of width ``W``::

    y_t = act( b + sum_{k=0}^{W-1} w[:, W-1-k] * x_{t-k} ),   x_{t-k} := 0 when t - k < 0

With packed input, ``t - k < 0`` means "before the start of *this* sequence": every ``cu_seqlens`` boundary gets
zero left context, so the first ``W - 1`` tokens of a sequence never see the previous sequence.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from verl.ops.backends import select_backend
from verl.utils.packing import position_in_sequence, validate_cu_seqlens

__all__ = ["causal_conv1d", "torch_causal_conv1d"]

_ACTIVATIONS = {None: lambda x: x, "silu": F.silu, "swish": F.silu}


def torch_causal_conv1d(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    *,
    activation: str | None = None,
    cu_seqlens: torch.Tensor | None = None,
) -> torch.Tensor:
    """Pure-torch varlen causal depthwise conv (exact reference, autograd through torch ops).

    Args:
        x: ``(B, T, D)``; with ``cu_seqlens`` B must be 1.
        weight: ``(D, W)`` (an ``nn.Conv1d(D, D, W, groups=D)`` weight squeezed at dim 1).
        bias: ``(D,)`` or None.
        activation: None or ``"silu"``.
        cu_seqlens: ``(N + 1,)`` boundaries of the sequences packed along T; None = each row is one sequence.

    Returns:
        ``(B, T, D)`` in ``x.dtype`` (computed in fp32 at least).
    """
    batch, total, _ = x.shape
    width = weight.shape[-1]
    dtype = torch.promote_types(x.dtype, torch.float32)
    xf, wf = x.to(dtype), weight.to(dtype)
    # offset of each token inside its own sequence: a shift by k is valid only where offset >= k
    if cu_seqlens is None:
        offset = torch.arange(total, device=x.device)
    else:
        offset = position_in_sequence(cu_seqlens, total)
    out = xf * wf[:, width - 1]
    for k in range(1, width):  # W - 1 shifts (3 for Qwen3.5), not a loop over tokens
        shifted = F.pad(xf, (0, 0, k, 0))[:, :total]
        valid = (offset >= k).to(xf.dtype)[None, :, None]
        out = out + shifted * valid * wf[:, width - 1 - k]
    if bias is not None:
        out = out + bias.to(dtype)
    return _ACTIVATIONS[activation](out).to(x.dtype)


def _fla_causal_conv1d(x, weight, bias, *, activation, cu_seqlens):
    from fla.modules.causal_conv1d import causal_conv1d as fla_conv  # lazy: never imported on CPU

    cu = None if cu_seqlens is None else cu_seqlens.to(torch.long).contiguous()
    out = fla_conv(x=x.contiguous(), weight=weight.contiguous(), bias=bias, activation=activation, cu_seqlens=cu)
    return out[0] if isinstance(out, tuple) else out


def causal_conv1d(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    *,
    activation: str | None = None,
    cu_seqlens: torch.Tensor | None = None,
    backend: str = "auto",
) -> torch.Tensor:
    """Varlen causal depthwise conv1d with zero left context at every ``cu_seqlens`` boundary.

    Shapes as in :func:`torch_causal_conv1d`. ``backend``: ``"auto"`` (fla on CUDA/NPU when importable, torch
    otherwise), ``"torch"`` or ``"fla"``.
    """
    if activation not in _ACTIVATIONS:
        raise ValueError(
            f"causal_conv1d: unsupported activation {activation!r}; valid: {sorted(map(str, _ACTIVATIONS))}"
        )
    if x.dim() != 3 or weight.dim() != 2 or weight.shape[0] != x.shape[-1]:
        raise ValueError(
            f"causal_conv1d: expected x (B, T, D) and weight (D, W), got {tuple(x.shape)} and {tuple(weight.shape)}"
        )
    if cu_seqlens is not None and x.shape[0] != 1:
        raise ValueError(f"causal_conv1d: packed input (cu_seqlens given) must have batch 1, got {x.shape[0]}")
    if select_backend("causal_conv1d", x.device.type, backend) == "fla":
        # no host-side validation here: it would sync the device once per layer (forward_packed validated already)
        return _fla_causal_conv1d(x, weight, bias, activation=activation, cu_seqlens=cu_seqlens)
    if cu_seqlens is not None:
        validate_cu_seqlens(cu_seqlens, x.shape[1])
    return torch_causal_conv1d(x, weight, bias, activation=activation, cu_seqlens=cu_seqlens)
