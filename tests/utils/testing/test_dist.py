"""The gloo rank harness (verl/utils/testing/dist.py): per-rank results, launcher environment, failures."""

import os

import pytest
import torch
import torch.distributed as dist

from verl.utils.testing.dist import RankFailedError, run_on_ranks


def _report(scale: float, *, offset: float = 0.0):
    """Each rank contributes rank+1; the all-reduced sum proves the ranks share one group."""
    rank = dist.get_rank()
    total = torch.tensor([float(rank + 1)])
    dist.all_reduce(total)
    env = {k: os.environ[k] for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "EXTRA")}
    return {"rank": rank, "sum": total * scale + offset, "env": env, "threads": torch.get_num_threads()}


def _fail_on_rank_1():
    if dist.get_rank() == 1:
        raise ValueError("rank 1 broke on purpose")
    dist.barrier()  # rank 0 blocks here until the harness ends it


@pytest.mark.dist
def test_results_come_back_per_rank_with_the_launcher_environment():
    """Invariant: run_on_ranks returns one result per rank in rank order; the ranks form one gloo group
    (all_reduce of rank+1 over 2 ranks = 1 + 2 = 3, times scale 2 plus offset 1 = 7); args/kwargs reach fn; the
    torchrun variables and the extra env are set; each rank runs on one thread."""
    results = run_on_ranks(_report, 2, args=(2.0,), kwargs={"offset": 1.0}, env={"EXTRA": "x"}, timeout_s=120)
    assert [r["rank"] for r in results] == [0, 1]
    for rank, r in enumerate(results):
        assert torch.equal(r["sum"], torch.tensor([7.0]))
        assert r["env"] == {
            "RANK": str(rank),
            "WORLD_SIZE": "2",
            "LOCAL_RANK": str(rank),
            "LOCAL_WORLD_SIZE": "2",
            "EXTRA": "x",
        }
        assert r["threads"] == 1


@pytest.mark.dist
def test_a_failing_rank_raises_with_its_traceback():
    """Invariant: an exception on one rank surfaces in the caller with that rank's traceback, even though the
    other rank is blocked in a collective (it is ended, not waited for until the group timeout)."""
    with pytest.raises(RankFailedError, match=r"(?s)rank 1 ---.*ValueError: rank 1 broke on purpose"):
        run_on_ranks(_fail_on_rank_1, 2, timeout_s=120)
