"""The `model_engine` config group (upstream's Hydra switch between config families): `dp` (default, FSDP1/FSDP2)
and `veomni` (VeOmni actor/ref with their engine settings under `.veomni`, FSDP2 critic, engine workers)."""

import dataclasses

import pytest
from omegaconf import OmegaConf

from verl.base_config import ConfigError
from verl.trainer.config.legacy_reward import migrate_legacy_reward_impl
from verl.trainer.config.ppo_trainer import ActorRolloutRefConfig, PPOTrainerConfig
from verl.utils.config import omega_conf_to_dataclass, validate_config
from verl.workers.config import (
    FSDPActorConfig,
    FSDPCriticConfig,
    FSDPRefConfig,
    VeOmniActorConfig,
    VeOmniEngineConfig,
    VeOmniRefConfig,
)

# a valid launch on 2 devices: 16 prompts x 1 response, mini-batch 8, micro-batches of 2
VALID = [
    "actor_rollout_ref.rollout.name=hf",
    "data.train_batch_size=16",
    "trainer.n_gpus_per_node=2",
    "actor_rollout_ref.actor.ppo_mini_batch_size=8",
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
    "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=2",
    "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=2",
    "critic.ppo_micro_batch_size_per_gpu=2",
]


def _leaves(node, prefix=""):
    out = {}
    for key, value in node.items():
        if key == "_target_":
            continue
        path = f"{prefix}.{key}" if prefix else key
        if isinstance(value, dict) and value:
            out.update(_leaves(value, path))
        else:
            out[path] = value
    return out


def _typed(compose_config, *overrides):
    return validate_config(compose_config([*VALID, *overrides]), use_reference_policy=True, use_critic=True)


def test_default_family_is_dp(compose_config):
    """Without the override the tree is the FSDP family it always was (model_engine: dp)."""
    cfg = compose_config()
    assert cfg.model_engine == "dp"
    built = omega_conf_to_dataclass(migrate_legacy_reward_impl(cfg), PPOTrainerConfig)
    assert type(built.actor_rollout_ref.actor) is FSDPActorConfig
    assert type(built.actor_rollout_ref.ref) is FSDPRefConfig


def test_veomni_yaml_equals_the_veomni_dataclasses(compose_config, upstream_defaults):
    """Every key and default of the composed veomni actor/ref subtrees is the VeOmni dataclasses' (one home per
    default; upstream's optim.min_lr_ratio split on its YAML side), the engine blocks included; the reference
    engine is forward-only."""
    tree = OmegaConf.to_container(compose_config(["model_engine=veomni"]), resolve=True)
    arr = tree["actor_rollout_ref"]
    actor = upstream_defaults.with_yaml_side(VeOmniActorConfig(), prefix="actor_rollout_ref.actor")
    assert _leaves(arr["actor"]) == _leaves(dataclasses.asdict(actor))
    assert _leaves(arr["ref"]) == _leaves(dataclasses.asdict(VeOmniRefConfig()))
    assert arr["ref"]["veomni"]["forward_only"] is True
    assert set(arr["actor"]["veomni"]) - {"_target_"} == {f.name for f in dataclasses.fields(VeOmniEngineConfig)} - {
        "_target_"
    }


def test_veomni_family_builds_veomni_roles_and_an_fsdp2_critic(compose_config, upstream_defaults):
    """model_engine=veomni: the typed config is the default one with the VeOmni actor/ref and the FSDP2 critic
    (there is no VeOmni value engine)."""
    built = omega_conf_to_dataclass(
        migrate_legacy_reward_impl(compose_config(["model_engine=veomni"])), PPOTrainerConfig
    )
    expected = PPOTrainerConfig(
        model_engine="veomni",
        actor_rollout_ref=ActorRolloutRefConfig(actor=VeOmniActorConfig(), ref=VeOmniRefConfig()),
        critic=FSDPCriticConfig(strategy="fsdp2"),
    )
    assert built == upstream_defaults.with_yaml_side(expected)
    assert built.actor_rollout_ref.actor.engine_config is built.actor_rollout_ref.actor.veomni
    typed = _typed(compose_config, "model_engine=veomni", "actor_rollout_ref.actor.veomni.expert_parallel_size=2")
    assert typed.actor_rollout_ref.actor.veomni.expert_parallel_size == 2


def test_veomni_ulysses_is_accepted_and_drives_dispatch_and_reference(compose_config):
    """Invariant: veomni.ulysses_parallel_size=2 validates (VeOmni's own SP is wired); the reference follows the
    actor's size, and the actor's ulysses_sp_size (the workers' dispatch layout, rank // sp) is VeOmni's size."""
    typed = _typed(compose_config, "model_engine=veomni", "actor_rollout_ref.actor.veomni.ulysses_parallel_size=2")
    arr = typed.actor_rollout_ref
    assert arr.actor.veomni.ulysses_parallel_size == 2 and arr.ref.veomni.ulysses_parallel_size == 2
    assert arr.actor.ulysses_sp_size == 2


@pytest.mark.parametrize(
    ("overrides", "key", "fix"),
    [
        # strategy=veomni without the group: the FSDP family cannot hold VeOmni settings
        (["actor_rollout_ref.actor.strategy=veomni"], "actor_rollout_ref.actor.strategy", "model_engine=veomni"),
        # VeOmni's Ulysses SP shards the packed stream: without it, refused before Ray (not on every worker)
        (
            [
                "model_engine=veomni",
                "actor_rollout_ref.actor.veomni.ulysses_parallel_size=2",
                "actor_rollout_ref.model.use_remove_padding=false",
            ],
            "actor_rollout_ref.actor.veomni.ulysses_parallel_size",
            "use_remove_padding=True",
        ),
        # the reference follows the actor's SP size, so its own attention must have VeOmni's Ulysses variant
        (
            [
                "model_engine=veomni",
                "actor_rollout_ref.actor.veomni.ulysses_parallel_size=2",
                "actor_rollout_ref.ref.veomni.attn_implementation=sdpa",
            ],
            "actor_rollout_ref.ref.veomni.attn_implementation",
            "flash_attention_2",
        ),
        # the workers dispatch actor and reference rows by one (dp, sp) layout
        (
            [
                "model_engine=veomni",
                "actor_rollout_ref.actor.veomni.ulysses_parallel_size=2",
                "actor_rollout_ref.ref.veomni.ulysses_parallel_size=4",
            ],
            "actor_rollout_ref.ref.veomni.ulysses_parallel_size",
            "follows",
        ),
        (
            ["model_engine=veomni", "trainer.use_legacy_worker_impl=enable"],
            "trainer.use_legacy_worker_impl",
            "engine workers",
        ),
        (["model_engine=veomni", "critic.strategy=fsdp"], "critic.strategy", "must be fsdp2"),
        (["model_engine=veomni", "actor_rollout_ref.ref.strategy=fsdp2"], "actor_rollout_ref.ref.strategy", "veomni"),
    ],
)
def test_veomni_mistakes_name_the_key_and_the_fix(compose_config, overrides, key, fix):
    with pytest.raises(ConfigError, match="(?s)" + key.replace(".", r"\.") + ".*" + fix):
        _typed(compose_config, *overrides)


def test_auto_worker_impl_selects_the_engine_workers_for_veomni(compose_config, monkeypatch):
    """With trainer.use_legacy_worker_impl=auto (upstream scripts' default) a VeOmni actor gets the engine workers
    (the only path that runs it); the FSDP family keeps the legacy workers."""
    import ray

    from verl.trainer.main_ppo import TaskRunner
    from verl.trainer.ppo.utils import Role

    veomni = compose_config([*VALID, "model_engine=veomni", "trainer.device=npu"])
    dp = compose_config(VALID)
    monkeypatch.setattr(ray, "remote", lambda cls: cls)  # the mapping's classes themselves, no Ray actor wrapper
    module_of = {
        name: TaskRunner.role_worker_mapping(cfg)[Role.ActorRollout].__module__
        for name, cfg in (("veomni", veomni), ("dp", dp))
    }
    assert module_of == {"veomni": "verl.workers.engine_workers", "dp": "verl.workers.fsdp_workers"}
