"""Outcome-reward, group-relative advantage estimators (no critic).

Each response's *score* is its summed token-level reward. Responses to the same prompt (same ``index`` label,
the trainer's ``uid``) form a group, and a response's advantage is its score compared with its group. The scalar
advantage is broadcast over the response tokens and zeroed outside ``response_mask``. All return
``(advantages, returns)`` with ``returns is advantages`` (outcome-only), both ``(bs, response_length)``.

===================================  =========================================================================
``grpo`` / ``grpo_vectorized``       (s − mean_g) / (std_g + ε); Dr.GRPO (``norm_adv_by_std_in_grpo=False``):
                                     s − mean_g. Groups of one: mean 0, std 1.
``gdpo``                             GRPO per reward component, weighted sum, whitened over the batch
``grpo_passk``                       only the group's best response: (s_max − s_second) [/ (std_g + ε)]
``reinforce_plus_plus_baseline``     s − mean_g, broadcast, whitened over the batch
``rloo`` / ``rloo_vectorized``       s − mean of the *other* responses = n/(n−1)·(s − mean_g)
``opo``                              s − length-weighted group mean Σ|y|s / Σ|y|
``gpg``                              α·(s − mean_g)/f_norm, α = bs / #(non-zero scores)
===================================  =========================================================================
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from verl.trainer.ppo.advantage_registry import AdvantageEstimator, register_adv_est
from verl.trainer.ppo.group_stats import IndexLike, group_ids, group_mean_std, group_rows, group_sum
from verl.trainer.ppo.input_checks import check_2d, check_batch_length, check_same_shape
from verl.utils import torch_functional as verl_F


def _outcome_scores(
    where: str, token_level_rewards: torch.Tensor, response_mask: torch.Tensor, index: IndexLike
) -> torch.Tensor:
    """Validate the common inputs and return the per-response scores ``(bs,)``."""
    check_2d(where, "token_level_rewards", token_level_rewards)
    check_same_shape(where, token_level_rewards=token_level_rewards, response_mask=response_mask)
    check_batch_length(where, "index", index, token_level_rewards.shape[0])
    return token_level_rewards.sum(dim=-1)


def _broadcast(per_response: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    """``(bs,)`` -> ``(bs, T)``: the scalar on every valid token, 0 elsewhere."""
    return per_response.unsqueeze(-1) * response_mask.to(per_response.dtype)


def _mean_std(group_scores: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Mean and unbiased std of one group; a group of one gets (0, 1) so its score passes through."""
    if group_scores.numel() == 1:
        return torch.zeros_like(group_scores[0]), torch.ones_like(group_scores[0])
    return group_scores.mean(), group_scores.std()


@register_adv_est(AdvantageEstimator.GRPO)
def compute_grpo_outcome_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: IndexLike,
    epsilon: float = 1e-6,
    norm_adv_by_std_in_grpo: bool = True,
    config: Any = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """GRPO (arXiv:2402.03300): A = (s − mean_g)/(std_g + ε), or s − mean_g for Dr.GRPO (arXiv:2503.20783).

    Args:
        token_level_rewards: ``(bs, T)``; score s = sum over T.
        response_mask: ``(bs, T)``.
        index: ``(bs,)`` group label (prompt uid) per response.
        epsilon: added to the std.
        norm_adv_by_std_in_grpo: divide by the group std (``algorithm.norm_adv_by_std_in_grpo``).
        config: unused (the trainer passes ``norm_adv_by_std_in_grpo`` explicitly).
    """
    scores = _outcome_scores("compute_grpo_outcome_advantage", token_level_rewards, response_mask, index)
    with torch.no_grad():
        advantages = torch.empty_like(scores)
        for rows in group_rows(index).values():
            mean, std = _mean_std(scores[rows])
            centred = scores[rows] - mean
            advantages[rows] = centred / (std + epsilon) if norm_adv_by_std_in_grpo else centred
        advantages = _broadcast(advantages, response_mask)
    return advantages, advantages


@register_adv_est(AdvantageEstimator.GRPO_VECTORIZED)
def compute_grpo_vectorized_outcome_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: IndexLike,
    epsilon: float = 1e-6,
    norm_adv_by_std_in_grpo: bool = True,
    config: Any = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Same result as :func:`compute_grpo_outcome_advantage`, with scatter reductions instead of a group loop."""
    scores = _outcome_scores("compute_grpo_vectorized_outcome_advantage", token_level_rewards, response_mask, index)
    with torch.no_grad():
        ids = group_ids(index, device=scores.device)
        mean, std, _ = group_mean_std(scores, ids)
        centred = scores - mean[ids]
        advantages = centred / (std[ids] + epsilon) if norm_adv_by_std_in_grpo else centred
        advantages = _broadcast(advantages, response_mask)
    return advantages, advantages


def _gdpo_components(
    config: Any, non_tensor_batch: dict, batch: Any, response_mask: torch.Tensor
) -> tuple[list[torch.Tensor], list[float] | None]:
    """Per-component reward matrices ``(bs, T)`` (score on each response's last token) and optional weights."""
    # gdpo_reward_keys / gdpo_reward_weights are newer AlgoConfig fields; an older config simply lacks them.
    keys = getattr(config, "gdpo_reward_keys", None)
    if not keys:
        raise ValueError(
            "GDPO needs algorithm.gdpo_reward_keys: the names of the reward components your compute_score returns "
            "in its dict (e.g. ['format_reward', 'accuracy_reward'])."
        )
    prompt_length = batch["prompts"].shape[1]
    last_token = (batch["attention_mask"][:, prompt_length:].sum(dim=-1).long() - 1).clamp(min=0)
    rows = torch.arange(response_mask.shape[0], device=response_mask.device)
    components = []
    for key in keys:
        if key not in non_tensor_batch:
            raise ValueError(
                f"GDPO reward component {key!r} (algorithm.gdpo_reward_keys) is not in the batch; available: "
                f"{sorted(non_tensor_batch)}. Make compute_score return a dict containing {key!r}."
            )
        values = torch.as_tensor(np.asarray(non_tensor_batch[key], dtype=np.float32), device=response_mask.device)
        component = torch.zeros(response_mask.shape, dtype=torch.float32, device=response_mask.device)
        component[rows, last_token] = values
        components.append(component)
    weights = getattr(config, "gdpo_reward_weights", None)
    if weights is not None and len(weights) != len(keys):
        raise ValueError(
            f"algorithm.gdpo_reward_weights has {len(weights)} entries but gdpo_reward_keys has {len(keys)}."
        )
    return components, (list(weights) if weights is not None else None)


@register_adv_est(AdvantageEstimator.GDPO)
def compute_gdpo_outcome_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: IndexLike,
    epsilon: float = 1e-6,
    norm_adv_by_std_in_grpo: bool = True,
    config: Any = None,
    non_tensor_batch: dict | None = None,
    batch: Any = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """GDPO (arXiv:2601.05242): normalise each reward component within its group, then combine.

    A = whiten(Σ_k w_k · GRPO(r_k)) · mask, so a large-scale component cannot drown the others. Components come
    from ``non_tensor_batch[key]`` for ``key in config.gdpo_reward_keys`` when ``config``, ``non_tensor_batch``
    and ``batch`` (with ``prompts`` and ``attention_mask``) are all given; otherwise ``token_level_rewards`` is
    the single component. Weights ``config.gdpo_reward_weights`` default to 1.
    """
    _outcome_scores("compute_gdpo_outcome_advantage", token_level_rewards, response_mask, index)
    components, weights = [token_level_rewards], None
    if config is not None and non_tensor_batch is not None and batch is not None:
        components, weights = _gdpo_components(config, non_tensor_batch, batch, response_mask)
    weights = weights if weights is not None else [1.0] * len(components)
    with torch.no_grad():
        combined = torch.zeros(response_mask.shape, dtype=torch.float32, device=response_mask.device)
        for weight, component in zip(weights, components):
            normalised, _ = compute_grpo_outcome_advantage(
                component, response_mask, index, epsilon=epsilon, norm_adv_by_std_in_grpo=norm_adv_by_std_in_grpo
            )
            combined = combined + weight * normalised
        advantages = verl_F.masked_whiten(combined, response_mask) * response_mask.to(combined.dtype)
    return advantages, advantages


@register_adv_est(AdvantageEstimator.GRPO_PASSK)
def compute_grpo_passk_outcome_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: IndexLike,
    epsilon: float = 1e-6,
    norm_adv_by_std_in_grpo: bool = True,
    config: Any = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Pass@k GRPO (arXiv:2503.19595): only each group's best response is credited, by s_max − s_second_max.

    With ``norm_adv_by_std_in_grpo`` the credit is divided by (std_g + ε). ``config.norm_adv_by_std_in_grpo``
    overrides the argument when a config is given. Every group needs at least two responses.
    """
    scores = _outcome_scores("compute_grpo_passk_outcome_advantage", token_level_rewards, response_mask, index)
    if config is not None:
        norm_adv_by_std_in_grpo = config.norm_adv_by_std_in_grpo
    with torch.no_grad():
        advantages = torch.zeros_like(scores)
        for label, rows in group_rows(index).items():
            if len(rows) < 2:
                raise ValueError(
                    f"grpo_passk needs at least 2 responses per prompt, group {label!r} has {len(rows)}; "
                    "set actor_rollout_ref.rollout.n >= 2."
                )
            group = scores[rows]
            top2, top2_pos = torch.topk(group, 2)
            credit = top2[0] - top2[1]
            if norm_adv_by_std_in_grpo:
                credit = credit / (group.std() + epsilon)
            advantages[rows[int(top2_pos[0])]] = credit
        advantages = _broadcast(advantages, response_mask)
    return advantages, advantages


@register_adv_est(AdvantageEstimator.REINFORCE_PLUS_PLUS_BASELINE)
def compute_reinforce_plus_plus_baseline_outcome_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: IndexLike,
    epsilon: float = 1e-6,
    config: Any = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """REINFORCE++-baseline (arXiv:2501.03262): s − mean_g broadcast over tokens, then whitened over the batch."""
    where = "compute_reinforce_plus_plus_baseline_outcome_advantage"
    scores = _outcome_scores(where, token_level_rewards, response_mask, index)
    with torch.no_grad():
        centred = torch.empty_like(scores)
        for rows in group_rows(index).values():
            centred[rows] = scores[rows] - _mean_std(scores[rows])[0]
        mask = response_mask.to(scores.dtype)
        advantages = verl_F.masked_whiten(_broadcast(centred, response_mask), response_mask) * mask
    return advantages, advantages


@register_adv_est(AdvantageEstimator.RLOO)
def compute_rloo_outcome_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: IndexLike,
    epsilon: float = 1e-6,
    config: Any = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """RLOO (arXiv:2402.14740): s_i − mean_{j≠i} s_j = n/(n−1)·(s_i − mean_g).

    A group of one has no other response to compare with; its advantage is its raw score.
    """
    scores = _outcome_scores("compute_rloo_outcome_advantage", token_level_rewards, response_mask, index)
    with torch.no_grad():
        advantages = scores.clone()
        for rows in group_rows(index).values():
            n = len(rows)
            if n > 1:
                advantages[rows] = (scores[rows] - scores[rows].mean()) * n / (n - 1)
        advantages = _broadcast(advantages, response_mask)
    return advantages, advantages


@register_adv_est(AdvantageEstimator.RLOO_VECTORIZED)
def compute_rloo_vectorized_outcome_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: IndexLike,
    epsilon: float = 1e-6,
    config: Any = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Vectorized RLOO: (n·s_i − Σ_g s)/(n − 1) for groups of n ≥ 2.

    Unlike the loop version (upstream behaviour kept on both), a group of one gets advantage 0 here.
    """
    where = "compute_rloo_vectorized_outcome_advantage"
    scores = _outcome_scores(where, token_level_rewards, response_mask, index)
    with torch.no_grad():
        ids = group_ids(index, device=scores.device)
        counts = group_sum(torch.ones_like(scores), ids)[ids]
        totals = group_sum(scores, ids)[ids]
        advantages = torch.where(counts > 1, (counts * scores - totals) / (counts - 1).clamp(min=1), 0.0)
        advantages = _broadcast(advantages, response_mask)
    return advantages, advantages


@register_adv_est(AdvantageEstimator.OPO)
def compute_opo_outcome_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: IndexLike,
    epsilon: float = 1e-6,
    config: Any = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """OPO (arXiv:2505.23585): s − b_g with the length-weighted baseline b_g = Σ|y_i|·s_i / Σ|y_i| (0 for one)."""
    scores = _outcome_scores("compute_opo_outcome_advantage", token_level_rewards, response_mask, index)
    with torch.no_grad():
        lengths = response_mask.sum(dim=-1).to(scores.dtype)
        advantages = scores.clone()
        for rows in group_rows(index).values():
            if len(rows) > 1:
                baseline = (lengths[rows] * scores[rows]).sum() / lengths[rows].sum()
                advantages[rows] = scores[rows] - baseline
        advantages = _broadcast(advantages, response_mask)
    return advantages, advantages


@register_adv_est(AdvantageEstimator.GPG)
def compute_gpg_outcome_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: IndexLike,
    epsilon: float = 1e-6,
    f_norm: float = 1.0,
    alpha: float = 1.0,
    config: Any = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """GPG (arXiv:2504.02546): α·(s − mean_g)/f_norm with α = bs / #(responses with a non-zero score).

    α corrects for groups whose responses all scored 0 and so carry no gradient. As upstream, the ``alpha``
    argument is accepted for signature compatibility but α is always computed from the batch.
    """
    scores = _outcome_scores("compute_gpg_outcome_advantage", token_level_rewards, response_mask, index)
    with torch.no_grad():
        alpha = scores.shape[0] / torch.count_nonzero(scores).clamp(min=1)
        advantages = torch.empty_like(scores)
        for rows in group_rows(index).values():
            advantages[rows] = alpha * (scores[rows] - _mean_std(scores[rows])[0]) / f_norm
        advantages = _broadcast(advantages, response_mask)
    return advantages, advantages
