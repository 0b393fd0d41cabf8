"""Ulysses SP helpers (verl/utils/ulysses.py): group state, padding/slicing, collectives and their gradients."""

import os
import tempfile

import pytest
import torch
import torch.distributed as dist

from verl.utils import ulysses as U
from verl.utils.packing import pack_padded_batch
from verl.utils.testing.dist import spawn


def test_without_a_group_sp_is_one_and_helpers_are_identities():
    """No group installed (and no process group): world size 1, rank 0; slicing, gathering and all-to-all return
    their input unchanged."""
    assert U.get_ulysses_sequence_parallel_group() is None
    assert U.get_ulysses_sequence_parallel_world_size() == 1
    assert U.get_ulysses_sequence_parallel_rank() == 0
    x = torch.arange(6.0).reshape(1, 3, 2)
    assert U.slice_input_tensor(x, dim=1) is x
    assert U.gather_outputs_and_unpad(x, gather_dim=1, unpad_dim=1, padding_size=1) is x
    assert U.all_to_all_tensor(x, 2, 1) is x
    assert U.gather_seq_scatter_heads(x, seq_dim=1, head_dim=2) is x


def test_ulysses_pad_right_pads_ids_and_restarts_positions():
    """T = 5, sp = 4 -> pad 3: ids get pad_value, positions get 0, 1, 2 (a sequence of its own), on every M-RoPE
    row; T already a multiple -> unchanged, pad 0."""
    ids = torch.tensor([[11, 12, 13, 14, 15]])
    pos = torch.tensor([[0, 1, 2, 0, 1]])
    padded_ids, padded_pos, pad = U.ulysses_pad(ids, pos, sp_size=4, pad_value=7)
    assert pad == 3
    assert padded_ids.tolist() == [[11, 12, 13, 14, 15, 7, 7, 7]]
    assert padded_pos.tolist() == [[0, 1, 2, 0, 1, 0, 1, 2]]
    mrope = torch.stack([pos, pos + 10, pos + 20, pos + 30])  # (4, 1, 5)
    _, padded_mrope, _ = U.ulysses_pad(ids, mrope, sp_size=4)
    assert padded_mrope.shape == (4, 1, 8)
    assert padded_mrope[:, 0, 5:].tolist() == [[0, 1, 2]] * 4
    assert padded_mrope.is_contiguous()
    same_ids, same_pos, zero = U.ulysses_pad(ids, pos, sp_size=5)
    assert zero == 0 and same_ids is ids and same_pos is pos


def test_validate_ulysses_config_and_removed_alias_raise():
    """16 heads split over 4 ranks is fine; over 3 raises ValueError naming the config key; the misspelt legacy
    alias gather_outpus_and_unpad raises (as upstream)."""
    U.validate_ulysses_config(16, 4)
    with pytest.raises(ValueError, match="ulysses_sequence_parallel_size=3"):
        U.validate_ulysses_config(16, 3)
    with pytest.raises(RuntimeError, match="gather_outputs_and_unpad"):
        U.gather_outpus_and_unpad(torch.zeros(1), 0)


def test_shard_at_sp_one_is_the_packed_batch():
    """Without SP the shard is the whole packed stream: no padding, same cu_seqlens (int32)."""
    ids = torch.tensor([[0, 5, 6], [7, 8, 9]])
    mask = torch.tensor([[0, 1, 1], [1, 1, 1]])
    packed = pack_padded_batch(ids, mask)
    shard = U.shard_packed_batch(packed)
    assert (shard.sp_size, shard.sp_rank, shard.pad_size, shard.total_tokens) == (1, 0, 0, 5)
    assert shard.input_ids.tolist() == [[5, 6, 7, 8, 9]]
    assert shard.cu_seqlens.tolist() == [0, 2, 5] and shard.cu_seqlens.dtype == torch.int32


# ---- two gloo ranks -------------------------------------------------------------------------------------------


def _record_contiguity(calls: list):
    """Wrap the two collectives used by verl.utils.ulysses to record whether every tensor they get is contiguous."""
    real_a2a, real_gather = dist.all_to_all_single, dist.all_gather_single

    def a2a(output, input, *args, **kwargs):
        calls.append(("all_to_all_single", output.is_contiguous() and input.is_contiguous()))
        return real_a2a(output, input, *args, **kwargs)

    def gather(output, input, *args, **kwargs):
        calls.append(("all_gather_single", output.is_contiguous() and input.is_contiguous()))
        return real_gather(output, input, *args, **kwargs)

    dist.all_to_all_single, dist.all_gather_single = a2a, gather


def _collective_checks(rank: int, group) -> dict:
    res = {}
    # (1, seq 4, heads 2) per rank; rank r holds 100 r + 10 s + h
    x = torch.tensor([[[100 * rank + 10 * s + h for h in range(2)] for s in range(4)]], dtype=torch.float32)
    # seq -> heads: each rank receives its head h = rank for all 8 tokens (rank 0's 4 tokens, then rank 1's)
    y = U.gather_seq_scatter_heads(x, seq_dim=1, head_dim=2, group=group)
    res["seq_scatter_heads"] = y[0, :, 0].tolist()
    res["roundtrip"] = torch.equal(U.gather_heads_scatter_seq(y, head_dim=2, seq_dim=1, group=group), x)
    # unpadded_dim_size drops the padded tail of the gathered sequence: 8 -> 7 tokens
    res["unpadded_len"] = U.gather_seq_scatter_heads(x, 1, 2, unpadded_dim_size=7, group=group).shape[1]
    # gradient of sum(w * all_to_all(x)) w.r.t. x is the reverse all-to-all of w: w = y's values -> grad = x
    xg = x.clone().requires_grad_(True)
    (U.SeqAllToAll.apply(group, xg, 2, 1) * y).sum().backward()
    res["a2a_grad_is_reverse"] = torch.equal(xg.grad, x)
    # non-contiguous input (a transposed view) gives the same result as its contiguous copy
    xt = x.transpose(1, 2).contiguous().transpose(1, 2)
    res["noncontiguous_same"] = torch.equal(U.gather_seq_scatter_heads(xt, 1, 2, group=group), y)
    return res


def _gather_checks(rank: int, group) -> dict:
    res = {}
    # rank 0 holds [0, 1, 2], rank 1 holds [3, 4, 5] of a stream of 5 real tokens + 1 pad
    local = torch.arange(3.0 * rank, 3.0 * rank + 3).reshape(1, 3).requires_grad_(True)
    full = U.gather_outputs_and_unpad(local, gather_dim=1, unpad_dim=1, padding_size=1, group=group)
    res["gathered"] = full.tolist()
    # loss = sum(full * [1..5]); d/d(local) = my slice of [1, 2, 3, 4, 5, 0] times world size 2
    (full * torch.arange(1.0, 6.0)).sum().backward()
    res["gather_grad"] = local.grad.tolist()
    return res


def _slice_checks(rank: int, group) -> dict:
    res = {}
    ids = torch.tensor([[11, 12, 13, 14, 15]])
    pos = torch.tensor([[0, 1, 2, 0, 1]])
    sl_ids, sl_pos, pad = U.ulysses_pad_and_slice_inputs(ids, pos, sp_size=2, group=group)
    res["slice"] = (sl_ids.tolist(), sl_pos.tolist(), pad)
    res["slice_input"] = U.slice_input_tensor(torch.arange(5).reshape(1, 5), dim=1, group=group).tolist()
    packed = pack_padded_batch(torch.tensor([[9, 1, 2], [3, 4, 5]]), torch.tensor([[0, 1, 1], [1, 1, 1]]))
    shard = U.shard_packed_batch(packed, group)
    res["shard"] = (shard.input_ids.tolist(), shard.position_ids.tolist(), shard.cu_seqlens.tolist(), shard.pad_size)
    return res


def _sharding_manager_checks(rank: int) -> dict:
    import numpy as np
    from torch.distributed.device_mesh import init_device_mesh

    from verl.protocol import DataProto

    mesh = init_device_mesh("cpu", (1, 2), mesh_dim_names=("dp", "sp"))
    manager = U.FSDPUlyssesShardingManager(mesh)
    res = {}
    with manager:
        res["inside"] = U.get_ulysses_sequence_parallel_world_size()
        data = DataProto.from_dict(tensors={"x": torch.tensor([[rank]])}, non_tensors={"tag": np.array([f"r{rank}"])})
        data = manager.preprocess_data(data)
        res["gathered"] = (data.batch["x"].tolist(), data.non_tensor_batch["tag"].tolist())
        res["mine"] = manager.postprocess_data(data).batch["x"].tolist()
    res["outside"] = U.get_ulysses_sequence_parallel_group() is None
    return res


def _worker(rank: int, init_file: str, out_dir: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=2)
    calls: list = []
    _record_contiguity(calls)
    group = dist.new_group([0, 1])
    res = {
        "world": U.get_ulysses_sequence_parallel_world_size(group),
        "rank": U.get_ulysses_sequence_parallel_rank(group),
    }
    res.update(_collective_checks(rank, group))
    res.update(_gather_checks(rank, group))
    res.update(_slice_checks(rank, group))
    U.set_ulysses_sequence_parallel_group(group)  # the installed group is the default of every helper
    res["installed_world"] = U.get_ulysses_sequence_parallel_world_size()
    U.set_ulysses_sequence_parallel_group(None)
    res["calls"] = list(calls)
    res["manager"] = _sharding_manager_checks(rank)
    torch.save(res, os.path.join(out_dir, f"{rank}.pt"))
    dist.destroy_process_group()


@pytest.mark.dist
def test_collectives_padding_and_gradients_on_two_ranks():
    """On two gloo ranks: all-to-all swaps sequence and head splits (hand-computed values) and its inverse restores
    the input; its gradient is the reverse all-to-all; the all-gather's gradient is this rank's slice times SP;
    ids/positions are padded then sliced per rank; the packed shard carries the padding as an extra cu_seqlens
    segment; every tensor handed to a collective is contiguous, even for strided inputs (field-report item 4); the
    sharding manager installs the mesh's SP group only inside its context."""
    with tempfile.TemporaryDirectory() as tmp:
        spawn(_worker, args=(os.path.join(tmp, "init"), tmp), nprocs=2)
        results = [torch.load(os.path.join(tmp, f"{rank}.pt")) for rank in range(2)]
    for rank, res in enumerate(results):
        assert (res["world"], res["rank"], res["installed_world"]) == (2, rank, 2)
        # head `rank` of tokens 0..3 of rank 0 (10 s + rank), then of rank 1 (100 + 10 s + rank)
        assert res["seq_scatter_heads"] == [10 * s + rank for s in range(4)] + [100 + 10 * s + rank for s in range(4)]
        assert res["roundtrip"] and res["a2a_grad_is_reverse"] and res["noncontiguous_same"]
        assert res["unpadded_len"] == 7
        assert res["gathered"] == [[0.0, 1.0, 2.0, 3.0, 4.0]]
        # weights [1, 2, 3, 4, 5, 0(pad)] -> rank 0: 2 * [1, 2, 3]; rank 1: 2 * [4, 5, 0]
        assert res["gather_grad"] == ([[2.0, 4.0, 6.0]] if rank == 0 else [[8.0, 10.0, 0.0]])
        # T = 5 padded to 6 (id 0, position 0): rank 0 gets tokens 0-2, rank 1 tokens 3-5
        expected_slice = ([[11, 12, 13]], [[0, 1, 2]], 1) if rank == 0 else ([[14, 15, 0]], [[0, 1, 0]], 1)
        assert res["slice"] == expected_slice
        assert res["slice_input"] == ([[0, 1, 2]] if rank == 0 else [[3, 4, 0]])
        # packed [1 2 | 3 4 5] + pad -> cu_seqlens [0, 2, 5, 6]
        shard_ids, shard_pos = ([[1, 2, 3]], [[0, 1, 0]]) if rank == 0 else ([[4, 5, 0]], [[1, 2, 0]])
        assert res["shard"] == (shard_ids, shard_pos, [0, 2, 5, 6], 1)
        assert res["calls"] and all(ok for _, ok in res["calls"]), res["calls"]
        assert {name for name, _ in res["calls"]} == {"all_to_all_single", "all_gather_single"}
        # the sharding manager installs the mesh's "sp" group only inside `with`; pre/post-process gather and split
        manager = res["manager"]
        assert manager["inside"] == 2 and manager["outside"]
        assert manager["gathered"] == ([[0], [1]], ["r0", "r1"])
        assert manager["mine"] == [[rank]]
