"""Upstream v0.7.1's module path of ``RewardModelConfig`` (``verl.workers.config.reward_model``); the class lives
in ``verl.workers.config.reward`` with the rest of the ``reward`` tree."""

from verl.workers.config.reward import RewardModelConfig

__all__ = ["RewardModelConfig"]
