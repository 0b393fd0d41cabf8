"""How far the rollout engine's token probabilities are from the trainer's (the training-inference mismatch).

When the rollout returns the log-prob of every token it sampled (``rollout.calculate_log_probs=True``), the trainer's
old-log-prob pass computes the same quantity with the training stack (other kernels, other precision). Their gap is
what rollout correction and router replay exist to control, and a sudden jump in it is the first sign of a broken
weight sync.
"""

from __future__ import annotations

import torch

__all__ = ["calculate_rollout_probs_diff_metrics"]


def calculate_rollout_probs_diff_metrics(data) -> dict[str, float]:
    """Upstream's ``training/rollout_*`` metrics over the valid response tokens of a batch.

    With ``p_r = exp(rollout_log_probs)`` and ``p_a = exp(old_log_probs)`` per token (response mask applied):

    * ``training/rollout_probs_diff_{max,mean,std}``: of ``|p_r - p_a|`` (probabilities, as upstream);
    * ``training/rollout_actor_probs_pearson_corr``: Pearson correlation of ``p_r`` and ``p_a``;
    * ``training/rollout_log_probs_diff_{mean,max}``: of ``|log p_r - log p_a|`` (nats; not an upstream name).

    E.g. p_r = [0.5, 0.2], p_a = [0.4, 0.2] -> diff [0.1, 0.0]: max 0.1, mean 0.05, std 0.0707 (unbiased). An empty
    mask returns ``{}``; the correlation is omitted when either side is constant.
    """
    mask = data.batch["response_mask"].bool()
    rollout = data.batch["rollout_log_probs"].float()[mask]
    actor = data.batch["old_log_probs"].float()[mask]
    if rollout.numel() == 0:
        return {}
    p_rollout, p_actor = rollout.exp(), actor.exp()
    diff = (p_rollout - p_actor).abs()
    log_diff = (rollout - actor).abs()
    metrics = {
        "training/rollout_probs_diff_max": diff.max().item(),
        "training/rollout_probs_diff_mean": diff.mean().item(),
        "training/rollout_probs_diff_std": diff.std().item() if diff.numel() > 1 else 0.0,
        "training/rollout_log_probs_diff_mean": log_diff.mean().item(),
        "training/rollout_log_probs_diff_max": log_diff.max().item(),
    }
    if diff.numel() > 1 and p_rollout.std() > 0 and p_actor.std() > 0:
        stacked = torch.stack([p_rollout, p_actor])
        metrics["training/rollout_actor_probs_pearson_corr"] = torch.corrcoef(stacked)[0, 1].item()
    return metrics
