"""Mini-batches, micro-batches and global counts (verl/workers/core/micro_batching.py)."""

import pytest
import torch

from verl.protocol import DataProto
from verl.workers.core.micro_batching import global_batch_info, iter_mini_batches, restore_order, split_micro_batches


def _data(lengths: list[int]) -> DataProto:
    mask = torch.zeros(len(lengths), max(lengths), dtype=torch.long)
    for i, n in enumerate(lengths):
        mask[i, :n] = 1
    row = torch.arange(len(lengths)).unsqueeze(-1).float()
    return DataProto.from_dict(tensors={"attention_mask": mask, "response_mask": mask.float(), "row": row})


def test_global_batch_info_counts_tokens_and_non_empty_sequences():
    """Lengths 3, 0, 2: 5 valid tokens, 2 sequences with at least one token; one rank (no process group)."""
    info = global_batch_info(_data([3, 0, 2]).batch["response_mask"])
    assert info.as_kwargs() == {"dp_size": 1, "batch_num_tokens": 5, "global_batch_size": 2}


def test_fixed_count_split_keeps_the_order():
    data = _data([1, 2, 3, 4])
    micro, indices = split_micro_batches(data, micro_batch_size=2, use_dynamic_bsz=False, max_token_len=None)
    assert indices is None and [m.batch["row"][:, 0].tolist() for m in micro] == [[0.0, 1.0], [2.0, 3.0]]


def test_dynamic_split_respects_the_budget_and_restores_the_order():
    """Lengths 4, 1, 3, 2 with a budget of 4 tokens: every micro-batch holds <= 4 tokens (at least 10 / 4 -> 3
    micro-batches); restore_order puts the concatenated rows back as 0, 1, 2, 3."""
    data = _data([4, 1, 3, 2])
    micro, indices = split_micro_batches(data, micro_batch_size=None, use_dynamic_bsz=True, max_token_len=4)
    assert len(micro) >= 3 and all(int(m.batch["attention_mask"].sum()) <= 4 for m in micro)
    rows = restore_order(torch.cat([m.batch["row"] for m in micro]), indices)
    assert rows[:, 0].tolist() == [0.0, 1.0, 2.0, 3.0]


def test_missing_sizes_name_the_key():
    with pytest.raises(ValueError, match="log_prob_micro_batch_size_per_gpu is not set"):
        split_micro_batches(
            _data([1]),
            micro_batch_size=None,
            use_dynamic_bsz=False,
            max_token_len=None,
            micro_batch_key="log_prob_micro_batch_size_per_gpu",
        )
    with pytest.raises(ValueError, match="positive token budget"):
        split_micro_batches(_data([1]), micro_batch_size=None, use_dynamic_bsz=True, max_token_len=0)


def test_mini_batches_per_epoch():
    """4 rows, mini-batch 2, 2 epochs without shuffle: (0, [0, 1]), (0, [2, 3]), (1, [0, 1]), (1, [2, 3])."""
    seen = [(e, m.batch["row"][:, 0].tolist()) for e, m in iter_mini_batches(_data([1, 1, 1, 1]), 2, 2)]
    assert seen == [(0, [0.0, 1.0]), (0, [2.0, 3.0]), (1, [0.0, 1.0]), (1, [2.0, 3.0])]
