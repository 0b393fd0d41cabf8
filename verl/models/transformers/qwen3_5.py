"""Qwen3.5 / Qwen3.5-MoE patches: exact packed ("remove padding") training (qwen3_5_model.md §2, §7).

HF's Gated DeltaNet (GDN) layers let the causal conv window and the recurrent state run from one packed sequence
into the next, in every transformers version (5.2-5.8 cannot even receive boundaries; later versions need fla and
causal-conv1d). The patch here replaces, on each GDN *instance* of the model being built, ``forward`` with one that
runs :func:`verl.ops.causal_conv1d` and :func:`verl.ops.chunk_gated_delta_rule` with ``cu_seqlens``: zero conv
context and a zero state at every boundary (fla kernels on CUDA/NPU, the exact chunked torch kernel on CPU).

How ``cu_seqlens`` reaches every GDN layer (a design choice, explained):

* ``forward_packed`` passes it as the kwarg ``verl_cu_seqlens``. Every supported transformers version forwards the
  text model's ``**kwargs`` to each decoder layer, and from 5.9 on the decoder layer forwards them to the GDN too.
  Kwargs are the only channel that survives gradient checkpointing: the backward recomputation re-runs the layer
  with the same bound kwargs, after the forward (and any scope it set up) has long returned. A context variable set
  around the forward would be empty during that recomputation and silently train on leaked states.
* In 5.4-5.8 the decoder layer calls ``linear_attn`` *without* kwargs, so a forward pre-hook on each decoder layer
  copies the kwarg onto its GDN module for the duration of that layer call (a post-hook clears it). In those
  versions gradient checkpointing wraps ``__call__``, so hooks re-run during recomputation and the copy is
  current there too. The GDN forward prefers a kwarg it received directly over the copy.

Full (gated) attention needs no patch: with ``attention_mask=None``, ``use_cache=False`` and position ids that
restart at every boundary, HF builds the block-diagonal causal mask itself (sdpa/eager) or runs varlen flash
attention; ``forward_packed`` enforces those three conditions and checks the positions against ``cu_seqlens``.
MoE routing, norms and projections are per token. The patch also sets ``config.use_cache = False``: a forgotten
``use_cache`` in a training forward would otherwise create a cache, which disables HF's packed-mask detection
(generation passes ``use_cache`` explicitly from the generation config, so it is unaffected).
"""

from __future__ import annotations

import types

import torch
import torch.nn as nn
import torch.nn.functional as F

from verl.models.registry import QWEN3_5_MODEL_TYPES, QWEN3_5_TRANSFORMERS
from verl.models.transformers import qwen3_5_vision  # noqa: F401  (registers the vision patch-embedding patch)
from verl.models.transformers.packed_forward import PACKED_CU_SEQLENS_KWARG, VARLEN_PATCHED_ATTR
from verl.models.transformers.patch_registry import ModelPatch, PatchSkipped, register_patch
from verl.ops import causal_conv1d, chunk_gated_delta_rule

__all__ = ["apply_varlen_gdn", "VARLEN_GDN_PATCH"]
# kwargs HF may hand a GDN layer that our forward consumes or ignores (boundaries, flash-attention extras)
_BOUNDARY_KWARGS = ("cu_seq_lens_q", "cu_seq_lens_k", "max_length_q", "max_length_k", "seq_idx", "position_ids")
_STASH_ATTR = "_verl_layer_cu_seqlens"
_ORIGINAL_FORWARD_ATTR = "_verl_original_forward"


def _is_gdn(module: nn.Module) -> bool:
    return type(module).__name__.endswith("GatedDeltaNet")


def _apply_padding_mask(hidden_states: torch.Tensor, attention_mask: torch.Tensor | None) -> torch.Tensor:
    # Padded batches: zero the padding tokens, as HF does. With zero inputs (no projection/conv bias) the GDN state
    # stays exactly zero through left padding, so padded rows equal their unpadded sequences.
    if attention_mask is None or attention_mask.dim() != 2:
        return hidden_states
    return (hidden_states * attention_mask[:, :, None]).to(hidden_states.dtype)


def _gdn_mixer(module: nn.Module, hidden_states: torch.Tensor, cu_seqlens: torch.Tensor | None) -> torch.Tensor:
    """The GDN token mixer with explicit boundaries. hidden_states ``(B, T, hidden)`` -> ``(B, T, hidden)``.

    Same maths as HF's forward (qwen3_5_model.md §2.1): projections, causal conv + SiLU over the q|k|v channels,
    gates ``β = σ(b)``, ``g = -exp(A_log) softplus(a + dt_bias)``, the gated delta rule with l2-normalised q/k,
    the gated RMSNorm and ``out_proj``; only the conv and the recurrence see ``cu_seqlens``.
    """
    batch, seqlen, _ = hidden_states.shape
    backend = getattr(module, "_verl_kernel_backend", "auto")
    mixed_qkv = causal_conv1d(
        module.in_proj_qkv(hidden_states),
        module.conv1d.weight.squeeze(1),
        module.conv1d.bias,
        activation=module.activation,
        cu_seqlens=cu_seqlens,
        backend=backend,
    )
    query, key, value = torch.split(mixed_qkv, [module.key_dim, module.key_dim, module.value_dim], dim=-1)
    query = query.reshape(batch, seqlen, -1, module.head_k_dim)
    key = key.reshape(batch, seqlen, -1, module.head_k_dim)
    value = value.reshape(batch, seqlen, -1, module.head_v_dim)
    beta = module.in_proj_b(hidden_states).sigmoid()
    # fp32 gate: in bf16/fp16 exp(A_log) * softplus(.) can overflow to -inf
    g = -module.A_log.float().exp() * F.softplus(module.in_proj_a(hidden_states).float() + module.dt_bias)
    core, _ = chunk_gated_delta_rule(
        query, key, value, g, beta, use_qk_l2norm_in_kernel=True, cu_seqlens=cu_seqlens, backend=backend
    )
    z = module.in_proj_z(hidden_states).reshape(-1, module.head_v_dim)
    core = module.norm(core.reshape(-1, module.head_v_dim), z).reshape(batch, seqlen, -1)
    return module.out_proj(core)


def _varlen_gdn_forward(self, hidden_states, cache=None, attention_mask=None, *, cache_params=None, **kwargs):
    """Replacement ``forward`` bound to one GDN instance; accepts the 5.4 (``cache_params``) and 5.9+ (``cache``)
    signatures. With a cache (generation) it defers to HF's own forward, which handles the recurrent cache."""
    cu_seqlens = kwargs.pop(PACKED_CU_SEQLENS_KWARG, None)
    if cu_seqlens is None:
        cu_seqlens = kwargs.get("cu_seq_lens_q")
    if cu_seqlens is None:
        cu_seqlens = getattr(self, _STASH_ATTR, None)
    cache = cache if cache is not None else cache_params
    if cache is not None:
        if cu_seqlens is not None:
            raise ValueError(
                "Qwen3.5 GatedDeltaNet: packed sequences (cu_seqlens) cannot be combined with a cache; training "
                "forwards must pass use_cache=False (forward_packed does)"
            )
        for name in _BOUNDARY_KWARGS:
            kwargs.pop(name, None)
        return getattr(self, _ORIGINAL_FORWARD_ATTR)(hidden_states, cache, attention_mask=attention_mask, **kwargs)
    if cu_seqlens is not None and attention_mask is not None:
        raise ValueError("Qwen3.5 GatedDeltaNet: packed input must come with attention_mask=None (forward_packed)")
    return _gdn_mixer(self, _apply_padding_mask(hidden_states, attention_mask), cu_seqlens)


def _stash_pre_hook(layer: nn.Module, args, kwargs):
    object.__setattr__(layer.linear_attn, _STASH_ATTR, kwargs.get(PACKED_CU_SEQLENS_KWARG))


def _stash_clear_hook(layer: nn.Module, args, output):
    object.__setattr__(layer.linear_attn, _STASH_ATTR, None)


def _patch_gdn_instance(gdn: nn.Module, backend: str) -> None:
    if getattr(gdn, VARLEN_PATCHED_ATTR, False):
        return
    object.__setattr__(gdn, _ORIGINAL_FORWARD_ATTR, gdn.forward)
    gdn.forward = types.MethodType(_varlen_gdn_forward, gdn)
    object.__setattr__(gdn, "_verl_kernel_backend", backend)
    object.__setattr__(gdn, _STASH_ATTR, None)
    object.__setattr__(gdn, VARLEN_PATCHED_ATTR, True)


def _text_configs(model: nn.Module) -> list:
    config = getattr(model, "config", None)
    if config is None:
        return []
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    return [config] if text is config else [config, text]


def apply_varlen_gdn(model: nn.Module, *, backend: str = "auto") -> int:
    """Make every Qwen3.5 GDN layer of ``model`` honour packed boundaries (module docstring).

    Args:
        model: a Qwen3.5 / Qwen3.5-MoE model (ForCausalLM, ForConditionalGeneration, TextModel, ...), patched in place.
        backend: kernel backend for conv and recurrence (``"auto" | "torch" | "fla"``, see :mod:`verl.ops.backends`).

    Returns:
        The number of GDN layers patched.

    Raises:
        PatchSkipped: the model has no GDN layer.
    """
    patched = 0
    for module in model.modules():
        gdn = getattr(module, "linear_attn", None)
        if gdn is None or not _is_gdn(gdn):
            continue
        if not getattr(gdn, VARLEN_PATCHED_ATTR, False):
            module.register_forward_pre_hook(_stash_pre_hook, with_kwargs=True)
            module.register_forward_hook(_stash_clear_hook)
        _patch_gdn_instance(gdn, backend)
        patched += 1
    if patched == 0:
        raise PatchSkipped("no GatedDeltaNet layer found (layer_types has no linear_attention)")
    for config in _text_configs(model):
        config.use_cache = False
    return patched


def _apply_varlen_gdn_patch(model: nn.Module) -> None:
    apply_varlen_gdn(model)


VARLEN_GDN_PATCH = register_patch(
    ModelPatch(
        name="qwen3_5-varlen-gdn",
        model_types=QWEN3_5_MODEL_TYPES,
        platforms=("cpu", "cuda", "npu"),
        apply=_apply_varlen_gdn_patch,
        required=True,
        transformers=QWEN3_5_TRANSFORMERS,
        description="GatedDeltaNet conv + recurrence reset at every cu_seqlens boundary (packed training is exact)",
    )
)
