"""Per-rank batch plans of both worker paths and the typed meta_info readers (verl/workers/core/batch_plan.py)."""

import pytest

from verl.base_config import ConfigError
from verl.workers.config import FSDPActorConfig, FSDPCriticConfig
from verl.workers.core.batch_plan import (
    BatchPlan,
    ForwardSwitches,
    actor_update_plan,
    critic_update_plan,
    forward_plan,
    per_rank_update_plan,
)


def test_actor_update_plan_by_hand():
    """Invariant: per-rank sizes follow the legacy worker's arithmetic.
    ppo_mini_batch_size 8 prompts x rollout_n 2 / dp 4 = 4 responses per rank per optimizer step; the deprecated
    global micro size 8 / dp 4 = 2 per GPU; token budget 100 x SP 2 = 200 tokens per micro-batch."""
    cfg = FSDPActorConfig(
        strategy="fsdp2",
        ppo_mini_batch_size=8,
        rollout_n=2,
        ppo_micro_batch_size=8,
        ppo_max_token_len_per_gpu=100,
        ulysses_sequence_parallel_size=2,
        ppo_epochs=3,
        shuffle=True,
        data_loader_seed=7,
        use_torch_compile=False,
    )
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


def test_update_plan_refuses_a_micro_batch_that_does_not_divide_the_mini_batch():
    """Invariant: 4 prompts x 1 / dp 2 = 2 responses per rank cannot split into micro-batches of 3; the error names
    the per-GPU key under the role's prefix."""
    cfg = FSDPCriticConfig(strategy="fsdp2", ppo_mini_batch_size=4, ppo_micro_batch_size_per_gpu=3)
    with pytest.raises(ConfigError, match=r"critic.ppo_micro_batch_size_per_gpu: \(3\) must be set and divide the 2"):
        critic_update_plan(cfg, dp_size=2)


def test_the_config_keeps_its_global_values():
    """Invariant: building the plan changes no config field (the legacy worker used to rewrite ppo_mini_batch_size
    from prompts to responses per rank)."""
    cfg = FSDPActorConfig(strategy="fsdp2", ppo_mini_batch_size=8, rollout_n=2, ppo_micro_batch_size_per_gpu=2)
    actor_update_plan(cfg, dp_size=4)
    assert (cfg.ppo_mini_batch_size, cfg.ppo_micro_batch_size_per_gpu) == (8, 2)


def test_per_rank_update_plan_reads_the_config_as_per_rank_values():
    """Invariant: a DataParallelPPOActor built without a plan (upstream's contract) reads ppo_mini_batch_size as
    responses per rank: 8 stays 8 (not 8 x rollout_n 2); the token budget is 100 x SP 1 = 100."""
    cfg = FSDPActorConfig(
        strategy="fsdp2",
        ppo_mini_batch_size=8,
        rollout_n=2,
        ppo_micro_batch_size_per_gpu=2,
        ppo_max_token_len_per_gpu=100,
        ppo_epochs=2,
        use_torch_compile=False,
    )
    assert per_rank_update_plan(cfg) == BatchPlan(2, False, 100, mini_batch_size=8, epochs=2, seed=cfg.data_loader_seed)


def test_meta_info_defaults_are_the_dataclass_defaults():
    """Invariant: an empty meta_info gives the dataclass defaults (one set of defaults): no micro size, fixed-count
    split, one epoch, no shuffle, seed 42; no temperature (a log-prob forward then refuses, naming the key)."""
    assert BatchPlan.from_meta_info({}) == BatchPlan(None, False, None, None, 1, False, 42)
    switches = ForwardSwitches.from_meta_info({})
    assert switches == ForwardSwitches(temperature=None, calculate_entropy=False, router_replay=None)
    with pytest.raises(ValueError, match=r"compute_log_prob: data.meta_info\['temperature'\] is missing"):
        switches.require_temperature("compute_log_prob")
    meta = {"temperature": 0.7, "calculate_entropy": True, "router_replay": "record", "unrelated": 1}
    assert ForwardSwitches.from_meta_info(meta) == ForwardSwitches(0.7, True, "record")
