"""Balanced partitions and dynamic micro-batches (verl.utils.seqlen_balancing)."""

import os
import random
import tempfile

import numpy as np
import pytest
import torch
import torch.distributed as dist
from tensordict import TensorDict

from verl.protocol import DataProto
from verl.utils.seqlen_balancing import (
    calculate_workload,
    ceildiv,
    get_reverse_idx,
    get_seqlen_balanced_partitions,
    karmarkar_karp,
    log_seqlen_unbalance,
    prepare_dynamic_batch,
    rearrange_micro_batches,
    restore_dynamic_batch,
    roundup_divisible,
)
from verl.utils.testing.dist import spawn


def _batch(lengths, seqlen=12):
    """TensorDict of right-padded rows: attention_mask with `lengths` ones; row_id identifies each row."""
    mask = torch.zeros(len(lengths), seqlen, dtype=torch.long)
    for row, length in enumerate(lengths):
        mask[row, :length] = 1
    rows = torch.arange(len(lengths))
    return TensorDict({"attention_mask": mask, "row_id": rows}, batch_size=[len(lengths)])


def _token_sums(micro_batches):
    return [int(mb["attention_mask"].sum()) for mb in micro_batches]


def test_integer_helpers():
    """ceildiv(7, 3) = 3, ceildiv(6, 3) = 2; roundup_divisible(7, 4) = 8, (8, 4) = 8; workload(2) = 24576*2 + 4."""
    assert (ceildiv(7, 3), ceildiv(6, 3), roundup_divisible(7, 4), roundup_divisible(8, 4)) == (3, 2, 8, 8)
    assert calculate_workload(torch.tensor([2, 10])).tolist() == [49156, 245860]


def test_karmarkar_karp_hand_worked():
    """[8, 7, 6, 5, 4] into 2: differencing 8-7 -> 1, 6-5 -> 1, 4-1 -> 3, 3-1 -> 2, so sums 16 / 14;
    [1..6] into 2 equal-size sets: pairs (6,5), (4,3), (2,1) merged large-with-small -> sums 11 / 10."""
    sums = sorted(sum([8, 7, 6, 5, 4][i] for i in p) for p in karmarkar_karp([8, 7, 6, 5, 4], 2, equal_size=False))
    assert sums == [14, 16]
    equal = karmarkar_karp([1, 2, 3, 4, 5, 6], 2, equal_size=True)
    assert sorted(len(p) for p in equal) == [3, 3]
    assert sorted(sum(i + 1 for i in p) for p in equal) == [10, 11]


def test_balanced_partitions_are_complete_sorted_and_balanced():
    """Over 200 random cases: partitions cover every index once, are sorted and non-empty, have equal sizes when
    asked, and the largest minus smallest sum never exceeds the largest item (the differencing bound)."""
    for seed in range(200):
        rng = random.Random(seed)
        n = rng.randint(4, 40)
        k = rng.randint(1, min(8, n))
        values = [rng.randint(1, 4096) for _ in range(n)]
        for equal_size in (False, True):
            if equal_size and n % k:
                continue
            parts = get_seqlen_balanced_partitions(values, k, equal_size)
            assert sorted(i for p in parts for i in p) == list(range(n))
            assert all(p == sorted(p) and p for p in parts)
            if equal_size:
                assert {len(p) for p in parts} == {n // k}
            sums = [sum(values[i] for i in p) for p in parts]
            assert max(sums) - min(sums) <= max(values)


def test_partition_argument_errors():
    """Fewer items than partitions, or equal_size with a non-divisible count, raise ValueError."""
    with pytest.raises(ValueError, match="non-empty"):
        get_seqlen_balanced_partitions([1, 2], 3, equal_size=False)
    with pytest.raises(ValueError, match="divisible"):
        get_seqlen_balanced_partitions([1, 2, 3], 2, equal_size=True)


def test_log_seqlen_unbalance():
    """[1, 9, 5, 5] in contiguous halves sums 10 / 10 -> diff 0; partitions {0, 1}, {2, 3} -> balanced 10 / 10."""
    metrics = log_seqlen_unbalance([1, 9, 5, 5], [[0, 1], [2, 3]], prefix="bal")
    assert metrics == {
        "bal/min": 10,
        "bal/max": 10,
        "bal/minmax_diff": 0,
        "bal/balanced_min": 10,
        "bal/balanced_max": 10,
        "bal/mean": 10.0,
    }


def test_rearrange_respects_budget_and_restores_order():
    """Lengths [5, 3, 8, 2, 6, 4] (28 tokens), budget 10 -> ceil(28/10) = 3 micro-batches, each <= 10 tokens,
    together every row exactly once; restore_dynamic_batch puts per-row outputs back in the original order."""
    batch = _batch([5, 3, 8, 2, 6, 4])
    micro_batches, indices = rearrange_micro_batches(batch, max_token_len=10)
    assert len(micro_batches) == 3
    assert all(total <= 10 for total in _token_sums(micro_batches))
    assert sorted(i for idx in indices for i in idx) == list(range(6))
    for mb, idx in zip(micro_batches, indices):
        assert mb["row_id"].tolist() == idx
    outputs = torch.cat([mb["row_id"] * 10 for mb in micro_batches])
    assert restore_dynamic_batch(outputs, indices).tolist() == [0, 10, 20, 30, 40, 50]


def test_rearrange_adds_micro_batches_until_budget_fits():
    """[6, 6, 6] with budget 10: ceil(18/10) = 2 micro-batches would put 12 tokens in one, so 3 are used."""
    micro_batches, _ = rearrange_micro_batches(_batch([6, 6, 6]), max_token_len=10)
    assert _token_sums(micro_batches) == [6, 6, 6]


def test_rearrange_sequence_longer_than_budget_raises():
    """A single sequence above max_token_len raises ValueError naming ppo_max_token_len_per_gpu."""
    with pytest.raises(ValueError, match="ppo_max_token_len_per_gpu"):
        rearrange_micro_batches(_batch([3, 11]), max_token_len=10)


def test_min_count_and_divisibility():
    """Budget 100 fits all 6 rows in 1 micro-batch; min_num_micro_batch=2 gives 2, num_batches_divided_by=4 gives
    4; asking for more micro-batches than rows raises ValueError."""
    batch = _batch([5, 3, 8, 2, 6, 4])
    assert len(rearrange_micro_batches(batch, 100)[0]) == 1
    assert len(rearrange_micro_batches(batch, 100, min_num_micro_batch=2)[0]) == 2
    assert len(rearrange_micro_batches(batch, 100, num_batches_divided_by=4)[0]) == 4
    with pytest.raises(ValueError, match="only 6 sequences"):
        rearrange_micro_batches(batch, 100, min_num_micro_batch=7)


def test_pipeline_order_puts_light_micro_batches_at_the_ends():
    """Loads sorted descending a > b > c > d are ordered [c, a, b, d]: the heaviest is not first or last."""
    batch = _batch([12, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 10, 6, 9], seqlen=12)
    micro_batches, _ = rearrange_micro_batches(batch, max_token_len=12, min_num_micro_batch=4)
    loads = [int(calculate_workload(mb["attention_mask"].sum(1)).sum()) for mb in micro_batches]
    by_load = sorted(loads, reverse=True)
    assert len(loads) == 4 and loads == [by_load[2], by_load[0], by_load[1], by_load[3]]
    unordered, _ = rearrange_micro_batches(
        batch, max_token_len=12, min_num_micro_batch=4, use_dynamic_bsz_balance=False
    )
    assert sorted(_token_sums(unordered)) == sorted(_token_sums(micro_batches))


def test_nested_input_ids_lengths():
    """With a jagged nested input_ids the lengths come from its offsets (no attention_mask needed)."""
    ids = torch.nested.nested_tensor([torch.arange(n) for n in (4, 7, 2)], layout=torch.jagged)
    batch = TensorDict({"input_ids": ids}, batch_size=[3])
    _, indices = rearrange_micro_batches(batch, max_token_len=7)
    assert sorted(map(sorted, indices)) == [[0, 2], [1]]


def test_dataproto_micro_batches():
    """prepare_dynamic_batch on a DataProto returns DataProtos whose tensors and non-tensors follow the indices."""
    batch = _batch([5, 3, 8, 2])
    data = DataProto(batch=batch, non_tensor_batch={"uid": np.array(list("abcd"), dtype=object)}, meta_info={"t": 1})
    micro_batches, indices = prepare_dynamic_batch(data, max_token_len=9)
    for mb, idx in zip(micro_batches, indices):
        assert isinstance(mb, DataProto) and mb.meta_info == {"t": 1}
        assert mb.batch["row_id"].tolist() == idx
        assert mb.non_tensor_batch["uid"].tolist() == [list("abcd")[i] for i in idx]
    with pytest.raises(TypeError):
        prepare_dynamic_batch(batch, max_token_len=9)


def test_reverse_idx():
    """Inverse permutation: [2, 0, 1] -> [1, 2, 0]."""
    assert get_reverse_idx([2, 0, 1]) == [1, 2, 0]


def _dp_worker(rank, init_file, result_file):
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=2)
    lengths = [2, 2, 2, 2] if rank == 0 else [9, 9, 8, 2]
    micro_batches, _ = rearrange_micro_batches(_batch(lengths), max_token_len=10)
    torch.save(len(micro_batches), f"{result_file}.{rank}")
    dist.destroy_process_group()


@pytest.mark.dist
def test_same_micro_num_in_dp():
    """Two gloo ranks agree on the micro-batch count: rank 0 alone needs 1 (8 tokens), rank 1 needs 3
    ({9}, {9}, {8, 2} for a budget of 10) -> both use 3."""
    with tempfile.TemporaryDirectory() as tmp:
        result = os.path.join(tmp, "count")
        spawn(_dp_worker, args=(os.path.join(tmp, "init"), result), nprocs=2)
        assert [torch.load(f"{result}.{rank}") for rank in range(2)] == [3, 3]
