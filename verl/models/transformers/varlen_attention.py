"""The memory-lean packed attention patch: sdpa/eager models run packed rows without a ``T x T`` mask.

On a packed row HF's sdpa and eager attention derive the sequences from the position ids and build a
``(1, 1, T, T)`` block-diagonal causal mask (bool, then the float it is cast to): 4 GiB per mask at 32K tokens,
16 GiB of bool at 128K. Flash-attention and fused NPU kernels take ``cu_seqlens`` instead; the CPU and a simulated
NPU have neither. This patch gives every decoder attention instance an attention function that, for packed input
(``cu_seq_lens_q`` given, batch 1, causal, no sliding window), runs :func:`verl.ops.varlen_attention.varlen_causal_attention`
on the ``cu_seqlens`` segments; anything else (padded batches, generation with a cache) runs the configured
attention unchanged. Like HF's own flash varlen path, ``cu_seq_lens_q`` takes precedence over a mask.

The attention layers are half of it: the model still builds the mask before its first layer. Models whose
backbone accepts a precomputed ``{layer type: mask}`` mapping as ``attention_mask`` (Qwen2/3, Qwen3.5) get
``None`` for every layer type from ``forward_packed`` (:func:`packed_mask_mapping`) once all their attention
instances carry a varlen attention (this patch, or ``npu-fusion-attention``); Ulysses SP then builds no mask either.
Models that build their mask unconditionally (Llama, Qwen3-MoE here) are skipped with that reason.

The strategy for sequences longer than one chunk comes from the device contract
(:attr:`verl.utils.platform.base.Platform.long_segment_attention`): one patch per platform that has one,
registered by :mod:`verl.models.transformers.varlen_attention_patches` (importing this module registers nothing).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch
import torch.nn as nn

from verl.models.transformers.forward_globals import (
    FORWARD_GLOBALS_ATTR,
    WrappedAttentionFunctions,
    innermost,
    rebind_forward_globals,
)
from verl.models.transformers.instance_patch import original_class
from verl.models.transformers.patch_probe import record_call
from verl.models.transformers.patch_registry import PatchSkipped
from verl.ops.varlen_attention import varlen_causal_attention

__all__ = [
    "PROBE_KEY",
    "VARLEN_ATTENTION_ATTR",
    "apply_varlen_attention",
    "lean_varlen_attention",
    "packed_mask_mapping",
]

# Set on an attention instance whose attention function runs packed input from cu_seq_lens_q alone (no mask needed).
VARLEN_ATTENTION_ATTR = "_verl_varlen_attention"
_MAPPING_ATTR = "_verl_accepts_mask_mapping"
PROBE_KEY = "varlen-attention"  # what the segment kernel reports to the start-up probe
MODEL_TYPES = ("llama", "qwen2", "qwen3", "qwen3_moe", "qwen3_5", "qwen3_5_moe")
# Layer types whose mask is either the causal one this attention replaces or the recurrent one that is None anyway.
_MASK_FREE_LAYER_TYPES = {"full_attention", "linear_attention"}


def lean_varlen_attention(
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    *,
    inner: Callable,
    long_segments: str,
    dropout: float = 0.0,
    scaling: float | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """HF attention-function signature: query ``(1, H, T, d)``, key/value ``(1, KV, T, d)`` -> ``(1, T, H, d)``.

    Packed input goes to the segment kernel; everything else to ``inner`` (the configured attention).
    """
    cu_q = kwargs.get("cu_seq_lens_q")
    cu_k = kwargs.get("cu_seq_lens_k", cu_q)
    if not _runs_packed(module, query, key, cu_q, cu_k, dropout, kwargs):
        return inner(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs)
    record_call(PROBE_KEY)
    out = varlen_causal_attention(query[0], key[0], value[0], cu_q, scale=scaling, long_segments=long_segments)
    return out.transpose(0, 1).unsqueeze(0).contiguous(), None


def _runs_packed(module, query, key, cu_q, cu_k, dropout, kwargs) -> bool:
    if cu_q is None or query.shape[0] != 1 or query.shape[2] != key.shape[2]:
        return False
    if cu_k is not cu_q and not torch.equal(cu_k, cu_q):
        return False
    if dropout > 0.0 or kwargs.get("s_aux") is not None or kwargs.get("softcap") is not None:
        return False
    return getattr(module, "is_causal", True) and not getattr(module, "sliding_window", None)


def decoder_attention_modules(model: nn.Module) -> list[nn.Module]:
    """The decoder's attention instances (HF names them ``self_attn``; the vision tower's are ``attn``)."""
    found: dict[int, nn.Module] = {}
    for name, module in model.named_modules():
        if name.rsplit(".", 1)[-1] == "self_attn":
            while isinstance(getattr(module, "_fsdp_wrapped_module", None), nn.Module):
                module = module._fsdp_wrapped_module
            found.setdefault(id(module), module)
    return list(found.values())


def _accepts_mask_mapping(model: nn.Module) -> bool:
    """True when some submodule's forward takes ``attention_mask`` as a ready ``{layer type: mask}`` mapping (the
    answer is kept on the model: the forward code of its classes does not change)."""
    cached = getattr(model, _MAPPING_ATTR, None)
    if cached is None:
        cached = any(
            "causal_mask_mapping" in innermost(original_class(m).forward).__code__.co_varnames for m in model.modules()
        )
        object.__setattr__(model, _MAPPING_ATTR, cached)
    return cached


def apply_varlen_attention(model: nn.Module, *, long_segments: str) -> None:
    """Install :func:`lean_varlen_attention` on every decoder attention instance of ``model``.

    Raises:
        PatchSkipped: no decoder attention, a model that builds its mask itself, sliding-window or non-causal
            attention, or a fused varlen attention (``npu-fusion-attention``) already installed.
    """
    modules = decoder_attention_modules(model)
    if not modules:
        raise PatchSkipped("the model has no decoder self_attn module")
    if not _accepts_mask_mapping(model):
        raise PatchSkipped(f"{type(model).__name__} builds its attention mask itself (no precomputed mask mapping)")
    if any(getattr(m, "sliding_window", None) or not getattr(m, "is_causal", True) for m in modules):
        raise PatchSkipped("sliding-window or non-causal attention keeps the configured attention")
    if all(getattr(m, VARLEN_ATTENTION_ATTR, False) for m in modules):
        raise PatchSkipped("a fused varlen attention (npu-fusion-attention) already runs packed input")
    for module in modules:
        current = getattr(module, FORWARD_GLOBALS_ATTR, {}).get("ALL_ATTENTION_FUNCTIONS")
        if current is None:
            current = innermost(original_class(module).forward).__globals__.get("ALL_ATTENTION_FUNCTIONS")
        if current is None:
            raise PatchSkipped(f"{type(module).__name__}.forward does not use ALL_ATTENTION_FUNCTIONS")
        wrap = functools.partial(_lean_wrap, long_segments=long_segments)
        rebind_forward_globals(module, ALL_ATTENTION_FUNCTIONS=WrappedAttentionFunctions(current, wrap))
        object.__setattr__(module, VARLEN_ATTENTION_ATTR, True)


def _lean_wrap(inner: Callable, _name: str, *, long_segments: str) -> Callable:
    return functools.partial(lean_varlen_attention, inner=inner, long_segments=long_segments)


def packed_mask_mapping(model: nn.Module) -> dict[str, None] | None:
    """``attention_mask`` for a packed forward: ``{layer type: None}`` when every decoder attention instance runs
    packed input from ``cu_seqlens`` and the backbone accepts a mask mapping, else None (HF builds its mask)."""
    config = getattr(model, "config", None)
    text_config = getattr(config, "text_config", None) or config
    layer_types = set(getattr(text_config, "layer_types", None) or ["full_attention"])
    if not layer_types <= _MASK_FREE_LAYER_TYPES or getattr(text_config, "output_router_logits", False):
        return None
    modules = decoder_attention_modules(model)
    if not modules or not all(getattr(m, VARLEN_ATTENTION_ATTR, False) for m in modules):
        return None
    if not _accepts_mask_mapping(model):
        return None
    return dict.fromkeys(sorted(layer_types))
