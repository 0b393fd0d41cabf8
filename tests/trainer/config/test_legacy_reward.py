"""Legacy top-level reward keys (custom_reward_function.*, reward_model.*, sandbox_fusion.*) migrate into reward.*."""

import pytest
from omegaconf import OmegaConf

from verl.trainer.config.legacy_reward import LEGACY_SECTIONS, migrate_legacy_reward_impl


def test_non_null_legacy_values_move_to_reward_tree(compose_config):
    """Each set legacy key lands on its reward.* key; the legacy sections are removed."""
    cfg = compose_config(
        [
            "custom_reward_function.path=/data/my_reward.py",
            "custom_reward_function.name=score_fn",
            "reward_model.reward_manager=dapo",
            "reward_model.num_workers=2",
            "sandbox_fusion.url=http://sandbox:8080",
            "+custom_reward_function.reward_kwargs.scale=0.5",
        ]
    )
    migrated = migrate_legacy_reward_impl(cfg)
    assert not any(section in migrated for section in LEGACY_SECTIONS)
    reward = migrated.reward
    assert reward.custom_reward_function.path == "/data/my_reward.py"
    assert reward.custom_reward_function.name == "score_fn"
    assert OmegaConf.to_container(reward.custom_reward_function.reward_kwargs) == {"scale": 0.5}
    assert reward.reward_manager.name == "dapo"
    assert reward.num_workers == 2
    assert reward.sandbox_fusion.url == "http://sandbox:8080"
    # untouched keys keep their reward.* defaults
    assert reward.sandbox_fusion.max_concurrent == 64
    # the input is not modified
    assert cfg.custom_reward_function.path == "/data/my_reward.py"


def test_all_null_legacy_sections_change_nothing_else(compose_config):
    """With only null placeholders the migration just drops the legacy sections."""
    cfg = compose_config()
    migrated = migrate_legacy_reward_impl(cfg)
    assert migrated.reward == cfg.reward
    assert set(migrated) == set(cfg) - set(LEGACY_SECTIONS)


def test_contradiction_between_legacy_and_new_key(compose_config):
    """Setting the legacy key and its reward.* key to different values raises naming both."""
    cfg = compose_config(["custom_reward_function.path=/a.py", "reward.custom_reward_function.path=/b.py"])
    with pytest.raises(
        ValueError,
        match=r"^custom_reward_function\.path: \('/a\.py'\) contradicts "
        r"reward\.custom_reward_function\.path \('/b\.py'\)",
    ):
        migrate_legacy_reward_impl(cfg)


def test_same_value_on_both_sides_is_fine(compose_config):
    """The legacy key may repeat the value of its reward.* key."""
    cfg = compose_config(["custom_reward_function.path=/a.py", "reward.custom_reward_function.path=/a.py"])
    assert migrate_legacy_reward_impl(cfg).reward.custom_reward_function.path == "/a.py"


def test_legacy_key_without_equivalent_is_rejected(compose_config):
    """Reward-model serving keys have no equivalent; a non-null value raises with the key."""
    cfg = compose_config(["reward_model.rollout.name=vllm"])
    with pytest.raises(ValueError, match=r"^reward_model\.rollout\.name: \('vllm'\) has no equivalent"):
        migrate_legacy_reward_impl(cfg)


def test_config_without_legacy_sections_is_returned_as_is():
    """A config that has no legacy section is returned unchanged (same object)."""
    cfg = OmegaConf.create({"reward": {"num_workers": 1}})
    assert migrate_legacy_reward_impl(cfg) is cfg
