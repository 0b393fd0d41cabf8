"""Optimal Token Baseline (positional and multi-turn) on hand-computed examples."""

import math

import pytest
import torch

from verl.trainer.ppo.core_algos import (
    compute_multi_turn_optimal_token_baseline_advantage,
    compute_optimal_token_baseline_advantage,
)

# π = 0.5 for every sampled token and Σπ² = 0.5 -> per-token weight w = 1 − 2·0.5 + 0.5 = 0.5.
HALF = math.log(0.5)


def _inputs(mask: list[list[int]], rewards: list[list[float]]):
    mask_t = torch.tensor(mask, dtype=torch.float32)
    return (
        torch.tensor(rewards, dtype=torch.float32),
        mask_t,
        torch.full_like(mask_t, HALF),
        torch.full_like(mask_t, 0.5),
    )


def test_otb_one_group_of_two():
    """Row 0: r = [0, 0, 1], full mask -> G = [1, 1, 1], W = [0.5, 1.0, 1.5].
    Row 1: r = [0, 2, 0], mask [1, 1, 0] -> G = [2, 2, 0], W = [0.5, 1.0, ·].
    B_0 = (1·0.5 + 2·0.5)/1.0 = 1.5; B_1 = (1·1 + 2·1)/2 = 1.5; B_2 = 1·1.5/1.5 = 1 (row 0 alone).
    handle_zero_tail: row 0 is the unique longest, its baseline past length 2 is 0.
    A row 0 = [1 − 1.5, 1 − 1.5, 1 − 0] = [−0.5, −0.5, 1]; row 1 = [0.5, 0.5, 0]. Without zero tail A_{0,2} = 0."""
    rewards, mask, logp, sum_pi_sq = _inputs([[1, 1, 1], [1, 1, 0]], [[0, 0, 1], [0, 2, 0]])
    adv, ret = compute_optimal_token_baseline_advantage(rewards, mask, ["a", "a"], logp, sum_pi_sq)
    torch.testing.assert_close(ret, torch.tensor([[1.0, 1.0, 1.0], [2.0, 2.0, 0.0]]), atol=1e-6, rtol=0)
    torch.testing.assert_close(adv, torch.tensor([[-0.5, -0.5, 1.0], [0.5, 0.5, 0.0]]), atol=1e-6, rtol=0)
    adv, _ = compute_optimal_token_baseline_advantage(
        rewards, mask, ["a", "a"], logp, sum_pi_sq, handle_zero_tail=False
    )
    torch.testing.assert_close(adv, torch.tensor([[-0.5, -0.5, 0.0], [0.5, 0.5, 0.0]]), atol=1e-6, rtol=0)


def test_otb_uniform_is_weights_change_nothing_and_singletons_keep_returns():
    """B_t is a weighted mean, so scaling every weight by ρ² = 4 leaves it unchanged; a group of one gets A = G."""
    rewards, mask, logp, sum_pi_sq = _inputs([[1, 1, 1], [1, 1, 0], [1, 0, 0]], [[0, 0, 1], [0, 2, 0], [3, 0, 0]])
    index = ["a", "a", "c"]
    plain, ret = compute_optimal_token_baseline_advantage(rewards, mask, index, logp, sum_pi_sq)
    weighted, _ = compute_optimal_token_baseline_advantage(
        rewards, mask, index, logp, sum_pi_sq, rollout_is_weights=torch.full_like(mask, 2.0)
    )
    torch.testing.assert_close(weighted, plain, atol=1e-6, rtol=0)
    torch.testing.assert_close(plain[2], ret[2] * mask[2], atol=0, rtol=0)


def test_otb_variance_weighting_matters():
    """With Σπ² = 0.9 on row 1 (w = 1 − 1 + 0.9 = 0.9 there, 0.5 on row 0), B_0 = (1·0.5 + 2·0.9)/1.4 = 2.3/1.4."""
    rewards, mask, logp, sum_pi_sq = _inputs([[1, 1, 1], [1, 1, 0]], [[0, 0, 1], [0, 2, 0]])
    sum_pi_sq[1] = 0.9
    adv, _ = compute_optimal_token_baseline_advantage(rewards, mask, ["a", "a"], logp, sum_pi_sq)
    assert adv[0, 0].item() == pytest.approx(1 - 2.3 / 1.4, abs=1e-6)


def test_multi_turn_otb_aligns_by_policy_token():
    """Row 0 mask [1, 0, 1, 1] (token 1 is a tool observation), r = [0, 0, 0, 1]; row 1 mask [1, 1, 0, 0], r = [0, 2, 0, 0].
    Compacted to policy tokens: row 0 G = [1, 1, 1], W = [0.5, 1.0, 1.5]; row 1 G = [2, 2], W = [0.5, 1.0] — the
    same numbers as the positional example, so compact A row 0 = [−0.5, −0.5, 1], row 1 = [0.5, 0.5], scattered back
    to the valid positions: row 0 [−0.5, 0, −0.5, 1], row 1 [0.5, 0.5, 0, 0]."""
    rewards, mask, logp, sum_pi_sq = _inputs([[1, 0, 1, 1], [1, 1, 0, 0]], [[0, 0, 0, 1], [0, 2, 0, 0]])
    adv, ret = compute_multi_turn_optimal_token_baseline_advantage(rewards, mask, ["a", "a"], logp, sum_pi_sq)
    torch.testing.assert_close(adv, torch.tensor([[-0.5, 0.0, -0.5, 1.0], [0.5, 0.5, 0.0, 0.0]]), atol=1e-6, rtol=0)
    torch.testing.assert_close(ret, torch.tensor([[1.0, 1.0, 1.0, 1.0], [2.0, 2.0, 0.0, 0.0]]), atol=0, rtol=0)


def test_multi_turn_otb_skips_empty_responses():
    """A response without any policy token takes no part in its group: advantage 0, and the others are as if it
    were absent."""
    rewards, mask, logp, sum_pi_sq = _inputs(
        [[1, 0, 1, 1], [1, 1, 0, 0], [0, 0, 0, 0]], [[0, 0, 0, 1], [0, 2, 0, 0], [0, 0, 0, 0]]
    )
    adv, _ = compute_multi_turn_optimal_token_baseline_advantage(rewards, mask, ["a", "a", "a"], logp, sum_pi_sq)
    ref, _ = compute_multi_turn_optimal_token_baseline_advantage(
        rewards[:2], mask[:2], ["a", "a"], logp[:2], sum_pi_sq[:2]
    )
    torch.testing.assert_close(adv[:2], ref, atol=0, rtol=0)
    assert (adv[2] == 0).all()


@pytest.mark.parametrize(
    "fn", [compute_optimal_token_baseline_advantage, compute_multi_turn_optimal_token_baseline_advantage]
)
def test_validation(fn):
    """Missing Σπ² names the config switch; mismatched shapes raise ValueError."""
    rewards, mask, logp, sum_pi_sq = _inputs([[1, 1]], [[0, 1]])
    with pytest.raises(ValueError, match="calculate_sum_pi_squared"):
        fn(rewards, mask, ["a"], logp, None)
    with pytest.raises(ValueError, match="same shape"):
        fn(rewards, mask, ["a"], logp[:, :1], sum_pi_sq)
