"""Keys that mean the same thing in different nodes are one setting (field report item 9 for the FSDP strategy)."""

import pickle
from pathlib import Path

import pytest

import verl
from verl.trainer.config import ActorRolloutRefConfig, PPOTrainerConfig
from verl.trainer.config.legacy_reward import migrate_legacy_reward_impl
from verl.utils.config import omega_conf_to_dataclass
from verl.workers.config import FSDPActorConfig, FSDPRefConfig, RolloutConfig


def build(compose_config, *overrides):
    cfg = compose_config(["actor_rollout_ref.rollout.name=hf", *overrides])
    return omega_conf_to_dataclass(migrate_legacy_reward_impl(cfg), PPOTrainerConfig)


def test_cpu_quickstart_settings_build(compose_config):
    """trainer.device=cpu, rollout.name=hf and actor.strategy=fsdp2 give FSDP2 in every engine (one key)."""
    cfg = build(compose_config, "trainer.device=cpu", "actor_rollout_ref.actor.strategy=fsdp2")
    arr = cfg.actor_rollout_ref
    assert cfg.trainer.device == "cpu" and arr.rollout.name == "hf"
    assert arr.actor.strategy == arr.ref.strategy == cfg.critic.strategy == "fsdp2"
    assert arr.actor.fsdp_config.strategy == arr.ref.fsdp_config.strategy == "fsdp2"
    assert cfg.critic.model.fsdp_config.strategy == "fsdp2"


def test_field_report_item_9_both_knobs_set_consistently_is_accepted(compose_config):
    """The report's workaround (setting actor.strategy and fsdp_config.strategy both to fsdp2) still works."""
    cfg = build(
        compose_config, "actor_rollout_ref.actor.strategy=fsdp2", "actor_rollout_ref.actor.fsdp_config.strategy=fsdp2"
    )
    assert cfg.actor_rollout_ref.actor.fsdp_config.strategy == "fsdp2"


def test_field_report_item_9_contradicting_engine_strategy_raises(compose_config):
    """actor.strategy=fsdp2 with fsdp_config.strategy=fsdp is a contradiction naming both keys, not a silent FSDP1."""
    with pytest.raises(ValueError) as info:
        build(
            compose_config,
            "actor_rollout_ref.actor.strategy=fsdp2",
            "actor_rollout_ref.actor.fsdp_config.strategy=fsdp",
        )
    message = str(info.value)
    assert message.startswith("actor_rollout_ref.actor.fsdp_config.strategy: (fsdp) contradicts")
    assert "actor_rollout_ref.actor.strategy (fsdp2)" in message


@pytest.mark.parametrize("key", ["actor_rollout_ref.ref.strategy", "critic.strategy"])
def test_ref_and_critic_strategy_must_repeat_the_actor(compose_config, key):
    """ref.strategy and critic.strategy follow actor.strategy; a different value raises naming the key."""
    with pytest.raises(ValueError) as info:
        build(compose_config, f"{key}=fsdp2")
    assert str(info.value).startswith(f"{key}: (fsdp2) contradicts actor_rollout_ref.actor.strategy (fsdp)")


def test_rollout_n_drives_actor_ref_and_critic(compose_config):
    """rollout.n=4 reaches actor.rollout_n, ref.rollout_n and critic.rollout_n; a conflicting explicit value raises."""
    cfg = build(compose_config, "actor_rollout_ref.rollout.n=4")
    assert cfg.actor_rollout_ref.actor.rollout_n == cfg.actor_rollout_ref.ref.rollout_n == cfg.critic.rollout_n == 4
    with pytest.raises(
        ValueError,
        match=r"^actor_rollout_ref\.actor\.rollout_n: \(3\) contradicts "
        r"actor_rollout_ref\.rollout\.n \(4\)",
    ):
        build(compose_config, "actor_rollout_ref.rollout.n=4", "actor_rollout_ref.actor.rollout_n=3")


def test_link_rule_in_python_construction():
    """Built in Python (no YAML interpolation), the side changed from its default wins in either direction."""
    arr = ActorRolloutRefConfig(rollout=RolloutConfig(name="hf", n=4))
    assert arr.actor.rollout_n == 4 and arr.ref.rollout_n == 4
    arr = ActorRolloutRefConfig(actor=FSDPActorConfig(rollout_n=4), rollout=RolloutConfig(name="hf"))
    assert arr.rollout.n == 4 and arr.ref.rollout_n == 4


def test_data_lengths_drive_rollout_lengths(compose_config):
    """data.max_prompt_length / max_response_length are the home of rollout.prompt_length / response_length."""
    cfg = build(compose_config, "data.max_prompt_length=64", "data.max_response_length=32")
    assert cfg.actor_rollout_ref.rollout.prompt_length == 64
    assert cfg.actor_rollout_ref.rollout.response_length == 32


def test_remove_padding_link_between_model_and_actor(compose_config):
    """model.use_remove_padding and actor.use_remove_padding are one setting: whichever side was changed from the
    default (True) wins, so the model forward and the actor never disagree about packing."""
    cfg = build(compose_config, "actor_rollout_ref.model.use_remove_padding=false")
    assert cfg.actor_rollout_ref.actor.use_remove_padding is False
    cfg = build(compose_config, "actor_rollout_ref.actor.use_remove_padding=false")
    assert cfg.actor_rollout_ref.model.use_remove_padding is False


def test_engine_level_sequence_parallel_reaches_actor_and_ref(compose_config):
    """Upstream NPU scripts set only actor.fsdp_config.ulysses_sequence_parallel_size=2: actor and ref both get SP 2."""
    cfg = build(compose_config, "actor_rollout_ref.actor.fsdp_config.ulysses_sequence_parallel_size=2")
    arr = cfg.actor_rollout_ref
    assert arr.actor.ulysses_sequence_parallel_size == arr.ref.ulysses_sequence_parallel_size == 2
    assert arr.ref.fsdp_config.ulysses_sequence_parallel_size == 2


def test_hybrid_engine_is_required():
    """Only the hybrid engine layout exists; hybrid_engine=False is rejected naming the key."""
    with pytest.raises(ValueError, match="^hybrid_engine: only the hybrid engine"):
        ActorRolloutRefConfig(hybrid_engine=False)


def test_sequence_parallel_needs_remove_padding_with_node_path():
    """ref SP 2 reaches the actor (one mesh), whose check then names actor.ulysses_sequence_parallel_size."""
    from verl.workers.config import HFModelConfig

    with pytest.raises(ValueError, match=r"^actor\.ulysses_sequence_parallel_size: \(2\) > 1 needs the packed"):
        ActorRolloutRefConfig(
            model=HFModelConfig(use_remove_padding=False),
            actor=FSDPActorConfig(use_remove_padding=False),
            ref=FSDPRefConfig(ulysses_sequence_parallel_size=2),
        )


def test_quickstart_overlay_validates(compose_config):
    """The CPU quickstart overlay (quickstart_cpu.yaml, owned by the trainer) composes on this tree and validates:
    trainer.device=cpu, rollout.name=hf and strategy fsdp2 in every engine."""
    from verl.utils.config import validate_config

    if not (Path(verl.__file__).parent / "trainer" / "config" / "quickstart_cpu.yaml").exists():
        pytest.skip("quickstart_cpu.yaml not present")
    cfg = validate_config(compose_config(config_name="quickstart_cpu"), use_reference_policy=False, use_critic=False)
    assert cfg.trainer.device == "cpu" and cfg.actor_rollout_ref.rollout.name == "hf"
    assert cfg.actor_rollout_ref.actor.fsdp_config.strategy == cfg.actor_rollout_ref.ref.fsdp_config.strategy == "fsdp2"


def test_whole_config_pickles_for_ray(compose_config):
    """The typed root config survives pickling (Ray ships it to the TaskRunner and the workers)."""
    cfg = build(compose_config, "actor_rollout_ref.actor.strategy=fsdp2")
    assert pickle.loads(pickle.dumps(cfg)) == cfg
