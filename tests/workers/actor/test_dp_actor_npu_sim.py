"""DataParallelPPOActor with ``trainer.device=npu`` on the simulated Ascend, parameters and AdamW state offloaded
between steps, equals the same steps with ``trainer.device=cpu`` (FSDP2 and FSDP1, one process)."""

import copy
import os
import socket

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from omegaconf import OmegaConf

from verl.utils.config import omega_conf_to_dataclass
from verl.utils.testing.dist import spawn
from verl.workers.config.actor import FSDPActorConfig

STEPS = 2


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _local(t: torch.Tensor) -> torch.Tensor:
    # one rank: a DTensor's local shard is the whole tensor (FSDP2); FSDP1 exposes its flat parameter
    return t.to_local() if hasattr(t, "to_local") else t


def _devices(module, optimizer) -> set[str]:
    tensors = [_local(p) for p in module.parameters()]
    tensors += [v for s in optimizer.state.values() for v in s.values() if isinstance(v, torch.Tensor) and v.dim()]
    return {t.device.type for t in tensors}


def _config(strategy: str) -> FSDPActorConfig:
    return omega_conf_to_dataclass(
        {
            "strategy": strategy,
            "ppo_mini_batch_size": 8,
            "ppo_micro_batch_size_per_gpu": 4,
            "use_torch_compile": False,
            "optim": {"lr": 1e-3, "weight_decay": 0.01},
            "fsdp_config": {"dtype": "float32", "param_offload": True, "optimizer_offload": True},
        },
        FSDPActorConfig,
    )


def _train(device: str, strategy: str, model_dir: str, batch) -> dict:
    """``STEPS`` actor updates the way the worker runs them with offload: load params (+ optimizer state) to the
    device, update, offload both. Selects the platform exactly as main_ppo does for ``trainer.device``."""
    from verl.utils.device import auto_set_device, get_nccl_backend, get_platform
    from verl.utils.fsdp_utils import (
        create_device_mesh,
        load_fsdp_model_to_gpu,
        load_fsdp_optimizer,
        offload_fsdp_model_to_cpu,
        offload_fsdp_optimizer,
    )
    from verl.workers.actor.dp_actor import DataParallelPPOActor
    from verl.workers.config.model import HFModelConfig
    from verl.workers.core.fsdp_model import build_fsdp_model

    assert auto_set_device(OmegaConf.create({"trainer": {"device": device}})) == device
    compute = get_platform().device() if device != "cpu" else torch.device("cpu")
    dist.init_process_group(get_nccl_backend(), rank=0, world_size=1)
    try:
        config = _config(strategy)
        torch.manual_seed(0)
        built = build_fsdp_model(
            HFModelConfig(path=model_dir),
            config.fsdp_config,
            strategy=strategy,
            mesh=create_device_mesh(1, -1),
            optim_config=config.optim,
        )
        module, optimizer = built.module, built.optimizer
        offload_fsdp_model_to_cpu(module)
        actor = DataParallelPPOActor(config, module, optimizer)
        initial = {name: _local(p).detach().clone() for name, p in module.named_parameters()}
        metrics = []
        for _ in range(STEPS):
            load_fsdp_model_to_gpu(module, compute)
            load_fsdp_optimizer(optimizer, compute)
            assert _devices(module, optimizer) == {compute.type}
            metrics.append(actor.update_policy(copy.deepcopy(batch).to(compute)))  # .to moves in place
            offload_fsdp_model_to_cpu(module)
            offload_fsdp_optimizer(optimizer)
            assert _devices(module, optimizer) == {"cpu"}
        weights = {name: _local(p).detach().clone() for name, p in module.named_parameters()}
        moved = max((weights[name] - initial[name]).abs().max().item() for name in weights)
        return {"metrics": metrics, "weights": weights, "moved": moved}
    finally:
        dist.destroy_process_group()


def _scenario(rank: int, port: int, strategy: str, model_dir: str, batch, out) -> None:
    from verl.utils.platform.npu_sim import simulated_ascend

    os.environ.pop("VERL_PLATFORM", None)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    with simulated_ascend():  # installed before any backward (autograd sizes its device queues at the first one)
        out["npu"] = _train("npu", strategy, model_dir, batch)
    out["cpu"] = _train("cpu", strategy, model_dir, batch)


@pytest.mark.parametrize("strategy", ["fsdp2", "fsdp"])
def test_offloaded_actor_steps_on_simulated_npu_match_cpu(tmp_path, make_model, make_batch, strategy):
    """Invariant: two PPO updates (2 micro-batches each, AdamW lr 1e-3) with param+optimizer offload on the simulated
    npu give the same pg_loss and grad norm per step (1e-5 relative) and the same weights afterwards (1e-5 absolute)
    as on the CPU. The simulated kernels are the CPU kernels; only the NPU fused-op patches (RMSNorm, SwiGLU, rotary,
    TND attention) reorder a few fp32 reductions. AdamW divides each gradient element by its RMS, so a roundoff-level
    difference in a near-zero gradient element can move that weight by a fraction of lr: measured <= 1e-6 at lr 1e-3
    (9e-6 at lr 1e-2), hence 1e-5. Between steps every parameter and optimizer-state tensor is on the CPU, during a
    step all are on the npu (a tensor left behind makes the step raise there, as on hardware)."""
    model_dir = str(tmp_path / "tiny")
    make_model().save_pretrained(model_dir)
    batch = make_batch(batch_size=8)
    out = mp.Manager().dict()
    spawn(_scenario, args=(_free_port(), strategy, model_dir, batch, out), nprocs=1)
    npu, cpu = out["npu"], out["cpu"]
    for step in range(STEPS):
        for key in ("actor/pg_loss", "actor/grad_norm"):
            assert npu["metrics"][step][key] == pytest.approx(cpu["metrics"][step][key], rel=1e-5, abs=1e-7), key
    assert cpu["moved"] > 5e-4  # AdamW moved the weights by ~lr per step
    for name, weight in cpu["weights"].items():
        assert npu["weights"][name].device.type == "cpu"
        torch.testing.assert_close(npu["weights"][name], weight, rtol=0, atol=1e-5, msg=name)
