"""Hydra/OmegaConf nodes -> typed config dataclasses, and the pre-Ray validation of the whole config.

`omega_conf_to_dataclass(cfg, dataclass_type=None)` (upstream name and signature) builds a `BaseConfig`
from a DictConfig or dict. The class comes from `dataclass_type`, else from the node's `_target_`. Nested
nodes become the dataclasses named by the field annotations (or their own `_target_`). Every key is checked:
a key that maps to no field (`+actor_rollout_ref.actor.ppo_mini_batchsize=8`) raises `ValueError` naming the
full key path and the closest valid names. Values are type-checked against the annotations, and errors of
the dataclasses' own checks are re-raised with the full key path.

`validate_config(config, use_reference_policy, use_critic)` is what `main_ppo` calls before `ray.init`.
"""

from __future__ import annotations

import dataclasses
import importlib
import logging
import types
import typing
from collections.abc import Mapping
from typing import Any, Optional, Union

from omegaconf import DictConfig, ListConfig, OmegaConf

from verl.base_config import ConfigError, closest_names

__all__ = ["omega_conf_to_dataclass", "validate_config"]

logger = logging.getLogger(__name__)


def omega_conf_to_dataclass(config: Any, dataclass_type: Optional[type] = None) -> Any:
    """Convert a DictConfig/dict node into its config dataclass (see the module docstring).

    Returns `config` unchanged when it is already a dataclass instance or not a container; returns
    `dataclass_type()` for an empty/None node when a type is given (upstream behaviour).
    """
    if dataclasses.is_dataclass(config) and not isinstance(config, type):
        return config
    if not config:
        return dataclass_type() if dataclass_type is not None else config
    if not isinstance(config, DictConfig | ListConfig | Mapping | list):
        return config
    path = config._get_full_key(None) if isinstance(config, DictConfig) else ""
    data = _to_plain(config)
    if dataclass_type is None:
        target = data.get("_target_") if isinstance(data, dict) else None
        if not target:
            raise ConfigError(path, "has no _target_ and no dataclass_type was given; cannot tell which config it is.")
        cls = _import_target(target, path)
        if not dataclasses.is_dataclass(cls):
            return _instantiate_callable(config)
        dataclass_type = cls
    if not dataclasses.is_dataclass(dataclass_type):
        raise TypeError(f"{dataclass_type!r} is not a dataclass")
    return _build(dataclass_type, data, path)


def _to_plain(config: Any) -> Any:
    """Resolve interpolations and turn OmegaConf containers into dicts/lists ('???' stays a string)."""
    if isinstance(config, DictConfig | ListConfig):
        return OmegaConf.to_container(config, resolve=True, throw_on_missing=False)
    if isinstance(config, Mapping):
        return {k: _to_plain(v) for k, v in config.items()}
    if isinstance(config, list | tuple):
        return [_to_plain(v) for v in config]
    return config


def _import_target(target: str, path: str) -> Any:
    module_name, _, attr = target.rpartition(".")
    try:
        return getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError, ValueError) as exc:
        raise ConfigError(_join(path, "_target_"), f"cannot import {target!r}: {exc}") from None


def _instantiate_callable(config: Any) -> Any:
    """A `_target_` that is not a dataclass (a user factory): let Hydra call it, as upstream does."""
    from hydra.utils import instantiate

    return instantiate(config, _convert_="partial")


def _join(prefix: str, key: str) -> str:
    return f"{prefix}.{key}" if prefix else key


def _build(cls: type, data: Mapping[str, Any], path: str) -> Any:
    """Instantiate dataclass `cls` from `data`, checking keys and value types; `path` names the node."""
    if not isinstance(data, Mapping):
        raise ConfigError(path, f"expected a mapping of {cls.__name__} keys, got {type(data).__name__} {data!r}.")
    data = dict(data)
    target = data.pop("_target_", None)
    if target:
        resolved = _import_target(target, path)
        if isinstance(resolved, type) and issubclass(resolved, cls):
            cls = resolved
        elif resolved is not cls:
            raise ConfigError(
                _join(path, "_target_"), f"{target!r} is not a {cls.__name__}; remove _target_ or fix it."
            )
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    unknown = [key for key in data if key not in fields]
    if unknown:
        key = unknown[0]
        valid = ", ".join(k for k in fields if k != "_target_")
        raise ConfigError(
            _join(path, key),
            f"unknown config key.{closest_names(key, fields)} Valid keys of {path or cls.__name__}: {valid}.",
        )
    hints = _node_types(cls, data)
    kwargs = {key: _coerce(value, hints[key], _join(path, key)) for key, value in data.items()}
    if target:
        kwargs["_target_"] = target
    try:
        return cls(**kwargs)
    except ConfigError as err:
        raise err.under(path) from None


def _node_types(cls: type, data: Mapping[str, Any]) -> dict[str, Any]:
    """Field annotations for building `data`; a field annotated with a base config class whose default is a
    subclass (`actor: ActorConfig = field(default_factory=FSDPActorConfig)`) builds a node without `_target_` as
    that default class, so a plain `{strategy: fsdp2, fsdp_config: {...}}` is the FSDP actor it always was (a
    `_target_` in the node still picks any subclass)."""
    hints = _field_types(cls)
    for f in dataclasses.fields(cls):
        factory, hint = f.default_factory, hints.get(f.name)
        if (
            isinstance(factory, type)
            and dataclasses.is_dataclass(hint)
            and factory is not hint
            and issubclass(factory, hint)
            and not (isinstance(data.get(f.name), Mapping) and data[f.name].get("_target_"))
        ):
            hints[f.name] = factory
    return hints


def _field_types(cls: type) -> dict[str, Any]:
    """Resolved field annotations; string annotations that cannot be resolved (a class defined inside a function
    under `from __future__ import annotations`) are not type-checked."""
    try:
        return typing.get_type_hints(cls)
    except (NameError, TypeError):
        return {f.name: Any if isinstance(f.type, str) else f.type for f in dataclasses.fields(cls)}


def _coerce(value: Any, annotation: Any, path: str) -> Any:
    """Check `value` against a field annotation and convert it (dict -> dataclass, int -> float, ...)."""
    if annotation is Any:
        return value
    origin = typing.get_origin(annotation)
    if origin in (Union, types.UnionType):
        return _coerce_union(value, typing.get_args(annotation), path)
    if dataclasses.is_dataclass(annotation):
        if isinstance(value, annotation):
            return value
        return _build(annotation, value, path)
    if origin in (list, tuple):
        if not isinstance(value, list | tuple):
            raise ConfigError(path, f"expected a list, got {type(value).__name__} {value!r}.")
        (item_type,) = typing.get_args(annotation)[:1] or (Any,)
        return [_coerce(item, item_type, f"{path}[{i}]") for i, item in enumerate(value)]
    if origin is dict or annotation is dict:
        if not isinstance(value, Mapping):
            raise ConfigError(path, f"expected a mapping, got {type(value).__name__} {value!r}.")
        args = typing.get_args(annotation)
        value_type = args[1] if len(args) == 2 else Any
        return {k: _coerce(v, value_type, _join(path, str(k))) for k, v in value.items()}
    return _coerce_scalar(value, annotation, path)


def _coerce_union(value: Any, options: tuple[Any, ...], path: str) -> Any:
    if value is None:
        if type(None) in options:
            return None
        raise ConfigError(path, "must not be null.")
    options = tuple(option for option in options if option is not type(None))
    if len(options) == 1:
        return _coerce(value, options[0], path)
    errors = []
    for option in options:
        try:
            return _coerce(value, option, path)
        except ConfigError as err:
            errors.append(err.detail)
    raise ConfigError(path, " / ".join(errors))


def _coerce_scalar(value: Any, annotation: Any, path: str) -> Any:
    if value is None:
        raise ConfigError(path, f"must not be null (expected {getattr(annotation, '__name__', annotation)}).")
    if annotation is bool:
        if isinstance(value, bool):
            return value
        raise ConfigError(path, f"expected true or false, got {value!r}.")
    if annotation is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if isinstance(value, float) and value.is_integer():
            return int(value)  # `1e4` on the command line parses as a float
        raise ConfigError(path, f"expected an integer, got {value!r}.")
    if annotation is float:
        if isinstance(value, int | float) and not isinstance(value, bool):
            return float(value)
        raise ConfigError(path, f"expected a number, got {value!r}.")
    if annotation is str:
        if isinstance(value, str):
            return value
        if isinstance(value, int | float) and not isinstance(value, bool):
            return str(value)  # `trainer.experiment_name=2024` parses as an int
        raise ConfigError(path, f"expected a string, got {value!r}.")
    return value


# --------------------------------------------------------------------------------------------------------------
# validate_config: everything about the config that can be checked on the driver, before Ray starts.
# --------------------------------------------------------------------------------------------------------------
def validate_config(config: Any, use_reference_policy: bool, use_critic: bool) -> Any:
    """Check the whole PPO config before `ray.init`; raise `ValueError` naming the key and the fix.

    1. Unknown keys anywhere (also ones added with `+`), wrong value types and every dataclass check
       (`__post_init__`, cross-node links such as actor.strategy vs ref/critic strategy).
    2. `rollout.name` is set.
    3. Batch arithmetic against n_gpus = trainer.nnodes * trainer.n_gpus_per_node: train_batch_size * rollout.n
       divisible by n_gpus; actor (and critic) mini/micro batch sizes (`ActorConfig.validate`); the log-prob
       micro-batch of rollout (and ref) set unless dynamic batching; token budgets large enough for one
       sequence with dynamic batching.
    4. Features this distribution does not ship (model-based reward serving, and the upstream keys listed in
       `verl.utils.config_support`: refused when ignoring them would change results, reported otherwise).

    `config` is the Hydra DictConfig (legacy reward keys are migrated on a copy) or a `PPOTrainerConfig`.
    Returns the typed `PPOTrainerConfig` so callers can use it instead of the DictConfig.
    """
    from verl.trainer.config.legacy_reward import migrate_legacy_reward_impl
    from verl.trainer.config.ppo_trainer import PPOTrainerConfig

    if isinstance(config, DictConfig):
        config = omega_conf_to_dataclass(migrate_legacy_reward_impl(config), PPOTrainerConfig)
    elif not isinstance(config, PPOTrainerConfig):
        raise TypeError(f"validate_config expects a DictConfig or PPOTrainerConfig, got {type(config).__name__}")
    _check_rollout_name(config)
    _check_batch_sizes(config, use_reference_policy=use_reference_policy, use_critic=use_critic)
    _check_token_budgets(config, use_reference_policy=use_reference_policy, use_critic=use_critic)
    _check_supported_features(config)
    _warn_deprecated(config)
    return config


def _check_rollout_name(config: Any) -> None:
    """``rollout.name`` is set and names a registered rollout (an unknown name would only fail at worker build)."""
    from verl.workers.rollout.registry import registered_rollouts

    name, valid = config.actor_rollout_ref.rollout.name, registered_rollouts()
    if name in ("???", None, ""):
        raise ConfigError("actor_rollout_ref.rollout.name", f"is mandatory: set one of {valid} (hf: CPU / tests).")
    if name not in valid:
        raise ConfigError(
            "actor_rollout_ref.rollout.name",
            f"({name!r}) is not a rollout of this distribution; registered: {valid} (hf: transformers generate, "
            "CPU and small models; vllm: GPU, and Ascend through vllm-ascend).",
        )


def _check_log_prob_micro_batch(node: Any, prefix: str) -> None:
    """Without dynamic batching the log-prob pass needs a micro-batch size (exactly one of the two keys)."""
    if node.log_prob_use_dynamic_bsz:
        return
    if node.log_prob_micro_batch_size is None and node.log_prob_micro_batch_size_per_gpu is None:
        raise ConfigError(
            f"{prefix}.log_prob_micro_batch_size_per_gpu",
            f"is not set: set it (responses per GPU per log-prob forward), or set "
            f"{prefix}.log_prob_use_dynamic_bsz=True.",
        )


def _check_batch_sizes(config: Any, *, use_reference_policy: bool, use_critic: bool) -> None:
    arr = config.actor_rollout_ref
    n_gpus = config.trainer.n_gpus
    responses = config.data.train_batch_size * arr.rollout.n
    if responses % n_gpus != 0:
        raise ConfigError(
            "data.train_batch_size",
            f"({config.data.train_batch_size}) * actor_rollout_ref.rollout.n ({arr.rollout.n}) = {responses} responses "
            f"must be divisible by trainer.nnodes * trainer.n_gpus_per_node = {n_gpus}.",
        )
    try:
        arr.actor.validate(n_gpus, config.data.train_batch_size)
    except ConfigError as err:
        raise err.under("actor_rollout_ref.actor") from None
    _check_log_prob_micro_batch(arr.rollout, "actor_rollout_ref.rollout")
    if use_reference_policy:
        _check_log_prob_micro_batch(arr.ref, "actor_rollout_ref.ref")
    if use_critic:
        try:
            config.critic.validate(n_gpus, config.data.train_batch_size)
        except ConfigError as err:
            raise err.under("critic") from None


def _check_token_budgets(config: Any, *, use_reference_policy: bool, use_critic: bool) -> None:
    """With dynamic batching a micro-batch holds at least one whole sequence, so the budget must fit one."""
    arr = config.actor_rollout_ref
    longest = config.data.max_prompt_length + config.data.max_response_length
    actor_sp, critic_sp = arr.actor.ulysses_sp_size, config.critic.ulysses_sequence_parallel_size
    budgets = []  # (key, tokens per GPU, Ulysses SP size of the pass)
    if arr.actor.use_dynamic_bsz:
        budgets.append(
            ("actor_rollout_ref.actor.ppo_max_token_len_per_gpu", arr.actor.ppo_max_token_len_per_gpu, actor_sp)
        )
    if arr.rollout.log_prob_use_dynamic_bsz:
        key = "actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu"
        budgets.append((key, arr.rollout.log_prob_max_token_len_per_gpu, actor_sp))
    if use_reference_policy and arr.ref.log_prob_use_dynamic_bsz:
        key = "actor_rollout_ref.ref.log_prob_max_token_len_per_gpu"
        budgets.append((key, arr.ref.log_prob_max_token_len_per_gpu, arr.ref.ulysses_sp_size))
    if use_critic and config.critic.use_dynamic_bsz:
        budgets.append(("critic.ppo_max_token_len_per_gpu", config.critic.ppo_max_token_len_per_gpu, critic_sp))
        budgets.append(("critic.forward_max_token_len_per_gpu", config.critic.forward_max_token_len_per_gpu, critic_sp))
    for key, budget, sp in budgets:
        # Ulysses SP splits a sequence over sp ranks; the budget is per rank, so sp * budget must hold one.
        if budget * sp < longest:
            raise ConfigError(
                key,
                f"({budget}) * ulysses_sequence_parallel_size ({sp}) is smaller than one sequence: "
                f"data.max_prompt_length + data.max_response_length = {longest} tokens. Raise it to >= {longest}.",
            )


def _check_supported_features(config: Any) -> None:
    from verl.utils.config_support import check_supported_features, report_inert_settings

    check_supported_features(config)
    report_inert_settings(config)


def _warn_deprecated(config: Any) -> None:
    if config.data.val_batch_size is not None:
        logger.warning(
            "data.val_batch_size is deprecated (still honoured: validation batches of %d prompts); set it to null to "
            "validate the whole set as one batch.",
            config.data.val_batch_size,
        )
    algorithm, actor = config.algorithm, config.actor_rollout_ref.actor
    if algorithm.use_kl_in_reward and actor.use_kl_loss:
        logger.warning(
            "algorithm.use_kl_in_reward and actor_rollout_ref.actor.use_kl_loss are both on: the KL to the reference "
            "policy is applied twice (once in the reward, once in the loss)."
        )
