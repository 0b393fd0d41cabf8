"""RL algorithm settings: `algorithm` (advantage estimator, discount, KL penalty in the reward)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from verl.base_config import BaseConfig, ConfigError, require_choice, require_positive

__all__ = [
    "KL_ESTIMATORS",
    "AlgoConfig",
    "KLControlConfig",
    "PFPPOConfig",
    "RolloutCorrectionConfig",
    "check_kl_estimator",
]

KL_ESTIMATORS = ("kl", "k1", "abs", "mse", "k2", "low_var_kl", "k3")
"""KL estimators of core_algos.kl_penalty; a trailing '+' (e.g. 'k3+') uses the k2 gradient (straight-through)."""


def check_kl_estimator(name: str, value: str) -> None:
    """Raise ConfigError unless `value` is a KL estimator name, optionally with the straight-through '+'."""
    base = value[:-1] if value.endswith("+") else value
    if base == "full":
        raise ConfigError(name, "'full' (exact KL over the vocabulary) is not implemented; use low_var_kl (k3) or kl.")
    if base not in KL_ESTIMATORS:
        raise ConfigError(
            name,
            f"{value!r} is not a KL estimator; choose one of {', '.join(KL_ESTIMATORS)} "
            f"(append '+' for the straight-through k2 gradient).",
        )


@dataclass
class KLControlConfig(BaseConfig):
    """`algorithm.kl_ctrl`: the coefficient of the KL penalty subtracted from the reward."""

    type: str = "fixed"
    """fixed (constant kl_coef) | adaptive (proportional controller towards target_kl)."""

    kl_coef: float = 0.001
    """Initial (fixed: constant) KL coefficient beta."""

    horizon: int = 10000
    """adaptive: steps over which beta moves towards the target."""

    target_kl: float = 0.1
    """adaptive: KL the controller aims for."""

    def __post_init__(self) -> None:
        require_choice("type", self.type, ("fixed", "adaptive"))
        if self.kl_coef < 0:
            raise ConfigError("kl_coef", f"must be >= 0, got {self.kl_coef}.")
        if self.type == "adaptive":
            require_positive("horizon", self.horizon)
            require_positive("target_kl", self.target_kl)


@dataclass
class PFPPOConfig(BaseConfig):
    """`algorithm.pf_ppo`: preference-feedback PPO resampling by reward."""

    reweight_method: str = "pow"
    """pow | max_min | max_random."""

    weight_pow: float = 2.0
    """Exponent of the pow reweighting."""

    def __post_init__(self) -> None:
        require_choice("reweight_method", self.reweight_method, ("pow", "max_min", "max_random"))


@dataclass
class RolloutCorrectionConfig(BaseConfig):
    """`algorithm.rollout_correction`: importance weighting / rejection for rollout-vs-training mismatch."""

    rollout_is: Optional[str] = None
    """Importance-sampling weights: null (off) | token | sequence."""

    rollout_is_threshold: float = 2.0
    """Upper truncation of the IS weights."""

    rollout_rs: Optional[str] = None
    """Rejection sampling of mismatched samples: null (off) or the aggregation level."""

    rollout_rs_threshold: Optional[float] = None
    """Rejection threshold."""

    bypass_mode: bool = False
    """Use the rollout's log-probs as old log-probs (skip the recomputation)."""

    loss_type: str = "ppo_clip"
    """Loss used in bypass mode: ppo_clip | reinforce."""

    rollout_is_batch_normalize: bool = False
    """Normalise the IS weights to mean 1 over the batch."""

    def __post_init__(self) -> None:
        if self.rollout_is is not None:
            require_choice("rollout_is", self.rollout_is, ("token", "sequence"))
        require_choice("loss_type", self.loss_type, ("ppo_clip", "reinforce"))
        require_positive("rollout_is_threshold", self.rollout_is_threshold)


@dataclass
class AlgoConfig(BaseConfig):
    """`algorithm`: how rewards become advantages."""

    gamma: float = 1.0
    """Discount factor."""

    lam: float = 1.0
    """GAE lambda."""

    adv_estimator: str = "gae"
    """Name in core_algos' estimator registry: gae | grpo | rloo | reinforce_plus_plus | remax | opo | gpg | ..."""

    norm_adv_by_std_in_grpo: bool = True
    """GRPO: divide by the group std (false = Dr. GRPO)."""

    use_kl_in_reward: bool = False
    """Subtract kl_ctrl.kl_coef * KL(actor || reference) from the token rewards; needs the reference policy."""

    kl_penalty: str = "kl"
    """KL estimator of the reward penalty: kl|k1, abs, mse|k2, low_var_kl|k3 (optional '+' suffix)."""

    kl_ctrl: KLControlConfig = field(default_factory=KLControlConfig)
    """KL coefficient controller."""

    use_pf_ppo: bool = False
    """Preference-feedback PPO."""

    pf_ppo: Optional[PFPPOConfig] = None
    """PF-PPO options; null = not given (upstream's class default, an empty node), i.e. PFPPOConfig's defaults.
    The YAML writes the node out with those defaults, as upstream's YAML does."""

    rollout_correction: RolloutCorrectionConfig = field(default_factory=RolloutCorrectionConfig)
    """Rollout/training mismatch correction."""

    def __post_init__(self) -> None:
        check_kl_estimator("kl_penalty", self.kl_penalty)
        if not 0.0 <= self.gamma <= 1.0:
            raise ConfigError("gamma", f"must be in [0, 1], got {self.gamma}.")
        if not 0.0 <= self.lam <= 1.0:
            raise ConfigError("lam", f"must be in [0, 1], got {self.lam}.")
        if not self.adv_estimator:
            raise ConfigError("adv_estimator", "is empty; use gae, grpo, rloo, ... (core_algos registry names).")
