"""Compose verl/trainer/config/ppo_trainer.yaml with Hydra's compose API (what main_ppo sees)."""

from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

import verl

CONFIG_DIR = Path(verl.__file__).parent / "trainer" / "config"


def compose_ppo(overrides=(), config_name="ppo_trainer"):
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base=None):
        return compose(config_name=config_name, overrides=list(overrides))


@pytest.fixture
def compose_config():
    return compose_ppo
