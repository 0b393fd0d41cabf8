"""KL estimators between the policy and the reference policy, and the KL-coefficient controllers.

Used twice in PPO: as a reward penalty (``algorithm.use_kl_in_reward``, ``algorithm.kl_penalty``, coefficient
from a controller, ``algorithm.kl_ctrl``) and as a loss term (``actor.use_kl_loss``, ``actor.kl_loss_type``).

Per-token estimators of KL(π‖π_ref) from a sample y ~ π, with Δ = log π(y) − log π_ref(y) (J. Schulman,
"Approximating KL divergence", 2020):

=================  ==========================================  ============================================
name               value                                       per-sample gradient (w.r.t. θ, via log π)
=================  ==========================================  ============================================
``kl`` / ``k1``    Δ                                           ∇log π                 (E_π[·] = 0)
``abs``            |Δ|                                         sign(Δ)·∇log π
``mse`` / ``k2``   ½ Δ²                                        Δ·∇log π               (E_π[·] = ∇KL(π‖π_ref))
``low_var_kl`` /   e^{−Δ} + Δ − 1  (clamped: Δ to ±20,         (1 − π_ref/π)·∇log π   (E_π[·] = ∇KL(π_ref‖π))
``k3``             value to ±10)
``full``           needs full-vocabulary distributions:        NotImplementedError
                   not supported
=================  ==========================================  ============================================

k1 and k3 are unbiased for the *value* of KL(π‖π_ref) but their gradients are not the gradient of that KL:
E_π[∇log π] = Σ∇π = 0, so k1 has zero expected gradient, and k3's expected gradient is −Σ π_ref ∇log π, the
gradient of the *forward* KL(π_ref‖π). k2 is biased in value but its expected gradient
E_π[Δ ∇log π] = ∇ Σ π Δ is exactly ∇KL(π‖π_ref) (the term Σ π ∇Δ = Σ ∇π vanishes).

Straight-through ``+`` variants (``k1+``, ``k3+``, ``low_var_kl+``, ``abs+`` ...): the *value* of the named
estimator (what is logged and what enters the loss) with the *gradient* of k2::

    out = k2 − stop_grad(k2) + stop_grad(named)

so out == named in the forward pass and ∂out/∂θ == ∂k2/∂θ. ``k2+`` / ``mse+`` are plain k2.
"""

from __future__ import annotations

from typing import Protocol

import numpy as np
import torch

from verl.trainer.ppo.input_checks import check_same_shape

_KL_ESTIMATOR_NAMES = ("kl", "k1", "abs", "mse", "k2", "low_var_kl", "k3", "full")


def kl_penalty_forward(logprob: torch.Tensor, ref_logprob: torch.Tensor, kl_penalty: str) -> torch.Tensor:
    """The raw per-token KL estimator named ``kl_penalty`` (no ``+`` suffix; see the module docstring).

    Args:
        logprob: ``(bs, T)`` log π of the sampled tokens.
        ref_logprob: ``(bs, T)`` log π_ref of the same tokens.
        kl_penalty: estimator name.

    Returns:
        ``(bs, T)`` estimate; its autograd graph is that of the estimator itself.
    """
    check_same_shape("kl_penalty", logprob=logprob, ref_logprob=ref_logprob)
    if kl_penalty in ("kl", "k1"):
        return logprob - ref_logprob
    if kl_penalty == "abs":
        return (logprob - ref_logprob).abs()
    if kl_penalty in ("mse", "k2"):
        return 0.5 * (logprob - ref_logprob).square()
    if kl_penalty in ("low_var_kl", "k3"):
        # log(π_ref/π) is clamped so exp() cannot overflow; the result is clamped because rare tokens with
        # π_ref ≫ π would otherwise dominate the mean.
        log_ref_over_pi = torch.clamp(ref_logprob - logprob, min=-20.0, max=20.0)
        k3 = torch.exp(log_ref_over_pi) - log_ref_over_pi - 1.0
        return torch.clamp(k3, min=-10.0, max=10.0)
    if kl_penalty == "full":
        raise NotImplementedError(
            "kl_penalty='full' needs the full-vocabulary distributions, which are never materialised here; "
            "use 'low_var_kl' (k3), 'kl' (k1) or 'mse' (k2)."
        )
    raise ValueError(
        f"Unknown KL estimator {kl_penalty!r} (algorithm.kl_penalty / actor_rollout_ref.actor.kl_loss_type); "
        f"choose one of {list(_KL_ESTIMATOR_NAMES)}, optionally with a '+' suffix (e.g. 'k3+')."
    )


def kl_penalty(logprob: torch.Tensor, ref_logprob: torch.Tensor, kl_penalty: str) -> torch.Tensor:
    """Per-token KL estimate; a trailing ``+`` keeps the value but uses the k2 gradient (straight-through).

    Args:
        logprob: ``(bs, T)`` log π.
        ref_logprob: ``(bs, T)`` log π_ref.
        kl_penalty: ``kl|k1, abs, mse|k2, low_var_kl|k3, full``, each optionally suffixed with ``+``.

    Returns:
        ``(bs, T)`` KL estimate.
    """
    straight_through = kl_penalty.endswith("+")
    base = kl_penalty[:-1] if straight_through else kl_penalty
    value = kl_penalty_forward(logprob, ref_logprob, base)
    if not straight_through or base in ("mse", "k2"):
        return value
    k2 = 0.5 * (logprob - ref_logprob).square()
    return k2 - k2.detach() + value.detach()


def compute_rewards(
    token_level_scores: torch.Tensor, old_log_prob: torch.Tensor, ref_log_prob: torch.Tensor, kl_ratio: float
) -> torch.Tensor:
    """Token-level rewards with a k1 KL penalty: ``scores − kl_ratio · (log π_old − log π_ref)``, all ``(bs, T)``."""
    check_same_shape(
        "compute_rewards", token_level_scores=token_level_scores, old_log_prob=old_log_prob, ref_log_prob=ref_log_prob
    )
    return token_level_scores - (old_log_prob - ref_log_prob) * kl_ratio


class AdaptiveKLController:
    """Adaptive KL coefficient (Ziegler et al. 2019, arXiv:1909.08593).

    After each step the coefficient moves towards keeping the observed KL at ``target_kl``:
    ``value *= 1 + clip(current_kl / target_kl − 1, −0.2, 0.2) · n_steps / horizon``.
    """

    def __init__(self, init_kl_coef: float, target_kl: float, horizon: int):
        self.value = init_kl_coef
        self.target = target_kl
        self.horizon = horizon

    def update(self, current_kl: float, n_steps: int) -> None:
        """Update ``value`` from the KL measured over the last ``n_steps`` samples."""
        proportional_error = float(np.clip(current_kl / self.target - 1.0, -0.2, 0.2))
        self.value *= 1.0 + proportional_error * n_steps / self.horizon


class FixedKLController:
    """Constant KL coefficient; ``update`` is a no-op."""

    def __init__(self, kl_coef: float):
        self.value = kl_coef

    def update(self, current_kl: float, n_steps: int) -> None:
        """Nothing to update: the coefficient is fixed."""


class _KLControlFields(Protocol):
    """The fields of ``algorithm.kl_ctrl`` (``KLControlConfig``) read here."""

    type: str
    kl_coef: float
    horizon: int
    target_kl: float


def get_kl_controller(kl_ctrl: _KLControlFields) -> FixedKLController | AdaptiveKLController:
    """Build the controller configured by ``algorithm.kl_ctrl`` (``type`` = ``fixed`` | ``adaptive``)."""
    if kl_ctrl.type == "fixed":
        return FixedKLController(kl_coef=kl_ctrl.kl_coef)
    if kl_ctrl.type == "adaptive":
        if not kl_ctrl.horizon > 0:
            raise ValueError(
                f"algorithm.kl_ctrl.horizon must be > 0 for the adaptive KL controller, got {kl_ctrl.horizon}."
            )
        return AdaptiveKLController(init_kl_coef=kl_ctrl.kl_coef, target_kl=kl_ctrl.target_kl, horizon=kl_ctrl.horizon)
    raise ValueError(f"Unknown algorithm.kl_ctrl.type {kl_ctrl.type!r}; choose 'fixed' or 'adaptive'.")
