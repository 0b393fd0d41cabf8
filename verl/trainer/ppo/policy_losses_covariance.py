"""Covariance-targeted PPO losses ``clip_cov`` and ``kl_cov`` ("The Entropy Mechanism of RL for Reasoning LMs",
arXiv:2505.22617).

Entropy collapse is driven by tokens where the advantage and the log-probability co-vary strongly. Both losses
compute, per valid token, cov = (A − mean A)·(log π − mean log π) (means over the valid tokens of the
micro-batch) and treat a small fraction of high-covariance tokens specially:

* ``clip_cov``: among tokens not already clipped by PPO with lb < cov < ub (``policy_loss.clip_cov_lb/ub``),
  a random ``clip_cov_ratio`` fraction (at least one) has its loss — hence its gradient — removed.
* ``kl_cov``: the top ``kl_cov_ratio`` fraction (at least one) by cov gets a penalty ``ppo_kl_coef·|log r|`` on
  top of the unclipped policy-gradient loss −A·r.
"""

from __future__ import annotations

from typing import Any

import torch

from verl.trainer.ppo.loss_aggregation import agg_loss
from verl.trainer.ppo.policy_loss_registry import agg_kwargs, clip_ratio_bounds, register_policy_loss, require_config
from verl.trainer.ppo.policy_losses import check_policy_loss_inputs, clamped_log_ratio
from verl.utils import torch_functional as verl_F


def token_covariance(advantages: torch.Tensor, log_prob: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    """cov_t = (A_t − mean A)·(log π_t − mean log π), means over valid tokens; ``(bs, T)``, no autograd."""
    with torch.no_grad():
        centred_adv = advantages - verl_F.masked_mean(advantages, response_mask)
        centred_logp = log_prob.detach() - verl_F.masked_mean(log_prob.detach(), response_mask)
        return centred_adv * centred_logp


def _positive_ratio(value: float | None, key: str) -> float:
    if value is None or not value > 0:
        raise ValueError(f"actor_rollout_ref.actor.policy_loss.{key} must be > 0, got {value}.")
    return value


@register_policy_loss("clip_cov")
def compute_policy_loss_clip_cov(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "token-mean",
    config: Any = None,
    rollout_is_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, Any]]:
    """Clip-Cov: PPO clip, plus detaching a random few high-covariance tokens (see module docstring).

    Metrics: ``actor/pg_clipfrac`` is the fraction of tokens detached by the covariance rule.
    """
    where = "compute_policy_loss_clip_cov"
    config = require_config(where, config)
    check_policy_loss_inputs(where, old_log_prob, log_prob, advantages, response_mask, rollout_is_weights)
    ratio_of_tokens = _positive_ratio(config.policy_loss.clip_cov_ratio, "clip_cov_ratio")
    clip_low, clip_high = clip_ratio_bounds(config)
    log_ratio = clamped_log_ratio(log_prob, old_log_prob)
    ratio = torch.exp(log_ratio)
    unclipped = -advantages * ratio
    clipped = -advantages * torch.clamp(ratio, 1.0 - clip_low, 1.0 + clip_high)
    valid = response_mask > 0
    cov = token_covariance(advantages, log_prob, response_mask)
    in_band = (cov > config.policy_loss.clip_cov_lb) & (cov < config.policy_loss.clip_cov_ub)
    candidates = torch.nonzero(in_band & valid & ~(clipped > unclipped))
    budget = max(int(ratio_of_tokens * valid.sum().item()), 1)
    chosen = candidates[torch.randperm(len(candidates), device=candidates.device)[:budget]]
    keep = torch.ones_like(advantages)
    keep[chosen[:, 0], chosen[:, 1]] = 0.0
    losses = torch.maximum(unclipped, clipped) * keep
    if rollout_is_weights is not None:
        losses = losses * rollout_is_weights
    pg_loss = agg_loss(losses, response_mask, loss_agg_mode, **agg_kwargs(config))
    return pg_loss, {
        "actor/pg_clipfrac": verl_F.masked_mean((keep == 0).float(), response_mask).item(),
        "actor/ppo_kl": verl_F.masked_mean(-log_ratio.detach(), response_mask).item(),
    }


@register_policy_loss("kl_cov")
def compute_policy_loss_kl_cov(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "token-mean",
    config: Any = None,
    rollout_is_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, Any]]:
    """KL-Cov: −A·r everywhere, plus ``ppo_kl_coef·|log r|`` on the top-covariance tokens (see module docstring).

    Metrics: ``actor/ppo_kl`` here is mean |log r| over valid tokens.
    """
    where = "compute_policy_loss_kl_cov"
    config = require_config(where, config)
    check_policy_loss_inputs(where, old_log_prob, log_prob, advantages, response_mask, rollout_is_weights)
    ratio_of_tokens = _positive_ratio(config.policy_loss.kl_cov_ratio, "kl_cov_ratio")
    log_ratio = clamped_log_ratio(log_prob, old_log_prob)
    losses = -advantages * torch.exp(log_ratio)
    valid = response_mask > 0
    num_valid = int(valid.sum().item())
    if num_valid > 0:
        cov = token_covariance(advantages, log_prob, response_mask).masked_fill(~valid, -torch.inf)
        top = torch.topk(cov.flatten(), max(1, int(num_valid * ratio_of_tokens))).indices
        penalised = torch.zeros(cov.numel(), dtype=torch.bool, device=cov.device)
        penalised[top] = True
        penalty = config.policy_loss.ppo_kl_coef * log_ratio.abs()
        losses = torch.where(penalised.view_as(losses), losses + penalty, losses)
    if rollout_is_weights is not None:
        losses = losses * rollout_is_weights
    pg_loss = agg_loss(losses, response_mask, loss_agg_mode, **agg_kwargs(config))
    return pg_loss, {"actor/ppo_kl": verl_F.masked_mean(log_ratio.detach().abs(), response_mask).item()}
