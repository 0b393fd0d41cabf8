"""DataParallelPPOActor on 2 gloo ranks (FSDP1 and FSDP2) equals the single-process update."""

import copy
import os
import socket

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.distributed.device_mesh import init_device_mesh

from verl.utils.fsdp_utils import create_device_mesh, get_fsdp_adapter
from verl.utils.testing.dist import spawn
from verl.workers.actor.dp_actor import DataParallelPPOActor
from verl.workers.config.actor import FSDPActorConfig

_FP32 = {"param_dtype": torch.float32, "reduce_dtype": torch.float32, "buffer_dtype": torch.float32}


def _config(strategy: str, **overrides) -> FSDPActorConfig:
    base = dict(strategy=strategy, ppo_micro_batch_size_per_gpu=2, use_torch_compile=False, use_kl_loss=True)
    base.update(overrides)
    return FSDPActorConfig(**base)


def _worker(rank, world_size, port, strategy, dynamic, sp, model, batch, out):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    try:
        adapter = get_fsdp_adapter(strategy)
        wrapped = adapter.wrap(model, mesh=create_device_mesh(world_size, -1), dtypes=_FP32, wrap_policy=None)
        optimizer = torch.optim.SGD(wrapped.parameters(), lr=1.0)
        groups = {}
        if sp > 1:
            # one SP group of both ranks (dp = 1): both hold all 8 rows, the packed stream is split between them
            sp_mesh = init_device_mesh("cpu", (world_size // sp, sp), mesh_dim_names=("dp", "sp"))
            groups = {"dp_group": sp_mesh["dp"].get_group(), "ulysses_group": sp_mesh["sp"].get_group()}
            shard, rows = batch, 8
        else:
            # every rank holds half the rows; sizes are per rank (4 = 8 global rows / 2 ranks)
            shard, rows = batch.chunk(world_size)[rank], 4
        config = _config(
            strategy,
            ppo_mini_batch_size=rows,
            use_dynamic_bsz=dynamic,
            ppo_max_token_len_per_gpu=30,
            ulysses_sequence_parallel_size=sp,
        )
        metrics = DataParallelPPOActor(config, wrapped, optimizer, **groups).update_policy(shard)
        state = adapter.full_state_dict(wrapped)
        if rank == 0:
            out["state"] = state
            out["grad_norm"] = metrics["actor/grad_norm"][0]
    finally:
        dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.dist
@pytest.mark.parametrize(
    "strategy,dynamic,sp",
    [("fsdp", False, 1), ("fsdp2", True, 1), ("fsdp2", False, 2)],
)
def test_two_rank_update_equals_single_process(make_model, make_batch, strategy, dynamic, sp):
    """Invariant (FSDP = single process): one PPO mini-batch of 8 rows with KL loss, split over 2 ranks (fixed-size
    micro-batches with FSDP1, token-budget micro-batches with FSDP2; the ranks then agree on the micro-batch count
    and hold different token counts; or Ulysses SP 2 over both ranks with the whole batch on each), gives the same grad norm and weights after an
    SGD step (lr 1, fp32: 1e-5) as one process on all 8 rows, because losses are normalised by the global token
    count and FSDP averages gradients over ranks."""
    model, batch = make_model(), make_batch(batch_size=8)
    reference = copy.deepcopy(model)
    optimizer = torch.optim.SGD(reference.parameters(), lr=1.0)
    ref_metrics = DataParallelPPOActor(_config(strategy, ppo_mini_batch_size=8), reference, optimizer).update_policy(
        batch
    )
    out = mp.Manager().dict()
    spawn(_worker, args=(2, _free_port(), strategy, dynamic, sp, model, batch, out), nprocs=2)
    assert out["grad_norm"] == pytest.approx(ref_metrics["actor/grad_norm"][0], rel=1e-5)
    for name, value in reference.state_dict().items():
        torch.testing.assert_close(out["state"][name], value, rtol=0, atol=1e-5, msg=name)
