"""Legacy path = engine path: the proof that both worker paths run one core (DESIGN.md "Two worker paths, one core").

The legacy side is ``DataParallelPPOActor`` over an FSDP2-wrapped HF model built here the way a legacy worker does
(``from_pretrained``, platform patches, the FSDP adapter, the core's optimizer); the engine side is the engine-mode
``ActorRolloutRefWorker`` (``trainer.use_legacy_worker_impl=disable``) building its own ``FSDPEngine`` from the same
checkpoint. Both get the same rollout batch; fp32 on one CPU thread makes every kernel deterministic, so the results
agree to 1e-6 (observed: bitwise), far below the ~1e-2 a different loss or an extra/missing term would produce.

Not covered here: Ulysses SP (refused by the engines), FSDP1 (the adapter module's own tests), the rollout.
"""

import dataclasses
import os
import socket

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from verl.models.tiny import build_tiny_model
from verl.models.transformers.patch_registry import apply_patches
from verl.trainer.config.ppo_trainer import ActorRolloutRefConfig
from verl.utils.fsdp_utils import create_device_mesh, get_fsdp_adapter
from verl.workers.actor.dp_actor import DataParallelPPOActor
from verl.workers.config import (
    FSDPActorConfig,
    FSDPEngineConfig,
    FSDPOptimizerConfig,
    FSDPRefConfig,
    HFModelConfig,
    RolloutConfig,
)
from verl.workers.core.optimizer_step import build_optimizer
from verl.workers.engine_workers import ActorRolloutRefWorker

_FP32 = {"param_dtype": torch.float32, "reduce_dtype": torch.float32, "buffer_dtype": torch.float32}
TEMPERATURE = 0.7


def _configs(
    model_dir: str, *, mini_batch_prompts: int, rollout_n: int = 1, use_dynamic_bsz: bool = False
) -> ActorRolloutRefConfig:
    """fp32 FSDP2 actor with KL + entropy loss terms, 2 responses per micro-batch (or a 30-token budget)."""
    fsdp = FSDPEngineConfig(mixed_precision={"param_dtype": "fp32", "reduce_dtype": "fp32", "buffer_dtype": "fp32"})
    actor = FSDPActorConfig(
        strategy="fsdp2", ppo_mini_batch_size=mini_batch_prompts, ppo_micro_batch_size_per_gpu=2,
        use_dynamic_bsz=use_dynamic_bsz, ppo_max_token_len_per_gpu=30, use_kl_loss=True, entropy_coeff=0.01,
        use_torch_compile=False, optim=FSDPOptimizerConfig(lr=1e-3), fsdp_config=fsdp,
    )  # fmt: skip
    rollout = RolloutConfig(name="hf", n=rollout_n, temperature=TEMPERATURE, log_prob_micro_batch_size_per_gpu=3)
    model = HFModelConfig(path=model_dir, enable_gradient_checkpointing=False)
    return ActorRolloutRefConfig(model=model, actor=actor, ref=FSDPRefConfig(strategy="fsdp2"), rollout=rollout)


def _legacy_actor(model_dir: str, config: ActorRolloutRefConfig, mini_batch: int) -> DataParallelPPOActor:
    """What a legacy worker builds: HF model + platform patches, FSDP2 through the adapter, the core's optimizer,
    and the actor config rescaled to ``mini_batch`` responses per rank."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    apply_patches(model, platform="cpu", report=False)
    wrapped = get_fsdp_adapter("fsdp2").wrap(
        model, mesh=create_device_mesh(dist.get_world_size(), -1), dtypes=_FP32, wrap_policy=None
    )
    optimizer = build_optimizer(wrapped.parameters(), config.actor.optim)
    return DataParallelPPOActor(dataclasses.replace(config.actor, ppo_mini_batch_size=mini_batch), wrapped, optimizer)


def _run_both(model_dir: str, batch, config: ActorRolloutRefConfig, legacy_mini_batch: int):
    """compute_log_prob then one update_actor through both paths; returns (legacy, engine) result dicts."""
    engine_worker = ActorRolloutRefWorker(config, role="actor")
    engine_worker.init_model()
    legacy = _legacy_actor(model_dir, config, legacy_mini_batch)

    engine_lp = engine_worker.compute_log_prob(batch.select(deepcopy=True))
    legacy_batch = batch.select(deepcopy=True)
    legacy_batch.meta_info.update(temperature=TEMPERATURE, micro_batch_size=3, use_dynamic_bsz=False)
    legacy_lp = legacy.compute_log_prob(legacy_batch, calculate_entropy=True)

    engine_batch = batch.select(deepcopy=True)
    engine_batch.meta_info["temperature"] = TEMPERATURE
    engine_metrics = engine_worker.update_actor(engine_batch).meta_info["metrics"]
    legacy_metrics = legacy.update_policy(legacy_batch)

    adapter = get_fsdp_adapter("fsdp2")
    return (
        {"lp": legacy_lp, "metrics": legacy_metrics, "state": adapter.full_state_dict(legacy.actor_module)},
        {
            "lp": engine_lp,
            "metrics": engine_metrics,
            "state": adapter.full_state_dict(engine_worker.actor.engine.module),
        },
    )


def _assert_same(legacy: dict, engine: dict, atol: float = 1e-6) -> None:
    torch.testing.assert_close(engine["lp"].batch["old_log_probs"], legacy["lp"]["log_probs"], rtol=0, atol=atol)
    torch.testing.assert_close(engine["lp"].batch["entropys"], legacy["lp"]["entropys"], rtol=0, atol=atol)
    for key in ("actor/pg_loss", "actor/kl_loss", "actor/entropy", "actor/pg_clipfrac", "actor/grad_norm"):
        assert engine["metrics"][key] == pytest.approx(legacy["metrics"][key], abs=atol, rel=0), key
    assert engine["metrics"]["actor/skipped_steps"] == [0.0]
    assert legacy["state"].keys() == engine["state"].keys()
    for name, value in legacy["state"].items():
        torch.testing.assert_close(engine["state"][name], value, rtol=0, atol=atol, msg=name)


@pytest.fixture
def qwen3_5_moe_dir(tmp_path):
    path = tmp_path / "tiny_qwen3_5_moe"
    build_tiny_model("qwen3_5_moe", vocab_size=128).save_pretrained(path)
    return str(path)


@pytest.fixture
def qwen2_dir(tmp_path, make_model):
    path = tmp_path / "tiny_qwen2"
    make_model().save_pretrained(path)
    return str(path)


@pytest.mark.parametrize("model", ["qwen2", "qwen3_5_moe"])
def test_single_process_log_probs_update_and_weights_match(model, qwen2_dir, qwen3_5_moe_dir, make_batch, tmp_path):
    """Invariant (legacy = engine, one process): the same batch of 8 responses gives the same old log-probs and
    entropies (3 rows per micro-batch), the same PPO losses (pg + KL + entropy bonus), grad norm and AdamW-updated
    weights after one update (4 prompts x 2 responses per mini-batch, 2 rows per micro-batch), for a dense Qwen2
    and the hybrid GDN/attention Qwen3.5-MoE (packed forward with the varlen GDN patch on both sides)."""
    model_dir = qwen2_dir if model == "qwen2" else qwen3_5_moe_dir
    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/pg", rank=0, world_size=1)
    try:
        config = _configs(model_dir, mini_batch_prompts=4, rollout_n=2)
        legacy, engine = _run_both(model_dir, make_batch(batch_size=8), config, legacy_mini_batch=8)
    finally:
        dist.destroy_process_group()
    assert len(engine["metrics"]["actor/pg_loss"]) == 1  # one mini-batch of 8 responses → one optimizer step
    _assert_same(legacy, engine)


def _dist_worker(rank: int, world_size: int, port: int, model_dir: str, batch, out) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world_size))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    try:
        # 8 prompts x 1 response over 2 ranks: 4 responses per rank per optimizer step, token-budget micro-batches
        # (their count is synchronised over the ranks, a collective both paths must issue in the same order)
        config = _configs(model_dir, mini_batch_prompts=8, use_dynamic_bsz=True)
        legacy, engine = _run_both(model_dir, batch.chunk(world_size)[rank], config, legacy_mini_batch=4)
        _assert_same(legacy, engine)
        out[rank] = "ok"
    finally:
        dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.dist
def test_two_rank_fsdp2_paths_match(qwen2_dir, make_batch):
    """Invariant (legacy = engine, FSDP2 over 2 gloo ranks): with each rank holding half of 8 responses, trained in
    token-budget micro-batches (30 tokens), the two paths give the same log-probs and losses on every rank, the same
    grad norm (reduced over ranks) and the same full weights (gathered on rank 0), to 1e-6."""
    out = mp.Manager().dict()
    mp.spawn(_dist_worker, args=(2, _free_port(), qwen2_dir, make_batch(batch_size=8), out), nprocs=2, join=True)
    assert dict(out) == {0: "ok", 1: "ok"}
