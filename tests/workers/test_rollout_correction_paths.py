"""Bypass-mode rollout correction on both worker paths: the legacy ``DataParallelPPOActor`` (what ``fsdp_workers``
runs) and the engine-mode ``ActorRolloutRefWorker`` compute the same bypass loss, rejection and ``rollout_corr/*``
metrics from the trainer's ``meta_info["rollout_correction"]``, in one process on a tiny fp32 Qwen2 (FSDP2).
"""

import dataclasses

import pytest
import torch
import torch.distributed as dist

from verl.models.transformers.patch_registry import apply_patches
from verl.trainer.config.ppo_trainer import ActorRolloutRefConfig
from verl.utils.fsdp_utils import create_device_mesh, get_fsdp_adapter
from verl.utils.tokenizer import build_offline_tokenizer
from verl.workers.actor.dp_actor import DataParallelPPOActor
from verl.workers.config import (
    FSDPActorConfig,
    FSDPEngineConfig,
    FSDPOptimizerConfig,
    FSDPRefConfig,
    HFModelConfig,
    PolicyLossConfig,
    RolloutConfig,
)
from verl.workers.core.losses import ROLLOUT_CORRECTION_META_KEY, bind_rollout_correction
from verl.workers.core.optimizer_step import build_optimizer

_FP32 = {"param_dtype": torch.float32, "reduce_dtype": torch.float32, "buffer_dtype": torch.float32}
CORRECTION = {
    "loss_type": "reinforce",
    "rollout_is": "token",
    "rollout_is_threshold": 2.0,
    "rollout_is_batch_normalize": False,
    # k1 ratio bounds [0.05, 20]: the batch's random rollout log-probs put some tokens outside
    "rollout_rs": "token_k1",
    "rollout_rs_threshold": "0.05_20",
}


@pytest.fixture
def qwen2_dir(tmp_path, make_model):
    path = tmp_path / "tiny_qwen2"
    make_model().save_pretrained(path)
    build_offline_tokenizer([f"Q: {i} plus {i}? A: {2 * i}" for i in range(200)], vocab_size=300).save_pretrained(path)
    return str(path)


def _config(model_dir: str) -> ActorRolloutRefConfig:
    fsdp = FSDPEngineConfig(mixed_precision={"param_dtype": "fp32", "reduce_dtype": "fp32", "buffer_dtype": "fp32"})
    actor = FSDPActorConfig(
        strategy="fsdp2",
        ppo_mini_batch_size=4,
        ppo_micro_batch_size_per_gpu=2,
        use_torch_compile=False,
        optim=FSDPOptimizerConfig(lr=1e-3),
        fsdp_config=fsdp,
        policy_loss=PolicyLossConfig(loss_mode="bypass_mode"),
        loss_agg_mode="seq-mean-token-sum",
    )
    rollout = RolloutConfig(name="hf", n=2, temperature=0.7, log_prob_micro_batch_size_per_gpu=3)
    model = HFModelConfig(path=model_dir, enable_gradient_checkpointing=False)
    return ActorRolloutRefConfig(model=model, actor=actor, ref=FSDPRefConfig(strategy="fsdp2"), rollout=rollout)


def _legacy_actor(model_dir: str, config: ActorRolloutRefConfig) -> DataParallelPPOActor:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    apply_patches(model, platform="cpu", report=False)
    wrapped = get_fsdp_adapter("fsdp2").wrap(
        model, mesh=create_device_mesh(dist.get_world_size(), -1), dtypes=_FP32, wrap_policy=None
    )
    optimizer = build_optimizer(wrapped.parameters(), config.actor.optim)
    return DataParallelPPOActor(dataclasses.replace(config.actor, ppo_mini_batch_size=8), wrapped, optimizer)


def test_bypass_mode_same_loss_on_both_worker_paths(qwen2_dir, make_batch, tmp_path):
    """Invariant: with bypass_mode (reinforce, token IS u = 2, token_k1 rejection) the legacy actor and the engine
    worker report the same pg loss, grad norm and rollout_corr/* metrics, and some tokens were rejected."""
    from verl.workers.engine_workers import ActorRolloutRefWorker

    batch = make_batch(batch_size=8)
    batch.batch["rollout_log_probs"] = batch.batch["old_log_probs"].clone()  # bypass: old = rollout
    batch.meta_info[ROLLOUT_CORRECTION_META_KEY] = dict(CORRECTION)
    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/pg", rank=0, world_size=1)
    try:
        config = _config(qwen2_dir)
        engine = ActorRolloutRefWorker(config, role="actor")
        engine.init_model()
        legacy = _legacy_actor(qwen2_dir, config)
        engine_metrics = engine.update_actor(batch.select(deepcopy=True)).meta_info["metrics"]
        legacy_batch = batch.select(deepcopy=True)
        bind_rollout_correction(legacy.config, legacy_batch.meta_info)  # what fsdp_workers.update_actor does
        legacy_metrics = legacy.update_policy(legacy_batch)
    finally:
        dist.destroy_process_group()
    corr_keys = {k for k in legacy_metrics if k.startswith("rollout_corr/")}
    assert {"rollout_corr/rollout_is_mean", "rollout_corr/rollout_rs_masked_fraction", "rollout_corr/kl"} <= corr_keys
    assert corr_keys == {k for k in engine_metrics if k.startswith("rollout_corr/")}
    for key in ("actor/pg_loss", "actor/grad_norm", "actor/ppo_kl", *sorted(corr_keys)):
        assert engine_metrics[key] == pytest.approx(legacy_metrics[key], abs=1e-6, rel=0), key
    assert all(v > 0 for v in legacy_metrics["rollout_corr/rollout_rs_masked_fraction"])


def test_bind_refuses_a_non_bypass_loss():
    actor = FSDPActorConfig(strategy="fsdp2", ppo_micro_batch_size_per_gpu=1)
    with pytest.raises(ValueError, match="loss_mode='vanilla'"):
        bind_rollout_correction(actor, {ROLLOUT_CORRECTION_META_KEY: dict(CORRECTION)})
    bind_rollout_correction(actor, {})  # no settings sent: nothing to do


# ------------------------------------------------------------------------------------------------ router replay R2
@pytest.fixture
def qwen3_5_moe_dir(tmp_path):
    from verl.models.tiny import build_tiny_model

    path = tmp_path / "tiny_qwen3_5_moe"
    build_tiny_model("qwen3_5_moe", vocab_size=128).save_pretrained(path)
    build_offline_tokenizer([f"Q: {i} plus {i}? A: {2 * i}" for i in range(200)], vocab_size=300).save_pretrained(path)
    return str(path)


def test_router_replay_r2_same_on_both_worker_paths(qwen3_5_moe_dir, make_batch, tmp_path):
    """Invariant: with router_replay.mode=R2 on the tiny Qwen3.5-MoE, the legacy actor and the engine worker record
    the same routed_experts in compute_log_prob and give the same update (pg loss, grad norm) replaying it."""
    from verl.workers.config import RouterReplayConfig
    from verl.workers.engine_workers import ActorRolloutRefWorker

    batch = make_batch(batch_size=8)
    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/pg", rank=0, world_size=1)
    try:
        config = _config(qwen3_5_moe_dir)
        actor = dataclasses.replace(
            config.actor, policy_loss=PolicyLossConfig(), router_replay=RouterReplayConfig(mode="R2")
        )
        config = dataclasses.replace(config, actor=actor)
        engine = ActorRolloutRefWorker(config, role="actor")
        engine.init_model()
        legacy = _legacy_actor(qwen3_5_moe_dir, config)
        engine_out = engine.compute_log_prob(batch.select(deepcopy=True)).batch
        legacy_batch = batch.select(deepcopy=True)
        legacy_batch.meta_info.update(temperature=0.7, micro_batch_size=3, use_dynamic_bsz=False)
        legacy_out = legacy.compute_log_prob(legacy_batch, calculate_entropy=True)
        batch.batch["routed_experts"] = engine_out["routed_experts"]
        engine_metrics = engine.update_actor(batch.select(deepcopy=True)).meta_info["metrics"]
        legacy_batch.batch["routed_experts"] = legacy_out["routed_experts"]
        legacy_metrics = legacy.update_policy(legacy_batch)
    finally:
        dist.destroy_process_group()
    real = batch.batch["attention_mask"].bool()
    assert torch.equal(engine_out["routed_experts"][real], legacy_out["routed_experts"][real])
    torch.testing.assert_close(engine_out["old_log_probs"], legacy_out["log_probs"], rtol=0, atol=1e-6)
    for key in ("actor/pg_loss", "actor/grad_norm"):
        assert engine_metrics[key] == pytest.approx(legacy_metrics[key], abs=1e-6, rel=0), key
