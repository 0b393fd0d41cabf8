"""RLDatasetConfig: reads the data.* node in any form, validates its values, and keeps the same defaults as the
trainer's DataConfig (so the dataset never disagrees with ppo_trainer.yaml)."""

import dataclasses

import pytest
from omegaconf import OmegaConf

from verl.utils.dataset.dataset_config import RLDatasetConfig


def test_from_dictconfig_ignores_unrelated_keys_and_nulls():
    """Only the dataset's own keys are read; a null value keeps the default."""
    node = OmegaConf.create({"max_prompt_length": 64, "train_batch_size": 8, "seed": None, "truncation": "left"})
    config = RLDatasetConfig.from_data_config(node)
    assert (config.max_prompt_length, config.truncation, config.seed) == (64, "left", None)


def test_validation_names_the_data_key():
    """Bad values are ValueErrors naming data.<key>."""
    with pytest.raises(ValueError, match=r"data\.max_prompt_length: must be > 0"):
        RLDatasetConfig.from_data_config({"max_prompt_length": 0})
    with pytest.raises(ValueError, match=r"data\.truncation"):
        RLDatasetConfig.from_data_config({"truncation": "cut"})


def test_defaults_match_trainer_data_config():
    """Every shared field has the same default as verl.trainer.config.DataConfig (one source of truth)."""
    data_module = pytest.importorskip("verl.trainer.config.data")
    data_config = data_module.DataConfig()
    for field in dataclasses.fields(RLDatasetConfig):
        if field.name != "_target_" and field.name in data_config:
            assert getattr(RLDatasetConfig(), field.name) == data_config[field.name], field.name
