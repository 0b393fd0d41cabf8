"""The typed config validate_config builds is what the TaskRunner reads its data and reward settings from
(main_ppo.prepare_config returns it with the DictConfig), and it gives the same sampler and reward manager as
the DictConfig; the shuffle seed default is declared once, in verl.trainer.config.data."""

import torch

from verl.trainer.config.data import DEFAULT_SHUFFLE_SEED, DataConfig, shuffle_seed
from verl.trainer.config.ppo_trainer import PPOTrainerConfig
from verl.trainer.main_ppo import create_rl_sampler, validate_typed
from verl.trainer.ppo.reward import load_reward_manager


def test_validate_typed_returns_the_dataclass_tree(compose_config):
    """validate_typed (prepare_config's validation) keeps the PPOTrainerConfig instead of dropping it, and the tree
    survives the trip to the TaskRunner actor (Ray pickles arguments with cloudpickle)."""
    import ray.cloudpickle

    typed = validate_typed(compose_config(config_name="quickstart_cpu"))
    assert isinstance(typed, PPOTrainerConfig) and isinstance(typed.data, DataConfig)
    assert ray.cloudpickle.loads(ray.cloudpickle.dumps(typed)) == typed


def test_sampler_from_typed_and_dict_config_agree(compose_config):
    """Same shuffled order from typed.data and the DictConfig's data; with data.seed null the order is that of a
    generator seeded with 1 (torchdata's RandomSampler draws one randperm of the dataset length)."""
    config = compose_config(config_name="quickstart_cpu", overrides=["data.seed=null"])
    typed = validate_typed(config)
    dataset = list(range(10))
    from_typed = list(create_rl_sampler(typed.data, dataset))
    from_dict = list(create_rl_sampler(config.data, dataset))
    reference = torch.randperm(10, generator=torch.Generator().manual_seed(1)).tolist()
    assert from_typed == from_dict == reference


def test_shuffle_seed_default_is_declared_once():
    """null -> DEFAULT_SHUFFLE_SEED (1, upstream's); a set seed is kept."""
    assert DEFAULT_SHUFFLE_SEED == 1
    assert shuffle_seed(None) == 1 and shuffle_seed(7) == 7


def test_reward_manager_from_typed_and_dict_config_agree(compose_config):
    """load_reward_manager builds the same manager (class, reward_fn_key, scoring settings) from either form."""
    config = compose_config(config_name="quickstart_cpu")
    typed = validate_typed(config)
    a, b = load_reward_manager(typed, tokenizer=None), load_reward_manager(config, tokenizer=None)
    assert type(a) is type(b)
    assert a.reward_fn_key == b.reward_fn_key == "data_source"  # DataConfig.reward_fn_key's default
    assert a.compute_score is b.compute_score  # quickstart sets no reward file: default_compute_score
    assert a.compute_score_timeout == b.compute_score_timeout == 300.0  # RewardConfig's default
