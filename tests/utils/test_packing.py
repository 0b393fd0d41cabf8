"""Tests for the one packed format (verl/utils/packing.py)."""

import pytest
import torch

from verl.utils.packing import (
    PackedBatch,
    cu_seqlens_from_lengths,
    pack_padded_batch,
    pack_values,
    position_in_sequence,
    seq_idx_from_cu_seqlens,
    unpack_to_padded,
    validate_cu_seqlens,
)


def _example():
    # Row 0 left-padded (3 tokens), row 1 right-padded (2 tokens), row 2 both sides (3 tokens).
    input_ids = torch.tensor([[0, 0, 11, 12, 13], [21, 22, 0, 0, 0], [0, 31, 32, 33, 0]])
    mask = torch.tensor([[0, 0, 1, 1, 1], [1, 1, 0, 0, 0], [0, 1, 1, 1, 0]])
    return input_ids, mask


def test_pack_padded_batch_by_hand():
    """Packing keeps real tokens in row order; cu_seqlens are the running lengths; positions restart at 0."""
    input_ids, mask = _example()
    packed = pack_padded_batch(input_ids, mask)
    assert packed.input_ids.tolist() == [[11, 12, 13, 21, 22, 31, 32, 33]]
    # lengths 3, 2, 3 -> cumulative 0, 3, 5, 8
    assert packed.cu_seqlens.tolist() == [0, 3, 5, 8]
    assert packed.cu_seqlens.dtype == torch.int32
    assert packed.max_seqlen == 3
    # flat positions in the 3 x 5 layout: row 0 cols 2-4 -> 2,3,4; row 1 cols 0-1 -> 5,6; row 2 cols 1-3 -> 11,12,13
    assert packed.indices.tolist() == [2, 3, 4, 5, 6, 11, 12, 13]
    assert packed.position_ids.tolist() == [[0, 1, 2, 0, 1, 0, 1, 2]]
    assert (packed.batch_size, packed.seqlen, packed.total_tokens) == (3, 5, 8)
    assert packed.seq_lens.tolist() == [3, 2, 3]


def test_pack_uses_given_position_ids_and_mrope_rows():
    """Given (C, B, S) M-RoPE ids are packed row by row into (C, 1, T) with the same token selection."""
    input_ids, mask = _example()
    pos = torch.arange(4 * 3 * 5).reshape(4, 3, 5)
    packed = pack_padded_batch(input_ids, mask, pos)
    assert packed.position_ids.shape == (4, 1, 8)
    for c in range(4):
        assert packed.position_ids[c, 0].tolist() == pos[c].flatten()[packed.indices].tolist()
    assert packed.text_position_ids.shape == (1, 8)


def test_packed_tensors_are_contiguous_even_from_strided_inputs():
    """Invariant (not a regression test): pack_padded_batch's outputs are contiguous even from a transposed
    (B, C, S) -> (C, B, S) position-id view, because the token selection is advanced indexing, which copies. The
    field-report item 4 regression tests are in tests/models/transformers/test_packed_forward.py, where strided
    tensors can reach the model."""
    input_ids, mask = _example()
    pos_bcs = torch.arange(3 * 4 * 5).reshape(3, 4, 5)
    pos = pos_bcs.transpose(0, 1)  # (C, B, S) view, not contiguous
    assert not pos.is_contiguous()
    packed = pack_padded_batch(input_ids.t().contiguous().t(), mask, pos)
    for name in ("input_ids", "position_ids", "cu_seqlens", "indices"):
        assert getattr(packed, name).is_contiguous(), name
    assert pack_values(input_ids.t().contiguous().t(), packed).is_contiguous()


def test_unpack_roundtrip_and_zero_padding():
    """unpack_to_padded inverts packing on real tokens and writes zeros at padding, for (T,...) and (1,T,...)."""
    input_ids, mask = _example()
    packed = pack_padded_batch(input_ids, mask)
    values = torch.arange(1.0, 9.0).unsqueeze(-1).repeat(1, 2)  # (T=8, 2)
    padded = unpack_to_padded(values, packed)
    assert padded.shape == (3, 5, 2)
    assert padded[..., 0].tolist() == [[0, 0, 1, 2, 3], [4, 5, 0, 0, 0], [0, 6, 7, 8, 0]]
    assert torch.equal(unpack_to_padded(values.unsqueeze(0), packed), padded)
    assert torch.equal(unpack_to_padded(pack_values(input_ids, packed), packed), input_ids * mask)


def test_unpack_is_differentiable():
    """Gradients flow from the padded layout back to the packed values (1 at real tokens; padding gets none)."""
    input_ids, mask = _example()
    packed = pack_padded_batch(input_ids, mask)
    values = torch.zeros(8, requires_grad=True)
    unpack_to_padded(values, packed).sum().backward()
    assert values.grad.tolist() == [1.0] * 8


def test_seq_idx_and_position_in_sequence():
    """cu_seqlens [0, 3, 5, 8] -> sequence ids 0,0,0,1,1,2,2,2 and offsets 0,1,2,0,1,0,1,2."""
    cu = cu_seqlens_from_lengths(torch.tensor([3, 2, 3]))
    assert cu.tolist() == [0, 3, 5, 8]
    assert seq_idx_from_cu_seqlens(cu, 8).tolist() == [0, 0, 0, 1, 1, 2, 2, 2]
    assert position_in_sequence(cu, 8).tolist() == [0, 1, 2, 0, 1, 0, 1, 2]


@pytest.mark.parametrize(
    "cu, total, match",
    [
        ([1, 3, 5], 5, "start at 0"),
        ([0, 3, 3, 5], 5, "strictly increasing"),
        ([0, 4, 2, 5], 5, "strictly increasing"),
        ([0, 3, 5], 6, "end at the packed token count 6"),
        ([0], 0, "at least 2 entries"),
    ],
)
def test_validate_cu_seqlens_rejects_bad_boundaries(cu, total, match):
    """Bad cu_seqlens (not starting at 0, not increasing, wrong end) raise ValueError naming the problem."""
    with pytest.raises(ValueError, match=match):
        validate_cu_seqlens(torch.tensor(cu, dtype=torch.int32), total)


def test_validate_cu_seqlens_accepts_good_and_rejects_float():
    """A valid int32 cu_seqlens passes; a float tensor is a TypeError."""
    validate_cu_seqlens(torch.tensor([0, 1, 5], dtype=torch.int32), 5)
    with pytest.raises(TypeError, match="integer"):
        validate_cu_seqlens(torch.tensor([0.0, 5.0]), 5)


def test_pack_rejects_empty_rows_and_bad_shapes():
    """A row without tokens and mismatched shapes are user errors with a message naming the row/shape."""
    input_ids, mask = _example()
    mask = mask.clone()
    mask[1] = 0
    with pytest.raises(ValueError, match=r"rows \[1\]"):
        pack_padded_batch(input_ids, mask)
    with pytest.raises(ValueError, match="attention_mask shape"):
        pack_padded_batch(input_ids, mask[:, :4])
    with pytest.raises(ValueError, match="transposed"):
        pack_padded_batch(input_ids, torch.ones_like(input_ids), torch.zeros(3, 4, 5, dtype=torch.long))


def test_packed_batch_is_a_plain_dataclass():
    """PackedBatch carries exactly the contract's fields (others construct it directly, e.g. from nested tensors)."""
    fields = set(PackedBatch.__dataclass_fields__)
    assert fields == {"input_ids", "position_ids", "cu_seqlens", "max_seqlen", "indices", "batch_size", "seqlen"}
