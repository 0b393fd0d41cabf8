"""Upstream's Megatron-family config classes import from verl.workers.config (code supporting several backends,
type hints, isinstance checks keep working), while building one or selecting the backend by its strategy name is
refused before anything starts, naming the key and what to use instead."""

import pytest

from verl.base_config import ConfigError
from verl.workers.config import (
    ActorConfig,
    CriticConfig,
    EngineConfig,
    FSDPActorConfig,
    FSDPCriticConfig,
    McoreActorConfig,
    McoreCriticConfig,
    McoreEngineConfig,
    McoreOptimizerConfig,
    MindSpeedEngineConfig,
    OptimizerConfig,
)


def test_megatron_names_are_the_upstream_family():
    """The classes sit where upstream's do in the hierarchy, so isinstance / issubclass checks hold."""
    assert issubclass(McoreActorConfig, ActorConfig) and issubclass(McoreCriticConfig, CriticConfig)
    assert issubclass(McoreEngineConfig, EngineConfig) and issubclass(MindSpeedEngineConfig, McoreEngineConfig)
    assert issubclass(McoreOptimizerConfig, OptimizerConfig)
    assert not isinstance(FSDPActorConfig(), McoreActorConfig)


@pytest.mark.parametrize(
    "cls", [McoreActorConfig, McoreCriticConfig, McoreEngineConfig, MindSpeedEngineConfig, McoreOptimizerConfig]
)
def test_building_a_megatron_config_is_refused(cls):
    with pytest.raises(ConfigError, match=r"Megatron backend|MindSpeed.*not part of verl-ascend.*strategy=fsdp"):
        cls()


@pytest.mark.parametrize("strategy", ["megatron", "torchtitan", "automodel", "fsdp_turbo"])
def test_selecting_an_upstream_backend_by_strategy_names_the_key(strategy):
    """actor/critic strategy=<upstream backend> raises ConfigError naming the key, the backend and the fix (it
    used to be a generic 'not supported; choose fsdp | fsdp2')."""
    with pytest.raises(ConfigError, match=rf"^strategy: '{strategy}': .*not part of verl-ascend.*fsdp2"):
        FSDPActorConfig(strategy=strategy)
    with pytest.raises(ConfigError, match=rf"^strategy: '{strategy}': .*not part of verl-ascend"):
        FSDPCriticConfig(strategy=strategy)


def test_megatron_strategy_in_the_composed_config_fails_before_ray():
    """The Hydra override users of upstream's Megatron recipes pass is refused by the config check main_ppo runs
    before Ray starts, with the full key path."""
    from pathlib import Path

    from hydra import compose, initialize_config_dir

    import verl
    from verl.trainer.config.legacy_reward import migrate_legacy_reward_impl
    from verl.trainer.config.ppo_trainer import PPOTrainerConfig
    from verl.utils.config import omega_conf_to_dataclass

    config_dir = str(Path(verl.__file__).parent / "trainer" / "config")
    with initialize_config_dir(config_dir=config_dir, version_base=None):
        cfg = compose(config_name="ppo_trainer", overrides=["actor_rollout_ref.actor.strategy=megatron"])
    with pytest.raises(ValueError, match=r"actor_rollout_ref\.actor\.strategy: 'megatron': the Megatron backend"):
        omega_conf_to_dataclass(migrate_legacy_reward_impl(cfg), PPOTrainerConfig)
