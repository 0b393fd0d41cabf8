"""clip_cov and kl_cov on hand-computed examples where the covariance selection is deterministic."""

import math
from dataclasses import dataclass, field

import pytest
import torch

from verl.trainer.ppo.core_algos import compute_policy_loss_clip_cov, compute_policy_loss_kl_cov


@dataclass
class PolicyLossCfg:
    clip_cov_ratio: float = 0.0002
    clip_cov_lb: float = 1.0
    clip_cov_ub: float = 5.0
    kl_cov_ratio: float = 0.0002
    ppo_kl_coef: float = 0.1


@dataclass
class ActorCfg:
    clip_ratio: float = 0.2
    clip_ratio_low: float | None = 0.2
    clip_ratio_high: float | None = 0.2
    clip_ratio_c: float = 3.0
    loss_scale_factor: float | None = None
    policy_loss: PolicyLossCfg = field(default_factory=PolicyLossCfg)


# A = [2, −2, 0, 0], log π = [−1, −2.2, −2.4, −2.4]: mean A = 0, mean log π = −8/4 = −2
# cov = A·(log π + 2) = [2·1, −2·(−0.2), 0, 0] = [2, 0.4, 0, 0]: only token 0 lies in (lb, ub) = (1, 5).
ADV = torch.tensor([[2.0, -2.0, 0.0, 0.0]])
LOGP = torch.tensor([[-1.0, -2.2, -2.4, -2.4]])
MASK = torch.ones(1, 4)


def test_clip_cov_detaches_the_high_covariance_token():
    """r = 1 (no PPO clipping), budget max(int(0.0002·4), 1) = 1 = the single candidate (token 0).
    Per-token loss −A·r = [−2, 2, 0, 0]; token 0 is zeroed -> token-mean 2/4 = 0.5; pg_clipfrac 1/4.
    Gradient: token 0 none, token 1 −A·r/4 = 0.5."""
    log_prob = LOGP.clone().requires_grad_(True)
    loss, metrics = compute_policy_loss_clip_cov(LOGP, log_prob, ADV, MASK, config=ActorCfg())
    assert loss.item() == pytest.approx(0.5, abs=1e-6)
    assert metrics["actor/pg_clipfrac"] == pytest.approx(0.25)
    loss.backward()
    torch.testing.assert_close(log_prob.grad, torch.tensor([[0.0, 0.5, 0.0, 0.0]]), atol=1e-6, rtol=0)


def test_clip_cov_ignores_tokens_outside_the_band():
    """With the band moved to (2.5, 5) no token qualifies: plain PPO, loss (−2 + 2)/4 = 0, clipfrac 0."""
    cfg = ActorCfg(policy_loss=PolicyLossCfg(clip_cov_lb=2.5))
    loss, metrics = compute_policy_loss_clip_cov(LOGP, LOGP.clone(), ADV, MASK, config=cfg)
    assert loss.item() == pytest.approx(0.0, abs=1e-6) and metrics["actor/pg_clipfrac"] == 0.0


def test_kl_cov_penalises_the_top_covariance_token():
    """old = log π − 0.1, so r = e^{0.1} everywhere; top-k with k = max(1, int(4·0.0002)) = 1 picks token 0.
    Loss per token −A·r = [−2e^{0.1}, 2e^{0.1}, 0, 0] plus 0.1·|0.1| = 0.01 on token 0 -> token-mean 0.01/4.
    Metric actor/ppo_kl = mean |log r| = 0.1."""
    loss, metrics = compute_policy_loss_kl_cov(LOGP - 0.1, LOGP.clone(), ADV, MASK, config=ActorCfg())
    assert loss.item() == pytest.approx(0.01 / 4, abs=1e-6)
    assert metrics["actor/ppo_kl"] == pytest.approx(0.1, abs=1e-6)


def test_kl_cov_penalty_gradient():
    """∂/∂log π at token 0 = (−A·r + coef·sign(log r))/4 = (−2e^{0.1} + 0.1)/4; token 1: 2e^{0.1}/4."""
    log_prob = LOGP.clone().requires_grad_(True)
    loss, _ = compute_policy_loss_kl_cov(LOGP - 0.1, log_prob, ADV, MASK, config=ActorCfg())
    loss.backward()
    e = math.exp(0.1)
    torch.testing.assert_close(
        log_prob.grad, torch.tensor([[(-2 * e + 0.1) / 4, 2 * e / 4, 0.0, 0.0]]), atol=1e-6, rtol=0
    )


@pytest.mark.parametrize(
    "fn, key", [(compute_policy_loss_clip_cov, "clip_cov_ratio"), (compute_policy_loss_kl_cov, "kl_cov_ratio")]
)
def test_non_positive_ratio_is_rejected(fn, key):
    """A token ratio <= 0 raises ValueError naming the policy_loss key."""
    cfg = ActorCfg(policy_loss=PolicyLossCfg(**{key: 0.0}))
    with pytest.raises(ValueError, match=key):
        fn(LOGP, LOGP, ADV, MASK, config=cfg)
