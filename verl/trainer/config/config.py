"""Upstream's import path of the config pieces shared by several roles (checkpoint contents, the common model-path
block); they are defined in ``verl.workers.config.common``, below the trainer's config."""

from verl.workers.config.common import CHECKPOINT_CONTENTS, BaseModelConfig, CheckpointConfig

__all__ = ["CHECKPOINT_CONTENTS", "BaseModelConfig", "CheckpointConfig"]
