"""VeOmni's own Ulysses sequence parallelism (``veomni.ulysses_parallel_size > 1``) around the shared core's forward.

VeOmni's patched models do the Ulysses all-to-all inside their attention and Gated DeltaNet layers (heads split
over VeOmni's ``ulysses`` group, read from its global ``ParallelState``). They expect every SP rank to be fed what
VeOmni's ``veomni.data.data_collator.SequenceParallelCollator`` makes of a packed row:

* the stream right-padded to a multiple of SP (token 0, position 0: the padding is a sequence of its own);
* ``cu_seq_lens_q/k``, ``max_length_q/k`` and ``linear_attn_cu_seq_lens_q`` of the *whole* padded stream (computed
  from the full position ids, before slicing);
* this rank's contiguous ``T_pad / sp`` slice of ``input_ids`` and ``position_ids``.

Their output is this rank's slice; VeOmni's trainers gather it with
``veomni.distributed.sequence_parallel.gather_outputs``.

The shared core calls the model with the whole packed stream on every SP rank (``forward_packed``, one micro-batch
per SP group). :func:`veomni_sequence_parallel` scopes two hooks to the core's call: a pre-hook on the root module
that rewrites the whole-stream kwargs through VeOmni's collator, and a forward hook on the backbone that gathers the
final hidden states with VeOmni's ``gather_outputs`` (unpadded). The LM head and the core's log-prob maths then see
the whole stream on every SP rank, exactly as at SP 1. ``gather_outputs``' backward sums the SP ranks' (identical)
full-stream gradients and keeps this rank's slice, i.e. SP × its share; FSDP2's mean over VeOmni's
``dp_shard_sp`` mesh (all ``dp × sp`` ranks) then gives the dp-mean gradient, the convention of the FSDP engine's
own Ulysses (``verl.models.transformers.packed_forward``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Generator
from typing import Any

import torch
import torch.nn as nn

from verl.models.transformers.packed_forward import PACKED_CU_SEQLENS_KWARG

__all__ = ["shard_packed_kwargs", "veomni_sequence_parallel"]

# the core's whole-stream boundary kwargs; VeOmni's collator recomputes them for the padded stream
_CORE_BOUNDARY_KWARGS = (PACKED_CU_SEQLENS_KWARG, "cu_seq_lens_q", "cu_seq_lens_k", "max_length_q", "max_length_k")
_VISION_INPUTS = ("pixel_values", "pixel_values_videos")
_KEY = "actor_rollout_ref.actor.veomni.ulysses_parallel_size"


def shard_packed_kwargs(kwargs: dict[str, Any], collator: Callable[[dict], dict]) -> tuple[dict[str, Any], int]:
    """The model kwargs of this SP rank from the core's whole-stream kwargs; also the stream's token count ``T``.

    ``collator`` is VeOmni's ``SequenceParallelCollator`` (``seq_classification=True``: there are no labels to
    shift). Position ids: the core's ``(1, T)`` or M-RoPE ``(C, 1, T)``; VeOmni's collator takes ``(1, C, T)`` (its
    text row first), so the 3-D form is transposed there and back.
    """
    if any(kwargs.get(name) is not None for name in _VISION_INPUTS):
        raise ValueError(
            f"{_KEY} > 1 with image/video inputs is not wired to VeOmni's vision sharding here; set it to 1 for "
            "multimodal data, or use strategy=fsdp2 with ulysses_sequence_parallel_size"
        )
    input_ids, position_ids = kwargs["input_ids"], kwargs["position_ids"]
    mrope = position_ids.dim() == 3
    batch = collator({"input_ids": input_ids, "position_ids": position_ids.transpose(0, 1) if mrope else position_ids})
    if mrope:
        batch["position_ids"] = batch["position_ids"].transpose(0, 1)
    kept = {k: v for k, v in kwargs.items() if k not in _CORE_BOUNDARY_KWARGS and k not in batch}
    # the core's packed mask mapping describes the whole stream; VeOmni's SP attention takes the boundaries only
    kept["attention_mask"] = None
    return {**kept, **batch}, int(input_ids.shape[-1])


def _backbone(model: nn.Module) -> nn.Module:
    backbone = getattr(model, getattr(model, "base_model_prefix", ""), None)
    if not isinstance(backbone, nn.Module):
        raise TypeError(f"{_KEY} > 1 needs an HF model with a backbone (base_model_prefix); {type(model).__name__}")
    return backbone


@contextlib.contextmanager
def veomni_sequence_parallel(
    model: nn.Module, *, collator: Callable[[dict], dict], gather_outputs: Callable[..., torch.Tensor], group: Any
) -> Generator[None, None, None]:
    """Within the block, a whole-stream call of ``model`` runs VeOmni's Ulysses SP (module docstring)."""
    tokens: list[int] = []

    def shard(_module, args, kwargs):
        if args:
            raise RuntimeError(f"{_KEY} > 1: the model must be called with keyword arguments only (the core does)")
        sharded, total = shard_packed_kwargs(kwargs, collator)
        tokens.append(total)
        return (), sharded

    def gather(_module, _args, output):
        hidden = output[0] if isinstance(output, tuple) else output.last_hidden_state
        full = gather_outputs(hidden, gather_dim=1, padding_dim=1, unpad_dim_size=tokens[-1], group=group)
        if isinstance(output, tuple):
            return (full, *output[1:])
        output.last_hidden_state = full
        return output

    handles = [
        model.register_forward_pre_hook(shard, with_kwargs=True),
        _backbone(model).register_forward_hook(gather, prepend=True),
    ]
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()
