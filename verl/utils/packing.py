"""The one packed ("remove padding") format that every model forward consumes (docs/design.md "The one packed format").

A padded batch ``(B, S)`` with an ``attention_mask`` is turned into a single row of ``T`` real tokens::

    padded (B=3, S=5), mask:        packed (1, T=9):
      [0 0 a a a]                     [a a a | b b | c c c c]
      [b b 0 0 0]                     cu_seqlens  = [0, 3, 5, 9]   (int32, leading 0)
      [0 c c c c]                     indices     = flat positions of the real tokens in the (B*S) layout
                                      position_ids restart at 0 for every sequence

Every consumer gets the boundaries explicitly (``cu_seqlens``): attention uses them for varlen attention and
the Qwen3.5 Gated DeltaNet layers reset their recurrent state and conv window there. ``position_ids`` are either
``(1, T)`` or ``(C, 1, T)`` (M-RoPE: ``C = 4`` rows, a text row restarting at 0 then the 3 M-RoPE rows).

Every tensor here is contiguous: packed tensors are handed to fused kernels and collectives, which reject or
silently mis-read strided inputs (field-report item 4).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = [
    "PackedBatch",
    "pack_padded_batch",
    "pack_values",
    "unpack_to_padded",
    "validate_cu_seqlens",
    "cu_seqlens_from_lengths",
    "seq_idx_from_cu_seqlens",
    "position_in_sequence",
]


@dataclass
class PackedBatch:
    """A padded batch with the padding removed.

    Attributes:
        input_ids: ``(1, T)`` token ids of all sequences, back to back.
        position_ids: ``(1, T)``, or ``(C, 1, T)`` for M-RoPE models; each sequence's (text) row restarts at 0.
        cu_seqlens: ``(B + 1,)`` int32 cumulative sequence lengths, ``cu_seqlens[0] == 0``, ``cu_seqlens[-1] == T``.
        max_seqlen: length of the longest sequence (a Python int, so kernels need no device sync).
        indices: ``(T,)`` int64 flat positions of the packed tokens in the padded ``(B * S)`` layout.
        batch_size: ``B`` of the padded layout.
        seqlen: ``S`` of the padded layout.
    """

    input_ids: torch.Tensor
    position_ids: torch.Tensor
    cu_seqlens: torch.Tensor
    max_seqlen: int
    indices: torch.Tensor
    batch_size: int
    seqlen: int

    @property
    def total_tokens(self) -> int:
        """``T``, the number of real (non-padding) tokens."""
        return int(self.input_ids.shape[-1])

    @property
    def seq_lens(self) -> torch.Tensor:
        """``(B,)`` int32 length of every sequence."""
        return self.cu_seqlens[1:] - self.cu_seqlens[:-1]

    @property
    def text_position_ids(self) -> torch.Tensor:
        """``(1, T)`` the row that restarts at 0 per sequence (row 0 of M-RoPE ids)."""
        return self.position_ids if self.position_ids.dim() == 2 else self.position_ids[0]


def validate_cu_seqlens(cu_seqlens: torch.Tensor, total_tokens: int) -> None:
    """Check that ``cu_seqlens`` describes ``total_tokens`` tokens split into non-empty sequences.

    Args:
        cu_seqlens: ``(N + 1,)`` integer tensor.
        total_tokens: ``T``, the packed length it must end at.

    Raises:
        TypeError: not an integer tensor.
        ValueError: not 1-D with at least 2 entries, not starting at 0, not strictly increasing
            (an empty sequence), or not ending at ``total_tokens``.
    """
    if not isinstance(cu_seqlens, torch.Tensor) or cu_seqlens.dtype.is_floating_point or cu_seqlens.dtype == torch.bool:
        raise TypeError(
            f"cu_seqlens must be an integer tensor (int32), got {type(cu_seqlens).__name__} "
            f"{getattr(cu_seqlens, 'dtype', '')}"
        )
    if cu_seqlens.dim() != 1 or cu_seqlens.numel() < 2:
        raise ValueError(
            f"cu_seqlens must be 1-D with at least 2 entries (leading 0, then one end per sequence), "
            f"got shape {tuple(cu_seqlens.shape)}"
        )
    values = cu_seqlens.tolist()
    if values[0] != 0:
        raise ValueError(f"cu_seqlens must start at 0, got {values[0]} (cu_seqlens={_short(values)})")
    lengths = [b - a for a, b in zip(values[:-1], values[1:])]
    if min(lengths) <= 0:
        bad = lengths.index(min(lengths))
        raise ValueError(
            f"cu_seqlens must be strictly increasing (every sequence needs >= 1 token); sequence {bad} "
            f"has length {lengths[bad]} (cu_seqlens={_short(values)})"
        )
    if values[-1] != total_tokens:
        raise ValueError(
            f"cu_seqlens must end at the packed token count {total_tokens}, got {values[-1]} "
            f"(cu_seqlens={_short(values)})"
        )


def _short(values: list[int], limit: int = 12) -> str:
    return str(values) if len(values) <= limit else f"{values[:limit]}... ({len(values)} entries)"


def cu_seqlens_from_lengths(lengths: torch.Tensor) -> torch.Tensor:
    """``(N,)`` sequence lengths -> ``(N + 1,)`` int32 cumulative lengths with a leading 0."""
    return torch.nn.functional.pad(torch.cumsum(lengths, 0, dtype=torch.int32), (1, 0)).contiguous()


def seq_idx_from_cu_seqlens(cu_seqlens: torch.Tensor, total_tokens: int) -> torch.Tensor:
    """``(T,)`` int64 index of the sequence each packed token belongs to.

    Example: cu_seqlens [0, 3, 5] -> [0, 0, 0, 1, 1].
    """
    lengths = (cu_seqlens[1:] - cu_seqlens[:-1]).long()
    ids = torch.arange(lengths.numel(), device=cu_seqlens.device)
    return torch.repeat_interleave(ids, lengths, output_size=total_tokens)


def position_in_sequence(cu_seqlens: torch.Tensor, total_tokens: int) -> torch.Tensor:
    """``(T,)`` int64 offset of every packed token from the start of its own sequence.

    Example: cu_seqlens [0, 3, 5] -> [0, 1, 2, 0, 1].
    """
    seq_idx = seq_idx_from_cu_seqlens(cu_seqlens, total_tokens)
    starts = cu_seqlens[:-1].long()[seq_idx]
    return torch.arange(total_tokens, device=cu_seqlens.device) - starts


def _check_padded_inputs(input_ids: torch.Tensor, attention_mask: torch.Tensor, position_ids) -> None:
    if input_ids.dim() != 2:
        raise ValueError(f"pack_padded_batch: input_ids must be (batch, seqlen), got shape {tuple(input_ids.shape)}")
    if attention_mask.shape != input_ids.shape:
        raise ValueError(
            f"pack_padded_batch: attention_mask shape {tuple(attention_mask.shape)} must equal "
            f"input_ids shape {tuple(input_ids.shape)}"
        )
    if position_ids is None:
        return
    if position_ids.shape[-2:] != input_ids.shape or position_ids.dim() not in (2, 3):
        raise ValueError(
            f"pack_padded_batch: position_ids must be (batch, seqlen) or (C, batch, seqlen) for "
            f"M-RoPE, got {tuple(position_ids.shape)} for input_ids {tuple(input_ids.shape)}; "
            "(batch, C, seqlen) ids must be transposed to (C, batch, seqlen) first"
        )


def pack_padded_batch(
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    position_ids: torch.Tensor | None = None,
) -> PackedBatch:
    """Remove the padding of a ``(B, S)`` batch (left, right or both sides).

    Args:
        input_ids: ``(B, S)`` token ids.
        attention_mask: ``(B, S)`` 1 for real tokens, 0 for padding; every row needs at least one real token.
        position_ids: ``(B, S)`` or ``(C, B, S)`` (M-RoPE); by default ``cumsum(mask) - 1`` per row, i.e. each
            sequence restarts at 0.

    Returns:
        The :class:`PackedBatch`; ``input_ids`` ``(1, T)``, ``position_ids`` ``(1, T)`` or ``(C, 1, T)``.
    """
    _check_padded_inputs(input_ids, attention_mask, position_ids)
    batch_size, seqlen = input_ids.shape
    mask = attention_mask.bool()
    lengths = mask.sum(-1, dtype=torch.int32)
    empty = (lengths == 0).nonzero().flatten().tolist()
    if empty:
        raise ValueError(
            f"pack_padded_batch: rows {empty[:8]} of attention_mask have no real token; every sequence "
            "needs at least one (drop empty rows before packing)"
        )
    indices = mask.flatten().nonzero().flatten()
    if position_ids is None:
        position_ids = (torch.cumsum(mask, -1) - 1).clamp(min=0)
    if position_ids.dim() == 2:
        packed_pos = position_ids.reshape(-1)[indices].unsqueeze(0)
    else:
        packed_pos = position_ids.reshape(position_ids.shape[0], -1)[:, indices].unsqueeze(1)
    return PackedBatch(
        input_ids=input_ids.reshape(-1)[indices].unsqueeze(0).contiguous(),
        position_ids=packed_pos.contiguous(),
        cu_seqlens=cu_seqlens_from_lengths(lengths),
        max_seqlen=int(lengths.max()),
        indices=indices.contiguous(),
        batch_size=batch_size,
        seqlen=seqlen,
    )


def pack_values(values: torch.Tensor, packed: PackedBatch) -> torch.Tensor:
    """Pack another per-token tensor the same way: ``(B, S, ...)`` -> ``(1, T, ...)`` (labels, temperatures, masks)."""
    if values.shape[:2] != (packed.batch_size, packed.seqlen):
        raise ValueError(
            f"pack_values: expected leading shape ({packed.batch_size}, {packed.seqlen}), got {tuple(values.shape)}"
        )
    flat = values.reshape(packed.batch_size * packed.seqlen, *values.shape[2:])
    return flat.index_select(0, packed.indices).unsqueeze(0).contiguous()


def unpack_to_padded(values: torch.Tensor, packed: PackedBatch) -> torch.Tensor:
    """Scatter packed per-token values back to the padded layout, zero at padding (differentiable).

    Args:
        values: ``(T, ...)`` or ``(1, T, ...)``.
        packed: the batch ``values`` was computed for.

    Returns:
        ``(B, S, ...)``.
    """
    total = packed.indices.numel()
    if values.dim() >= 2 and values.shape[0] == 1 and values.shape[1] == total:
        values = values[0]
    if values.shape[0] != total:
        raise ValueError(
            f"unpack_to_padded: expected {total} packed tokens on dim 0 (or dim 1 after a leading 1), "
            f"got shape {tuple(values.shape)}"
        )
    rest = tuple(values.shape[1:])
    out = values.new_zeros((packed.batch_size * packed.seqlen, *rest)).index_copy(0, packed.indices, values)
    return out.reshape(packed.batch_size, packed.seqlen, *rest)
