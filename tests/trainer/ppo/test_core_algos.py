"""core_algos public surface: every upstream name importable from it, and the losses/estimators working with the
project's real config dataclasses (ActorConfig, AlgoConfig, KLControlConfig)."""

import importlib

import numpy as np
import pytest
import torch

from verl.trainer.config import AlgoConfig, KLControlConfig
from verl.trainer.ppo import core_algos
from verl.workers.config import ActorConfig

# Names users import from upstream's verl.trainer.ppo.core_algos (v0.7.1 and HEAD), with the family module that
# implements each here.
UPSTREAM_NAMES = {
    "advantage_registry": ["AdvantageEstimator", "ADV_ESTIMATOR_REGISTRY", "register_adv_est", "get_adv_estimator_fn"],
    "policy_loss_registry": ["POLICY_LOSS_REGISTRY", "PolicyLossFn", "register_policy_loss", "get_policy_loss_fn"],
    "loss_aggregation": ["agg_loss"],
    "value_loss": ["compute_value_loss", "compute_entropy_loss"],
    "kl": [
        "kl_penalty",
        "kl_penalty_forward",
        "compute_rewards",
        "AdaptiveKLController",
        "FixedKLController",
        "get_kl_controller",
    ],
    "pf_ppo": ["compute_pf_ppo_reweight_data"],
    "policy_losses": [
        "compute_policy_loss",
        "compute_policy_loss_vanilla",
        "compute_policy_loss_gspo",
        "compute_policy_loss_sapo",
        "compute_policy_loss_gpg",
        "compute_policy_loss_geo_mean",
        "compute_policy_loss_cispo",
    ],
    "policy_losses_covariance": ["compute_policy_loss_clip_cov", "compute_policy_loss_kl_cov"],
    "policy_losses_off_policy": [
        "compute_policy_loss_dppo_tv",
        "compute_policy_loss_dppo_kl",
        "compute_policy_loss_reinforce",
        "compute_policy_loss_bypass_mode",
    ],
    "advantage_estimators": [
        "compute_gae_advantage_return",
        "compute_reinforce_plus_plus_outcome_advantage",
        "compute_remax_outcome_advantage",
    ],
    "group_advantages": [
        "compute_grpo_outcome_advantage",
        "compute_grpo_vectorized_outcome_advantage",
        "compute_gdpo_outcome_advantage",
        "compute_grpo_passk_outcome_advantage",
        "compute_reinforce_plus_plus_baseline_outcome_advantage",
        "compute_rloo_outcome_advantage",
        "compute_rloo_vectorized_outcome_advantage",
        "compute_opo_outcome_advantage",
        "compute_gpg_outcome_advantage",
    ],
    "optimal_token_baseline": [
        "compute_optimal_token_baseline_advantage",
        "compute_multi_turn_optimal_token_baseline_advantage",
    ],
}


@pytest.mark.parametrize("family", sorted(UPSTREAM_NAMES))
def test_every_upstream_name_is_reexported(family):
    """`from verl.trainer.ppo.core_algos import X` works for every upstream name and gives the family's object."""
    module = importlib.import_module(f"verl.trainer.ppo.{family}")
    for name in UPSTREAM_NAMES[family]:
        assert getattr(core_algos, name) is getattr(module, name), name
        assert name in core_algos.__all__


def _policy_inputs():
    gen = torch.Generator().manual_seed(0)
    old = -torch.rand(4, 6, generator=gen) - 0.1
    log_prob = (old + 0.1 * torch.randn(4, 6, generator=gen)).requires_grad_(True)
    adv = torch.randn(4, 6, generator=gen)
    mask = torch.ones(4, 6)
    mask[1, 4:] = 0
    return old, log_prob, adv, mask


@pytest.mark.parametrize("name", sorted(set(core_algos.POLICY_LOSS_REGISTRY) - {"bypass_mode"}))
def test_losses_run_with_the_real_actor_config(name):
    """Every registered loss reads only fields the real ActorConfig has, and back-propagates a finite gradient."""
    old, log_prob, adv, mask = _policy_inputs()
    loss, _ = core_algos.get_policy_loss_fn(name)(old, log_prob, adv, mask, "token-mean", ActorConfig(), None)
    loss.backward()
    assert torch.isfinite(log_prob.grad).all()


def test_bypass_mode_explains_the_missing_rollout_correction():
    """ActorConfig.policy_loss carries no rollout_correction (yet): bypass_mode says which key is needed."""
    old, log_prob, adv, mask = _policy_inputs()
    with pytest.raises(ValueError, match="rollout_correction"):
        core_algos.compute_policy_loss_bypass_mode(old, log_prob, adv, mask, config=ActorConfig())


def test_estimators_read_the_real_algo_config():
    """REINFORCE++ reads AlgoConfig.gamma, pass@k AlgoConfig.norm_adv_by_std_in_grpo; GDPO without
    gdpo_reward_keys on the config names the missing key."""
    rewards = torch.tensor([[0.0, 1.0], [0.0, 0.0]])
    mask = torch.ones(2, 2)
    _, returns = core_algos.compute_reinforce_plus_plus_outcome_advantage(rewards, mask, config=AlgoConfig(gamma=0.5))
    torch.testing.assert_close(returns[0], torch.tensor([0.5, 1.0]), atol=0, rtol=0)
    adv, _ = core_algos.compute_grpo_passk_outcome_advantage(
        rewards, mask, np.array(["a", "a"], dtype=object), config=AlgoConfig(norm_adv_by_std_in_grpo=False)
    )
    torch.testing.assert_close(adv, torch.tensor([[1.0, 1.0], [0.0, 0.0]]), atol=0, rtol=0)
    batch = {"prompts": torch.zeros(2, 1), "attention_mask": torch.ones(2, 3)}
    with pytest.raises(ValueError, match="gdpo_reward_keys"):
        core_algos.compute_gdpo_outcome_advantage(
            rewards, mask, ["a", "a"], config=AlgoConfig(), non_tensor_batch={}, batch=batch
        )


def test_kl_controller_from_the_real_config():
    """get_kl_controller accepts algorithm.kl_ctrl (KLControlConfig) for both types."""
    assert isinstance(core_algos.get_kl_controller(KLControlConfig()), core_algos.FixedKLController)
    adaptive = core_algos.get_kl_controller(KLControlConfig(type="adaptive", kl_coef=0.05, target_kl=0.2))
    assert isinstance(adaptive, core_algos.AdaptiveKLController) and adaptive.value == 0.05
