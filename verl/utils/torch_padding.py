"""Padding, truncation and mask helpers under upstream `verl_F` names (re-exported by `torch_functional`).

The packed (remove-padding) format used by the model forwards is built in `verl.utils.packing`; the helpers
here are the small upstream utilities (`get_unpad_data`, `expand_as_nested`, prompt padding/truncation).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

__all__ = [
    "SequenceTooLongError",
    "expand_as_nested",
    "get_unpad_data",
    "pad_2d_list_to_length",
    "pad_sequence_to_length",
    "postprocess_data",
    "prepare_decoder_attention_mask",
    "remove_pad_token",
    "tokenize_and_postprocess_data",
]

TRUNCATION_MODES = ("left", "right", "middle", "error")


class SequenceTooLongError(ValueError, NotImplementedError):
    """A prompt is longer than max_length with truncation='error'.

    A ValueError by this project's rules; also a NotImplementedError, which is what upstream raises here.
    """


def pad_2d_list_to_length(response: list[list[Any]], pad_token_id: Any, max_length: int | None = None) -> torch.Tensor:
    """Right-pad a list of lists to max(longest row, max_length) and return a (B, L) tensor."""
    if len(response) == 0:
        raise ValueError("pad_2d_list_to_length needs at least one row.")
    longest = max(len(row) for row in response)
    target = max_length if max_length is not None and max_length > longest else longest
    return torch.tensor([list(row) + [pad_token_id] * (target - len(row)) for row in response])


def pad_sequence_to_length(
    tensors: torch.Tensor, max_seq_len: int, pad_token_id: Any, left_pad: bool = False
) -> torch.Tensor:
    """Pad the last dim of (..., L) to max_seq_len with pad_token_id (left or right); longer inputs are unchanged."""
    missing = max_seq_len - tensors.shape[-1]
    if missing <= 0:
        return tensors
    return F.pad(tensors, (missing, 0) if left_pad else (0, missing), "constant", pad_token_id)


def _truncate(tensor: torch.Tensor, max_length: int, truncation: str) -> torch.Tensor:
    """Cut the last dim of (B, L) to max_length, keeping the right end, the left end or both halves."""
    if truncation == "left":
        return tensor[:, -max_length:]
    if truncation == "right":
        return tensor[:, :max_length]
    left = max_length // 2  # "middle": keep the first half and the last (max_length - half) tokens
    return torch.cat([tensor[:, :left], tensor[:, tensor.shape[-1] - (max_length - left) :]], dim=-1)


def postprocess_data(
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    max_length: int,
    pad_token_id: int,
    left_pad: bool = True,
    truncation: str = "error",
) -> tuple[torch.Tensor, torch.Tensor]:
    """Pad or truncate tokenizer output (B, L) to (B, max_length).

    truncation: "left" keeps the last max_length tokens, "right" the first, "middle" both ends, "error" raises
    SequenceTooLongError (a ValueError) naming the config keys to change.
    """
    if truncation not in TRUNCATION_MODES:
        raise ValueError(
            f"truncation must be one of {TRUNCATION_MODES}, got {truncation!r} (config key: data.truncation)."
        )
    if input_ids.dim() != 2 or attention_mask.shape != input_ids.shape:
        raise ValueError(
            f"input_ids and attention_mask must both be (B, L); got {tuple(input_ids.shape)} and "
            f"{tuple(attention_mask.shape)}."
        )
    length = input_ids.shape[-1]
    if length < max_length:
        input_ids = pad_sequence_to_length(input_ids, max_length, pad_token_id, left_pad=left_pad)
        attention_mask = pad_sequence_to_length(attention_mask, max_length, 0, left_pad=left_pad)
    elif length > max_length:
        if truncation == "error":
            raise SequenceTooLongError(
                f"sequence length {length} exceeds max_length {max_length}; raise data.max_prompt_length, or set "
                "data.truncation to left/right/middle, or filter long prompts (data.filter_overlong_prompts=True)."
            )
        input_ids = _truncate(input_ids, max_length, truncation)
        attention_mask = _truncate(attention_mask, max_length, truncation)
    return input_ids, attention_mask


def tokenize_and_postprocess_data(
    prompt: str,
    tokenizer: PreTrainedTokenizerBase,
    max_length: int,
    pad_token_id: int,
    left_pad: bool = True,
    truncation: str = "error",
) -> tuple[torch.Tensor, torch.Tensor]:
    """Tokenize one prompt (no special tokens) and pad/truncate it with `postprocess_data`: -> (1, max_length) x2."""
    encoded = tokenizer(prompt, return_tensors="pt", add_special_tokens=False)
    return postprocess_data(
        encoded["input_ids"], encoded["attention_mask"], max_length, pad_token_id, left_pad, truncation
    )


def remove_pad_token(input_ids: torch.Tensor, attention_mask: torch.Tensor) -> list[list[int]]:
    """Token ids of each row where attention_mask is 1: (B, L), (B, L) -> B lists (left or right padding)."""
    if input_ids.shape != attention_mask.shape:
        raise ValueError(f"input_ids {tuple(input_ids.shape)} and attention_mask {tuple(attention_mask.shape)} differ.")
    return [ids[mask.bool()].tolist() for ids, mask in zip(input_ids, attention_mask)]


def get_unpad_data(attention_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, int]:
    """attention_mask (B, S) -> (indices (nnz,) flat positions of kept tokens, cu_seqlens (B+1,) int32, max_seqlen)."""
    seqlens = attention_mask.sum(dim=-1, dtype=torch.int32)
    indices = torch.nonzero(attention_mask.flatten(), as_tuple=False).flatten()
    cu_seqlens = F.pad(torch.cumsum(seqlens, dim=0, dtype=torch.int32), (1, 0))
    max_seqlen = int(seqlens.max().item()) if seqlens.numel() else 0
    return indices, cu_seqlens, max_seqlen


def expand_as_nested(tensor: torch.Tensor, nested_tensor: torch.Tensor) -> torch.Tensor:
    """Broadcast a per-sample value (B,) over a jagged nested tensor (B, j): row b repeated len_b times.

    Used for per-sample temperatures on the packed path. Returns a jagged nested tensor with the same offsets.
    """
    if not getattr(nested_tensor, "is_nested", False) or nested_tensor.dim() != 2:
        raise ValueError("nested_tensor must be a 2-D jagged nested tensor (B, j).")
    if tensor.dim() != 1 or tensor.shape[0] != nested_tensor.shape[0]:
        raise ValueError(
            f"tensor must be (B,) with B = {nested_tensor.shape[0]} (the nested batch size), got {tuple(tensor.shape)}."
        )
    offsets = nested_tensor.offsets()
    values = torch.repeat_interleave(tensor, offsets.diff(), dim=0)
    return torch.nested.nested_tensor_from_jagged(values=values, offsets=offsets)


def _make_causal_mask(input_ids_shape: torch.Size, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """Additive causal mask (B, 1, L, L): 0 on and below the diagonal, finfo(dtype).min above."""
    bsz, tgt_len = input_ids_shape
    mask = torch.full((tgt_len, tgt_len), torch.finfo(dtype).min, device=device)
    positions = torch.arange(tgt_len, device=device)
    mask.masked_fill_(positions < (positions + 1).view(tgt_len, 1), 0)
    return mask.to(dtype)[None, None, :, :].expand(bsz, 1, tgt_len, tgt_len)


def _expand_mask(mask: torch.Tensor, dtype: torch.dtype, tgt_len: int | None = None) -> torch.Tensor:
    """Padding mask (B, S) of 1/0 -> additive (B, 1, tgt_len, S): 0 where attended, finfo(dtype).min where padded."""
    bsz, src_len = mask.size()
    tgt_len = tgt_len if tgt_len is not None else src_len
    expanded = mask[:, None, None, :].expand(bsz, 1, tgt_len, src_len).to(dtype)
    inverted = 1.0 - expanded
    return inverted.masked_fill(inverted.to(torch.bool), torch.finfo(dtype).min)


def prepare_decoder_attention_mask(
    attention_mask: torch.Tensor | None, input_shape: torch.Size, inputs_embeds: torch.Tensor
) -> torch.Tensor | None:
    """Legacy additive decoder mask (B, 1, L, L) = causal mask (if L > 1) + expanded padding mask (if given)."""
    combined = None
    if input_shape[-1] > 1:
        combined = _make_causal_mask(input_shape, inputs_embeds.dtype, device=inputs_embeds.device)
    if attention_mask is not None:
        expanded = _expand_mask(attention_mask, inputs_embeds.dtype, tgt_len=input_shape[-1]).to(inputs_embeds.device)
        combined = expanded if combined is None else expanded + combined
    return combined
