"""Critics of the legacy worker path (upstream names)."""

from verl.workers.critic.base import BasePPOCritic
from verl.workers.critic.dp_critic import DataParallelPPOCritic

__all__ = ["BasePPOCritic", "DataParallelPPOCritic"]
