"""The spawn helpers every distributed test stands on: results come back, a failing rank is reported with its
traceback, and a rank that keeps a gloo group referenced after its work ends with exit code 0 (the abort at
interpreter exit that ``end_rank_process`` prevents was a race, about 1 run in 10 of the SP test; these tests run
that shape but cannot force the race, the 20-run loop in the changelog entry is the evidence)."""

import os
import tempfile

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from verl.utils.testing.dist import RankFailedError, run_on_ranks, spawn

_KEPT = []  # a module global holding a group past destroy_process_group: the shape that used to abort at exit


def _sum_ranks(offset: int) -> int:
    t = torch.tensor([dist.get_rank() + offset])
    group = dist.new_group([0, 1])
    _KEPT.append(group)
    dist.all_reduce(t, group=group)
    return int(t.item())


def _raise_on_rank_1() -> None:
    if dist.get_rank() == 1:
        raise ValueError("rank 1 was told to fail")


def _spawned(rank: int, init_file: str, out_dir: str, fail: bool) -> None:
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=2)
    _KEPT.append(dist.new_group([0, 1]))
    if fail and rank == 1:
        raise KeyError("spawned rank 1 failed")
    with open(os.path.join(out_dir, f"{rank}.txt"), "w") as f:
        f.write(str(rank))


@pytest.mark.dist
def test_run_on_ranks_returns_each_rank_result_and_reports_a_failing_rank():
    # ranks 0 and 1 with offset 10 contribute 10 and 11: every rank sees 21
    assert run_on_ranks(_sum_ranks, 2, args=(10,), timeout_s=120) == [21, 21]
    with pytest.raises(RankFailedError, match="rank 1 was told to fail"):
        run_on_ranks(_raise_on_rank_1, 2, timeout_s=120)


@pytest.mark.dist
def test_spawn_runs_every_rank_and_propagates_a_rank_error():
    with tempfile.TemporaryDirectory() as tmp:
        spawn(_spawned, args=(os.path.join(tmp, "init"), tmp, False), nprocs=2)
        assert sorted(f for f in os.listdir(tmp) if f.endswith(".txt")) == ["0.txt", "1.txt"]
    with tempfile.TemporaryDirectory() as tmp, pytest.raises(mp.ProcessRaisedException, match="spawned rank 1 failed"):
        spawn(_spawned, args=(os.path.join(tmp, "init"), tmp, True), nprocs=2)
