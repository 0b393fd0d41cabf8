"""HFRollout on an FSDP1 / FSDP2-wrapped actor (2 gloo ranks) generates what the plain model generates."""

import os
import socket

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from tensordict import TensorDict

from verl.protocol import DataProto
from verl.utils.fsdp_utils import create_device_mesh, get_fsdp_adapter
from verl.utils.testing.dist import spawn
from verl.workers.config.rollout import RolloutConfig
from verl.workers.rollout.hf_rollout import HFRollout

_FP32 = {"param_dtype": torch.float32, "reduce_dtype": torch.float32, "buffer_dtype": torch.float32}


def _prompts(eos: int = 127) -> DataProto:
    ids = torch.randint(1, 120, (2, 5), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(ids)
    mask[1, :2] = 0
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    td = TensorDict({"input_ids": ids * mask, "attention_mask": mask, "position_ids": pos}, batch_size=[2])
    return DataProto(batch=td, meta_info={"eos_token_id": eos, "pad_token_id": 0, "do_sample": False})


def _config() -> RolloutConfig:
    return RolloutConfig(name="hf", response_length=5)


def _worker(rank, world_size, port, strategy, model, eos, out):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    try:
        adapter = get_fsdp_adapter(strategy)
        wrapped = adapter.wrap(model, mesh=create_device_mesh(world_size, -1), dtypes=_FP32, wrap_policy=None)
        wrapped.train()
        # rank 0 holds only row 0, which stops at its EOS after 2 tokens; rank 1 holds row 1, which runs on
        result = HFRollout(wrapped, _config()).generate_sequences(_prompts(eos)[rank : rank + 1])
        gathered = [None, None]
        dist.all_gather_object(gathered, result.batch["responses"])
        if rank == 0:
            out["responses"] = torch.cat(gathered)
            out["training"] = wrapped.training
    finally:
        dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.dist
@pytest.mark.parametrize("strategy", ["fsdp", "fsdp2"])
def test_generate_on_sharded_actor_equals_plain(make_model, strategy):
    """Invariant: greedy responses from the sharded actor (FSDP1 via full-params context, FSDP2 via its forward
    hooks) equal those of the unsharded model, also when one rank's sequences finish (EOS) steps before the other's
    (the finished rank keeps stepping with the others instead of hanging the collectives); the module's train mode
    is restored afterwards."""
    model = make_model()
    first = HFRollout(model, _config()).generate_sequences(_prompts()).batch["responses"]
    eos = int(first[0, 1])  # row 0 stops after 2 tokens
    expected = HFRollout(model, _config()).generate_sequences(_prompts(eos)).batch["responses"]
    assert (expected[1] == eos).sum() == 0 or (expected[1] == eos).nonzero()[0] > 1  # row 1 runs longer
    out = mp.Manager().dict()
    spawn(_worker, args=(2, _free_port(), strategy, model, eos, out), nprocs=2)
    assert torch.equal(out["responses"], expected)
    assert out["training"] is True


def _tiny_moe():
    """The tiny Qwen3.5-MoE, built from a fixed seed in each process (identical weights everywhere)."""
    from verl.models.tiny import build_tiny_model
    from verl.models.transformers.patch_registry import apply_patches

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = build_tiny_model("qwen3_5_moe", vocab_size=128).float()
    apply_patches(model, platform="cpu", report=False)
    return model


def _routing_config() -> RolloutConfig:
    return RolloutConfig(name="hf", response_length=5, enable_rollout_routing_replay=True)


def _routing_worker(rank, world_size, port, strategy, eos, out):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    try:
        adapter = get_fsdp_adapter(strategy)
        wrapped = adapter.wrap(_tiny_moe(), mesh=create_device_mesh(world_size, -1), dtypes=_FP32, wrap_policy=None)
        result = HFRollout(wrapped, _routing_config()).generate_sequences(_prompts(eos)[rank : rank + 1])
        gathered = [None, None]
        dist.all_gather_object(gathered, {k: result.batch[k] for k in ("routed_experts", "attention_mask")})
        if rank == 0:
            out["routed_experts"] = torch.cat([g["routed_experts"] for g in gathered])
            out["attention_mask"] = torch.cat([g["attention_mask"] for g in gathered])
    finally:
        dist.destroy_process_group()


@pytest.mark.dist
@pytest.mark.parametrize("strategy", [pytest.param("fsdp", marks=pytest.mark.slow), "fsdp2"])
def test_rollout_routing_on_sharded_actor_equals_plain(strategy):
    """R3 under synced_gpus: the rank whose row stops at EOS first keeps stepping (forwards that generate nothing)
    and every rank runs the extra last-token decoding step; the routing each rank records still equals the plain
    model's on every real token and MoE layer."""
    model = _tiny_moe()
    first = HFRollout(model, _config()).generate_sequences(_prompts()).batch["responses"]
    eos = int(first[0, 1])  # row 0 stops after 2 tokens
    expected = HFRollout(model, _routing_config()).generate_sequences(_prompts(eos)).batch
    assert expected["attention_mask"][0, 5:].sum() < expected["attention_mask"][1, 5:].sum()  # row 0 ends first
    out = mp.Manager().dict()
    spawn(_routing_worker, args=(2, _free_port(), strategy, eos, out), nprocs=2)
    assert torch.equal(out["attention_mask"], expected["attention_mask"])
    real = expected["attention_mask"].bool()
    assert torch.equal(out["routed_experts"][real], expected["routed_experts"][real])
