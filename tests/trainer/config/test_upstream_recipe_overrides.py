"""Upstream's rollout-correction and router-replay launch overrides compose against this config tree and mean the
same here: the lists are fixtures (tests/trainer/config/fixtures/upstream_recipe_overrides.py) written from
upstream's scripts and docs; composed with Hydra and validated as main_ppo does before Ray starts."""

import sys
from pathlib import Path

import pytest

from verl.base_config import ConfigError
from verl.trainer.ppo.rollout_corr_helper import parse_rollout_rs_options, parse_rollout_rs_thresholds
from verl.utils.config import validate_config

sys.path.insert(0, str(Path(__file__).parent / "fixtures"))
import upstream_recipe_overrides as recipes  # noqa: E402

# sizes that validate on 2 devices (upstream's scripts size a GPU cluster)
SIZES = [
    "actor_rollout_ref.rollout.name=hf",
    "actor_rollout_ref.rollout.n=4",
    "data.train_batch_size=16",
    "actor_rollout_ref.actor.ppo_mini_batch_size=8",
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4",
    "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=4",
    "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=4",
    "critic.ppo_micro_batch_size_per_gpu=4",
    "trainer.n_gpus_per_node=2",
]


def _typed(compose_config, overrides):
    return validate_config(compose_config([*SIZES, *overrides]), use_reference_policy=False, use_critic=False)


def test_rollout_correction_multi_rs_example(compose_config):
    """Bypass PPO-clip with token IS and chained token_k1 (ratio bounds [0.6, 1.6]) + seq_max_k2 (<= 2.5)."""
    typed = _typed(compose_config, recipes.ROLLOUT_CORRECTION_MULTI_RS)
    corr = typed.algorithm.rollout_correction
    assert (corr.rollout_is, corr.bypass_mode, corr.loss_type) == ("token", True, "ppo_clip")
    options = parse_rollout_rs_options(corr.rollout_rs)
    assert options == ["token_k1", "seq_max_k2"]
    assert parse_rollout_rs_thresholds(options, corr.rollout_rs_threshold) == {
        "token_k1": (0.6, 1.6),
        "seq_max_k2": (None, 2.5),
    }


def test_rollout_correction_rloo_example(compose_config):
    """Upstream's run_with_rollout_corr.sh: RLOO, sequence IS at 2.0 self-normalised, no RS, bypass + REINFORCE."""
    typed = _typed(compose_config, recipes.ROLLOUT_CORRECTION_RLOO)
    corr = typed.algorithm.rollout_correction
    assert typed.algorithm.adv_estimator == "rloo"
    assert (corr.rollout_is, corr.rollout_is_threshold, corr.rollout_is_batch_normalize) == ("sequence", 2.0, True)
    assert (corr.rollout_rs, corr.rollout_rs_threshold) == (None, None)
    assert (corr.bypass_mode, corr.loss_type) == (True, "reinforce")


@pytest.mark.parametrize("mode", ["R2", "R3"])
def test_router_replay_veomni_qwen3_5_35b_recipe(compose_config, mode):
    """Upstream's Qwen3.5-35B-A3B VeOmni router-replay recipe with its defaults composes and validates: R2 (or R3
    with the rollout recording) under VeOmni's Ulysses SP 2 (the replay is cut per SP rank like the ids:
    tests/workers/engine/veomni/test_sequence_parallel.py), EP 1, GSPO, VeOmni's kernels."""
    overrides = list(recipes.ROUTER_REPLAY_VEOMNI_QWEN3_5_35B)
    if mode == "R3":
        overrides += [
            "actor_rollout_ref.actor.veomni.router_replay.mode=R3",
            "actor_rollout_ref.rollout.enable_rollout_routing_replay=True",
        ]
    typed = _typed(compose_config, overrides)
    actor = typed.actor_rollout_ref.actor
    assert actor.router_replay.mode == actor.veomni.router_replay.mode == mode
    assert actor.ulysses_sp_size == actor.veomni.ulysses_parallel_size == 2
    assert actor.veomni.expert_parallel_size == 1 and actor.policy_loss.loss_mode == "gspo"
    assert typed.actor_rollout_ref.rollout.enable_rollout_routing_replay == (mode == "R3")


def test_router_replay_veomni_r2(compose_config):
    """The engine-scoped key selects R2 for the actor (one setting with actor.router_replay.mode)."""
    typed = _typed(compose_config, recipes.ROUTER_REPLAY_VEOMNI_R2)
    actor = typed.actor_rollout_ref.actor
    assert actor.veomni.router_replay.mode == actor.router_replay.mode == "R2"


def test_router_replay_veomni_r3(compose_config):
    """R3 composes with the HF rollout and with vLLM without prefix caching (both record the routing); refused,
    naming the key, with vLLM's prefix cache on (cached prompt blocks are never routed), with a rollout that cannot
    record it, and when the rollout is not asked to record it."""
    typed = _typed(compose_config, recipes.ROUTER_REPLAY_VEOMNI_R3)
    assert typed.actor_rollout_ref.actor.router_replay.mode == "R3"
    assert typed.actor_rollout_ref.rollout.enable_rollout_routing_replay
    vllm = [*recipes.ROUTER_REPLAY_VEOMNI_R3, "actor_rollout_ref.rollout.name=vllm"]
    assert _typed(compose_config, [*vllm, "actor_rollout_ref.rollout.enable_prefix_caching=False"])
    with pytest.raises(ConfigError, match="enable_rollout_routing_replay.*enable_prefix_caching=False"):
        _typed(compose_config, vllm)
    with pytest.raises(ConfigError, match="enable_rollout_routing_replay.*name=hf or vllm"):
        _typed(compose_config, [*recipes.ROUTER_REPLAY_VEOMNI_R3, "actor_rollout_ref.rollout.name=sglang"])
    no_routing = [o for o in recipes.ROUTER_REPLAY_VEOMNI_R3 if "enable_rollout_routing_replay" not in o]
    with pytest.raises(ConfigError, match="enable_rollout_routing_replay.*must be True"):
        _typed(compose_config, no_routing)
