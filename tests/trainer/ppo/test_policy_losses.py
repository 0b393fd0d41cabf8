"""Ratio-based policy losses (vanilla PPO dual-clip, GSPO, SAPO, GPG, GMPO, CISPO) and the policy-loss registry,
on hand-computed examples."""

import logging
import math
from dataclasses import dataclass, field

import pytest
import torch

from verl.trainer.ppo import core_algos
from verl.trainer.ppo.core_algos import (
    POLICY_LOSS_REGISTRY,
    compute_policy_loss,
    compute_policy_loss_cispo,
    compute_policy_loss_geo_mean,
    compute_policy_loss_gpg,
    compute_policy_loss_gspo,
    compute_policy_loss_sapo,
    compute_policy_loss_vanilla,
    get_policy_loss_fn,
    register_policy_loss,
)


@dataclass
class PolicyLossCfg:
    """The fields of ActorConfig.policy_loss the losses read (upstream names and defaults)."""

    loss_mode: str = "vanilla"
    clip_cov_ratio: float = 0.0002
    clip_cov_lb: float = 1.0
    clip_cov_ub: float = 5.0
    kl_cov_ratio: float = 0.0002
    ppo_kl_coef: float = 0.1
    rollout_correction: object = None


@dataclass
class ActorCfg:
    """The fields of ActorConfig the losses read (upstream names and defaults)."""

    clip_ratio: float = 0.2
    clip_ratio_low: float | None = 0.2
    clip_ratio_high: float | None = 0.28
    clip_ratio_c: float = 3.0
    tau_pos: float = 1.0
    tau_neg: float = 1.05
    loss_agg_mode: str = "token-mean"
    loss_scale_factor: float | None = None
    policy_loss: PolicyLossCfg = field(default_factory=PolicyLossCfg)
    global_batch_info: dict = field(default_factory=dict)


def _log_probs(ratios, old=0.2):
    """old_log_prob = log(old) everywhere; log_prob = old + log r (requires grad)."""
    old_lp = torch.full((1, len(ratios)), math.log(old))
    log_prob = (old_lp + torch.log(torch.tensor([ratios]))).requires_grad_(True)
    return old_lp, log_prob


# Vanilla example, ε_low = 0.2, ε_high = 0.28, c = 3 (clip range [0.8, 1.28]):
#   t0 A=+1 r=1.5 : max(−1.5, −1.28) = −1.28      PPO-clipped (gradient 0)
#   t1 A=+1 r=0.5 : max(−0.5, −0.8)  = −0.5       unclipped (∂/∂log π = −A·r = −0.5)
#   t2 A=−1 r=0.5 : max(0.5, 0.8)    = 0.8        PPO-clipped; min(3, 0.8) = 0.8
#   t3 A=−1 r=4.0 : max(4.0, 1.28)   = 4.0        dual clip: min(3, 4) = 3 (gradient 0)
# token-mean = (−1.28 − 0.5 + 0.8 + 3)/4 = 0.505; pg_clipfrac 2/4; pg_clipfrac_lower 1/4;
# ppo_kl = mean(−log r) = −(ln 1.5 + 2 ln 0.5 + ln 4)/4 = −ln 1.5 / 4.
RATIOS = [1.5, 0.5, 0.5, 4.0]
ADV = torch.tensor([[1.0, 1.0, -1.0, -1.0]])
MASK = torch.ones(1, 4)


def test_vanilla_clip_and_dual_clip():
    """Loss, metrics and gradient of the vanilla PPO loss on the four hand-computed cases above."""
    old_lp, log_prob = _log_probs(RATIOS)
    loss, metrics = compute_policy_loss_vanilla(old_lp, log_prob, ADV, MASK, "token-mean", ActorCfg())
    assert loss.item() == pytest.approx(0.505, abs=1e-6)
    assert metrics["actor/pg_clipfrac"] == pytest.approx(0.5, abs=1e-6)
    assert metrics["actor/pg_clipfrac_lower"] == pytest.approx(0.25, abs=1e-6)
    assert metrics["actor/ppo_kl"] == pytest.approx(-math.log(1.5) / 4, abs=1e-6)
    loss.backward()
    torch.testing.assert_close(log_prob.grad, torch.tensor([[0.0, -0.5 / 4, 0.0, 0.0]]), atol=1e-6, rtol=0)


def test_vanilla_symmetric_fallback_to_clip_ratio():
    """clip_ratio_low/high = None fall back to clip_ratio = 0.2: t0 is then clipped at 1.2 -> (−1.2 − 0.5 + 0.8 + 3)/4."""
    old_lp, log_prob = _log_probs(RATIOS)
    cfg = ActorCfg(clip_ratio_low=None, clip_ratio_high=None)
    loss, _ = compute_policy_loss_vanilla(old_lp, log_prob, ADV, MASK, "token-mean", cfg)
    assert loss.item() == pytest.approx((-1.2 - 0.5 + 0.8 + 3.0) / 4, abs=1e-6)


def test_vanilla_mask_is_weights_and_global_batch_info():
    """A masked 5th token with a huge ratio changes nothing; IS weights [1, 2, 1, 1] scale t1 -> (−1.28 − 1 + 0.8 + 3)/4;
    global_batch_info (dp 2, 8 global tokens) -> 2.02/8·2 = 0.505 again."""
    old_lp, log_prob = _log_probs(RATIOS + [100.0])
    adv = torch.cat([ADV, torch.tensor([[5.0]])], dim=1)
    mask = torch.tensor([[1.0, 1.0, 1.0, 1.0, 0.0]])
    loss, _ = compute_policy_loss_vanilla(old_lp, log_prob, adv, mask, "token-mean", ActorCfg())
    assert loss.item() == pytest.approx(0.505, abs=1e-6)
    weights = torch.tensor([[1.0, 2.0, 1.0, 1.0, 1.0]])
    loss, _ = compute_policy_loss_vanilla(old_lp, log_prob, adv, mask, "token-mean", ActorCfg(), weights)
    assert loss.item() == pytest.approx((-1.28 - 1.0 + 0.8 + 3.0) / 4, abs=1e-6)
    cfg = ActorCfg(global_batch_info={"dp_size": 2, "batch_num_tokens": 8, "global_batch_size": 2})
    loss, _ = compute_policy_loss_vanilla(old_lp, log_prob, adv, mask, "token-mean", cfg)
    assert loss.item() == pytest.approx(0.505, abs=1e-6)


def test_vanilla_validation():
    """No config, clip_ratio_c <= 1 and mismatched shapes are ValueErrors naming the problem."""
    old_lp, log_prob = _log_probs(RATIOS)
    with pytest.raises(ValueError, match="actor config"):
        compute_policy_loss_vanilla(old_lp, log_prob, ADV, MASK)
    with pytest.raises(ValueError, match="clip_ratio_c"):
        compute_policy_loss_vanilla(old_lp, log_prob, ADV, MASK, config=ActorCfg(clip_ratio_c=1.0))
    with pytest.raises(ValueError, match="same shape"):
        compute_policy_loss_vanilla(old_lp, log_prob, ADV[:, :3], MASK, config=ActorCfg())


def test_deprecated_compute_policy_loss_matches_vanilla():
    """The deprecated function warns and returns (loss, clipfrac, ppo_kl, clipfrac_lower) equal to vanilla's."""
    old_lp, log_prob = _log_probs(RATIOS)
    with pytest.warns(DeprecationWarning):
        loss, clipfrac, ppo_kl, clipfrac_lower = compute_policy_loss(
            old_lp, log_prob, ADV, MASK, cliprange=0.2, cliprange_high=0.28
        )
    assert loss.item() == pytest.approx(0.505, abs=1e-6)
    assert (clipfrac.item(), clipfrac_lower.item()) == pytest.approx((0.5, 0.25), abs=1e-6)
    assert ppo_kl.item() == pytest.approx(-math.log(1.5) / 4, abs=1e-6)


def test_gspo_sequence_ratio():
    """One sequence, log r = [0.2, 0.4] -> s = e^{0.3} = 1.3498588. A = +1: clip at 1.28 binds -> loss −1.28, clipfrac 1,
    no gradient. A = −1: loss = s, gradient per token = −A·s/T = 1.3498588/2 (value s, gradient through each log π)."""
    old_lp = torch.zeros(1, 2)
    log_prob = torch.tensor([[0.2, 0.4]], requires_grad=True)
    loss, metrics = compute_policy_loss_gspo(old_lp, log_prob, torch.ones(1, 2), torch.ones(1, 2), config=ActorCfg())
    assert loss.item() == pytest.approx(-1.28, abs=1e-6) and metrics["actor/pg_clipfrac"] == 1.0
    loss, _ = compute_policy_loss_gspo(old_lp, log_prob, -torch.ones(1, 2), torch.ones(1, 2), config=ActorCfg())
    assert loss.item() == pytest.approx(math.exp(0.3), abs=1e-6)
    loss.backward()
    torch.testing.assert_close(log_prob.grad, torch.full((1, 2), math.exp(0.3) / 2), atol=1e-6, rtol=0)


def test_gspo_always_aggregates_seq_mean_token_mean():
    """r = 1; seq 0 (1 token, A = −2) and seq 1 (3 tokens, A = −1): seq-mean-token-mean = (2 + 1)/2 = 1.5 even when
    loss_agg_mode='token-mean' is passed (token-mean would give (2 + 3)/4 = 1.25)."""
    mask = torch.tensor([[1.0, 0.0, 0.0], [1.0, 1.0, 1.0]])
    adv = torch.tensor([[-2.0, -2.0, -2.0], [-1.0, -1.0, -1.0]])
    loss, _ = compute_policy_loss_gspo(torch.zeros(2, 3), torch.zeros(2, 3), adv, mask, "token-mean", ActorCfg())
    assert loss.item() == pytest.approx(1.5, abs=1e-6)


def test_sapo_soft_gate():
    """r = 1: gate = σ(0)·4/τ = 2/τ. Row 0 A = +1, τ_pos = 1 -> −2; row 1 A = −1, τ_neg = 1.05 -> +2/1.05.
    seq-mean-token-mean = (−2 + 2/1.05)/2. f'(1) = 1, so ∂/∂log π = −A·r·f'(1)/2 = [−0.5, +0.5]."""
    log_prob = torch.zeros(2, 1, requires_grad=True)
    loss, metrics = compute_policy_loss_sapo(
        torch.zeros(2, 1), log_prob, torch.tensor([[1.0], [-1.0]]), torch.ones(2, 1), config=ActorCfg()
    )
    assert loss.item() == pytest.approx((-2 + 2 / 1.05) / 2, abs=1e-6)
    assert metrics["actor/pg_clipfrac"] == 0.0
    loss.backward()
    torch.testing.assert_close(log_prob.grad, torch.tensor([[-0.5], [0.5]]), atol=1e-6, rtol=0)


def test_gpg_plain_policy_gradient():
    """L = −A·log π: log π = [−1, −2], A = [1, −1] -> [1, −2] -> token-mean −0.5; no metrics."""
    loss, metrics = compute_policy_loss_gpg(
        torch.zeros(1, 2),
        torch.tensor([[-1.0, -2.0]]),
        torch.tensor([[1.0, -1.0]]),
        torch.ones(1, 2),
        config=ActorCfg(),
    )
    assert loss.item() == pytest.approx(-0.5, abs=1e-6) and metrics == {}


def test_geo_mean_sign_aware_clip():
    """Symmetric ε = 0.2 (log-ratio clip [−0.2, 0.2]); log r = [0.1, 0.5] in both rows.
    Row 0 A = +1: clipped log r = [0.1, 0.2] (upper clip binds), mean 0.15 -> L0 = −e^{0.15}.
    Row 1 A = −1: the pessimistic side for A < 0 keeps the larger value: [0.1, 0.5], mean 0.3 -> L1 = +e^{0.3}.
    loss = (L0 + L1)/2; pg_clipfrac (clipped & A > 0) = 1/4, pg_clipfrac_lower (clipped & A < 0) = 1/4."""
    cfg = ActorCfg(clip_ratio_low=0.2, clip_ratio_high=0.2)
    log_ratio = torch.tensor([[0.1, 0.5], [0.1, 0.5]])
    adv = torch.tensor([[1.0, 1.0], [-1.0, -1.0]])
    loss, metrics = compute_policy_loss_geo_mean(torch.zeros(2, 2), log_ratio, adv, torch.ones(2, 2), config=cfg)
    assert loss.item() == pytest.approx((-math.exp(0.15) + math.exp(0.3)) / 2, abs=1e-6)
    assert metrics["actor/pg_clipfrac"] == 0.25 and metrics["actor/pg_clipfrac_lower"] == 0.25


def test_cispo_keeps_gradient_on_clipped_tokens():
    """r = [1.5, 0.5], A = 1, clip [0.8, 1.28] -> weights sg([1.28, 0.8]). L = −w·A·log π, token-mean:
    loss = −(1.28·log π0 + 0.8·log π1)/2; ∂/∂log π = [−0.64, −0.4] (non-zero although both tokens are clipped)."""
    old_lp, log_prob = _log_probs([1.5, 0.5])
    loss, metrics = compute_policy_loss_cispo(old_lp, log_prob, torch.ones(1, 2), torch.ones(1, 2), config=ActorCfg())
    lp = log_prob.detach()[0]
    assert loss.item() == pytest.approx(-(1.28 * lp[0].item() + 0.8 * lp[1].item()) / 2, abs=1e-6)
    assert metrics["actor/pg_clipfrac"] == 1.0
    loss.backward()
    torch.testing.assert_close(log_prob.grad, torch.tensor([[-0.64, -0.4]]), atol=1e-6, rtol=0)


UPSTREAM_LOSSES = {
    "vanilla": "compute_policy_loss_vanilla",
    "dppo_tv": "compute_policy_loss_dppo_tv",
    "dppo_kl": "compute_policy_loss_dppo_kl",
    "gspo": "compute_policy_loss_gspo",
    "sapo": "compute_policy_loss_sapo",
    "gpg": "compute_policy_loss_gpg",
    "clip_cov": "compute_policy_loss_clip_cov",
    "kl_cov": "compute_policy_loss_kl_cov",
    "geo_mean": "compute_policy_loss_geo_mean",
    "cispo": "compute_policy_loss_cispo",
    "bypass_mode": "compute_policy_loss_bypass_mode",
}


def test_registry_holds_the_v0_7_losses():
    """Every v0.7.1 loss_mode resolves to the core_algos function of upstream's name."""
    for name, fn_name in UPSTREAM_LOSSES.items():
        assert get_policy_loss_fn(name) is getattr(core_algos, fn_name)


def test_unknown_loss_mode_lists_choices():
    """An unknown loss_mode raises ValueError starting with upstream's "Unsupported loss mode: <name>", listing the
    registered names and naming the config key."""
    with pytest.raises(
        ValueError, match=r"^Unsupported loss mode: vanila\. Supported modes are: \[.*'vanilla'.*loss_mode"
    ):
        get_policy_loss_fn("vanila")


@pytest.mark.parametrize("name", sorted(UPSTREAM_LOSSES))
def test_every_registered_loss_follows_the_call_convention(name):
    """Each loss accepts the common positional call and returns (scalar tensor with grad, dict of floats)."""
    cfg = ActorCfg(policy_loss=PolicyLossCfg(rollout_correction=_RolloutCorrection()))
    old_lp, log_prob = _log_probs([1.1, 0.9, 1.0])
    loss, metrics = get_policy_loss_fn(name)(
        old_lp, log_prob, torch.tensor([[1.0, -1.0, 0.5]]), torch.ones(1, 3), "token-mean", cfg, None
    )
    assert loss.dim() == 0 and loss.requires_grad and torch.isfinite(loss)
    assert all(isinstance(v, float) for v in metrics.values())


@dataclass
class _RolloutCorrection:
    loss_type: str = "ppo_clip"
    rollout_is: str | None = None
    rollout_is_threshold: float = 2.0
    rollout_is_batch_normalize: bool = False
    rollout_rs: str | None = None
    rollout_rs_threshold: float | None = None


def test_register_policy_loss_overrides_with_a_warning(caplog):
    """As upstream, registering under a taken name replaces the function (user override), and it is logged."""
    original = POLICY_LOSS_REGISTRY["gpg"]

    def my_gpg(*args, **kwargs):
        return torch.tensor(0.0), {}

    try:
        with caplog.at_level(logging.WARNING):
            register_policy_loss("gpg")(my_gpg)
        assert get_policy_loss_fn("gpg") is my_gpg
        assert "replaces" in caplog.text
    finally:
        POLICY_LOSS_REGISTRY["gpg"] = original
