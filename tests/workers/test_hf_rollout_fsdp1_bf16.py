"""The HF rollout on an FSDP1 actor under bf16 mixed precision (the worker defaults: fp32 master weights,
``fsdp_config.dtype=bfloat16``), through ``ActorRolloutRefWorker`` on one rank with the tiny Qwen3.5-MoE.

``generate`` runs the HF model's own methods, not the FSDP1 wrapper's forward, so the root unit's parameters
(embeddings, final norm, lm_head) are gathered by ``FSDPAdapter.inference_params``. Gathered in full precision
(``summon_full_params``) they produced fp32 hidden states that the first bf16 decoder layer rejected
(``expected m1 and m2 to have the same dtype, but got: float != c10::BFloat16``); they must be gathered in
``param_dtype``, as the wrapper's forward gathers them, and from the current (updated) shard.
"""

import os

import torch
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf
from tensordict import TensorDict

import verl.trainer.config as trainer_config_pkg
from verl.models.tiny import save_tiny_checkpoint
from verl.protocol import DataProto
from verl.utils.testing.dist import run_on_ranks
from verl.utils.tokenizer import build_offline_tokenizer

PROMPTS, N, PROMPT_LEN, RESPONSE_LEN = 2, 2, 6, 4
# Bound on |rollout log-prob - actor log-prob| in bf16: the rollout scores token t with a KV cache, the actor with
# one packed forward, so the two bf16 paths round differently (bf16 eps 2^-8 ~ 4e-3 relative per rounding).
# Measured max 1.3e-3 before and 6.1e-3 after the update (in fp32 compute both are <= 2.4e-6); the update moves
# the actor's log-probs by up to 1.49, so root weights left at their pre-update values would break the bound.
BF16_ATOL = 0.02


def _config(model_path: str):
    overrides = [
        "actor_rollout_ref.rollout.name=hf",
        f"actor_rollout_ref.model.path={model_path}",
        "actor_rollout_ref.actor.strategy=fsdp",
        f"actor_rollout_ref.rollout.n={N}",
        f"actor_rollout_ref.rollout.response_length={RESPONSE_LEN}",
        "actor_rollout_ref.rollout.calculate_log_probs=true",
        "actor_rollout_ref.actor.ppo_mini_batch_size=2",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
        "actor_rollout_ref.actor.optim.lr=2e-2",  # a step that moves log-probs ~100x the bound
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=4",
    ]
    with initialize_config_dir(config_dir=os.path.dirname(trainer_config_pkg.__file__), version_base=None):
        cfg = compose("ppo_trainer", overrides=overrides)
    OmegaConf.resolve(cfg)
    return cfg


def _generate_and_score(worker, prompts: DataProto) -> tuple[DataProto, torch.Tensor, torch.Tensor]:
    gen = worker.generate_sequences(prompts)
    batch = DataProto(batch=gen.batch, meta_info={"temperature": 1.0})
    batch.batch["response_mask"] = batch.batch["attention_mask"][:, -RESPONSE_LEN:]
    actor = worker.compute_log_prob(batch).batch["old_log_probs"]
    mask = batch.batch["response_mask"].bool()
    return batch, (batch.batch["rollout_log_probs"] - actor)[mask].abs(), actor


def _rank_body(cfg) -> dict:
    from verl.workers.fsdp_workers import ActorRolloutRefWorker

    worker = ActorRolloutRefWorker(cfg.actor_rollout_ref, role="actor_rollout")
    worker.init_model()
    module = worker.actor_module_fsdp
    layout = (next(module.parameters()).dtype, module.mixed_precision.param_dtype)
    ids = torch.randint(5, 250, (PROMPTS, PROMPT_LEN), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(ids)
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    td = TensorDict({"input_ids": ids, "attention_mask": mask, "position_ids": pos}, batch_size=[PROMPTS])
    prompts = DataProto(batch=td, meta_info={"do_sample": True}).repeat(N, interleave=True)

    batch, before, old = _generate_and_score(worker, prompts)
    batch.batch["old_log_probs"] = old
    batch.batch["advantages"] = torch.randn(old.shape, generator=torch.Generator().manual_seed(1))
    worker.update_actor(batch)
    _, after, _ = _generate_and_score(worker, prompts)
    moved = worker.compute_log_prob(batch).batch["old_log_probs"] - old
    return {"layout": layout, "before": before, "after": after, "moved": moved[batch.batch["response_mask"].bool()]}


def test_fsdp1_bf16_hf_rollout_generates_with_the_forward_numerics(tmp_path):
    """FSDP1, fp32 master weights with bf16 compute: generate_sequences runs (it raised the dtype mismatch), and
    the rollout's own log-probs of its samples match the actor's bf16 forward through the FSDP1 wrapper within
    the bf16 bound, before and after an update that moved the policy (the rollout reads the updated weights)."""
    tokenizer = build_offline_tokenizer([f"Q: {i} plus {i}? A: {2 * i}" for i in range(100)], vocab_size=300)
    path = save_tiny_checkpoint("qwen3_5_moe", tokenizer, str(tmp_path / "tiny"))
    (result,) = run_on_ranks(_rank_body, world_size=1, args=(_config(path),), timeout_s=600)
    assert result["layout"] == (torch.float32, torch.bfloat16)  # the recipe's precision layout
    assert result["before"].max() < BF16_ATOL, result["before"]
    assert result["moved"].abs().max() > 5 * BF16_ATOL  # the update moved log-probs well past the bound
    assert result["after"].max() < BF16_ATOL, result["after"]
