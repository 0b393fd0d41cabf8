"""Typed configs of the trainer (`algorithm`, `data`, `trainer`, shared pieces) and the Hydra YAML tree.

`PPOTrainerConfig` / `ActorRolloutRefConfig` (the whole tree) import the worker configs, which import this
package; they are therefore loaded on first access instead of at import time.
"""

from verl.trainer.config.algorithm import AlgoConfig, KLControlConfig, PFPPOConfig, RolloutCorrectionConfig
from verl.trainer.config.config import BaseModelConfig, CheckpointConfig
from verl.trainer.config.data import CustomClsConfig, DataConfig, DatagenConfig, SamplerConfig
from verl.trainer.config.trainer import GlobalProfilerConfig, RayKwargsConfig, TrainerConfig
from verl.upstream_gaps import missing_name_getattr

__all__ = [
    "ActorRolloutRefConfig",
    "AlgoConfig",
    "BaseModelConfig",
    "CheckpointConfig",
    "CustomClsConfig",
    "DataConfig",
    "DatagenConfig",
    "GlobalProfilerConfig",
    "KLControlConfig",
    "PFPPOConfig",
    "PPOTrainerConfig",
    "RayKwargsConfig",
    "RolloutCorrectionConfig",
    "SamplerConfig",
    "TrainerConfig",
]

_LAZY = {"ActorRolloutRefConfig", "PPOTrainerConfig"}


_missing = missing_name_getattr(__name__)  # upstream names missing here raise with the reason


def __getattr__(name: str):
    if name in _LAZY:
        from verl.trainer.config import ppo_trainer

        return getattr(ppo_trainer, name)
    return _missing(name)
