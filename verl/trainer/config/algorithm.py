"""RL algorithm settings: `algorithm` (advantage estimator, discount, KL penalty in the reward)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

from verl.base_config import BaseConfig, ConfigError, require_choice, require_positive
from verl.workers.config.common import KL_ESTIMATORS as KL_ESTIMATORS  # re-export (the actor checks them too)
from verl.workers.config.common import check_kl_estimator as check_kl_estimator

__all__ = [
    "KL_ESTIMATORS",
    "AlgoConfig",
    "KLControlConfig",
    "PFPPOConfig",
    "RolloutCorrectionConfig",
    "check_kl_estimator",
]


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
    """`algorithm.rollout_correction`: importance weighting / rejection for rollout-vs-training mismatch.

    The maths and the metrics are in ``verl.trainer.ppo.rollout_corr_helper``. The class methods are upstream's
    presets (``RolloutCorrectionConfig.decoupled_token_is()``, ``bypass_ppo_clip()``, ...). Unlike upstream's class
    default (``rollout_is="sequence"``), the field default here is the YAML's (null): a config built without the
    key behaves as one composed from the YAML.
    """

    rollout_is: Optional[str] = None
    """Importance-sampling weights: null (off) | token | sequence."""

    rollout_is_threshold: Any = 2.0
    """A number u: truncate the weights at u (TIS); a string "l_u": zero the weights outside [l, u] (IcePop)."""

    rollout_rs: Optional[str] = None
    """Rejection sampling: null (off) or comma-separated options (token_k1|k2|k3, seq_sum_k1|k2|k3,
    seq_mean_k1|k2|k3, seq_max_k2|k3, binary_kl); all must pass."""

    rollout_rs_threshold: Any = None
    """One bound for all rollout_rs options or one per option (comma-separated); k1 options take "l_u" ratio
    bounds (or u alone: l = 1/u), the others an upper bound."""

    bypass_mode: bool = False
    """Use the rollout's log-probs as old log-probs (skip the recomputation); the actor's loss becomes
    bypass_mode with `loss_type`."""

    loss_type: str = "ppo_clip"
    """Loss used in bypass mode: ppo_clip | reinforce."""

    rollout_is_batch_normalize: bool = False
    """Normalise the IS weights to mean 1 over the batch."""

    def __post_init__(self) -> None:
        from verl.trainer.ppo import rollout_corr_helper as helper

        if self.rollout_is is not None:
            require_choice("rollout_is", self.rollout_is, ("token", "sequence"))
        require_choice("loss_type", self.loss_type, ("ppo_clip", "reinforce"))
        try:
            helper.parse_rollout_is_threshold(self.rollout_is_threshold)
        except ValueError as err:
            raise ConfigError("rollout_is_threshold", str(err).partition(": ")[2] or str(err)) from None
        if self.rollout_rs is not None:
            try:
                options = helper.parse_rollout_rs_options(self.rollout_rs)
                helper.parse_rollout_rs_thresholds(options, self.rollout_rs_threshold)
            except ValueError as err:
                raise ConfigError("rollout_rs", str(err)) from None

    @property
    def enabled(self) -> bool:
        """Whether anything changes training (weights, rejection or bypass), not just the metrics."""
        return self.rollout_is is not None or self.rollout_rs is not None or self.bypass_mode

    # Upstream's presets. Decoupled mode: three policies (rollout, old, current); bypass: old = rollout.
    @classmethod
    def decoupled_token_is(cls, threshold: float = 2.0) -> RolloutCorrectionConfig:
        return cls(rollout_is="token", rollout_is_threshold=threshold)

    @classmethod
    def decoupled_seq_is(cls, threshold: float = 2.0) -> RolloutCorrectionConfig:
        return cls(rollout_is="sequence", rollout_is_threshold=threshold)

    @classmethod
    def decoupled_token_icepop(cls, threshold: float = 5.0, threshold_lower: float = 0.5) -> RolloutCorrectionConfig:
        return cls(rollout_is="token", rollout_is_threshold=f"{threshold_lower}_{threshold}")

    @classmethod
    def decoupled_seq_is_rs(cls, is_threshold: float = 2.0, rs_threshold: Any = "0.5_2.0") -> RolloutCorrectionConfig:
        return cls(
            rollout_is="sequence",
            rollout_is_threshold=is_threshold,
            rollout_rs="seq_sum_k1",
            rollout_rs_threshold=rs_threshold,
        )

    @classmethod
    def decoupled_geo_rs(cls, rs_threshold: Any = "0.999_1.001") -> RolloutCorrectionConfig:
        return cls(rollout_rs="seq_mean_k1", rollout_rs_threshold=rs_threshold)

    @classmethod
    def decoupled_geo_rs_seq_tis(cls, is_threshold: float = 2.0, rs_threshold: Any = "0.999_1.001"):
        return cls(
            rollout_is="sequence",
            rollout_is_threshold=is_threshold,
            rollout_rs="seq_mean_k1",
            rollout_rs_threshold=rs_threshold,
        )

    @classmethod
    def decoupled_geo_rs_token_tis(cls, is_threshold: float = 2.0, rs_threshold: Any = "0.999_1.001"):
        return cls(
            rollout_is="token",
            rollout_is_threshold=is_threshold,
            rollout_rs="seq_mean_k1",
            rollout_rs_threshold=rs_threshold,
        )

    @classmethod
    def decoupled_k3_rs(cls, rs_threshold: float = 0.01) -> RolloutCorrectionConfig:
        return cls(rollout_rs="seq_mean_k3", rollout_rs_threshold=rs_threshold)

    @classmethod
    def decoupled_k3_rs_seq_tis(cls, is_threshold: float = 2.0, rs_threshold: float = 0.01):
        return cls(
            rollout_is="sequence",
            rollout_is_threshold=is_threshold,
            rollout_rs="seq_mean_k3",
            rollout_rs_threshold=rs_threshold,
        )

    @classmethod
    def decoupled_k3_rs_token_tis(cls, is_threshold: float = 2.0, rs_threshold: float = 0.01):
        return cls(
            rollout_is="token",
            rollout_is_threshold=is_threshold,
            rollout_rs="seq_mean_k3",
            rollout_rs_threshold=rs_threshold,
        )

    @classmethod
    def bypass_ppo_clip(cls) -> RolloutCorrectionConfig:
        return cls(bypass_mode=True, loss_type="ppo_clip")

    @classmethod
    def bypass_ppo_clip_geo_rs(cls, rs_threshold: Any = "0.999_1.001") -> RolloutCorrectionConfig:
        return cls(rollout_rs="seq_mean_k1", rollout_rs_threshold=rs_threshold, bypass_mode=True, loss_type="ppo_clip")

    @classmethod
    def bypass_ppo_clip_k3_rs(cls, rs_threshold: float = 0.01) -> RolloutCorrectionConfig:
        return cls(rollout_rs="seq_mean_k3", rollout_rs_threshold=rs_threshold, bypass_mode=True, loss_type="ppo_clip")

    @classmethod
    def bypass_pg_is(cls, threshold: float = 2.0) -> RolloutCorrectionConfig:
        return cls(rollout_is="sequence", rollout_is_threshold=threshold, bypass_mode=True, loss_type="reinforce")

    @classmethod
    def bypass_pg_token_icepop(cls, threshold: float = 5.0, threshold_lower: float = 0.5) -> RolloutCorrectionConfig:
        return cls(
            rollout_is="token",
            rollout_is_threshold=f"{threshold_lower}_{threshold}",
            bypass_mode=True,
            loss_type="reinforce",
        )

    @classmethod
    def bypass_pg_geo_rs(cls, rs_threshold: Any = "0.999_1.001") -> RolloutCorrectionConfig:
        return cls(rollout_rs="seq_mean_k1", rollout_rs_threshold=rs_threshold, bypass_mode=True, loss_type="reinforce")

    @classmethod
    def bypass_pg_geo_rs_seq_tis(cls, is_threshold: float = 2.0, rs_threshold: Any = "0.999_1.001"):
        return cls(
            rollout_is="sequence",
            rollout_is_threshold=is_threshold,
            rollout_rs="seq_mean_k1",
            rollout_rs_threshold=rs_threshold,
            bypass_mode=True,
            loss_type="reinforce",
        )

    @classmethod
    def bypass_pg_geo_rs_token_tis(cls, is_threshold: float = 2.0, rs_threshold: Any = "0.999_1.001"):
        return cls(
            rollout_is="token",
            rollout_is_threshold=is_threshold,
            rollout_rs="seq_mean_k1",
            rollout_rs_threshold=rs_threshold,
            bypass_mode=True,
            loss_type="reinforce",
        )

    @classmethod
    def disabled(cls) -> RolloutCorrectionConfig:
        return cls(rollout_is=None, rollout_rs=None)


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
