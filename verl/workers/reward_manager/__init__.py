"""Reward managers (upstream ``verl.workers.reward_manager``): turn a rollout batch into token-level rewards.

Registered names: ``naive`` (one call per sample), ``batch`` (one call per batch), ``dapo`` (naive + overlong
penalty). ``register(name)`` adds user classes; ``get_reward_manager_cls(name)`` looks them up.
"""

from verl.workers.reward_manager.abstract import AbstractRewardManager
from verl.workers.reward_manager.batch import BatchRewardManager
from verl.workers.reward_manager.dapo import DAPORewardManager
from verl.workers.reward_manager.naive import NaiveRewardManager
from verl.workers.reward_manager.registry import REWARD_MANAGER_REGISTRY, get_reward_manager_cls, register

__all__ = [
    "AbstractRewardManager",
    "BatchRewardManager",
    "DAPORewardManager",
    "NaiveRewardManager",
    "REWARD_MANAGER_REGISTRY",
    "get_reward_manager_cls",
    "register",
]
