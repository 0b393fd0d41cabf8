"""Qwen3.5 / Qwen3.5-MoE patches: exact packed ("remove padding") training.

Background: docs/qwen3_5.md, "Gated DeltaNet" and "Packing pitfalls".

HF's Gated DeltaNet (GDN) layers let the causal conv window and the recurrent state run from one packed sequence
into the next, in every transformers version (5.2-5.8 cannot even receive boundaries; later versions need fla and
causal-conv1d). The patch here gives each GDN *instance* of the model being built a forward of its own
(:func:`verl.models.transformers.instance_patch.set_forward`: a per-instance subclass, which the hub-kernel
re-dispatch of transformers >= 5.25 cannot undo) that runs :func:`verl.ops.causal_conv1d` and
:func:`verl.ops.chunk_gated_delta_rule` with ``cu_seqlens``: zero conv context and a zero state at every boundary
(fla kernels on CUDA/NPU, the exact chunked torch kernel on CPU). Each call reports to the start-up probe
(:mod:`verl.models.transformers.patch_probe`) whether it received the boundaries.

Does the project still need its own patch where transformers >= 5.15 threads ``cu_seq_lens_q`` / ``seq_idx`` to
fla and causal-conv1d itself (docs/qwen3_5.md, "transformers 5.25: the hub-kernel layer")? Yes: HF's conv keeps sequences apart only with
the CUDA-only ``causal-conv1d`` package (on Ascend, and on the CPU, it refuses ``seq_idx`` or leaks), 5.4-5.14
cannot pass boundaries at all, and Ulysses SP needs the head-split layer below.

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
MoE routing, norms and projections are per token.

Ulysses SP (a ``verl_ulysses`` context in the kwargs, see :mod:`verl.models.transformers.ulysses`): each rank holds a
slice of the stream, but the conv and the recurrence need whole sequences. The GDN layer therefore splits by *heads*
(docs/qwen3_5.md, "Ulysses SP for the GDN layers"): projections run on the local tokens, one all-to-all gives each
rank the whole stream of the ``[q | k | v | b | a]`` channels of its heads (value heads ``[r nv/sp, (r+1) nv/sp)``
and the key heads they read, replicated when there are fewer key heads than ranks), the conv and delta rule run on
those heads with the stream's ``cu_seqlens``, and a second all-to-all brings the core output back to the local tokens
for the norm and ``out_proj``. The patch also sets ``config.use_cache = False``: a forgotten ``use_cache`` in a
training forward would otherwise create a cache, which disables HF's packed-mask detection (generation passes
``use_cache`` explicitly from the generation config, so it is unaffected).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

from verl.models.registry import QWEN3_5_MODEL_TYPES, QWEN3_5_TRANSFORMERS
from verl.models.transformers import qwen3_5_vision  # noqa: F401  (registers the vision patch-embedding patch)
from verl.models.transformers.instance_patch import call_original_forward, set_forward
from verl.models.transformers.packed_forward import PACKED_CU_SEQLENS_KWARG, VARLEN_PATCHED_ATTR
from verl.models.transformers.patch_probe import record_call
from verl.models.transformers.patch_registry import ModelPatch, PatchSkipped, register_patch
from verl.models.transformers.ulysses import ULYSSES_KWARG, ULYSSES_MIXER_ATTR, UlyssesContext
from verl.ops import causal_conv1d, chunk_gated_delta_rule
from verl.utils.ulysses import gather_heads_scatter_seq, gather_seq_scatter_heads

__all__ = ["apply_varlen_gdn", "VARLEN_GDN_PATCH"]
# kwargs HF may hand a GDN layer that our forward consumes or ignores (boundaries, flash-attention extras)
_BOUNDARY_KWARGS = ("cu_seq_lens_q", "cu_seq_lens_k", "max_length_q", "max_length_k", "seq_idx", "position_ids")
_STASH_ATTR = "_verl_layer_cu_seqlens"
_STASH_SP_ATTR = "_verl_layer_ulysses"
PROBE_KEY = "qwen3_5-varlen-gdn"


def _is_gdn(module: nn.Module) -> bool:
    return type(module).__name__.endswith("GatedDeltaNet")


def _apply_padding_mask(hidden_states: torch.Tensor, attention_mask: torch.Tensor | None) -> torch.Tensor:
    # Padded batches: zero the padding tokens, as HF does. With zero inputs (no projection/conv bias) the GDN state
    # stays exactly zero through left padding, so padded rows equal their unpadded sequences.
    if attention_mask is None or attention_mask.dim() != 2:
        return hidden_states
    return (hidden_states * attention_mask[:, :, None]).to(hidden_states.dtype)


@dataclass(frozen=True)
class _GdnHeads:
    """The GDN heads one SP rank computes, as indices into the layer's projected channels.

    Attributes:
        channels: into ``cat([in_proj_qkv, in_proj_b, in_proj_a])`` outputs: the rank's ``[q | k | v | b | a]``.
        conv: into the ``[q | k | v]`` conv channels: the rank's ``[q | k | v]``.
        value_heads: the rank's value heads (a contiguous range).
        num_k_heads: key heads of the rank (1 when key heads are replicated over several ranks).
    """

    channels: torch.Tensor
    conv: torch.Tensor
    value_heads: torch.Tensor
    num_k_heads: int


def _check_gdn_heads(module: nn.Module, sp_size: int) -> None:
    """Raise unless ``sp_size`` ranks can split this GDN layer by heads (see :func:`_gdn_rank_heads`)."""
    nk, nv = module.num_k_heads, module.num_v_heads
    if nv % sp_size or (nk % sp_size and sp_size % nk):
        raise ValueError(
            f"ulysses_sequence_parallel_size={sp_size} cannot split the Qwen3.5 Gated DeltaNet heads: it must divide "
            f"the {nv} linear value heads and divide or be a multiple of the {nk} linear key heads"
        )


@functools.lru_cache(maxsize=64)
def _gdn_rank_heads(nk: int, nv: int, dk: int, dv: int, sp_size: int, rank: int) -> _GdnHeads:
    """Heads of rank ``rank``: value heads ``[r nv/sp, (r+1) nv/sp)`` and the key heads they read.

    Value head j reads key head ``j // (nv / nk)`` (the kernel repeats q/k heads with ``repeat_interleave``), so
    with ``sp | nk`` the rank owns key heads ``[r nk/sp, (r+1) nk/sp)``; with ``nk | sp`` all its value heads read
    key head ``r nk // sp``, which it holds as a replica. Example (nk=2, nv=4, dk=dv=1, sp=2), rank 1:
    q channel 1, k channel 2+1=3, v channels 4+2, 4+3 -> conv [1, 3, 6, 7]; b = 8+[2, 3], a = 12+[2, 3].
    """
    if nk % sp_size == 0:
        k_heads = torch.arange(rank * nk // sp_size, (rank + 1) * nk // sp_size)
    else:
        k_heads = torch.tensor([rank * nk // sp_size])
    v_heads = torch.arange(rank * nv // sp_size, (rank + 1) * nv // sp_size)
    key_dim, conv_dim = nk * dk, 2 * nk * dk + nv * dv
    q = (k_heads[:, None] * dk + torch.arange(dk)).flatten()
    v = (v_heads[:, None] * dv + torch.arange(dv)).flatten()
    conv = torch.cat([q, key_dim + q, 2 * key_dim + v])
    channels = torch.cat([conv, conv_dim + v_heads, conv_dim + nv + v_heads])
    return _GdnHeads(channels=channels, conv=conv, value_heads=v_heads, num_k_heads=len(k_heads))


def _gdn_mixer_ulysses(module: nn.Module, hidden_states: torch.Tensor, ctx: UlyssesContext) -> torch.Tensor:
    """The GDN mixer under Ulysses SP: hidden ``(1, T_pad/sp, hidden)`` (this rank's slice) -> same shape.

    Projections run on the local tokens; one all-to-all turns each rank's ``[q|k|v|b|a]`` channels of its heads
    from a sequence slice into the whole stream; conv + delta rule run per head on whole sequences (cu_seqlens of
    the padded stream); the core output goes back to the sequence slice for the per-token norm and ``out_proj``.
    """
    ctx.mixer_calls += 1
    sp_size = ctx.world_size
    dims = (module.num_k_heads, module.num_v_heads, module.head_k_dim, module.head_v_dim)
    heads = [_gdn_rank_heads(*dims, sp_size, r) for r in range(sp_size)]
    mine = heads[ctx.rank]
    device = hidden_states.device
    projected = torch.cat(
        [module.in_proj_qkv(hidden_states), module.in_proj_b(hidden_states), module.in_proj_a(hidden_states)], -1
    )
    send = projected[..., torch.cat([h.channels for h in heads]).to(device)].unflatten(-1, (sp_size, -1))
    local = gather_seq_scatter_heads(send, seq_dim=1, head_dim=2, group=ctx.group).squeeze(2)  # (1, T_pad, C_r)
    nv_local = mine.value_heads.numel()
    mixed_qkv, b, a = local.split([mine.conv.numel(), nv_local, nv_local], dim=-1)
    on_device = _GdnHeads(mine.channels, mine.conv.to(device), mine.value_heads.to(device), mine.num_k_heads)
    core = _gdn_core(module, mixed_qkv, b, a, on_device, ctx.cu_seqlens.to(device))
    core = gather_heads_scatter_seq(core, head_dim=2, seq_dim=1, group=ctx.group)  # (1, T_pad/sp, nv, dv)
    return _gdn_output(module, core, hidden_states)


def _gdn_core(
    module: nn.Module,
    mixed_qkv: torch.Tensor,
    b: torch.Tensor,
    a: torch.Tensor,
    heads: _GdnHeads | None,
    cu_seqlens: torch.Tensor | None,
) -> torch.Tensor:
    """Causal conv + gated delta rule of the GDN heads ``heads`` (None: all heads) over whole sequences.

    Shapes: mixed_qkv ``(B, T, [q | k | v] channels of the heads)``, b/a ``(B, T, value heads)`` -> core
    ``(B, T, value heads, head_v_dim)``. Gates: ``β = σ(b)``, ``g = -exp(A_log) softplus(a + dt_bias)``.
    """
    weight, bias = module.conv1d.weight.squeeze(1), module.conv1d.bias
    a_log, dt_bias, num_k_heads = module.A_log, module.dt_bias, module.num_k_heads
    if heads is not None:  # this rank's channels and value heads (Ulysses SP)
        weight, bias = weight[heads.conv], None if bias is None else bias[heads.conv]
        a_log, dt_bias, num_k_heads = a_log[heads.value_heads], dt_bias[heads.value_heads], heads.num_k_heads
    batch, seqlen, _ = mixed_qkv.shape
    backend = getattr(module, "_verl_kernel_backend", "auto")
    mixed_qkv = causal_conv1d(
        mixed_qkv, weight, bias, activation=module.activation, cu_seqlens=cu_seqlens, backend=backend
    )
    key_dim, value_heads = num_k_heads * module.head_k_dim, b.shape[-1]
    query, key, value = torch.split(mixed_qkv, [key_dim, key_dim, value_heads * module.head_v_dim], dim=-1)
    query = query.reshape(batch, seqlen, num_k_heads, module.head_k_dim)
    key = key.reshape(batch, seqlen, num_k_heads, module.head_k_dim)
    value = value.reshape(batch, seqlen, value_heads, module.head_v_dim)
    # fp32 gate: in bf16/fp16 exp(A_log) * softplus(.) can overflow to -inf
    g = -a_log.float().exp() * F.softplus(a.float() + dt_bias)
    core, _ = chunk_gated_delta_rule(
        query, key, value, g, b.sigmoid(), use_qk_l2norm_in_kernel=True, cu_seqlens=cu_seqlens, backend=backend
    )
    return core


def _gdn_output(module: nn.Module, core: torch.Tensor, hidden_states: torch.Tensor) -> torch.Tensor:
    """Gated RMSNorm (gate ``z`` from the layer input) and ``out_proj``: core ``(B, T, nv, dv)`` -> ``(B, T, hidden)``."""
    batch, seqlen = core.shape[:2]
    z = module.in_proj_z(hidden_states).reshape(-1, module.head_v_dim)
    core = module.norm(core.reshape(-1, module.head_v_dim), z).reshape(batch, seqlen, -1)
    return module.out_proj(core)


def _gdn_mixer(module: nn.Module, hidden_states: torch.Tensor, cu_seqlens: torch.Tensor | None) -> torch.Tensor:
    """The GDN token mixer with explicit boundaries. hidden_states ``(B, T, hidden)`` -> ``(B, T, hidden)``.

    Same maths as HF's forward (docs/qwen3_5.md, "Gated DeltaNet"): projections, causal conv + SiLU over the
    q|k|v channels, the gated delta rule with l2-normalised q/k, the gated RMSNorm and ``out_proj``; only the conv
    and the recurrence see ``cu_seqlens``.
    """
    projected = (module.in_proj_qkv(hidden_states), module.in_proj_b(hidden_states), module.in_proj_a(hidden_states))
    return _gdn_output(module, _gdn_core(module, *projected, None, cu_seqlens), hidden_states)


def _varlen_gdn_forward(self, hidden_states, cache=None, attention_mask=None, *, cache_params=None, **kwargs):
    """The forward of one patched GDN instance; accepts the 5.4 (``cache_params``) and 5.9+ (``cache``)
    signatures. With a cache (generation) it defers to HF's own forward, which handles the recurrent cache; with a
    Ulysses context (``verl_ulysses``, SP > 1) it runs the sequence-parallel mixer."""
    cu_seqlens = kwargs.pop(PACKED_CU_SEQLENS_KWARG, None)
    if cu_seqlens is None:
        cu_seqlens = kwargs.get("cu_seq_lens_q")
    if cu_seqlens is None:
        cu_seqlens = getattr(self, _STASH_ATTR, None)
    ulysses = kwargs.pop(ULYSSES_KWARG, None)
    if ulysses is None:
        ulysses = getattr(self, _STASH_SP_ATTR, None)
    cache = cache if cache is not None else cache_params
    if cache is not None:
        if cu_seqlens is not None or ulysses is not None:
            raise ValueError(
                "Qwen3.5 GatedDeltaNet: packed sequences (cu_seqlens) cannot be combined with a cache; training "
                "forwards must pass use_cache=False (forward_packed does)"
            )
        for name in _BOUNDARY_KWARGS:
            kwargs.pop(name, None)
        return call_original_forward(self, hidden_states, cache, attention_mask=attention_mask, **kwargs)
    if (cu_seqlens is not None or ulysses is not None) and attention_mask is not None:
        raise ValueError("Qwen3.5 GatedDeltaNet: packed input must come with attention_mask=None (forward_packed)")
    if ulysses is not None and ulysses.world_size > 1:
        record_call(PROBE_KEY, ok=ulysses.cu_seqlens is not None, why="without the packed boundaries")
        return _gdn_mixer_ulysses(self, hidden_states, ulysses)
    record_call(PROBE_KEY, ok=cu_seqlens is not None, why="without the packed boundaries (no cu_seqlens reached it)")
    return _gdn_mixer(self, _apply_padding_mask(hidden_states, attention_mask), cu_seqlens)


def _stash_pre_hook(layer: nn.Module, args, kwargs):
    object.__setattr__(layer.linear_attn, _STASH_ATTR, kwargs.get(PACKED_CU_SEQLENS_KWARG))
    object.__setattr__(layer.linear_attn, _STASH_SP_ATTR, kwargs.get(ULYSSES_KWARG))


def _stash_clear_hook(layer: nn.Module, args, output):
    object.__setattr__(layer.linear_attn, _STASH_ATTR, None)
    object.__setattr__(layer.linear_attn, _STASH_SP_ATTR, None)


def _patch_gdn_instance(gdn: nn.Module, backend: str) -> None:
    if getattr(gdn, VARLEN_PATCHED_ATTR, False):
        return
    set_forward(gdn, _varlen_gdn_forward)
    object.__setattr__(gdn, "_verl_kernel_backend", backend)
    object.__setattr__(gdn, _STASH_ATTR, None)
    object.__setattr__(gdn, _STASH_SP_ATTR, None)
    object.__setattr__(gdn, ULYSSES_MIXER_ATTR, _check_gdn_heads)
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


def gdn_backend_note(device_type: str, backend: str = "auto") -> str:
    """The GDN kernels the patched layers will use on ``device_type``, for the start-up patch report.

    Same rule as :func:`verl.ops.backends.select_backend`: fla (Triton on CUDA, triton-ascend on NPU) where its
    kernels import, else the pure-torch chunked kernels (exact, slower); the CPU always uses torch.
    """
    from verl.ops.backends import fla_available, has_fla_kernels

    if backend == "torch" or not has_fla_kernels(device_type):
        return "GDN kernels: torch"
    if backend == "fla" or fla_available():
        return "GDN kernels: fla"
    return "GDN kernels: torch (fla not importable: pure-torch chunked kernels, exact but slower)"


def _apply_varlen_gdn_patch(model: nn.Module) -> str:
    from verl.utils.platform import get_platform

    apply_varlen_gdn(model)
    return gdn_backend_note(get_platform().device_name)


VARLEN_GDN_PATCH = register_patch(
    ModelPatch(
        name="qwen3_5-varlen-gdn",
        model_types=QWEN3_5_MODEL_TYPES,
        platforms=("cpu", "cuda", "npu"),
        apply=_apply_varlen_gdn_patch,
        required=True,
        transformers=QWEN3_5_TRANSFORMERS,
        description="GatedDeltaNet conv + recurrence reset at every cu_seqlens boundary (packed training is exact)",
        probe_key=PROBE_KEY,
    )
)
