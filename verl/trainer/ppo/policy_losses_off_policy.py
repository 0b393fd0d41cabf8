"""Policy losses for off-policy / rollout-mismatch training: DPPO (``dppo_tv``, ``dppo_kl``), REINFORCE with
importance weights (``compute_policy_loss_reinforce``, not registered) and ``bypass_mode``.

DPPO (arXiv:2602.04879) replaces PPO's ratio clip by a trust region on the *probability* of the sampled token:
a token contributes −A·sg(min(r, c))·log π_θ only while π_θ has not moved past a divergence bound from π_old in
the direction the advantage pushes it; otherwise its loss (and gradient) is masked out. The ratio is truncated
at ``clip_ratio_c`` (truncated importance sampling) instead of PPO's dual clip. For DPPO, ``clip_ratio_low/high``
are divergence thresholds, not ratio clips.
"""

from __future__ import annotations

from typing import Any

import torch

from verl.trainer.ppo.loss_aggregation import agg_loss
from verl.trainer.ppo.policy_loss_registry import agg_kwargs, clip_ratio_bounds, register_policy_loss, require_config
from verl.trainer.ppo.policy_losses import check_policy_loss_inputs, clamped_log_ratio, compute_policy_loss_vanilla
from verl.utils import torch_functional as verl_F


def _dppo_loss(
    trust_region: torch.Tensor,
    log_ratio: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str,
    config: Any,
    rollout_is_weights: torch.Tensor | None,
) -> tuple[torch.Tensor, dict[str, Any]]:
    """Shared DPPO tail: L = −A · sg(min(r, c)) · log π_θ · inside, aggregated; plus metrics."""
    ratio = torch.exp(log_ratio)
    truncated = torch.clamp(ratio, max=config.clip_ratio_c).detach()
    inside = trust_region.detach().to(log_prob.dtype)
    losses = -advantages * truncated * log_prob * inside
    if rollout_is_weights is not None:
        losses = losses * rollout_is_weights
    pg_loss = agg_loss(losses, response_mask, loss_agg_mode, **agg_kwargs(config))
    return pg_loss, {
        "actor/pg_clipfrac": verl_F.masked_mean(1.0 - inside, response_mask).item(),
        "actor/ppo_kl": verl_F.masked_mean(-log_ratio.detach(), response_mask).item(),
        "actor/pg_clipfrac_lower": verl_F.masked_mean(
            (ratio > config.clip_ratio_c).float() * inside, response_mask
        ).item(),
    }


@register_policy_loss("dppo_tv")
def compute_policy_loss_dppo_tv(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "token-mean",
    config: Any = None,
    rollout_is_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, Any]]:
    """DPPO-Binary-TV: inside while π_θ − π_old ≤ δ_high (A > 0) or ≥ −δ_low (A ≤ 0)."""
    where = "compute_policy_loss_dppo_tv"
    config = require_config(where, config)
    check_policy_loss_inputs(where, old_log_prob, log_prob, advantages, response_mask, rollout_is_weights)
    delta_low, delta_high = clip_ratio_bounds(config)
    prob_shift = torch.exp(log_prob) - torch.exp(old_log_prob)
    inside = torch.where(advantages > 0, prob_shift <= delta_high, prob_shift >= -delta_low)
    log_ratio = clamped_log_ratio(log_prob, old_log_prob)
    return _dppo_loss(inside, log_ratio, log_prob, advantages, response_mask, loss_agg_mode, config, rollout_is_weights)


def binary_kl(old_log_prob: torch.Tensor, log_prob: torch.Tensor) -> torch.Tensor:
    """KL between the Bernoulli distributions (p_old, 1 − p_old) and (p, 1 − p) of "this token is sampled".

    KL = p_old·log(p_old/p) + (1 − p_old)·log((1 − p_old)/(1 − p)); 1e-8 keeps the second log finite at p → 1.
    """
    p_old, p = torch.exp(old_log_prob), torch.exp(log_prob)
    return p_old * (old_log_prob - log_prob) + (1.0 - p_old) * torch.log((1.0 - p_old + 1e-8) / (1.0 - p + 1e-8))


@register_policy_loss("dppo_kl")
def compute_policy_loss_dppo_kl(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "token-mean",
    config: Any = None,
    rollout_is_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, Any]]:
    """DPPO-Binary-KL: inside while the binary KL ≤ δ_high (A > 0, π rising) or ≤ δ_low (A ≤ 0, π falling);
    moving against the advantage's push is always inside."""
    where = "compute_policy_loss_dppo_kl"
    config = require_config(where, config)
    check_policy_loss_inputs(where, old_log_prob, log_prob, advantages, response_mask, rollout_is_weights)
    delta_low, delta_high = clip_ratio_bounds(config)
    divergence = binary_kl(old_log_prob, log_prob)
    rising = log_prob >= old_log_prob
    falling = log_prob <= old_log_prob
    inside = torch.where(advantages > 0, (divergence <= delta_high) | falling, (divergence <= delta_low) | rising)
    log_ratio = clamped_log_ratio(log_prob, old_log_prob)
    return _dppo_loss(inside, log_ratio, log_prob, advantages, response_mask, loss_agg_mode, config, rollout_is_weights)


def compute_policy_loss_reinforce(
    rollout_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "seq-mean-token-sum",
    config: Any = None,
    rollout_is_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, Any]]:
    """REINFORCE: L = −A·log π_θ, times the (constant) rollout IS weights w = π_θ/π_rollout when given.

    Metrics: ``actor/ppo_kl`` = mean(log π_rollout − log π_θ).
    """
    where = "compute_policy_loss_reinforce"
    config = require_config(where, config)
    check_policy_loss_inputs(where, rollout_log_prob, log_prob, advantages, response_mask, rollout_is_weights)
    losses = -advantages * log_prob
    if rollout_is_weights is not None:
        losses = losses * rollout_is_weights.detach()
    pg_loss = agg_loss(losses, response_mask, loss_agg_mode, **agg_kwargs(config))
    kl = verl_F.masked_mean((rollout_log_prob - log_prob).detach(), response_mask)
    return pg_loss, {"actor/ppo_kl": kl.item()}


def _rollout_correction_settings(config: Any) -> Any:
    corr = getattr(getattr(config, "policy_loss", None), "rollout_correction", None)
    if corr is None:
        raise ValueError(
            "policy_loss.loss_mode='bypass_mode' needs the rollout-correction settings: set "
            "algorithm.rollout_correction.bypass_mode=True (the trainer then selects this loss and sends "
            "algorithm.rollout_correction to the actor) instead of selecting loss_mode=bypass_mode by hand."
        )
    return corr


@register_policy_loss("bypass_mode")
def compute_policy_loss_bypass_mode(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "token-mean",
    config: Any = None,
    rollout_is_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, Any]]:
    """Bypass mode: ``old_log_prob`` *is* the rollout log-prob (no recomputation by the actor).

    The weights and the rejection mask of ``config.policy_loss.rollout_correction`` (``rollout_is``,
    ``rollout_is_threshold``, ``rollout_is_batch_normalize``, ``rollout_rs``, ``rollout_rs_threshold``) are computed
    here from the *current* π_θ against π_rollout (``rollout_corr_helper``); rejected tokens leave the loss mask.
    ``loss_type`` ``"ppo_clip"``: vanilla PPO on π_θ/π_rollout without the weights (the ratio already is the
    correction; weighting again would count it twice); ``"reinforce"``: ``−sg(w)·A·log π_θ``. The
    ``rollout_is_weights`` argument is ignored. Metrics: the loss's own plus ``rollout_corr/*``.
    """
    from verl.trainer.ppo.rollout_corr_helper import compute_rollout_correction_and_rejection_mask

    where = "compute_policy_loss_bypass_mode"
    config = require_config(where, config)
    corr = _rollout_correction_settings(config)
    loss_type = corr.get("loss_type", "ppo_clip") if hasattr(corr, "get") else corr.loss_type
    if loss_type not in ("ppo_clip", "reinforce"):
        raise ValueError(f"algorithm.rollout_correction.loss_type={loss_type!r}; choose 'ppo_clip' or 'reinforce'.")
    get = corr.get if hasattr(corr, "get") else lambda key, default=None: getattr(corr, key, default)
    with torch.no_grad():
        weights, kept_mask, corr_metrics = compute_rollout_correction_and_rejection_mask(
            log_prob.detach(),
            old_log_prob,
            response_mask,
            rollout_is=get("rollout_is", None),
            rollout_is_threshold=get("rollout_is_threshold", 2.0),
            rollout_is_batch_normalize=get("rollout_is_batch_normalize", False),
            rollout_rs=get("rollout_rs", None),
            rollout_rs_threshold=get("rollout_rs_threshold", None),
        )
    if loss_type == "ppo_clip":
        pg_loss, metrics = compute_policy_loss_vanilla(
            old_log_prob, log_prob, advantages, kept_mask, loss_agg_mode, config
        )
    else:
        pg_loss, metrics = compute_policy_loss_reinforce(
            old_log_prob, log_prob, advantages, kept_mask, loss_agg_mode, config, rollout_is_weights=weights
        )
    return pg_loss, {**metrics, **corr_metrics}
