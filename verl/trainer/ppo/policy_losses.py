"""Ratio-based policy losses: PPO clip (``vanilla``), GSPO, SAPO, GPG, GMPO (``geo_mean``), CISPO.

Notation (all ``(bs, T)``): log r = log π_θ − log π_old (clamped to ±20 before exp so the ratio cannot overflow),
r = exp(log r), A the advantages. Losses are to be minimised (the negated objective) and aggregated with
``agg_loss``. ``rollout_is_weights`` (rollout-correction importance weights) multiply the per-token loss.
Metrics: ``actor/ppo_kl`` = mean(−log r) ≈ KL(π_old‖π_θ); ``actor/pg_clipfrac`` = fraction of tokens whose
clipped term is active; ``actor/pg_clipfrac_lower`` = fraction hit by the dual-clip bound.
"""

from __future__ import annotations

import warnings
from typing import Any

import torch

from verl.trainer.ppo.input_checks import check_2d, check_same_shape
from verl.trainer.ppo.loss_aggregation import agg_loss
from verl.trainer.ppo.policy_loss_registry import agg_kwargs, clip_ratio_bounds, register_policy_loss, require_config
from verl.utils import torch_functional as verl_F

_LOG_RATIO_BOUND = 20.0


def check_policy_loss_inputs(
    where: str,
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    rollout_is_weights: torch.Tensor | None = None,
) -> None:
    """Raise ``ValueError`` unless all inputs are ``(bs, T)`` tensors of one shape."""
    check_2d(where, "log_prob", log_prob)
    check_same_shape(
        where,
        old_log_prob=old_log_prob,
        log_prob=log_prob,
        advantages=advantages,
        response_mask=response_mask,
        rollout_is_weights=rollout_is_weights,
    )


def clamped_log_ratio(log_prob: torch.Tensor, old_log_prob: torch.Tensor) -> torch.Tensor:
    """log r = log π_θ − log π_old, clamped to ±20 so exp() stays finite. ``(bs, T)``."""
    return torch.clamp(log_prob - old_log_prob, min=-_LOG_RATIO_BOUND, max=_LOG_RATIO_BOUND)


def _check_dual_clip(clip_ratio_c: float) -> None:
    if not clip_ratio_c > 1.0:
        raise ValueError(
            f"actor_rollout_ref.actor.clip_ratio_c is the dual-clip bound and must be > 1.0, got {clip_ratio_c}."
        )


def ppo_clip_losses(
    ratio: torch.Tensor, advantages: torch.Tensor, clip_low: float, clip_high: float, clip_ratio_c: float
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-token dual-clip PPO loss (Schulman et al. 2017; Ye et al. 2019, arXiv:1912.09729).

    L = max(−A·r, −A·clip(r, 1−ε_low, 1+ε_high)); for A < 0 additionally L = min(L, −A·c): a very large ratio
    on a bad token cannot make the loss unbounded.

    Args:
        ratio, advantages: ``(bs, T)``.

    Returns:
        ``(losses, clipped, dual_clipped)``: the loss ``(bs, T)`` and boolean masks of where the PPO clip and the
        dual-clip bound are active.
    """
    unclipped = -advantages * ratio
    clipped = -advantages * torch.clamp(ratio, 1.0 - clip_low, 1.0 + clip_high)
    clip_loss = torch.maximum(unclipped, clipped)
    dual_bound = -advantages * clip_ratio_c
    negative = advantages < 0
    losses = torch.where(negative, torch.minimum(dual_bound, clip_loss), clip_loss)
    return losses, clipped > unclipped, (clip_loss > dual_bound) & negative


def _metrics(
    response_mask: torch.Tensor,
    log_ratio: torch.Tensor,
    clipped: torch.Tensor | None = None,
    clipped_lower: torch.Tensor | None = None,
) -> dict[str, float]:
    """The standard metrics as floats; a clip fraction that does not apply to a loss is reported as 0."""

    def fraction(flags: torch.Tensor | None) -> float:
        return 0.0 if flags is None else verl_F.masked_mean(flags.float(), response_mask).item()

    return {
        "actor/pg_clipfrac": fraction(clipped),
        "actor/ppo_kl": verl_F.masked_mean(-log_ratio.detach(), response_mask).item(),
        "actor/pg_clipfrac_lower": fraction(clipped_lower),
    }


def _apply_is_weights(losses: torch.Tensor, rollout_is_weights: torch.Tensor | None) -> torch.Tensor:
    return losses if rollout_is_weights is None else losses * rollout_is_weights


@register_policy_loss("vanilla")
def compute_policy_loss_vanilla(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "token-mean",
    config: Any = None,
    rollout_is_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, Any]]:
    """PPO clipped objective with asymmetric clip (``clip_ratio_low/high``) and dual clip (``clip_ratio_c``)."""
    where = "compute_policy_loss_vanilla"
    config = require_config(where, config)
    check_policy_loss_inputs(where, old_log_prob, log_prob, advantages, response_mask, rollout_is_weights)
    _check_dual_clip(config.clip_ratio_c)
    clip_low, clip_high = clip_ratio_bounds(config)
    log_ratio = clamped_log_ratio(log_prob, old_log_prob)
    losses, clipped, clipped_lower = ppo_clip_losses(
        torch.exp(log_ratio), advantages, clip_low, clip_high, config.clip_ratio_c
    )
    losses = _apply_is_weights(losses, rollout_is_weights)
    pg_loss = agg_loss(losses, response_mask, loss_agg_mode, **agg_kwargs(config))
    return pg_loss, _metrics(response_mask, log_ratio, clipped, clipped_lower)


def compute_policy_loss(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    cliprange: float | None = None,
    cliprange_low: float | None = None,
    cliprange_high: float | None = None,
    clip_ratio_c: float = 3.0,
    loss_agg_mode: str = "token-mean",
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Deprecated: use ``get_policy_loss_fn("vanilla")``. Same maths as :func:`compute_policy_loss_vanilla`.

    Returns:
        ``(pg_loss, pg_clipfrac, ppo_kl, pg_clipfrac_lower)``, all scalar tensors.
    """
    warnings.warn(
        "compute_policy_loss is deprecated; use verl.trainer.ppo.core_algos.compute_policy_loss_vanilla "
        "(or get_policy_loss_fn('vanilla')) with an actor config.",
        DeprecationWarning,
        stacklevel=2,
    )
    check_policy_loss_inputs("compute_policy_loss", old_log_prob, log_prob, advantages, response_mask)
    _check_dual_clip(clip_ratio_c)
    clip_low = cliprange_low if cliprange_low is not None else cliprange
    clip_high = cliprange_high if cliprange_high is not None else cliprange
    if clip_low is None or clip_high is None:
        raise ValueError("compute_policy_loss: give cliprange (or both cliprange_low and cliprange_high).")
    log_ratio = clamped_log_ratio(log_prob, old_log_prob)
    losses, clipped, clipped_lower = ppo_clip_losses(
        torch.exp(log_ratio), advantages, clip_low, clip_high, clip_ratio_c
    )
    pg_loss = agg_loss(losses, response_mask, loss_agg_mode)
    return (
        pg_loss,
        verl_F.masked_mean(clipped.float(), response_mask),
        verl_F.masked_mean(-log_ratio, response_mask),
        verl_F.masked_mean(clipped_lower.float(), response_mask),
    )


@register_policy_loss("gspo")
def compute_policy_loss_gspo(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "seq-mean-token-mean",
    config: Any = None,
    rollout_is_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, Any]]:
    """GSPO (arXiv:2507.18071): PPO clip on the *sequence* ratio s_i = exp(mean_t log r_{i,t}).

    Per token the ratio is sg(s_i)·π_θ/sg(π_θ): its value is s_i, its gradient that of log π_θ(y_t) scaled by
    s_i (log-ratio clamped at 10). As upstream, the loss is always aggregated ``seq-mean-token-mean``, whatever
    ``loss_agg_mode`` says, because the objective is defined per sequence.
    """
    where = "compute_policy_loss_gspo"
    config = require_config(where, config)
    check_policy_loss_inputs(where, old_log_prob, log_prob, advantages, response_mask, rollout_is_weights)
    clip_low, clip_high = clip_ratio_bounds(config)
    log_ratio = log_prob - old_log_prob
    mask = response_mask.to(log_ratio.dtype)
    seq_log_ratio = (log_ratio * mask).sum(dim=-1) / mask.sum(dim=-1).clamp(min=1)
    token_log_ratio = log_prob - log_prob.detach() + seq_log_ratio.detach().unsqueeze(-1)
    ratio = torch.exp(torch.clamp(token_log_ratio, max=10.0))
    unclipped = -advantages * ratio
    clipped = -advantages * torch.clamp(ratio, 1.0 - clip_low, 1.0 + clip_high)
    losses = _apply_is_weights(torch.maximum(unclipped, clipped), rollout_is_weights)
    pg_loss = agg_loss(losses, response_mask, "seq-mean-token-mean", **agg_kwargs(config))
    return pg_loss, _metrics(response_mask, log_ratio, clipped > unclipped)


@register_policy_loss("sapo")
def compute_policy_loss_sapo(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "seq-mean-token-mean",
    config: Any = None,
    rollout_is_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, Any]]:
    """SAPO (arXiv:2511.20347): a smooth gate instead of a hard clip.

    L = −A · f_τ(r), f_τ(r) = σ(τ(r − 1))·4/τ, τ = ``tau_pos`` where A > 0 else ``tau_neg``. f_τ(1) = 2/τ and
    f'_τ(1) = 1, so near r = 1 it acts like the plain ratio and the gradient fades smoothly as r leaves 1.
    Always aggregated ``seq-mean-token-mean`` (as upstream). No clip fractions (reported as 0).
    """
    where = "compute_policy_loss_sapo"
    config = require_config(where, config)
    check_policy_loss_inputs(where, old_log_prob, log_prob, advantages, response_mask, rollout_is_weights)
    tau_pos = torch.as_tensor(config.tau_pos, dtype=advantages.dtype, device=advantages.device)
    tau_neg = torch.as_tensor(config.tau_neg, dtype=advantages.dtype, device=advantages.device)
    tau = torch.where(advantages > 0, tau_pos, tau_neg)
    log_ratio = clamped_log_ratio(log_prob, old_log_prob)
    gates = torch.sigmoid(tau * (torch.exp(log_ratio) - 1.0)) * (4.0 / tau)
    losses = _apply_is_weights(-gates * advantages, rollout_is_weights)
    pg_loss = agg_loss(losses, response_mask, "seq-mean-token-mean", **agg_kwargs(config))
    return pg_loss, _metrics(response_mask, log_ratio)


@register_policy_loss("gpg")
def compute_policy_loss_gpg(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "token-mean",
    config: Any = None,
    rollout_is_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, Any]]:
    """GPG (arXiv:2504.02546): plain policy gradient L = −A·log π_θ, no ratio, no clip, no metrics."""
    where = "compute_policy_loss_gpg"
    config = require_config(where, config)
    check_policy_loss_inputs(where, old_log_prob, log_prob, advantages, response_mask, rollout_is_weights)
    losses = _apply_is_weights(-log_prob * advantages, rollout_is_weights)
    return agg_loss(losses, response_mask, loss_agg_mode, **agg_kwargs(config)), {}


@register_policy_loss("geo_mean")
def compute_policy_loss_geo_mean(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "token-mean",
    config: Any = None,
    rollout_is_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, Any]]:
    """GMPO (arXiv:2507.20673): PPO on the geometric mean of the token ratios.

    Token log-ratios are clipped sign-aware (the pessimistic side of clip(log r, −ε_low, ε_high) for the sign of
    A), averaged per sequence: R_i = exp(mean_t clipped log r); L_i = −Ā_i·R_i with Ā_i the mean token advantage.
    The loss is the plain mean of L_i over the micro-batch (``loss_agg_mode`` is not used, as upstream).
    Rollout IS weights are folded in per sequence as their geometric mean.
    """
    where = "compute_policy_loss_geo_mean"
    config = require_config(where, config)
    check_policy_loss_inputs(where, old_log_prob, log_prob, advantages, response_mask, rollout_is_weights)
    clip_low, clip_high = clip_ratio_bounds(config)
    log_ratio = log_prob - old_log_prob
    sign = torch.sign(advantages)
    clamped = torch.clamp(log_ratio, -clip_low, clip_high)
    pessimistic = sign * torch.minimum(sign * log_ratio, sign * clamped)
    mask = response_mask.to(log_ratio.dtype)
    lengths = mask.sum(dim=-1) + 1e-8
    seq_ratio = torch.exp((pessimistic * mask).sum(dim=-1) / lengths)
    seq_advantage = (advantages * mask).sum(dim=-1) / lengths
    seq_losses = -seq_advantage * seq_ratio
    if rollout_is_weights is not None:
        seq_losses = seq_losses * torch.exp((torch.log(rollout_is_weights + 1e-10) * mask).sum(dim=-1) / lengths)
    was_clipped = log_ratio != clamped
    return seq_losses.mean(), _metrics(
        response_mask, log_ratio, was_clipped & (advantages > 0), was_clipped & (advantages < 0)
    )


@register_policy_loss("cispo")
def compute_policy_loss_cispo(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "token-mean",
    config: Any = None,
    rollout_is_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, Any]]:
    """CISPO (arXiv:2506.13585): L = −sg(clip(r, 1−ε_low, 1+ε_high))·A·log π_θ.

    The clipped ratio is a constant weight, so every token keeps a gradient (unlike PPO, where a clipped token
    gets none); the clip only bounds how much one token can weigh.
    """
    where = "compute_policy_loss_cispo"
    config = require_config(where, config)
    check_policy_loss_inputs(where, old_log_prob, log_prob, advantages, response_mask, rollout_is_weights)
    clip_low, clip_high = clip_ratio_bounds(config)
    log_ratio = clamped_log_ratio(log_prob, old_log_prob)
    ratio = torch.exp(log_ratio)
    clipped_ratio = torch.clamp(ratio, 1.0 - clip_low, 1.0 + clip_high)
    losses = _apply_is_weights(-clipped_ratio.detach() * advantages * log_prob, rollout_is_weights)
    pg_loss = agg_loss(losses, response_mask, loss_agg_mode, **agg_kwargs(config))
    return pg_loss, _metrics(response_mask, log_ratio, ratio != clipped_ratio)
