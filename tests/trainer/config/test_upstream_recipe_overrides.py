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


def test_router_replay_veomni_r2(compose_config):
    """The engine-scoped key selects R2 for the actor (one setting with actor.router_replay.mode)."""
    typed = _typed(compose_config, recipes.ROUTER_REPLAY_VEOMNI_R2)
    actor = typed.actor_rollout_ref.actor
    assert actor.veomni.router_replay.mode == actor.router_replay.mode == "R2"


def test_router_replay_veomni_r3(compose_config):
    """R3 composes with the HF rollout (which records the routing); refused, naming the key, with vLLM (whose CPU
    build cannot return routed experts) and when the rollout is not asked to record it."""
    typed = _typed(compose_config, recipes.ROUTER_REPLAY_VEOMNI_R3)
    assert typed.actor_rollout_ref.actor.router_replay.mode == "R3"
    assert typed.actor_rollout_ref.rollout.enable_rollout_routing_replay
    with pytest.raises(ConfigError, match="enable_rollout_routing_replay.*rollout.name=hf.*Triton"):
        _typed(compose_config, [*recipes.ROUTER_REPLAY_VEOMNI_R3, "actor_rollout_ref.rollout.name=vllm"])
    no_routing = [o for o in recipes.ROUTER_REPLAY_VEOMNI_R3 if "enable_rollout_routing_replay" not in o]
    with pytest.raises(ConfigError, match="enable_rollout_routing_replay.*must be True"):
        _typed(compose_config, no_routing)
