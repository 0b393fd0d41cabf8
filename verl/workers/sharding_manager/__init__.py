"""Sharding managers: move trained weights into the rollout engine around generation (upstream layout)."""

from verl.workers.sharding_manager.base import BaseShardingManager
from verl.workers.sharding_manager.fsdp_hf import FSDPHFShardingManager

__all__ = ["BaseShardingManager", "FSDPHFShardingManager"]
