"""``verl.trainer.ppo.core_algos``: the RL algorithm maths, under upstream verl's names.

This module is the public surface; the implementations live in one module per family:

=====================================  =====================================================================
``advantage_registry``                 ``AdvantageEstimator``, ``register_adv_est``, ``get_adv_estimator_fn``
``advantage_estimators``               GAE, REINFORCE++, ReMax
``group_advantages``                   GRPO (+ vectorized, Dr.GRPO), GDPO, pass@k, RF++-baseline, RLOO, OPO, GPG
``optimal_token_baseline``             OTB and multi-turn OTB
``policy_loss_registry``               ``register_policy_loss``, ``get_policy_loss_fn``
``policy_losses``                      vanilla (PPO dual-clip), GSPO, SAPO, GPG, GMPO (geo_mean), CISPO
``policy_losses_covariance``           clip_cov, kl_cov
``policy_losses_off_policy``           DPPO-TV/KL, REINFORCE with IS, bypass_mode
``loss_aggregation``                   ``agg_loss``
``value_loss``                         ``compute_value_loss``, ``compute_entropy_loss``
``kl``                                 ``kl_penalty`` (+ straight-through variants), KL controllers
``pf_ppo``                             ``compute_pf_ppo_reweight_data``
=====================================  =====================================================================

Importing this module registers every built-in estimator and loss.

The registries are live module attributes, as in upstream where they are plain globals of this module: plugins
and tests read ``core_algos.ADV_ESTIMATOR_REGISTRY`` / ``POLICY_LOSS_REGISTRY`` and sometimes *rebind* them
(``core_algos.ADV_ESTIMATOR_REGISTRY = {...}``); ``register_*`` and ``get_*_fn`` then use the new dict. Here the
dicts live in their registry modules, so this module's attributes are properties that read and rebind those (see
``_CoreAlgosModule`` at the end).
"""

import sys
import types

from verl.trainer.ppo import advantage_registry, policy_loss_registry
from verl.trainer.ppo.advantage_estimators import (
    compute_gae_advantage_return,
    compute_reinforce_plus_plus_outcome_advantage,
    compute_remax_outcome_advantage,
)
from verl.trainer.ppo.advantage_registry import (
    AdvantageEstimator,
    get_adv_estimator_fn,
    register_adv_est,
)
from verl.trainer.ppo.group_advantages import (
    compute_gdpo_outcome_advantage,
    compute_gpg_outcome_advantage,
    compute_grpo_outcome_advantage,
    compute_grpo_passk_outcome_advantage,
    compute_grpo_vectorized_outcome_advantage,
    compute_opo_outcome_advantage,
    compute_reinforce_plus_plus_baseline_outcome_advantage,
    compute_rloo_outcome_advantage,
    compute_rloo_vectorized_outcome_advantage,
)
from verl.trainer.ppo.kl import (
    AdaptiveKLController,
    FixedKLController,
    compute_rewards,
    get_kl_controller,
    kl_penalty,
    kl_penalty_forward,
)
from verl.trainer.ppo.loss_aggregation import LOSS_AGG_MODES, agg_loss
from verl.trainer.ppo.optimal_token_baseline import (
    compute_multi_turn_optimal_token_baseline_advantage,
    compute_optimal_token_baseline_advantage,
)
from verl.trainer.ppo.pf_ppo import compute_pf_ppo_reweight_data
from verl.trainer.ppo.policy_loss_registry import (
    PolicyLossFn,
    get_policy_loss_fn,
    register_policy_loss,
)
from verl.trainer.ppo.policy_losses import (
    compute_policy_loss,
    compute_policy_loss_cispo,
    compute_policy_loss_geo_mean,
    compute_policy_loss_gpg,
    compute_policy_loss_gspo,
    compute_policy_loss_sapo,
    compute_policy_loss_vanilla,
)
from verl.trainer.ppo.policy_losses_covariance import compute_policy_loss_clip_cov, compute_policy_loss_kl_cov
from verl.trainer.ppo.policy_losses_off_policy import (
    compute_policy_loss_bypass_mode,
    compute_policy_loss_dppo_kl,
    compute_policy_loss_dppo_tv,
    compute_policy_loss_reinforce,
)
from verl.trainer.ppo.value_loss import compute_entropy_loss, compute_value_loss

__all__ = [
    "ADV_ESTIMATOR_REGISTRY",  # noqa: F822 - a property of _CoreAlgosModule
    "LOSS_AGG_MODES",
    "POLICY_LOSS_REGISTRY",  # noqa: F822 - a property of _CoreAlgosModule
    "AdaptiveKLController",
    "AdvantageEstimator",
    "FixedKLController",
    "PolicyLossFn",
    "agg_loss",
    "compute_entropy_loss",
    "compute_gae_advantage_return",
    "compute_gdpo_outcome_advantage",
    "compute_gpg_outcome_advantage",
    "compute_grpo_outcome_advantage",
    "compute_grpo_passk_outcome_advantage",
    "compute_grpo_vectorized_outcome_advantage",
    "compute_multi_turn_optimal_token_baseline_advantage",
    "compute_opo_outcome_advantage",
    "compute_optimal_token_baseline_advantage",
    "compute_pf_ppo_reweight_data",
    "compute_policy_loss",
    "compute_policy_loss_bypass_mode",
    "compute_policy_loss_cispo",
    "compute_policy_loss_clip_cov",
    "compute_policy_loss_dppo_kl",
    "compute_policy_loss_dppo_tv",
    "compute_policy_loss_geo_mean",
    "compute_policy_loss_gpg",
    "compute_policy_loss_gspo",
    "compute_policy_loss_kl_cov",
    "compute_policy_loss_reinforce",
    "compute_policy_loss_sapo",
    "compute_policy_loss_vanilla",
    "compute_reinforce_plus_plus_baseline_outcome_advantage",
    "compute_reinforce_plus_plus_outcome_advantage",
    "compute_remax_outcome_advantage",
    "compute_rewards",
    "compute_rloo_outcome_advantage",
    "compute_rloo_vectorized_outcome_advantage",
    "compute_value_loss",
    "get_adv_estimator_fn",
    "get_kl_controller",
    "get_policy_loss_fn",
    "kl_penalty",
    "kl_penalty_forward",
    "register_adv_est",
    "register_policy_loss",
]


class _CoreAlgosModule(types.ModuleType):
    """This module's type: ``ADV_ESTIMATOR_REGISTRY`` and ``POLICY_LOSS_REGISTRY`` read and rebind the registry
    dicts of ``advantage_registry`` / ``policy_loss_registry``, which ``register_*`` and ``get_*_fn`` use."""

    @property
    def ADV_ESTIMATOR_REGISTRY(self) -> dict:  # noqa: N802 - upstream's module-level name
        return advantage_registry.ADV_ESTIMATOR_REGISTRY

    @ADV_ESTIMATOR_REGISTRY.setter
    def ADV_ESTIMATOR_REGISTRY(self, registry: dict) -> None:  # noqa: N802
        advantage_registry.ADV_ESTIMATOR_REGISTRY = registry

    @property
    def POLICY_LOSS_REGISTRY(self) -> dict:  # noqa: N802 - upstream's module-level name
        return policy_loss_registry.POLICY_LOSS_REGISTRY

    @POLICY_LOSS_REGISTRY.setter
    def POLICY_LOSS_REGISTRY(self, registry: dict) -> None:  # noqa: N802
        policy_loss_registry.POLICY_LOSS_REGISTRY = registry


sys.modules[__name__].__class__ = _CoreAlgosModule
