"""Advantage-estimator registry: built-in names, enum/str lookup, duplicate registration, unknown names."""

import pytest

from verl.trainer.ppo import core_algos
from verl.trainer.ppo.core_algos import (
    ADV_ESTIMATOR_REGISTRY,
    AdvantageEstimator,
    get_adv_estimator_fn,
    register_adv_est,
)

# Upstream's name -> function mapping (the estimator registry of upstream's verl/trainer/ppo/core_algos.py).
EXPECTED = {
    "gae": "compute_gae_advantage_return",
    "grpo": "compute_grpo_outcome_advantage",
    "grpo_vectorized": "compute_grpo_vectorized_outcome_advantage",
    "gdpo": "compute_gdpo_outcome_advantage",
    "grpo_passk": "compute_grpo_passk_outcome_advantage",
    "reinforce_plus_plus_baseline": "compute_reinforce_plus_plus_baseline_outcome_advantage",
    "rloo": "compute_rloo_outcome_advantage",
    "opo": "compute_opo_outcome_advantage",
    "reinforce_plus_plus": "compute_reinforce_plus_plus_outcome_advantage",
    "remax": "compute_remax_outcome_advantage",
    "gpg": "compute_gpg_outcome_advantage",
    "rloo_vectorized": "compute_rloo_vectorized_outcome_advantage",
    "optimal_token_baseline": "compute_optimal_token_baseline_advantage",
    "tir_optimal_token_baseline": "compute_multi_turn_optimal_token_baseline_advantage",
}


def test_every_builtin_name_maps_to_the_upstream_function():
    """All 14 upstream estimator names resolve (by str and by enum) to the core_algos function of upstream's name."""
    assert {member.value for member in AdvantageEstimator} == set(EXPECTED)
    for member in AdvantageEstimator:
        fn = getattr(core_algos, EXPECTED[member.value])
        assert get_adv_estimator_fn(member) is fn
        assert get_adv_estimator_fn(member.value) is fn


def test_enum_is_a_str():
    """AdvantageEstimator members compare equal to their config strings (configs hold plain strings)."""
    assert AdvantageEstimator.GRPO == "grpo"


def test_unknown_name_lists_valid_choices():
    """An unknown name raises ValueError that starts with upstream's wording (scripts and upstream tests match
    "Unknown advantage estimator simply: <name>"), then names the config key and lists the registered names."""
    with pytest.raises(ValueError, match=r"^Unknown advantage estimator simply: grpo_typo.*adv_estimator.*'grpo'"):
        get_adv_estimator_fn("grpo_typo")


def test_custom_estimator_registration_and_duplicates():
    """A custom estimator registers under a new name; re-registering the same function is a no-op; a different
    function under a taken name raises ValueError (and leaves the first registration in place)."""

    def my_estimator(token_level_rewards, response_mask, **kwargs):
        return token_level_rewards, token_level_rewards

    def other_estimator(token_level_rewards, response_mask, **kwargs):
        return token_level_rewards, token_level_rewards

    try:
        register_adv_est("my_test_estimator")(my_estimator)
        register_adv_est("my_test_estimator")(my_estimator)
        assert get_adv_estimator_fn("my_test_estimator") is my_estimator
        with pytest.raises(ValueError, match="^Adv estimator my_test_estimator has already been registered"):
            register_adv_est("my_test_estimator")(other_estimator)
        assert ADV_ESTIMATOR_REGISTRY["my_test_estimator"] is my_estimator
    finally:
        ADV_ESTIMATOR_REGISTRY.pop("my_test_estimator", None)


def test_builtin_name_cannot_be_hijacked():
    """Registering another function as 'grpo' raises: a built-in is never silently replaced."""
    with pytest.raises(ValueError, match="Adv estimator grpo has already been registered"):
        register_adv_est(AdvantageEstimator.GRPO)(lambda **kw: None)
    assert get_adv_estimator_fn("grpo") is core_algos.compute_grpo_outcome_advantage


def test_rebound_module_registry_is_the_live_one(monkeypatch):
    """Upstream's own registry test rebinds ``core_algos.ADV_ESTIMATOR_REGISTRY = {...}`` and expects
    register_adv_est / get_adv_estimator_fn to use the new dict; plugins read it the same way. Registering the
    same function twice under one name stays a no-op there too."""
    fake = {"gae": lambda x: 2 * x}
    monkeypatch.setattr(core_algos, "ADV_ESTIMATOR_REGISTRY", fake)
    assert core_algos.ADV_ESTIMATOR_REGISTRY is fake
    assert get_adv_estimator_fn("gae")(5) == 10  # the rebound dict answers, not the built-in GAE

    def my_estimator(**kwargs):
        return None

    register_adv_est("my_est")(my_estimator)
    register_adv_est("my_est")(my_estimator)
    assert fake == {"gae": fake["gae"], "my_est": my_estimator}
    with pytest.raises(ValueError, match="^Unknown advantage estimator simply: grpo"):
        get_adv_estimator_fn("grpo")  # not in the rebound dict


def test_builtins_and_imported_name_are_the_same_dict():
    """``from core_algos import ADV_ESTIMATOR_REGISTRY`` is the dict the decorators fill (14 built-ins)."""
    from verl.trainer.ppo import advantage_registry

    assert ADV_ESTIMATOR_REGISTRY is advantage_registry.ADV_ESTIMATOR_REGISTRY is core_algos.ADV_ESTIMATOR_REGISTRY
    assert set(EXPECTED) <= set(ADV_ESTIMATOR_REGISTRY)


def test_rebound_policy_loss_registry_is_the_live_one(monkeypatch):
    """The same for ``core_algos.POLICY_LOSS_REGISTRY``: register_policy_loss fills the rebound dict and
    get_policy_loss_fn reads it; an unknown mode starts with upstream's "Unsupported loss mode: <name>"."""
    from verl.trainer.ppo.core_algos import get_policy_loss_fn, register_policy_loss

    fake = {}
    monkeypatch.setattr(core_algos, "POLICY_LOSS_REGISTRY", fake)

    def my_loss(*args, **kwargs):
        return None

    register_policy_loss("my_loss")(my_loss)
    assert fake == {"my_loss": my_loss} and get_policy_loss_fn("my_loss") is my_loss
    with pytest.raises(ValueError, match=r"^Unsupported loss mode: vanilla\. Supported modes are: \['my_loss'\]"):
        get_policy_loss_fn("vanilla")
