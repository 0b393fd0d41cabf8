"""Diagnostics of a training run (upstream's ``verl.utils.debug`` names)."""

from verl.utils.debug.metrics import calculate_rollout_probs_diff_metrics
from verl.utils.debug.performance import memory_metrics

__all__ = ["calculate_rollout_probs_diff_metrics", "memory_metrics"]
