"""Per-rank batch plans of both worker paths and the typed meta_info readers (verl/workers/core/batch_plan.py)."""

import pytest

from verl.base_config import ConfigError
from verl.workers.config import FSDPActorConfig, FSDPCriticConfig
from verl.workers.core.batch_plan import BatchPlan, actor_update_plan, critic_update_plan, forward_plan


def test_actor_update_plan_by_hand():
    """Invariant: per-rank sizes follow the legacy worker's arithmetic.
    ppo_mini_batch_size 8 prompts x rollout_n 2 / dp 4 = 4 responses per rank per optimizer step; the deprecated
    global micro size 8 / dp 4 = 2 per GPU; token budget 100 x SP 2 = 200 tokens per micro-batch."""
    cfg = FSDPActorConfig(
        strategy="fsdp2", ppo_mini_batch_size=8, rollout_n=2, ppo_micro_batch_size=8, ppo_max_token_len_per_gpu=100,
        ulysses_sequence_parallel_size=2, ppo_epochs=3, shuffle=True, data_loader_seed=7, use_torch_compile=False,
    )  # fmt: skip
    assert actor_update_plan(cfg, dp_size=4) == BatchPlan(
        micro_batch_size=2, use_dynamic_bsz=False, max_token_len=200, mini_batch_size=4, epochs=3, shuffle=True, seed=7
    )


def test_critic_update_plan_and_indivisible_mini_batch():
    """Invariant: the critic uses the same arithmetic (4 prompts x 1 / dp 2 = 2 per rank); a mini-batch that does
    not split over the ranks (3 x 1 / 2) raises naming ppo_mini_batch_size."""
    cfg = FSDPCriticConfig(strategy="fsdp2", ppo_mini_batch_size=4, ppo_micro_batch_size_per_gpu=1)
    plan = critic_update_plan(cfg, dp_size=2)
    assert (plan.mini_batch_size, plan.micro_batch_size) == (2, 1)
    with pytest.raises(ConfigError, match="ppo_mini_batch_size"):
        critic_update_plan(FSDPCriticConfig(strategy="fsdp2", ppo_mini_batch_size=3), dp_size=2)


def test_forward_plan_needs_a_micro_batch_or_dynamic_bsz():
    """Invariant: a forward pass needs a micro-batch size unless dynamic batching is on; the error names the
    per-GPU key. Global 8 over dp 4 converts to 2 per GPU."""
    assert forward_plan("ref.log_prob_micro_batch_size", 8, None, False, 64, 4).micro_batch_size == 2
    assert forward_plan("ref.log_prob_micro_batch_size", None, None, True, 64, 4).use_dynamic_bsz
    with pytest.raises(ValueError, match="ref.log_prob_micro_batch_size_per_gpu is not set"):
        forward_plan("ref.log_prob_micro_batch_size", None, None, False, 64, 4)


def test_batch_plan_from_meta_info():
    """Invariant: upstream's train_mini_batch contract reads sizes from meta_info; mini_batch_size is required."""
    plan = BatchPlan.from_meta_info({"mini_batch_size": 4, "micro_batch_size": 2, "epochs": 2})
    assert plan == BatchPlan(micro_batch_size=2, use_dynamic_bsz=False, max_token_len=None, mini_batch_size=4, epochs=2)
    assert plan.meta_info() == {"micro_batch_size": 2, "use_dynamic_bsz": False, "max_token_len": None}
    with pytest.raises(ValueError, match="mini_batch_size"):
        BatchPlan.from_meta_info({"micro_batch_size": 2}, training=True)
