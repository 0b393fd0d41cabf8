"""Migration of the legacy top-level reward keys into the `reward.*` tree (upstream v0.7 `main_ppo` does this).

Upstream scripts written for v0.6 set `custom_reward_function.path=...`, `reward_model.reward_manager=dapo`
or `sandbox_fusion.url=...`. `legacy_reward_impl.yaml` keeps those keys as null placeholders so the
overrides parse; `migrate_legacy_reward_impl` copies every non-null value to its `reward.*` key and removes
the legacy sections. A legacy value that contradicts an explicitly set `reward.*` value, or that has no
equivalent here (model-based reward serving), raises `ConfigError` naming the key.
"""

from __future__ import annotations

import copy
import logging
from typing import Any

from omegaconf import DictConfig, OmegaConf, open_dict

from verl.base_config import ConfigError

__all__ = ["LEGACY_REWARD_KEYS", "LEGACY_SECTIONS", "migrate_legacy_reward_impl"]

logger = logging.getLogger(__name__)

LEGACY_SECTIONS = ("custom_reward_function", "reward_model", "sandbox_fusion")

# legacy key -> new key; None = no equivalent (a non-null value raises).
LEGACY_REWARD_KEYS: dict[str, str | None] = {
    "custom_reward_function.path": "reward.custom_reward_function.path",
    "custom_reward_function.name": "reward.custom_reward_function.name",
    "custom_reward_function.reward_kwargs": "reward.custom_reward_function.reward_kwargs",
    "reward_model.num_workers": "reward.num_workers",
    "reward_model.reward_manager": "reward.reward_manager.name",
    "reward_model.enable": "reward.reward_model.enable",
    "reward_model.enable_resource_pool": "reward.reward_model.enable_resource_pool",
    "reward_model.n_gpus_per_node": "reward.reward_model.n_gpus_per_node",
    "reward_model.nnodes": "reward.reward_model.nnodes",
    "reward_model.reward_loop_source": "reward.reward_manager.source",
    "reward_model.reward_loop_module_path": "reward.reward_manager.module.path",
    "reward_model.reward_loop_class_name": "reward.reward_manager.module.name",
    "reward_model.model.path": "reward.reward_model.model_path",
    "reward_model.sandbox_fusion.url": "reward.sandbox_fusion.url",
    "reward_model.sandbox_fusion.max_concurrent": "reward.sandbox_fusion.max_concurrent",
    "reward_model.sandbox_fusion.memory_limit_mb": "reward.sandbox_fusion.memory_limit_mb",
    "sandbox_fusion.url": "reward.sandbox_fusion.url",
    "sandbox_fusion.max_concurrent": "reward.sandbox_fusion.max_concurrent",
    "sandbox_fusion.memory_limit_mb": "reward.sandbox_fusion.memory_limit_mb",
}


def _legacy_leaves(node: Any, prefix: str) -> dict[str, Any]:
    """Dotted legacy key -> value for every non-null leaf; a mapped key (e.g. reward_kwargs) is one leaf."""
    if prefix in LEGACY_REWARD_KEYS or not isinstance(node, dict):
        return {} if node is None else {prefix: node}
    leaves: dict[str, Any] = {}
    for key, value in node.items():
        leaves.update(_legacy_leaves(value, f"{prefix}.{key}"))
    return leaves


def _apply_legacy_value(config: DictConfig, legacy_key: str, value: Any, defaults: DictConfig) -> None:
    target = LEGACY_REWARD_KEYS.get(legacy_key)
    if target is None:
        raise ConfigError(
            legacy_key,
            f"({value!r}) has no equivalent in this distribution (model-based reward serving is not supported); "
            f"remove it, or use a rule-based reward via reward.custom_reward_function.path.",
        )
    current = OmegaConf.select(config, target)
    default = OmegaConf.select(defaults, target)
    if current != default and current != value:
        raise ConfigError(
            legacy_key,
            f"({value!r}) contradicts {target} ({current!r}); {legacy_key} is the legacy name of {target}: set only "
            f"{target}.",
        )
    OmegaConf.update(config, target, value, merge=False, force_add=True)
    logger.warning("legacy config key %s migrated to %s", legacy_key, target)


def migrate_legacy_reward_impl(config: DictConfig) -> DictConfig:
    """A copy of `config` with the legacy reward sections moved into `reward.*` (see the module docstring).

    "Explicitly set" on the new side means different from the `reward.*` defaults of RewardConfig.
    """
    from verl.workers.config.reward import RewardConfig

    present = [s for s in LEGACY_SECTIONS if s in config]
    if not present:
        return config
    migrated = copy.deepcopy(config)
    defaults = OmegaConf.create({"reward": RewardConfig().to_dict()})
    with open_dict(migrated):
        if "reward" not in migrated:
            migrated.reward = copy.deepcopy(defaults.reward)
        for section in present:
            raw = OmegaConf.to_container(migrated[section], resolve=True)
            for legacy_key, value in _legacy_leaves(raw, section).items():
                _apply_legacy_value(migrated, legacy_key, value, defaults)
            del migrated[section]
    return migrated
