"""Reward-manager registry: built-in names, user registration, clear error for unknown names."""

import pytest

from verl.workers.reward_manager import (
    BatchRewardManager,
    DAPORewardManager,
    NaiveRewardManager,
    get_reward_manager_cls,
    register,
)
from verl.workers.reward_manager.registry import REWARD_MANAGER_REGISTRY


def test_builtin_names():
    """naive, batch and dapo resolve to their classes."""
    assert get_reward_manager_cls("naive") is NaiveRewardManager
    assert get_reward_manager_cls("batch") is BatchRewardManager
    assert get_reward_manager_cls("dapo") is DAPORewardManager


def test_register_user_class_and_conflict():
    """A user class registers under a new name; a second class under the same name is refused."""

    @register("test_custom_manager")
    class Custom:
        pass

    try:
        assert get_reward_manager_cls("test_custom_manager") is Custom
        assert register("test_custom_manager")(Custom) is Custom  # re-registering the same class is fine

        with pytest.raises(ValueError, match="^Reward manager test_custom_manager has already been registered"):

            @register("test_custom_manager")
            class Other:
                pass

    finally:
        REWARD_MANAGER_REGISTRY.pop("test_custom_manager", None)


def test_unknown_name_lists_registered_and_config_key():
    """An unknown name raises ValueError starting with upstream's "Unknown reward manager: <name>", then listing the
    registered names and the config key to change."""
    with pytest.raises(
        ValueError,
        match=r"^Unknown reward manager: prime\. Registered: \['batch', 'dapo', 'naive'.*reward_manager\.name",
    ):
        get_reward_manager_cls("prime")
