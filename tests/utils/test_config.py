"""omega_conf_to_dataclass and validate_config: unknown keys and bad batch settings fail before Ray, naming the key."""

import dataclasses
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from hydra.errors import ConfigCompositionException
from omegaconf import OmegaConf

import verl
from verl.trainer.config import AlgoConfig, KLControlConfig, PPOTrainerConfig
from verl.trainer.config.legacy_reward import migrate_legacy_reward_impl
from verl.utils.config import omega_conf_to_dataclass, validate_config
from verl.workers.config import FSDPActorConfig, FSDPOptimizerConfig

CONFIG_DIR = str(Path(verl.__file__).parent / "trainer" / "config")

# A valid small run: 2 workers, 16 prompts x 4 responses = 64 responses (64 % 2 == 0);
# actor mini-batch 8 prompts x 4 = 32 responses / 2 ranks = 16 per rank, micro 4 divides 16.
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
    "trainer.device=cpu",
    "actor_rollout_ref.actor.strategy=fsdp2",
]


def compose_ppo(*overrides, base=GOOD):
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base=None):
        return compose(config_name="ppo_trainer", overrides=[*base, *overrides])


def to_typed(cfg):
    """The whole tree as PPOTrainerConfig (legacy reward sections migrated first, as main_ppo does)."""
    return omega_conf_to_dataclass(migrate_legacy_reward_impl(cfg), PPOTrainerConfig)


def validate(*overrides, use_reference_policy=True, use_critic=True, base=GOOD):
    return validate_config(compose_ppo(*overrides, base=base), use_reference_policy, use_critic)


# ---------------------------------------------------------------- omega_conf_to_dataclass
def test_target_selects_the_class_and_nested_nodes_follow_annotations():
    """With no dataclass_type the node's _target_ picks the class; nested dicts become their annotated classes."""
    cfg = OmegaConf.create(
        {"_target_": "verl.trainer.config.AlgoConfig", "gamma": 0.99, "kl_ctrl": {"type": "adaptive", "kl_coef": 0.2}}
    )
    algo = omega_conf_to_dataclass(cfg)
    assert isinstance(algo, AlgoConfig)
    assert algo.gamma == 0.99 and algo.lam == 1.0
    assert algo.kl_ctrl == KLControlConfig(type="adaptive", kl_coef=0.2)
    assert algo["kl_ctrl"]["kl_coef"] == 0.2  # Mapping access as upstream code expects


def test_explicit_type_empty_node_and_passthrough():
    """An explicit dataclass_type works without _target_; empty -> defaults; an instance is returned unchanged."""
    optim = omega_conf_to_dataclass({"lr": 1e-5, "betas": [0.9, 0.95]}, FSDPOptimizerConfig)
    assert optim.lr == 1e-5 and optim.betas == [0.9, 0.95]
    assert omega_conf_to_dataclass(None, FSDPOptimizerConfig) == FSDPOptimizerConfig()
    assert omega_conf_to_dataclass(optim) is optim


def test_node_without_target_is_its_fields_default_class():
    """`actor` is annotated with the base ActorConfig and defaults to FSDPActorConfig: a plain node (no _target_)
    builds that default class, so its FSDP keys are known; a _target_ in the node picks another subclass; a node
    with FSDP keys under the VeOmni class is refused naming the key."""
    from verl.base_config import ConfigError
    from verl.trainer.config.ppo_trainer import ActorRolloutRefConfig
    from verl.workers.config import VeOmniActorConfig

    plain = omega_conf_to_dataclass({"actor": {"fsdp_config": {"param_offload": True}}}, ActorRolloutRefConfig)
    assert type(plain.actor) is FSDPActorConfig and plain.actor.fsdp_config.param_offload
    veomni = {"_target_": "verl.workers.config.VeOmniActorConfig", "veomni": {"expert_parallel_size": 2}}
    ref = {"_target_": "verl.workers.config.VeOmniRefConfig"}
    picked = omega_conf_to_dataclass({"actor": veomni, "ref": ref}, ActorRolloutRefConfig)
    assert type(picked.actor) is VeOmniActorConfig and picked.actor.engine_config.expert_parallel_size == 2
    with pytest.raises(ConfigError, match="actor.fsdp_config: unknown config key"):
        omega_conf_to_dataclass({"actor": {**veomni, "fsdp_config": {}}, "ref": ref}, ActorRolloutRefConfig)


def test_plain_dataclasses_nested_and_from_dotlist():
    """Any dataclass works (not only BaseConfig): nested fields, dict fields and CLI-style dotlist overrides."""

    @dataclasses.dataclass
    class Model:
        hidden_size: int = 0
        activation: str = "relu"

    @dataclasses.dataclass
    class Train:
        batch_size: int = 1
        model: Model = dataclasses.field(default_factory=Model)
        override_config: dict = dataclasses.field(default_factory=dict)

    cfg = OmegaConf.merge(
        OmegaConf.create({"batch_size": 4, "model": {"hidden_size": 8}, "override_config": {"a": 1}}),
        OmegaConf.from_dotlist(["model.activation=gelu"]),
    )
    train = omega_conf_to_dataclass(cfg, Train)
    assert train == Train(batch_size=4, model=Model(hidden_size=8, activation="gelu"), override_config={"a": 1})


def test_unknown_key_in_plain_dict_names_key_and_suggestion():
    """A key that is no field raises ValueError naming it and the closest field."""
    with pytest.raises(ValueError, match=r"ppo_mini_batchsize: unknown config key. Did you mean: ppo_mini_batch_size"):
        omega_conf_to_dataclass({"ppo_mini_batchsize": 8}, FSDPActorConfig)


def test_hydra_rejects_unknown_override_naming_the_key():
    """Struct mode: `key=value` for a key absent from the YAML fails in Hydra, and the message names the key."""
    with pytest.raises(ConfigCompositionException, match=r"actor_rollout_ref\.actor\.ppo_mini_batchsize"):
        compose_ppo("actor_rollout_ref.actor.ppo_mini_batchsize=8")


def test_plus_added_key_is_rejected_with_full_path():
    """`+key=value` passes Hydra, but omega_conf_to_dataclass rejects it with the full key path."""
    cfg = compose_ppo("+actor_rollout_ref.actor.fsdp_config.param_ofload=true")
    with pytest.raises(ValueError) as info:
        to_typed(cfg)
    message = str(info.value)
    assert message.startswith("actor_rollout_ref.actor.fsdp_config.param_ofload: unknown config key")
    assert "Did you mean: param_offload" in message


def test_plus_added_key_on_a_subnode_uses_the_node_path():
    """Converting a sub-node (as workers do) still names the full path of the offending key."""
    cfg = compose_ppo("+critic.optim.learning_rate=1e-5")
    with pytest.raises(ValueError, match=r"^critic\.optim\.learning_rate: unknown config key"):
        omega_conf_to_dataclass(cfg.critic)


def test_plus_added_key_is_rejected_by_validate_config():
    """validate_config (what main_ppo runs before ray.init) rejects `+` keys too."""
    with pytest.raises(ValueError, match=r"^trainer\.total_epoch: unknown config key. Did you mean: total_epochs"):
        validate("+trainer.total_epoch=3")


def test_value_type_is_checked_with_key_path():
    """A value of the wrong type is rejected naming the key (bool where an int is expected)."""
    with pytest.raises(ValueError, match=r"^actor_rollout_ref\.actor\.ppo_epochs: expected an integer, got True"):
        to_typed(compose_ppo("actor_rollout_ref.actor.ppo_epochs=true"))


def test_numbers_are_coerced_where_lossless():
    """`1e4` (a float on the command line) is accepted for an int field; an int is accepted for a float field;
    an int experiment name becomes a string."""
    cfg = to_typed(
        compose_ppo(
            "actor_rollout_ref.actor.ppo_max_token_len_per_gpu=1e4",
            "actor_rollout_ref.actor.optim.lr=1",
            "trainer.experiment_name=2024",
        )
    )
    assert cfg.actor_rollout_ref.actor.ppo_max_token_len_per_gpu == 10000
    assert isinstance(cfg.actor_rollout_ref.actor.optim.lr, float)
    assert cfg.trainer.experiment_name == "2024"


def test_post_init_errors_get_the_full_key_path():
    """A dataclass check (loss_agg_mode choice) surfaces as ValueError naming the full key and the choices."""
    with pytest.raises(ValueError, match=r"^actor_rollout_ref\.actor\.loss_agg_mode: 'mean' is not supported"):
        to_typed(compose_ppo("actor_rollout_ref.actor.loss_agg_mode=mean"))


def test_target_of_the_wrong_class_is_rejected():
    """A _target_ that is not the annotated class (or a subclass) is an error naming the node."""
    with pytest.raises(ValueError, match=r"^algorithm\._target_: .*is not a AlgoConfig"):
        to_typed(compose_ppo("algorithm._target_=verl.trainer.config.TrainerConfig", "~algorithm.kl_ctrl"))


def test_non_dataclass_target_is_instantiated_by_hydra():
    """A `_target_` naming a plain callable is called by Hydra (upstream behaviour for user factories)."""
    assert omega_conf_to_dataclass({"_target_": "builtins.dict", "a": 1}) == {"a": 1}


# ---------------------------------------------------------------- validate_config
def test_valid_config_passes_and_returns_typed_config():
    """The GOOD settings pass and come back as a PPOTrainerConfig with the overrides applied."""
    cfg = validate()
    assert isinstance(cfg, PPOTrainerConfig)
    assert cfg.actor_rollout_ref.actor.fsdp_config.strategy == "fsdp2"
    assert cfg.trainer.device == "cpu" and cfg.actor_rollout_ref.rollout.name == "hf"


def test_missing_rollout_name():
    """rollout.name is mandatory (`???` in the YAML)."""
    base = [o for o in GOOD if not o.startswith("actor_rollout_ref.rollout.name")]
    with pytest.raises(ValueError, match=r"^actor_rollout_ref\.rollout\.name: is mandatory"):
        validate(base=base)


def test_train_batch_times_n_must_divide_over_gpus():
    """train_batch_size * rollout.n must split evenly over n_gpus: 3 * 4 = 12 responses over 8 workers fails."""
    with pytest.raises(ValueError, match=r"^data\.train_batch_size: \(3\) \* actor_rollout_ref\.rollout\.n \(4\) = 12"):
        validate(
            "data.train_batch_size=3", "trainer.n_gpus_per_node=8", "actor_rollout_ref.actor.ppo_mini_batch_size=1"
        )


def test_mini_batch_times_n_must_divide_over_dp():
    """ppo_mini_batch_size * rollout.n over dp ranks: 3 prompts * 1 response = 3 responses over 2 ranks fails."""
    with pytest.raises(ValueError) as info:
        validate("actor_rollout_ref.rollout.n=1", "actor_rollout_ref.actor.ppo_mini_batch_size=3")
    assert str(info.value).startswith(
        "actor_rollout_ref.actor.ppo_mini_batch_size: (3) * rollout.n (1) = 3 responses must be divisible by the "
        "data-parallel size 2"
    )


def test_micro_batch_must_divide_the_per_rank_mini_batch():
    """8 prompts * 4 / 2 ranks = 16 responses per rank; a micro-batch of 3 does not divide 16."""
    with pytest.raises(ValueError, match=r"^actor_rollout_ref\.actor\.ppo_micro_batch_size_per_gpu: \(3\) .* = 16"):
        validate("actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=3")


def test_mini_batch_larger_than_train_batch():
    """ppo_mini_batch_size (32 prompts) cannot exceed data.train_batch_size (16 prompts)."""
    with pytest.raises(ValueError, match=r"^actor_rollout_ref\.actor\.ppo_mini_batch_size: \(32 prompts\) must be <="):
        validate("actor_rollout_ref.actor.ppo_mini_batch_size=32")


def test_micro_batch_unset_without_dynamic_bsz():
    """Without dynamic batching the actor needs a micro-batch size; the message names the key and the fix."""
    with pytest.raises(
        ValueError,
        match=r"^actor_rollout_ref\.actor\.ppo_micro_batch_size_per_gpu: is not set.*"
        r"actor_rollout_ref\.actor\.use_dynamic_bsz",
    ):
        validate("actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=null")


def test_both_micro_batch_forms_set():
    """The deprecated global micro-batch size and the per-GPU one are mutually exclusive."""
    with pytest.raises(
        ValueError,
        match=r"^actor_rollout_ref\.actor\.ppo_micro_batch_size: \(8\) and "
        r"actor_rollout_ref\.actor\.ppo_micro_batch_size_per_gpu \(4\) are both set",
    ):
        validate("actor_rollout_ref.actor.ppo_micro_batch_size=8")


def test_log_prob_micro_batch_of_rollout_and_ref():
    """rollout (always) and ref (only when used) need a log-prob micro-batch size without dynamic batching."""
    with pytest.raises(ValueError, match=r"^actor_rollout_ref\.rollout\.log_prob_micro_batch_size_per_gpu: is not set"):
        validate("actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=null")
    with pytest.raises(ValueError, match=r"^actor_rollout_ref\.ref\.log_prob_micro_batch_size_per_gpu: is not set"):
        validate("actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=null")
    validate("actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=null", use_reference_policy=False)


def test_critic_checked_only_when_used():
    """The critic's batch settings are validated only when a critic is used."""
    with pytest.raises(ValueError, match=r"^critic\.ppo_micro_batch_size_per_gpu: is not set"):
        validate("critic.ppo_micro_batch_size_per_gpu=null")
    validate("critic.ppo_micro_batch_size_per_gpu=null", use_critic=False)


def test_dynamic_bsz_needs_a_budget_that_fits_one_sequence():
    """With use_dynamic_bsz a micro-batch holds >= 1 sequence: 512 + 512 = 1024 tokens > a budget of 1000."""
    dynamic = ["actor_rollout_ref.actor.use_dynamic_bsz=true", "actor_rollout_ref.actor.ppo_max_token_len_per_gpu=1000"]
    with pytest.raises(ValueError, match=r"^actor_rollout_ref\.actor\.ppo_max_token_len_per_gpu: \(1000\) .* = 1024"):
        validate(*dynamic, use_critic=False)
    # Ulysses SP 2 splits each sequence over 2 ranks: 2 * 1000 >= 1024 fits.
    validate(*dynamic, "actor_rollout_ref.actor.ulysses_sequence_parallel_size=2", use_critic=False)


def test_dynamic_bsz_without_budget():
    """use_dynamic_bsz with a null token budget fails naming ppo_max_token_len_per_gpu."""
    with pytest.raises(ValueError, match=r"^actor_rollout_ref\.actor\.ppo_max_token_len_per_gpu"):
        validate("actor_rollout_ref.actor.use_dynamic_bsz=true", "actor_rollout_ref.actor.ppo_max_token_len_per_gpu=0")


def test_sequence_parallel_needs_remove_padding():
    """Ulysses SP > 1 needs the packed forward; the fix names actor_rollout_ref.model.use_remove_padding."""
    with pytest.raises(ValueError, match=r"^actor_rollout_ref\.actor\.ulysses_sequence_parallel_size: \(2\) > 1 needs"):
        validate(
            "actor_rollout_ref.actor.ulysses_sequence_parallel_size=2",
            "actor_rollout_ref.model.use_remove_padding=false",
        )


def test_model_based_reward_is_rejected():
    """reward.reward_model.enable=True fails early (this distribution ships rule-based rewards only)."""
    with pytest.raises(ValueError, match=r"^reward\.reward_model\.enable"):
        validate("reward.reward_model.enable=true")


def test_legacy_reward_keys_are_migrated_by_validate_config():
    """Upstream's legacy custom_reward_function.path is accepted and lands in reward.custom_reward_function."""
    cfg = validate("custom_reward_function.path=/tmp/my_reward.py", "reward_model.reward_manager=dapo")
    assert cfg.reward.custom_reward_function.path == "/tmp/my_reward.py"
    assert cfg.reward.reward_manager.name == "dapo"


def test_entry_point_fails_before_ray_naming_the_key(tmp_path):
    """`python -m verl.trainer.main_ppo` with a `+` typo exits with the full key in the message and never starts Ray
    (main_ppo runs validate_config on the driver before ray.init; the batch checks share that path and are covered
    in-process above)."""
    import subprocess
    import sys

    command = [
        sys.executable,
        "-m",
        "verl.trainer.main_ppo",
        "actor_rollout_ref.rollout.name=hf",
        "trainer.device=cpu",
        "+trainer.total_epoch=3",
        f"hydra.run.dir={tmp_path}",
    ]
    result = subprocess.run(command, capture_output=True, text=True, timeout=300, cwd=tmp_path)
    output = result.stdout + result.stderr
    assert result.returncode != 0
    assert "trainer.total_epoch: unknown config key. Did you mean: total_epochs" in output, output[-2000:]
    assert "Started a local Ray instance" not in output
