"""``trainer.balance_batch`` (verl/utils/seqlen_balancing.py::balance_batch, called by the trainer after generation):
the rows each data-parallel rank gets change so that their token counts balance, and the actor update of the
balanced batch equals the update of the same rows unbalanced."""

import os

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from verl.utils.fsdp_utils import create_device_mesh, get_fsdp_adapter
from verl.utils.seqlen_balancing import balance_batch
from verl.utils.testing.dist import free_port, spawn
from verl.workers.actor.dp_actor import DataParallelPPOActor
from verl.workers.config.actor import FSDPActorConfig

_FP32 = {"param_dtype": torch.float32, "reduce_dtype": torch.float32, "buffer_dtype": torch.float32}


def _skewed(make_batch, rows: int = 8):
    """rollout_batch's rows sorted longest first, so the first DP chunk holds the long sequences."""
    batch = make_batch(batch_size=rows)
    lengths = batch.batch["attention_mask"].sum(-1)
    batch.reorder(torch.argsort(lengths, descending=True, stable=True))
    return batch


def _chunk_tokens(batch, dp: int) -> list[int]:
    return [int(c.batch["attention_mask"].sum()) for c in batch.chunk(dp)]


def test_balance_batch_moves_rows_between_ranks_and_balances_tokens(make_batch):
    """rollout_batch's row i has 13 - i % 3 - i % 4 tokens: [13, 11, 9, 10, 12, 10, 11, 9], 85 in all. Sorted
    longest first (13, 12, 11, 11 | 10, 10, 9, 9) the contiguous halves hold 47 and 38 tokens; the best split of
    85 into two sets of 4 rows is 43 / 42 (e.g. 13 + 11 + 10 + 9 | 12 + 11 + 10 + 9). Balanced, the halves hold
    exactly that, every row is still there once, and rank 0's rows are a different set."""
    batch = _skewed(make_batch)
    before = batch.batch["input_ids"].clone()
    assert _chunk_tokens(batch, 2) == [47, 38]
    metrics = balance_batch(batch, 2)
    assert sorted(_chunk_tokens(batch, 2)) == [42, 43]
    assert metrics["global_seqlen/minmax_diff"] == 9 and metrics["global_seqlen/balanced_max"] == 43
    after = batch.batch["input_ids"]
    assert sorted(map(tuple, after.tolist())) == sorted(map(tuple, before.tolist()))
    assert set(map(tuple, after[:4].tolist())) != set(map(tuple, before[:4].tolist()))


def test_balance_batch_refuses_an_uneven_split(make_batch):
    with pytest.raises(ValueError, match="trainer.balance_batch: 6 rows"):
        balance_batch(make_batch(batch_size=6), 4)


def _update(rank, world_size, port, model, batch, out):
    """One PPO mini-batch per rank (its whole chunk), FSDP2 over 2 gloo ranks, SGD lr 1; rank 0 returns weights."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    try:
        adapter = get_fsdp_adapter("fsdp2")
        wrapped = adapter.wrap(model, mesh=create_device_mesh(world_size, -1), dtypes=_FP32, wrap_policy=None)
        optimizer = torch.optim.SGD(wrapped.parameters(), lr=1.0)
        rows = len(batch) // world_size
        config = FSDPActorConfig(
            strategy="fsdp2",
            ppo_mini_batch_size=rows,
            ppo_micro_batch_size_per_gpu=2,
            use_torch_compile=False,
            use_kl_loss=True,
        )
        DataParallelPPOActor(config, wrapped, optimizer).update_policy(batch.chunk(world_size)[rank])
        state = adapter.full_state_dict(wrapped)
        if rank == 0:
            out["state"] = state
    finally:
        dist.destroy_process_group()


@pytest.mark.dist
def test_balanced_update_equals_the_unbalanced_update(make_model, make_batch):
    """Same 8 rows, same model: the update after balance_batch (ranks hold 43/42 tokens) equals the update without
    it (47/38) within 1e-6 in fp32, because the loss is normalised by the global token count and FSDP sums the
    ranks' gradients; only the float summation order differs."""
    unbalanced = _skewed(make_batch)
    balanced = _skewed(make_batch)
    balance_batch(balanced, 2)
    states = []
    for batch in (unbalanced, balanced):
        out = mp.Manager().dict()
        spawn(_update, args=(2, free_port(), make_model(), batch, out), nprocs=2)
        states.append(out["state"])
    moved = max((states[0][k] - v).abs().max().item() for k, v in make_model().state_dict().items())
    assert moved > 1e-3  # the step changed the weights, so the comparison below is not between two no-ops
    for name, value in states[0].items():
        torch.testing.assert_close(states[1][name], value, rtol=0, atol=1e-6, msg=name)
