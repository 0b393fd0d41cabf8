"""Roles of the RL dataflow and which optional roles a config needs (upstream names)."""

from __future__ import annotations

from enum import Enum


class Role(Enum):
    """A worker role. ``str(role)`` gives the name upstream uses for worker-group prefixes."""

    Actor = 0
    Rollout = 1
    ActorRollout = 2
    Critic = 3
    RefPolicy = 4
    RewardModel = 5
    ActorRolloutRef = 6
    Env = 7
    TeacherModel = 8

    def __str__(self) -> str:
        return _ROLE_NAMES[self]

    @classmethod
    def from_string(cls, name: str) -> Role:
        for role, role_name in _ROLE_NAMES.items():
            if role_name == name:
                return role
        raise ValueError(f"unknown role {name!r}; valid: {sorted(_ROLE_NAMES.values())}")


_ROLE_NAMES = {
    Role.Actor: "actor",
    Role.Rollout: "rollout",
    Role.ActorRollout: "actor_rollout",
    Role.Critic: "critic",
    Role.RefPolicy: "ref",
    Role.RewardModel: "rm",
    Role.ActorRolloutRef: "actor_rollout_ref",
    Role.Env: "env",
    Role.TeacherModel: "teacher",
}


def need_reference_policy(config) -> bool:
    """A reference policy is needed when KL is used, in the reward or as a loss."""
    return bool(config.algorithm.use_kl_in_reward or config.actor_rollout_ref.actor.use_kl_loss)


def need_reward_model(config) -> bool:
    """A model-based reward is used when ``reward.reward_model.enable`` (after the legacy-key migration)."""
    return bool(config.reward.reward_model.enable)


def need_critic(config) -> bool:
    """``critic.enable`` when set, else a critic exactly when the estimator is GAE."""
    if config.critic.enable is not None:
        return bool(config.critic.enable)
    return config.algorithm.adv_estimator == "gae"
