"""DPPO-TV / DPPO-KL trust regions, REINFORCE with IS weights and bypass_mode, on hand-computed examples."""

import math
from dataclasses import dataclass, field

import pytest
import torch

from verl.trainer.ppo.core_algos import (
    compute_policy_loss_bypass_mode,
    compute_policy_loss_dppo_kl,
    compute_policy_loss_dppo_tv,
    compute_policy_loss_reinforce,
    compute_policy_loss_vanilla,
)
from verl.trainer.ppo.policy_losses_off_policy import binary_kl


@dataclass
class RolloutCorrection:
    loss_type: str = "ppo_clip"
    rollout_is: str | None = None
    rollout_is_threshold: float = 2.0
    rollout_is_batch_normalize: bool = False
    rollout_rs: str | None = None
    rollout_rs_threshold: float | None = None


@dataclass
class PolicyLossCfg:
    rollout_correction: RolloutCorrection | None = field(default_factory=RolloutCorrection)


@dataclass
class ActorCfg:
    clip_ratio: float = 0.2
    clip_ratio_low: float | None = 0.2
    clip_ratio_high: float | None = 0.2
    clip_ratio_c: float = 3.0
    loss_scale_factor: float | None = None
    policy_loss: PolicyLossCfg = field(default_factory=PolicyLossCfg)


def _probs(old: list[float], new: list[float]):
    old_lp = torch.log(torch.tensor([old]))
    log_prob = torch.log(torch.tensor([new])).requires_grad_(True)
    return old_lp, log_prob


def test_dppo_tv_trust_region():
    """δ = 0.2 on the probability shift p − p_old; loss −A·sg(min(r, 3))·log p on tokens inside:
    t0 A=+1 0.5→0.6 (+0.1 ≤ 0.2, inside, r = 1.2)    t1 A=+1 0.3→0.6 (+0.3, outside)
    t2 A=−1 0.5→0.2 (−0.3 < −0.2, outside)            t3 A=−1 0.5→0.4 (−0.1, inside, r = 0.8)
    loss = (−1.2·ln 0.6 + 0.8·ln 0.4)/4; pg_clipfrac 2/4; gradient [−1.2, 0, 0, 0.8]/4."""
    old_lp, log_prob = _probs([0.5, 0.3, 0.5, 0.5], [0.6, 0.6, 0.2, 0.4])
    adv = torch.tensor([[1.0, 1.0, -1.0, -1.0]])
    loss, metrics = compute_policy_loss_dppo_tv(old_lp, log_prob, adv, torch.ones(1, 4), config=ActorCfg())
    assert loss.item() == pytest.approx((-1.2 * math.log(0.6) + 0.8 * math.log(0.4)) / 4, abs=1e-6)
    assert metrics["actor/pg_clipfrac"] == pytest.approx(0.5)
    loss.backward()
    torch.testing.assert_close(log_prob.grad, torch.tensor([[-1.2, 0.0, 0.0, 0.8]]) / 4, atol=1e-6, rtol=0)


def test_dppo_truncates_the_ratio_at_clip_ratio_c():
    """A=−1, p 0.1→0.5 (rising, inside for A ≤ 0): r = 5 is truncated to c = 3 -> loss = +3·ln 0.5;
    pg_clipfrac_lower counts it (r > c, inside)."""
    old_lp, log_prob = _probs([0.1], [0.5])
    loss, metrics = compute_policy_loss_dppo_tv(
        old_lp, log_prob, -torch.ones(1, 1), torch.ones(1, 1), config=ActorCfg()
    )
    assert loss.item() == pytest.approx(3 * math.log(0.5), abs=1e-6)
    assert metrics["actor/pg_clipfrac_lower"] == 1.0


def test_binary_kl_value():
    """KL(Bern(0.5)‖Bern(0.9)) = 0.5·ln(0.5/0.9) + 0.5·ln(0.5/0.1) = 0.5·(−0.5877867 + 1.6094379) = 0.5108256."""
    kl = binary_kl(torch.log(torch.tensor([0.5])), torch.log(torch.tensor([0.9])))
    assert kl.item() == pytest.approx(0.5108256, abs=1e-6)


def test_dppo_kl_trust_region_is_one_sided():
    """δ = 0.2 on the binary KL (0.5108 for 0.5↔0.9 and for 0.5↔0.1):
    t0 A=+1 rising 0.5→0.9: KL > δ -> outside        t1 A=+1 falling 0.5→0.1: against the push -> inside
    t2 A=−1 falling 0.5→0.1: KL > δ -> outside        t3 A=−1 rising 0.5→0.9: against the push -> inside
    loss = (−1·0.2·ln 0.1 + 1·1.8·ln 0.9)/4 (r = 0.2 and 1.8); pg_clipfrac 2/4."""
    old_lp, log_prob = _probs([0.5, 0.5, 0.5, 0.5], [0.9, 0.1, 0.1, 0.9])
    adv = torch.tensor([[1.0, 1.0, -1.0, -1.0]])
    loss, metrics = compute_policy_loss_dppo_kl(old_lp, log_prob, adv, torch.ones(1, 4), config=ActorCfg())
    assert loss.item() == pytest.approx((-0.2 * math.log(0.1) + 1.8 * math.log(0.9)) / 4, abs=1e-6)
    assert metrics["actor/pg_clipfrac"] == pytest.approx(0.5)


def test_reinforce_with_is_weights():
    """L = −A·w·log π, default seq-mean-token-sum: log π = [−1, −2], A = 1, w = [1, 0.5] -> (1 + 1)/1 seq = 2;
    ppo_kl = mean(log π_rollout − log π) = mean([0, 0.5]) = 0.25."""
    rollout_lp = torch.tensor([[-1.0, -1.5]])
    loss, metrics = compute_policy_loss_reinforce(
        rollout_lp,
        torch.tensor([[-1.0, -2.0]]),
        torch.ones(1, 2),
        torch.ones(1, 2),
        config=ActorCfg(),
        rollout_is_weights=torch.tensor([[1.0, 0.5]]),
    )
    assert loss.item() == pytest.approx(2.0, abs=1e-6)
    assert metrics["actor/ppo_kl"] == pytest.approx(0.25, abs=1e-6)


def test_bypass_mode_ppo_clip_is_vanilla():
    """loss_type ppo_clip: exactly the vanilla loss on π/π_rollout, no IS weights applied."""
    old_lp, log_prob = _probs([0.2, 0.2], [0.3, 0.1])
    adv = torch.tensor([[1.0, -1.0]])
    cfg = ActorCfg()
    bypass, _ = compute_policy_loss_bypass_mode(old_lp, log_prob, adv, torch.ones(1, 2), config=cfg)
    vanilla, _ = compute_policy_loss_vanilla(old_lp, log_prob, adv, torch.ones(1, 2), config=cfg)
    assert bypass.item() == vanilla.item()


def test_bypass_mode_reinforce_with_truncated_token_weights():
    """loss_type reinforce, rollout_is token, threshold 2: r = [1.5, 4] -> w = [1.5, 2];
    seq-mean-token-sum of −A·w·log π with A = 1: −(1.5·ln 0.3 + 2·ln 0.8)."""
    old_lp, log_prob = _probs([0.2, 0.2], [0.3, 0.8])
    corr = RolloutCorrection(loss_type="reinforce", rollout_is="token")
    cfg = ActorCfg(policy_loss=PolicyLossCfg(rollout_correction=corr))
    loss, _ = compute_policy_loss_bypass_mode(
        old_lp, log_prob, torch.ones(1, 2), torch.ones(1, 2), "seq-mean-token-sum", cfg
    )
    assert loss.item() == pytest.approx(-(1.5 * math.log(0.3) + 2 * math.log(0.8)), abs=1e-5)


def test_bypass_mode_reinforce_sequence_weights():
    """rollout_is sequence: w = min(Π r, 2) = min(1.5·0.5, 2) = 0.75 on every token of the sequence."""
    old_lp, log_prob = _probs([0.2, 0.2], [0.3, 0.1])
    corr = RolloutCorrection(loss_type="reinforce", rollout_is="sequence")
    cfg = ActorCfg(policy_loss=PolicyLossCfg(rollout_correction=corr))
    loss, _ = compute_policy_loss_bypass_mode(
        old_lp, log_prob, torch.ones(1, 2), torch.ones(1, 2), "seq-mean-token-sum", cfg
    )
    assert loss.item() == pytest.approx(-0.75 * (math.log(0.3) + math.log(0.1)), abs=1e-5)


def test_bypass_mode_rejection_drops_tokens_from_the_loss():
    """rollout_rs token_k1, threshold 2 (ratio bounds [1/2, 2]): r = [1.5, 4] -> k1 = -log r = [-0.405, -1.386];
    keep log(1/2) = -0.693 <= k1 <= log 2: token 2 is rejected. reinforce without IS, seq-mean-token-sum, A = 1:
    loss = -ln 0.3 (token 1 only)."""
    old_lp, log_prob = _probs([0.2, 0.2], [0.3, 0.8])
    corr = RolloutCorrection(loss_type="reinforce", rollout_rs="token_k1", rollout_rs_threshold=2.0)
    cfg = ActorCfg(policy_loss=PolicyLossCfg(rollout_correction=corr))
    loss, metrics = compute_policy_loss_bypass_mode(
        old_lp, log_prob, torch.ones(1, 2), torch.ones(1, 2), "seq-mean-token-sum", cfg
    )
    assert loss.item() == pytest.approx(-math.log(0.3), abs=1e-5)
    assert metrics["rollout_corr/rollout_rs_masked_fraction"] == pytest.approx(0.5)


def test_bypass_mode_config_errors():
    """Missing rollout_correction, an unknown rejection option and an unknown loss_type are clear errors."""
    old_lp, log_prob = _probs([0.2], [0.3])
    args = (old_lp, log_prob, torch.ones(1, 1), torch.ones(1, 1))
    with pytest.raises(ValueError, match="rollout_correction"):
        compute_policy_loss_bypass_mode(*args, config=ActorCfg(policy_loss=PolicyLossCfg(rollout_correction=None)))
    with pytest.raises(ValueError, match="rollout_rs: 'token' is not an option"):
        compute_policy_loss_bypass_mode(
            *args, config=ActorCfg(policy_loss=PolicyLossCfg(RolloutCorrection(rollout_rs="token")))
        )
    with pytest.raises(ValueError, match="loss_type"):
        compute_policy_loss_bypass_mode(
            *args, config=ActorCfg(policy_loss=PolicyLossCfg(RolloutCorrection(loss_type="a2c")))
        )
