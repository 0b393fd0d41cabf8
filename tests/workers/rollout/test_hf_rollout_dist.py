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
