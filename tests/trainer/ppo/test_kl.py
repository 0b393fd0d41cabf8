"""KL estimators (values, clamps, straight-through '+' gradients), compute_rewards and the KL controllers."""

import math
from dataclasses import dataclass

import pytest
import torch

from verl.trainer.ppo.core_algos import (
    AdaptiveKLController,
    FixedKLController,
    compute_rewards,
    get_kl_controller,
    kl_penalty,
    kl_penalty_forward,
)

# Δ = logprob − ref_logprob = [0.5, −1.0]
LOGP = torch.tensor([[-1.0, -2.0]])
REF = torch.tensor([[-1.5, -1.0]])


@pytest.mark.parametrize(
    "name, expected",
    [
        ("kl", [0.5, -1.0]),  # Δ
        ("k1", [0.5, -1.0]),
        ("abs", [0.5, 1.0]),  # |Δ|
        ("mse", [0.125, 0.5]),  # ½Δ²
        ("k2", [0.125, 0.5]),
        # k3 = e^{−Δ} + Δ − 1: e^{−0.5} − 0.5 = 0.6065306597 − 0.5 = 0.1065306597 ; e^{1} − 2 = 0.7182818285
        ("low_var_kl", [0.1065306597, 0.7182818285]),
        ("k3", [0.1065306597, 0.7182818285]),
    ],
)
def test_estimator_values(name, expected):
    """Each estimator's per-token value matches the hand-computed formula (fp32, tol 1e-6)."""
    torch.testing.assert_close(kl_penalty(LOGP, REF, name), torch.tensor([expected]), atol=1e-6, rtol=0)


def test_k3_is_clamped():
    """k3 clamps log(π_ref/π) to ±20 and the result to ±10: Δ = −30 gives 10 (not e^30), and stays finite."""
    out = kl_penalty(torch.tensor([[-31.0]]), torch.tensor([[-1.0]]), "k3")
    assert out.item() == 10.0


@pytest.mark.parametrize("name", ["k1+", "kl+", "k3+", "low_var_kl+", "abs+"])
def test_straight_through_keeps_value_and_uses_k2_gradient(name):
    """'+' variants: forward value == the base estimator's, gradient == k2's, i.e. ∂/∂logp = Δ = [0.5, −1.0] and
    ∂/∂ref = −Δ (k2 = ½Δ²)."""
    logp, ref = LOGP.clone().requires_grad_(True), REF.clone().requires_grad_(True)
    out = kl_penalty(logp, ref, name)
    torch.testing.assert_close(out.detach(), kl_penalty_forward(LOGP, REF, name[:-1]), atol=0, rtol=0)
    out.sum().backward()
    torch.testing.assert_close(logp.grad, torch.tensor([[0.5, -1.0]]), atol=1e-6, rtol=0)
    torch.testing.assert_close(ref.grad, torch.tensor([[-0.5, 1.0]]), atol=1e-6, rtol=0)


def test_plain_k3_gradient_differs_from_k2():
    """Without '+', k3's own gradient is used: ∂k3/∂logp = 1 − e^{−Δ} = [1 − 0.60653066, 1 − e] (guards against the
    straight-through trick leaking into the plain names)."""
    logp = LOGP.clone().requires_grad_(True)
    kl_penalty(logp, REF, "k3").sum().backward()
    expected = torch.tensor([[1 - math.exp(-0.5), 1 - math.e]])
    torch.testing.assert_close(logp.grad, expected, atol=1e-6, rtol=0)


def test_k2_plus_is_plain_k2():
    """'k2+' / 'mse+' are k2 itself (value and gradient)."""
    torch.testing.assert_close(kl_penalty(LOGP, REF, "k2+"), kl_penalty(LOGP, REF, "k2"), atol=0, rtol=0)


def test_full_and_unknown_names_raise():
    """'full' is NotImplementedError; an unknown name is a ValueError listing the choices."""
    with pytest.raises(NotImplementedError):
        kl_penalty(LOGP, REF, "full")
    with pytest.raises(ValueError, match=r"kl_penalty.*low_var_kl"):
        kl_penalty(LOGP, REF, "k4")


def test_shape_mismatch_raises():
    """logprob and ref_logprob of different shapes raise ValueError."""
    with pytest.raises(ValueError, match="same shape"):
        kl_penalty(LOGP, REF[:, :1], "kl")


def test_compute_rewards_subtracts_k1_penalty():
    """scores − β·(old − ref): kl = [0.5, 0, −0.5], β = 0.1 -> [0 − 0.05, 0, 1 + 0.05]."""
    out = compute_rewards(
        torch.tensor([[0.0, 0.0, 1.0]]), torch.tensor([[-1.0, -1.0, -1.0]]), torch.tensor([[-1.5, -1.0, -0.5]]), 0.1
    )
    torch.testing.assert_close(out, torch.tensor([[-0.05, 0.0, 1.05]]), atol=1e-6, rtol=0)


def test_adaptive_controller_update_rule():
    """value *= 1 + clip(kl/target − 1, ±0.2)·n/horizon.
    0.1 -> KL 0.1 vs target 0.05: error clip(1) = 0.2, n/h = 10/100 -> ×1.02 = 0.102;
    then KL 0.045: error −0.1, n/h = 50/100 -> ×0.95 = 0.0969."""
    ctrl = AdaptiveKLController(init_kl_coef=0.1, target_kl=0.05, horizon=100)
    ctrl.update(current_kl=0.1, n_steps=10)
    assert ctrl.value == pytest.approx(0.102, abs=1e-12)
    ctrl.update(current_kl=0.045, n_steps=50)
    assert ctrl.value == pytest.approx(0.0969, abs=1e-12)


def test_fixed_controller_never_changes():
    """FixedKLController.update is a no-op."""
    ctrl = FixedKLController(kl_coef=0.3)
    ctrl.update(current_kl=10.0, n_steps=1000)
    assert ctrl.value == 0.3


@dataclass
class _KLCtrl:
    type: str = "fixed"
    kl_coef: float = 0.001
    horizon: int = 10000
    target_kl: float = 0.1


def test_get_kl_controller_builds_and_validates():
    """type fixed|adaptive builds the right controller; horizon <= 0 and unknown types raise ValueError naming the key."""
    assert isinstance(get_kl_controller(_KLCtrl()), FixedKLController)
    adaptive = get_kl_controller(_KLCtrl(type="adaptive", kl_coef=0.2))
    assert isinstance(adaptive, AdaptiveKLController) and adaptive.value == 0.2 and adaptive.target == 0.1
    with pytest.raises(ValueError, match="kl_ctrl.horizon"):
        get_kl_controller(_KLCtrl(type="adaptive", horizon=0))
    with pytest.raises(ValueError, match="kl_ctrl.type"):
        get_kl_controller(_KLCtrl(type="pid"))
