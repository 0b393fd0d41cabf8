"""Return-based estimators (GAE, REINFORCE++, ReMax) on hand-computed examples."""

import math
from dataclasses import dataclass

import pytest
import torch

from verl.trainer.ppo.core_algos import (
    compute_gae_advantage_return,
    compute_reinforce_plus_plus_outcome_advantage,
    compute_remax_outcome_advantage,
)


def _whiten(raw: list[float]) -> torch.Tensor:
    """Reference whitening of a hand-computed list: (x − mean)/sqrt(unbiased var)."""
    mean = sum(raw) / len(raw)
    var = sum((x - mean) ** 2 for x in raw) / (len(raw) - 1)
    return torch.tensor([(x - mean) / math.sqrt(var) for x in raw])


def test_gae_three_tokens():
    """GAE with γ = λ = 0.5, r = [0, 0, 1], V = [0.5, 0.25, 0.5]:
    t=2: δ = 1 − 0.5 = 0.5                      A2 = 0.5
    t=1: δ = 0 + 0.5·0.5 − 0.25 = 0             A1 = 0 + 0.25·0.5 = 0.125
    t=0: δ = 0 + 0.5·0.25 − 0.5 = −0.375        A0 = −0.375 + 0.25·0.125 = −0.34375
    returns = A + V = [0.15625, 0.375, 1.0]; advantages = whiten([−0.34375, 0.125, 0.5])."""
    adv, ret = compute_gae_advantage_return(
        torch.tensor([[0.0, 0.0, 1.0]]), torch.tensor([[0.5, 0.25, 0.5]]), torch.ones(1, 3), gamma=0.5, lam=0.5
    )
    torch.testing.assert_close(ret, torch.tensor([[0.15625, 0.375, 1.0]]), atol=1e-6, rtol=0)
    torch.testing.assert_close(adv, _whiten([-0.34375, 0.125, 0.5]).unsqueeze(0), atol=1e-5, rtol=0)


def test_gae_skips_observation_tokens():
    """Multi-turn: token 1 is an observation (mask 0). Its value and reward neither bootstrap nor break the chain:
    t=2: A2 = 1 − 0.5 = 0.5;  t=1 (masked) carries V=0.5, A=0.5 through;
    t=0: δ = 0 + 0.5·0.5 − 0.5 = −0.25, A0 = −0.25 + 0.25·0.5 = −0.125.
    returns at valid tokens [0.375, ·, 1.0]; advantages at valid tokens = whiten([−0.125, 0.5]) = [−1/√2, 1/√2].
    Changing the observation's value or reward changes nothing at valid tokens."""
    mask = torch.tensor([[1.0, 0.0, 1.0]])
    rewards = torch.tensor([[0.0, 0.0, 1.0]])
    adv, ret = compute_gae_advantage_return(rewards, torch.tensor([[0.5, 9.0, 0.5]]), mask, gamma=0.5, lam=0.5)
    valid = mask.bool()
    torch.testing.assert_close(ret[valid], torch.tensor([0.375, 1.0]), atol=1e-6, rtol=0)
    torch.testing.assert_close(adv[valid], torch.tensor([-(0.5**0.5), 0.5**0.5]), atol=1e-5, rtol=0)
    adv2, ret2 = compute_gae_advantage_return(
        torch.tensor([[0.0, 7.0, 1.0]]), torch.tensor([[0.5, -3.0, 0.5]]), mask, gamma=0.5, lam=0.5
    )
    torch.testing.assert_close(adv2[valid], adv[valid], atol=0, rtol=0)
    torch.testing.assert_close(ret2[valid], ret[valid], atol=0, rtol=0)


def test_gae_accepts_bool_mask_and_has_no_grad():
    """A bool response_mask works like a float one, and the outputs carry no autograd graph."""
    values = torch.tensor([[0.5, 0.25, 0.5]], requires_grad=True)
    rewards = torch.tensor([[0.0, 0.0, 1.0]])
    adv_b, _ = compute_gae_advantage_return(rewards, values, torch.ones(1, 3, dtype=torch.bool), 0.5, 0.5)
    adv_f, ret = compute_gae_advantage_return(rewards, values, torch.ones(1, 3), 0.5, 0.5)
    torch.testing.assert_close(adv_b, adv_f, atol=0, rtol=0)
    assert not adv_f.requires_grad and not ret.requires_grad


@dataclass
class _AlgoCfg:
    gamma: float = 0.5


def test_reinforce_plus_plus_discounted_returns_and_whitening():
    """γ = 0.5. Row 0: r = [0, 0, 1] -> G = [0.25, 0.5, 1]. Row 1: r = [0, 2, 0], mask [1, 1, 0] -> G = [1, 2, 0].
    Valid returns [0.25, 0.5, 1, 1, 2] are whitened together; the masked token's advantage is 0."""
    rewards = torch.tensor([[0.0, 0.0, 1.0], [0.0, 2.0, 0.0]])
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]])
    adv, ret = compute_reinforce_plus_plus_outcome_advantage(rewards, mask, config=_AlgoCfg())
    torch.testing.assert_close(ret, torch.tensor([[0.25, 0.5, 1.0], [1.0, 2.0, 0.0]]), atol=1e-6, rtol=0)
    torch.testing.assert_close(adv[mask.bool()], _whiten([0.25, 0.5, 1.0, 1.0, 2.0]), atol=1e-5, rtol=0)
    assert adv[1, 2] == 0


def test_reinforce_plus_plus_needs_config():
    """REINFORCE++ reads algorithm.gamma from the config; calling it without one is a ValueError."""
    with pytest.raises(ValueError, match="algorithm.gamma"):
        compute_reinforce_plus_plus_outcome_advantage(torch.zeros(1, 2), torch.ones(1, 2))


def test_remax_return_minus_greedy_baseline():
    """returns = reverse cumsum of r·mask: row 0 [1, 1, 1], row 1 [2, 2, 0]; baselines [0.5, 3]:
    advantages = returns − b·mask = [[0.5, 0.5, 0.5], [−1, −1, 0]]."""
    rewards = torch.tensor([[0.0, 0.0, 1.0], [0.0, 2.0, 0.0]])
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]])
    adv, ret = compute_remax_outcome_advantage(rewards, torch.tensor([0.5, 3.0]), mask)
    torch.testing.assert_close(ret, torch.tensor([[1.0, 1.0, 1.0], [2.0, 2.0, 0.0]]), atol=0, rtol=0)
    torch.testing.assert_close(adv, torch.tensor([[0.5, 0.5, 0.5], [-1.0, -1.0, 0.0]]), atol=0, rtol=0)


@pytest.mark.parametrize(
    "call",
    [
        lambda: compute_gae_advantage_return(torch.zeros(2, 3), torch.zeros(2, 4), torch.ones(2, 3), 1.0, 1.0),
        lambda: compute_reinforce_plus_plus_outcome_advantage(torch.zeros(2, 3), torch.ones(2, 4), config=_AlgoCfg()),
        lambda: compute_remax_outcome_advantage(torch.zeros(2, 3), torch.zeros(2), torch.ones(3, 3)),
        lambda: compute_remax_outcome_advantage(torch.zeros(2, 3), torch.zeros(3), torch.ones(2, 3)),
    ],
)
def test_mismatched_shapes_raise(call):
    """Inputs of mismatched shapes raise ValueError instead of broadcasting."""
    with pytest.raises(ValueError, match="shape|reward_baselines"):
        call()
