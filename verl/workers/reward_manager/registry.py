"""Reward-manager registry (upstream ``verl.workers.reward_manager.registry``): ``register(name)`` decorates a
class, ``get_reward_manager_cls(name)`` looks it up."""

from __future__ import annotations

from collections.abc import Callable

__all__ = ["REWARD_MANAGER_REGISTRY", "register", "get_reward_manager_cls"]

REWARD_MANAGER_REGISTRY: dict[str, type] = {}


def register(name: str) -> Callable[[type], type]:
    """Class decorator adding a reward manager under ``name``; re-registering a different class is an error."""

    def decorator(cls: type) -> type:
        existing = REWARD_MANAGER_REGISTRY.get(name)
        if existing is not None and existing is not cls:
            raise ValueError(
                f"Reward manager {name} has already been registered: {existing.__qualname__} vs {cls.__qualname__}; "
                "pick another name."
            )
        REWARD_MANAGER_REGISTRY[name] = cls
        return cls

    return decorator


def get_reward_manager_cls(name: str) -> type:
    """The class registered as ``name``; ValueError lists the registered names and the config key to set."""
    # Built-in managers register on import of the package; make sure that happened.
    import verl.workers.reward_manager  # noqa: F401

    if name not in REWARD_MANAGER_REGISTRY:
        raise ValueError(
            f"Unknown reward manager: {name}. Registered: {sorted(REWARD_MANAGER_REGISTRY)}. Set "
            "reward.reward_manager.name (legacy: reward_model.reward_manager) to one of them, or load your own class "
            "with reward.reward_manager.source=importlib and reward.reward_manager.module.path/name."
        )
    return REWARD_MANAGER_REGISTRY[name]
