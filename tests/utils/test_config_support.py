"""Upstream keys whose feature this distribution lacks are never ignored silently (verl/utils/config_support.py):
refused before Ray when ignoring them would change results, reported in one warning otherwise."""

import logging
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

import verl
from verl.base_config import ConfigError
from verl.utils.config import validate_config
from verl.utils.config_support import INERT_SETTINGS, UNSUPPORTED_FEATURES, report_inert_settings

CONFIG_DIR = str(Path(verl.__file__).parent / "trainer" / "config")
# a valid launch on 2 devices: 16 prompts x 4 responses, mini-batch 8 prompts, micro-batches of 4
GOOD = [
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

# one override per refused key: the value a user script would set
REFUSED = {
    "actor_rollout_ref.actor.calculate_sum_pi_squared": "true",
    "algorithm.adv_estimator": "optimal_token_baseline",
    "actor_rollout_ref.actor.router_replay.mode": "R3",
    "actor_rollout_ref.rollout.enable_rollout_routing_replay": "true",
    "algorithm.rollout_correction.rollout_is": "token",
    "algorithm.rollout_correction.rollout_rs": "token",
    "algorithm.rollout_correction.bypass_mode": "true",
    "actor_rollout_ref.actor.policy_loss.loss_mode": "bypass_mode",
    "actor_rollout_ref.model.lora_rank": "8",
    "actor_rollout_ref.model.lora_adapter_path": "/adapters/a",
    "critic.model.lora_rank": "8",
    "actor_rollout_ref.rollout.multi_turn.enable": "true",
    "actor_rollout_ref.rollout.agent.default_agent_loop": "tool_agent",
    "actor_rollout_ref.rollout.agent.agent_loop_config_path": "/loops.yaml",
    "actor_rollout_ref.rollout.agent.custom_async_server.path": "/server.py",
    "data.datagen.path": "/gen.py",
    "actor_rollout_ref.rollout.quantization_config_file": "/q.json",
}
# refused values of a key that already has a row above (a dict holds one value per key)
REFUSED_TOO = [("algorithm.adv_estimator", "remax")]
INERT = {
    "actor_rollout_ref.model.use_liger": "true",
    "actor_rollout_ref.model.tiled_mlp.enabled": "true",
    "actor_rollout_ref.model.use_shm": "true",
    "critic.model.use_shm": "true",
    "data.use_shm": "true",
    "actor_rollout_ref.actor.use_prefix_grouper": "true",
    "actor_rollout_ref.actor.checkpoint.async_save": "true",
    "actor_rollout_ref.rollout.layered_summon": "true",
    "actor_rollout_ref.rollout.multi_stage_wake_up": "true",
    "actor_rollout_ref.rollout.over_sample_rate": "0.1",
    "actor_rollout_ref.rollout.skip_rollout": "true",
    "trainer.log_val_generations": "4",
    "trainer.validation_data_dir": "/tmp/val",
}


def _validate(*overrides):
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base=None):
        cfg = compose(config_name="ppo_trainer", overrides=[*GOOD, *overrides])
    return validate_config(cfg, use_reference_policy=True, use_critic=True)


def test_tables_are_what_these_tests_cover():
    """Adding or removing a row without a test here fails (each row is a reviewed decision)."""
    assert [s.key for s in UNSUPPORTED_FEATURES] == [*REFUSED, *(key for key, _ in REFUSED_TOO)]
    assert [s.key for s in INERT_SETTINGS] == list(INERT)


def test_default_config_is_neither_refused_nor_reported(caplog):
    with caplog.at_level(logging.WARNING, logger="verl.utils.config_support"):
        typed = _validate()
    assert report_inert_settings(typed) == []
    assert "no effect" not in caplog.text


@pytest.mark.parametrize("key", list(REFUSED))
def test_unimplemented_feature_is_refused_naming_the_key(key):
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        _validate(f"{key}={REFUSED[key]}")


@pytest.mark.parametrize("key, value", REFUSED_TOO)
def test_other_refused_values_name_the_key(key, value):
    with pytest.raises(ConfigError, match=key.replace(".", r"\.") + f".*{value}"):
        _validate(f"{key}={value}")


def test_unregistered_rollout_is_refused_listing_the_registered_ones():
    """rollout.name=sglang used to pass validation and fail at worker build (only hf and vllm are registered)."""
    with pytest.raises(ConfigError, match=r"rollout\.name: \('sglang'\) is not a rollout.*\['hf', 'vllm'\]"):
        _validate("actor_rollout_ref.rollout.name=sglang")


def test_inert_settings_are_reported_in_one_warning(caplog):
    with caplog.at_level(logging.WARNING, logger="verl.utils.config_support"):
        typed = _validate(*(f"{k}={v}" for k, v in INERT.items()))
    warnings = [r for r in caplog.records if "no effect" in r.getMessage()]  # validate_config's report
    assert len(warnings) == 1 and all(key in warnings[0].getMessage() for key in INERT)
    assert report_inert_settings(typed) == list(INERT)
