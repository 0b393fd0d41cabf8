"""Model forwards on the one packed format (``verl.utils.packing.PackedBatch``) and on padded batches.

``forward_packed`` runs any HF causal LM on a single packed row so that every sequence is computed exactly as if
it were alone. Three conditions make HF models keep packed sequences apart (docs/qwen3_5.md, "Packing pitfalls"):

* ``attention_mask=None`` — the packed (block-diagonal) mask is only derived when no mask is given;
* ``use_cache=False`` — with a cache (the config default is ``use_cache=True``, even in ``train()``) HF skips the
  packed-mask detection and full attention leaks across sequences;
* ``position_ids`` whose text row restarts at 0 at every ``cu_seqlens`` boundary (sdpa/eager derive the segments
  from them; M-RoPE models need the 4-row form: text row + 3 M-RoPE rows).

``cu_seqlens`` is also passed explicitly, as two kinds of kwargs that HF threads down to every decoder layer:

* ``verl_cu_seqlens`` (:data:`PACKED_CU_SEQLENS_KWARG`), always: the patched Qwen3.5 Gated DeltaNet layers read it.
  It has a name of its own because HF gives the standard names a second meaning elsewhere: the Qwen3.5 vision
  tower pops a ``cu_seqlens`` kwarg as *its* per-image boundaries and passes ``cu_seq_lens_q`` itself, so the
  standard names collide there.
* ``cu_seq_lens_q/k`` + ``max_length_q/k``, for text-only inputs: HF's flash-attention path uses them for varlen
  attention (sdpa/eager ignore them and use the position ids). With pixel inputs they are left out (the vision
  tower's flash attention would receive them twice); flash attention then derives the same boundaries from the text
  position row, which restarts at 0 per sequence.

Models whose recurrent layers cannot keep sequences apart without a patch (Qwen3.5's GDN) are refused until the
patch is applied.

Ulysses sequence parallelism (SP > 1, the group passed as ``ulysses_group`` or installed with
``verl.utils.ulysses.set_ulysses_sequence_parallel_group``) is a property of the same call: each rank of the SP group
runs its slice of the packed stream, and the result is the whole stream on every rank, equal to SP = 1
(:func:`_forward_packed_ulysses`, :mod:`verl.models.transformers.ulysses`). Callers change nothing else.
"""

from __future__ import annotations

import torch
import torch.nn as nn
from torch.distributed import ProcessGroup

from verl.models.transformers.ulysses import ULYSSES_KWARG, UlyssesContext, prepare_model_for_ulysses
from verl.models.transformers.varlen_attention import packed_mask_mapping
from verl.utils.packing import PackedBatch, validate_cu_seqlens
from verl.utils.ulysses import (
    all_gather_tensor,
    gather_outputs_and_unpad,
    get_ulysses_sequence_parallel_group,
    get_ulysses_sequence_parallel_world_size,
    shard_packed_batch,
    slice_input_tensor,
    ulysses_pad,
)

__all__ = [
    "PACKED_CU_SEQLENS_KWARG",
    "VARLEN_PATCHED_ATTR",
    "forward_packed",
    "forward_padded",
    "get_lm_head",
    "packed_attention_kwargs",
]

# The kwarg that carries cu_seqlens (int32, contiguous) down to patched recurrent layers.
PACKED_CU_SEQLENS_KWARG = "verl_cu_seqlens"
# Inputs that run the vision tower, whose attention already receives its own cu_seq_lens_q/k.
_VISION_INPUTS = ("pixel_values", "pixel_values_videos")

# Set to True on a recurrent mixer module (e.g. a Qwen3.5 GatedDeltaNet) once it honours cu_seqlens.
VARLEN_PATCHED_ATTR = "_verl_varlen_patched"
# Module class-name suffixes of token mixers that carry state across tokens and must be varlen-patched.
_RECURRENT_MIXER_SUFFIXES = ("GatedDeltaNet",)


def get_lm_head(model: nn.Module) -> nn.Linear | None:
    """The output projection (``lm_head``) of a causal LM, or None when the model has none (e.g. a critic)."""
    inner = _unwrap(model)
    head = inner.get_output_embeddings() if hasattr(inner, "get_output_embeddings") else None
    return head if isinstance(head, nn.Linear) else None


def packed_attention_kwargs(packed: PackedBatch, *, flash_kwargs: bool = True) -> dict:
    """The boundary kwargs of a packed forward (module docstring): ``verl_cu_seqlens`` and, with ``flash_kwargs``,
    ``cu_seq_lens_q/k`` + ``max_length_q/k``. cu_seqlens is int32 and contiguous on the device of the input ids."""
    cu_seqlens = packed.cu_seqlens.to(device=packed.input_ids.device, dtype=torch.int32).contiguous()
    kwargs = {PACKED_CU_SEQLENS_KWARG: cu_seqlens}
    if flash_kwargs:
        kwargs.update(
            cu_seq_lens_q=cu_seqlens,
            cu_seq_lens_k=cu_seqlens,
            max_length_q=packed.max_seqlen,
            max_length_k=packed.max_seqlen,
        )
    return kwargs


def forward_packed(
    model: nn.Module,
    packed: PackedBatch,
    *,
    return_hidden: bool = False,
    ulysses_group: ProcessGroup | None = None,
    **multimodal_inputs,
) -> torch.Tensor:
    """Run ``model`` on a packed batch.

    Args:
        model: an HF causal LM (possibly wrapped by FSDP/DDP); Qwen3.5 models must have their patches applied.
        packed: the packed batch (``input_ids`` ``(1, T)``); under SP every rank of the group passes the same one.
        return_hidden: return the final hidden states (after the last norm, before the LM head) instead of logits;
            the LM head is then run on zero positions, so no ``(T, V)`` tensor is materialised.
        ulysses_group: Ulysses SP group; default: the installed one
            (:func:`verl.utils.ulysses.set_ulysses_sequence_parallel_group`). With more than one rank, see
            :func:`_forward_packed_ulysses`.
        **multimodal_inputs: e.g. ``pixel_values``, ``image_grid_thw``, ``mm_token_type_ids`` (packed, sample order).

    Returns:
        ``(1, T, V)`` logits, or ``(1, T, H)`` hidden states (under SP too: the whole stream, on every SP rank).
    """
    _check_packed(model, packed)
    group = ulysses_group if ulysses_group is not None else get_ulysses_sequence_parallel_group()
    if get_ulysses_sequence_parallel_world_size(group) > 1:
        return _forward_packed_ulysses(model, packed, group, return_hidden, multimodal_inputs)
    text_only = not any(multimodal_inputs.get(k) is not None for k in _VISION_INPUTS)
    kwargs = dict(
        input_ids=packed.input_ids.contiguous(),
        position_ids=packed.position_ids.contiguous(),
        attention_mask=packed_mask_mapping(_unwrap(model)) if text_only else None,
        use_cache=False,
        **packed_attention_kwargs(packed, flash_kwargs=text_only),
        **multimodal_inputs,
    )
    return _call(model, kwargs, return_hidden)


def _forward_packed_ulysses(
    model: nn.Module, packed: PackedBatch, group: ProcessGroup, return_hidden: bool, multimodal_inputs: dict
) -> torch.Tensor:
    """``forward_packed`` with the packed stream split over the ranks of the Ulysses SP ``group``.

    Each rank runs the decoder on its slice of the stream, right-padded to a multiple of SP (the padding is a
    sequence of its own). Token mixers swap sequence and head splits around their sequence maths
    (:mod:`verl.models.transformers.ulysses`); the final hidden states are all-gathered and unpadded at the
    backbone's output, so the LM head (and the caller's log-prob maths) see the whole stream on every rank. The
    gather's backward scales by SP: averaging parameter gradients over the SP group gives the gradient of the loss.

    With image/video inputs every rank embeds the whole stream (the vision tower and the placeholder merge need
    all image tokens) and a pre-hook on the language model keeps this rank's slice of the merged embeddings.
    """
    sp_size = get_ulysses_sequence_parallel_world_size(group)
    expected_calls = prepare_model_for_ulysses(model, sp_size)
    _check_same_batch_on_sp_ranks(packed, group)
    shard = shard_packed_batch(packed, group)
    context = UlyssesContext.from_shard(shard, group)
    backbone = _backbone(model)
    hooks = [backbone.register_forward_hook(_gather_hidden_hook(shard.pad_size, group), prepend=True)]
    if any(multimodal_inputs.get(k) is not None for k in _VISION_INPUTS):
        kwargs = _whole_stream_inputs(packed, sp_size, multimodal_inputs)
        language_model = _language_model(backbone)
        hooks.append(language_model.register_forward_pre_hook(_slice_embeds_hook(group), with_kwargs=True))
    else:
        kwargs = dict(
            input_ids=shard.input_ids,
            position_ids=shard.position_ids,
            cu_seq_lens_q=shard.cu_seqlens,
            cu_seq_lens_k=shard.cu_seqlens,
            max_length_q=shard.max_seqlen,
            max_length_k=shard.max_seqlen,
            **multimodal_inputs,
        )
    text_only = not any(multimodal_inputs.get(k) is not None for k in _VISION_INPUTS)
    kwargs.update(attention_mask=packed_mask_mapping(_unwrap(model)) if text_only else None, use_cache=False)
    kwargs.update({PACKED_CU_SEQLENS_KWARG: shard.cu_seqlens, ULYSSES_KWARG: context})
    try:
        result = _call(model, kwargs, return_hidden)
    finally:
        for handle in hooks:
            handle.remove()
    context.check_calls(*expected_calls)
    return result


def _gather_hidden_hook(pad_size: int, group: ProcessGroup):
    """Backbone forward hook: (1, T_pad/sp, H) local final hidden states -> (1, T, H) whole stream."""

    def hook(_module, _args, output):
        hidden = gather_outputs_and_unpad(output[0], gather_dim=1, unpad_dim=1, padding_size=pad_size, group=group)
        if isinstance(output, tuple):
            return (hidden, *output[1:])
        output.last_hidden_state = hidden
        return output

    return hook


def _whole_stream_inputs(packed: PackedBatch, sp_size: int, multimodal_inputs: dict) -> dict:
    """Model kwargs of the whole padded stream (multimodal SP); ``mm_token_type_ids`` padded as text (0)."""
    input_ids, position_ids, pad = ulysses_pad(packed.input_ids, packed.position_ids, sp_size)
    inputs = dict(multimodal_inputs, input_ids=input_ids, position_ids=position_ids)
    types = multimodal_inputs.get("mm_token_type_ids")
    if types is not None and pad:
        inputs["mm_token_type_ids"] = torch.cat([types, types.new_zeros(*types.shape[:-1], pad)], dim=-1)
    return inputs


def _language_model(backbone: nn.Module) -> nn.Module:
    language_model = getattr(backbone, "language_model", None)
    if not isinstance(language_model, nn.Module):
        raise ValueError(
            f"Ulysses SP with image/video inputs needs a multimodal backbone with a language_model; "
            f"{type(backbone).__name__} has none. Set ulysses_sequence_parallel_size=1 for this model"
        )
    return language_model


def _slice_embeds_hook(group: ProcessGroup):
    """Language-model pre-hook: keep this rank's slice of the merged embeddings and of the position ids."""

    def hook(_module, args, kwargs):
        if args or kwargs.get("inputs_embeds") is None:
            raise RuntimeError("Ulysses SP: the language model was not called with inputs_embeds= as a keyword")
        kwargs["inputs_embeds"] = slice_input_tensor(kwargs["inputs_embeds"], dim=1, padding=False, group=group)
        kwargs["position_ids"] = slice_input_tensor(kwargs["position_ids"], dim=-1, padding=False, group=group)
        return args, kwargs

    return hook


def _check_same_batch_on_sp_ranks(packed: PackedBatch, group: ProcessGroup) -> None:
    """SP ranks must hold the same micro-batch (the worker all-gathers it over the SP group); a cheap fingerprint
    (token count, sequence count, position-weighted id sum) is compared, since different batches would silently
    mix sequences of different samples."""
    ids = packed.input_ids.reshape(-1).long()
    weights = torch.arange(ids.numel(), device=ids.device) % 1009 + 1
    mine = torch.stack([ids.new_tensor(ids.numel()), ids.new_tensor(packed.cu_seqlens.numel()), (ids * weights).sum()])
    everyone = all_gather_tensor(mine[None], group)
    if not bool((everyone == mine).all()):
        raise RuntimeError(
            "Ulysses SP: the ranks of one SP group received different micro-batches "
            f"(token count, sequences + 1, checksum per rank: {everyone.tolist()}); every SP rank must hold the same "
            "packed batch (gather the data over the SP group before the forward)"
        )


def forward_padded(
    model: nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    position_ids: torch.Tensor,
    *,
    return_hidden: bool = False,
    **multimodal_inputs,
) -> torch.Tensor:
    """Run ``model`` on a padded ``(B, S)`` batch (the ``use_remove_padding=False`` path).

    ``position_ids`` are ``(B, S)`` or ``(C, B, S)`` for M-RoPE. Returns ``(B, S, V)`` logits or ``(B, S, H)``.
    """
    kwargs = dict(
        input_ids=input_ids,
        attention_mask=attention_mask,
        position_ids=position_ids.contiguous(),
        use_cache=False,
        **multimodal_inputs,
    )
    return _call(model, kwargs, return_hidden)


def _call(model: nn.Module, kwargs: dict, return_hidden: bool) -> torch.Tensor:
    if not return_hidden:
        return model(**kwargs).logits
    # Capture the backbone's output through a hook scoped to this call, and ask the LM head for no position at
    # all: calling the backbone directly would bypass an FSDP1/DDP root wrapper's forward (and its unsharding).
    backbone = _backbone(model)
    captured: list[torch.Tensor] = []
    handle = backbone.register_forward_hook(lambda _m, _a, out: captured.append(out[0]))
    try:
        model(**kwargs, logits_to_keep=torch.empty(0, dtype=torch.long, device=kwargs["input_ids"].device))
    finally:
        handle.remove()
    if len(captured) != 1:
        raise RuntimeError(
            f"forward(return_hidden=True): expected the backbone {type(backbone).__name__} to run once, "
            f"it ran {len(captured)} times"
        )
    return captured[0]


def _unwrap(model: nn.Module) -> nn.Module:
    # FSDP1 (`_fsdp_wrapped_module`) and DDP (`module`) wrappers around the HF model.
    while True:
        if isinstance(getattr(model, "_fsdp_wrapped_module", None), nn.Module):
            model = model._fsdp_wrapped_module
        elif type(model).__name__ == "DistributedDataParallel":
            model = model.module
        else:
            return model


def _backbone(model: nn.Module) -> nn.Module:
    inner = _unwrap(model)
    prefix = getattr(inner, "base_model_prefix", "")
    backbone = getattr(inner, prefix, None) if prefix else None
    if not isinstance(backbone, nn.Module):
        raise TypeError(
            f"forward(return_hidden=True) needs an HF model with a backbone attribute "
            f"(base_model_prefix); {type(inner).__name__} has none"
        )
    return backbone


def _check_packed(model: nn.Module, packed: PackedBatch) -> None:
    if packed.input_ids.dim() != 2 or packed.input_ids.shape[0] != 1:
        raise ValueError(f"forward_packed: input_ids must be (1, T), got {tuple(packed.input_ids.shape)}")
    total = packed.total_tokens
    validate_cu_seqlens(packed.cu_seqlens, total)
    _check_position_ids(packed)
    unpatched = [name for name, module in model.named_modules() if _needs_varlen_patch(module)]
    if unpatched:
        raise RuntimeError(
            f"forward_packed: {len(unpatched)} recurrent layer(s) (first: {unpatched[0]}) do not honour cu_seqlens "
            "and would leak state across packed sequences; apply the model patches first "
            "(verl.models.transformers.patch_registry.apply_patches(model, platform=...)) or set "
            f"use_remove_padding=False.{_skipped_patches(model)}"
        )


def _skipped_patches(model: nn.Module) -> str:
    from verl.models.transformers.patch_registry import get_patch_status

    reasons = [
        f" {s.name} was {s.state}: {s.reason}."
        for s in get_patch_status(_unwrap(model)).values()
        if s.state != "applied"
    ]
    return "".join(reasons)


def _needs_varlen_patch(module: nn.Module) -> bool:
    return type(module).__name__.endswith(_RECURRENT_MIXER_SUFFIXES) and not getattr(module, VARLEN_PATCHED_ATTR, False)


def _check_position_ids(packed: PackedBatch) -> None:
    pos = packed.position_ids
    total = packed.total_tokens
    if pos.dim() == 3 and pos.shape[0] == 3:
        raise ValueError(
            "forward_packed: 3-row M-RoPE position_ids disable HF's packed-sequence detection; pass 4 rows "
            "(a text row restarting at 0 per sequence, then the 3 M-RoPE rows), see "
            "verl.utils.rope_utils.get_packed_mrope_position_ids"
        )
    if pos.shape[-1] != total or pos.shape[-2] != 1 or pos.dim() not in (2, 3):
        raise ValueError(
            f"forward_packed: position_ids must be (1, T) or (C, 1, T) with T={total}, got {tuple(pos.shape)}"
        )
    # sdpa/eager attention find the segments where consecutive text positions do not step by 1: they must be
    # exactly the cu_seqlens boundaries, or attention would silently mix (or split) sequences.
    text = packed.text_position_ids[0]
    steps = torch.diff(text)
    segment_starts = torch.nonzero(steps != 1).flatten() + 1
    expected = packed.cu_seqlens[1:-1].to(device=text.device, dtype=segment_starts.dtype)
    if segment_starts.shape != expected.shape or not torch.equal(segment_starts, expected):
        raise ValueError(
            "forward_packed: position_ids do not match cu_seqlens; each sequence's (text) positions must restart "
            "(not continue by +1) at every boundary and step by exactly 1 inside a sequence. Build them with "
            f"verl.utils.packing.pack_padded_batch. Boundaries from positions: {segment_starts.tolist()[:8]}, "
            f"from cu_seqlens: {expected.tolist()[:8]}"
        )
