"""Optimal Token Baseline (OTB): a per-token, variance-weighted group baseline.

Instead of one baseline per response, OTB gives every position t its own baseline from the group of responses
to the same prompt::

    B_t = Σ_i G_{i,t} · W_{i,t} / (Σ_i W_{i,t} + ε)          A_{i,t} = G_{i,t} − B_t

G_{i,t} is the reward-to-go and W_{i,t} = Σ_{j ≤ t} w_{i,j} the accumulated path-variance proxy, with
w = ‖∇log π‖² ≈ 1 − 2π(y_t) + Σ_v π(v)² per token (Σπ² is an input: the caller computes it, e.g. with
``verl.utils.torch_functional.calculate_sum_pi_squared_from_logits``; the trainer here does not).
With rollout importance weights ρ the per-token weight becomes ρ²·w. Groups of one get no baseline (A = G).
``handle_zero_tail``: past the second-longest response of a group, the longest one is alone, so its baseline
there would be its own return; it is set to 0 instead.

``optimal_token_baseline`` aligns responses by position; ``tir_optimal_token_baseline`` (multi-turn, tool
interleaved) aligns them by the index among *valid* (policy-generated) tokens, skipping observation tokens.
"""

from __future__ import annotations

from typing import Any

import torch

from verl.trainer.ppo.advantage_registry import AdvantageEstimator, register_adv_est
from verl.trainer.ppo.group_stats import IndexLike, group_rows
from verl.trainer.ppo.input_checks import check_2d, check_batch_length, check_same_shape


def _returns_and_path_weights(
    where: str,
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: IndexLike,
    old_log_probs: torch.Tensor,
    sum_pi_squared: torch.Tensor | None,
    rollout_is_weights: torch.Tensor | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Validate inputs; return reward-to-go G and accumulated weights W (zero where masked), both ``(bs, T)``."""
    if sum_pi_squared is None:
        raise ValueError(
            f"{where} needs sum_pi_squared (Σπ² per token, e.g. from "
            "verl.utils.torch_functional.calculate_sum_pi_squared_from_logits); the trainer of this distribution does "
            "not compute it (actor_rollout_ref.actor.calculate_sum_pi_squared is refused), so call the estimator "
            "with it yourself."
        )
    check_2d(where, "token_level_rewards", token_level_rewards)
    check_same_shape(
        where,
        token_level_rewards=token_level_rewards,
        response_mask=response_mask,
        old_log_probs=old_log_probs,
        sum_pi_squared=sum_pi_squared,
        rollout_is_weights=rollout_is_weights,
    )
    check_batch_length(where, "index", index, token_level_rewards.shape[0])
    mask = response_mask.to(token_level_rewards.dtype)
    returns = (token_level_rewards * mask).flip(dims=[-1]).cumsum(dim=-1).flip(dims=[-1])
    per_token = 1.0 - 2.0 * torch.exp(old_log_probs) + sum_pi_squared
    if rollout_is_weights is not None:
        per_token = per_token * rollout_is_weights.square()
    # W is kept only on valid tokens, so masked positions drop out of the group sums below.
    accumulated = (per_token * mask).cumsum(dim=-1) * mask
    return returns, accumulated


def _zero_unique_longest_tail(baselines: torch.Tensor, rows: list[int], lengths: torch.Tensor) -> None:
    """In place: if exactly one response of the group is the longest, zero its baseline past the runner-up."""
    group_lengths = lengths[rows]
    longest, runner_up = torch.topk(group_lengths, 2).values.tolist()
    holders = (group_lengths == longest).nonzero(as_tuple=True)[0]
    if holders.numel() == 1 and longest > runner_up:
        baselines[rows[int(holders[0])], int(runner_up) :] = 0.0


def _group_baselines(
    returns: torch.Tensor,
    weights: torch.Tensor,
    groups: dict[Any, list[int]],
    lengths: torch.Tensor,
    epsilon: float,
    handle_zero_tail: bool,
) -> torch.Tensor:
    """Per-position baselines ``(bs, T)``: B_t = Σ G·W / (Σ W + ε) within each group of ≥ 2 (0 otherwise).

    ``weights`` must be zero where a response has no token, so those positions do not count.
    """
    baselines = torch.zeros_like(returns)
    for rows in groups.values():
        if len(rows) < 2:
            continue
        numerator = (returns[rows] * weights[rows]).sum(dim=0)
        denominator = weights[rows].sum(dim=0) + epsilon
        baselines[rows] = (numerator / denominator).to(baselines.dtype)
        if handle_zero_tail:
            _zero_unique_longest_tail(baselines, rows, lengths)
    return baselines


@register_adv_est(AdvantageEstimator.OPTIMAL_TOKEN_BASELINE)
def compute_optimal_token_baseline_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: IndexLike,
    old_log_probs: torch.Tensor,
    sum_pi_squared: torch.Tensor,
    rollout_is_weights: torch.Tensor | None = None,
    handle_zero_tail: bool = True,
    epsilon: float = 1e-8,
    **kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """OTB advantages, responses aligned by position (see module docstring).

    Args:
        token_level_rewards, response_mask, old_log_probs, sum_pi_squared: ``(bs, T)``.
        index: ``(bs,)`` group labels (prompt uids).
        rollout_is_weights: optional ``(bs, T)`` rollout importance weights ρ.
        handle_zero_tail: zero the unique longest response's baseline past the second-longest.
        epsilon: added to the weight sum.

    Returns:
        ``(advantages, returns)``: ``(G − B)·mask`` and the reward-to-go G, both ``(bs, T)``.
    """
    where = "compute_optimal_token_baseline_advantage"
    with torch.no_grad():
        returns, weights = _returns_and_path_weights(
            where, token_level_rewards, response_mask, index, old_log_probs, sum_pi_squared, rollout_is_weights
        )
        lengths = response_mask.sum(dim=-1)
        baselines = _group_baselines(
            returns, weights, group_rows(index), lengths, epsilon=epsilon, handle_zero_tail=handle_zero_tail
        )
        advantages = (returns - baselines) * response_mask.to(returns.dtype)
    return advantages, returns


def _compact_left(values: torch.Tensor, valid: torch.Tensor, width: int) -> torch.Tensor:
    """``(bs, T)`` -> ``(bs, width)``: each row's valid entries moved to the front, in order, zero-padded."""
    compact = values.new_zeros((values.shape[0], width))
    for row in range(values.shape[0]):
        kept = values[row, valid[row]]
        compact[row, : kept.numel()] = kept
    return compact


@register_adv_est(AdvantageEstimator.TIR_OPTIMAL_TOKEN_BASELINE)
def compute_multi_turn_optimal_token_baseline_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: IndexLike,
    old_log_probs: torch.Tensor,
    sum_pi_squared: torch.Tensor,
    rollout_is_weights: torch.Tensor | None = None,
    handle_zero_tail: bool = True,
    epsilon: float = 1e-8,
    **kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Multi-turn OTB: like :func:`compute_optimal_token_baseline_advantage`, but responses are aligned by their
    k-th *policy* token (observation tokens, mask 0, are skipped), so turns interleaved with tool output line up.

    Responses with no valid token take no part in any group and get advantage 0.

    Returns:
        ``(advantages, returns)``, both ``(bs, T)``; returns is the positional reward-to-go.
    """
    where = "compute_multi_turn_optimal_token_baseline_advantage"
    with torch.no_grad():
        returns, weights = _returns_and_path_weights(
            where, token_level_rewards, response_mask, index, old_log_probs, sum_pi_squared, rollout_is_weights
        )
        valid = response_mask.bool()
        lengths = valid.sum(dim=-1)
        width = int(lengths.max().item()) if lengths.numel() else 0
        compact_returns = _compact_left(returns, valid, width)
        compact_weights = _compact_left(weights, valid, width)
        groups = {label: [r for r in rows if lengths[r] > 0] for label, rows in group_rows(index).items()}
        baselines = _group_baselines(
            compact_returns, compact_weights, groups, lengths, epsilon=epsilon, handle_zero_tail=handle_zero_tail
        )
        compact_advantages = compact_returns - baselines
        advantages = torch.zeros_like(returns)
        for row in range(advantages.shape[0]):
            advantages[row, valid[row]] = compact_advantages[row, : int(lengths[row])]
    return advantages, returns
