"""Padding, truncation and mask helpers (verl.utils.torch_padding, re-exported by torch_functional)."""

import pytest
import torch

from verl.utils.torch_padding import (
    SequenceTooLongError,
    _expand_mask,
    _make_causal_mask,
    expand_as_nested,
    get_unpad_data,
    pad_2d_list_to_length,
    pad_sequence_to_length,
    postprocess_data,
    prepare_decoder_attention_mask,
    remove_pad_token,
    tokenize_and_postprocess_data,
)

NEG = torch.finfo(torch.float32).min


def test_pad_2d_list_to_length():
    """[[1, 2], [3]] right-padded with 0: to the longest row (2), or to max_length 4 when that is longer."""
    assert pad_2d_list_to_length([[1, 2], [3]], 0).tolist() == [[1, 2], [3, 0]]
    assert pad_2d_list_to_length([[1, 2], [3]], 0, max_length=4).tolist() == [[1, 2, 0, 0], [3, 0, 0, 0]]
    assert pad_2d_list_to_length([[1, 2], [3]], 0, max_length=1).tolist() == [[1, 2], [3, 0]]


def test_pad_sequence_to_length():
    """[[1, 2]] to length 4 with pad 9: right [[1, 2, 9, 9]], left [[9, 9, 1, 2]]; longer input is unchanged."""
    x = torch.tensor([[1, 2]])
    assert pad_sequence_to_length(x, 4, 9).tolist() == [[1, 2, 9, 9]]
    assert pad_sequence_to_length(x, 4, 9, left_pad=True).tolist() == [[9, 9, 1, 2]]
    assert pad_sequence_to_length(x, 1, 9) is x


@pytest.mark.parametrize(
    ("truncation", "ids", "mask"),
    [
        ("left", [3, 4, 5, 6], [1, 1, 1, 1]),
        ("right", [1, 2, 3, 4], [0, 1, 1, 1]),
        ("middle", [1, 2, 5, 6], [0, 1, 1, 1]),
    ],
)
def test_postprocess_data_truncation(truncation, ids, mask):
    """ids [1..6], mask [0,1,1,1,1,1] cut to 4: left keeps the last 4, right the first 4, middle 2 + 2."""
    input_ids = torch.tensor([[1, 2, 3, 4, 5, 6]])
    attention_mask = torch.tensor([[0, 1, 1, 1, 1, 1]])
    out_ids, out_mask = postprocess_data(input_ids, attention_mask, 4, pad_token_id=0, truncation=truncation)
    assert out_ids.tolist() == [ids] and out_mask.tolist() == [mask]


def test_postprocess_data_pads_left_by_default():
    """[[7, 8]] to length 4 pads on the left with pad id 0 and mask 0."""
    ids, mask = postprocess_data(torch.tensor([[7, 8]]), torch.tensor([[1, 1]]), 4, pad_token_id=0)
    assert ids.tolist() == [[0, 0, 7, 8]] and mask.tolist() == [[0, 0, 1, 1]]


def test_postprocess_data_errors():
    """truncation='error' raises a ValueError that is also upstream's NotImplementedError; bad mode/shape raise."""
    ids = torch.ones(1, 5, dtype=torch.long)
    with pytest.raises(SequenceTooLongError, match="max_prompt_length") as info:
        postprocess_data(ids, ids, 3, pad_token_id=0)
    assert isinstance(info.value, ValueError) and isinstance(info.value, NotImplementedError)
    with pytest.raises(ValueError, match="data.truncation"):
        postprocess_data(ids, ids, 3, pad_token_id=0, truncation="drop")
    with pytest.raises(ValueError, match=r"\(B, L\)"):
        postprocess_data(ids[0], ids[0], 3, pad_token_id=0)


def test_tokenize_and_postprocess_data():
    """The tokenizer is called without special tokens; its (1, L) output is padded to max_length."""
    calls = []

    def tokenizer(prompt, return_tensors, add_special_tokens):
        calls.append((prompt, return_tensors, add_special_tokens))
        return {"input_ids": torch.tensor([[5, 6]]), "attention_mask": torch.tensor([[1, 1]])}

    ids, mask = tokenize_and_postprocess_data("hi", tokenizer, 3, pad_token_id=0)
    assert calls == [("hi", "pt", False)]
    assert ids.tolist() == [[0, 5, 6]] and mask.tolist() == [[0, 1, 1]]


def test_remove_pad_token():
    """Left-padded rows keep their real tokens: [0, 0, 7, 8] / [0, 9, 9, 9] -> [7, 8], [9, 9, 9]."""
    ids = torch.tensor([[0, 0, 7, 8], [0, 9, 9, 9]])
    mask = torch.tensor([[0, 0, 1, 1], [0, 1, 1, 1]])
    assert remove_pad_token(ids, mask) == [[7, 8], [9, 9, 9]]


def test_get_unpad_data():
    """mask [[0, 1, 1], [1, 1, 0]]: kept flat positions [1, 2, 3, 4], cu_seqlens [0, 2, 4] int32, max 2."""
    indices, cu_seqlens, max_seqlen = get_unpad_data(torch.tensor([[0, 1, 1], [1, 1, 0]]))
    assert indices.tolist() == [1, 2, 3, 4]
    assert cu_seqlens.tolist() == [0, 2, 4] and cu_seqlens.dtype == torch.int32
    assert max_seqlen == 2


def test_expand_as_nested():
    """Per-sample [2., 3.] over jagged rows of lengths 2 and 1 -> values [2, 2, 3] with the same offsets."""
    nested = torch.nested.nested_tensor([torch.zeros(2), torch.zeros(1)], layout=torch.jagged)
    out = expand_as_nested(torch.tensor([2.0, 3.0]), nested)
    assert out.values().tolist() == [2.0, 2.0, 3.0]
    assert out.offsets().tolist() == nested.offsets().tolist()
    with pytest.raises(ValueError):
        expand_as_nested(torch.tensor([2.0]), nested)
    with pytest.raises(ValueError):
        expand_as_nested(torch.tensor([2.0, 3.0]), torch.zeros(2, 3))


def test_decoder_attention_mask():
    """Causal (L=3) plus a padding mask [0, 1, 1]: column 0 is blocked in every row, and j > i is blocked."""
    causal = _make_causal_mask(torch.Size([1, 3]), torch.float32, torch.device("cpu"))
    assert causal.shape == (1, 1, 3, 3)
    assert torch.equal(causal[0, 0] == 0, torch.tensor([[1, 0, 0], [1, 1, 0], [1, 1, 1]]).bool())
    expanded = _expand_mask(torch.tensor([[0, 1, 1]]), torch.float32, tgt_len=3)
    assert torch.equal(expanded[0, 0, :, 0], torch.full((3,), NEG))
    embeds = torch.zeros(1, 3, 4)
    combined = prepare_decoder_attention_mask(torch.tensor([[0, 1, 1]]), torch.Size([1, 3]), embeds)
    allowed = combined[0, 0] == 0
    assert torch.equal(allowed, torch.tensor([[0, 0, 0], [0, 1, 0], [0, 1, 1]]).bool())
    assert prepare_decoder_attention_mask(None, torch.Size([1, 1]), embeds) is None
