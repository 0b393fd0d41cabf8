"""Build the reward function of a run from its config, and apply it to a batch (upstream
``verl.trainer.ppo.reward``: ``get_custom_reward_fn``, ``load_reward_manager``, ``compute_reward``,
``compute_reward_async``).

Config keys read (v0.7 layout first, legacy top-level keys accepted when ``main_ppo`` has not migrated them):

* ``reward.custom_reward_function.{path,name,reward_kwargs}`` / legacy ``custom_reward_function.*``:
  the user's ``compute_score(data_source, solution_str, ground_truth, extra_info=None)``;
* ``reward.reward_manager.{source,name,module.path,module.name}`` / legacy ``reward_model.reward_manager``;
* ``reward.sandbox_fusion.{url,memory_limit_mb}`` / legacy ``sandbox_fusion.*``;
* ``reward.{num_workers,compute_score_timeout,batch_timeout}``: parallel scoring in worker processes and its time
  limits (:mod:`verl.workers.reward_manager.scorer`), for the managers that take them;
* ``data.reward_fn_key``.

A function loaded from a file is an :class:`~verl.utils.import_utils.ExternFunction`: it pickles as the file's
source, so the reward worker processes (and Ray actors) load it themselves.
"""

from __future__ import annotations

import functools
import inspect
import logging
from collections.abc import Callable
from typing import Any

import torch

from verl.base_config import field_default
from verl.utils.import_utils import as_extern_function, load_extern_object, load_module
from verl.utils.reward_score import default_compute_score

logger = logging.getLogger(__name__)

__all__ = [
    "compute_reward",
    "compute_reward_async",
    "get_custom_reward_fn",
    "load_reward_manager",
    "reward_metrics_from_extra_info",
]

# reward.* settings handed to the managers whose constructor names them (upstream managers take
# compute_score_timeout; num_workers and batch_timeout are this distribution's).
SCORING_KEYS = ("num_workers", "compute_score_timeout", "batch_timeout")

SAMPLE_SIGNATURE = ("data_source", "solution_str", "ground_truth", "extra_info")
BATCH_SIGNATURE = ("data_sources", "solution_strs", "ground_truths", "extra_infos")


def _select(config: Any, dotted_key: str) -> Any:
    """Value at ``a.b.c`` in a DictConfig / Mapping / dataclass tree; None when any level is absent or null.

    The one place legacy-tolerant lookups live: the legacy reward sections may or may not exist in a config.
    """
    node = config
    for part in dotted_key.split("."):
        if node is None:
            return None
        if hasattr(node, "keys"):
            node = node[part] if part in node.keys() else None
        else:
            node = getattr(node, part, None)
    return node


def _select_or_default(config: Any, dotted_key: str, cls: type, name: str) -> Any:
    """``_select(config, dotted_key)``, or the declared default of field ``name`` of dataclass ``cls`` when the
    config holds no value there (a partial or legacy config): each default is written once, on its dataclass."""
    value = _select(config, dotted_key)
    return field_default(cls, name) if value is None else value


def _reward_config_classes() -> Any:
    # imported on use: building a reward function must not import every worker config at module import
    from verl.workers.config import reward

    return reward


def _plain_dict(value: Any) -> dict:
    """A DictConfig / Mapping as a plain dict (None -> {})."""
    if value is None:
        return {}
    return {key: value[key] for key in value.keys()}


def _pick(config: Any, new_key: str, legacy_key: str, new_default: Any = None) -> tuple[Any, str]:
    """(value, key it came from) for a setting with a v0.7 key and a legacy key.

    The legacy value wins only when the v0.7 key is unset (None or its default ``new_default``); both set to
    different values is a ValueError naming both keys.
    """
    new, legacy = _select(config, new_key), _select(config, legacy_key)
    if legacy is None:
        return new, new_key
    if new is None or new == new_default:
        return legacy, legacy_key
    if new != legacy:
        raise ValueError(f"{legacy_key}={legacy!r} contradicts {new_key}={new!r}; set only {new_key}.")
    return new, new_key


def _check_signature(fn: Callable, params: tuple[str, ...], reward_kwargs: dict, where: str) -> None:
    """Raise TypeError unless ``fn`` can be called with ``params`` (+ ``reward_kwargs``) as keyword arguments."""
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):
        return  # builtins / C callables: nothing to check
    try:
        signature.bind(**{name: None for name in params}, **reward_kwargs)
    except TypeError as exc:
        raise TypeError(
            f"Reward function {where} has signature {signature}, but it is called as "
            f"fn({', '.join(f'{p}=...' for p in (*params, *reward_kwargs))}): {exc}. "
            f"Expected: def {getattr(fn, '__name__', 'compute_score')}({', '.join(params)}=None)."
        ) from None


def _load_custom_fn(path: str, name: str, path_key: str) -> Callable:
    """Load ``name`` from the file at ``path``; errors name the config keys and what is defined there."""
    name_key = path_key.rsplit(".", 1)[0] + ".name"
    try:
        module = load_module(path)
    except FileNotFoundError as exc:
        raise FileNotFoundError(f"Reward function file not found: {path_key}={path!r} ({exc}).") from exc
    fn = getattr(module, name, None)
    if fn is None:
        functions = sorted(k for k, v in vars(module).items() if callable(v) and not k.startswith("_"))
        raise AttributeError(
            f"Reward function {name!r} ({name_key}) not found in {path!r}; callables defined there: {functions}."
        )
    if not callable(fn):
        raise TypeError(f"{name_key}={name!r} in {path!r} is a {type(fn).__name__}, not a function.")
    return as_extern_function(fn, path, name)


def get_custom_reward_fn(config: Any, batch: bool = False) -> Callable | None:
    """The user's reward function with its ``reward_kwargs`` bound, or None when no file is configured.

    ``batch``: check the batch signature (``data_sources, solution_strs, ...``) instead of the per-sample one.
    """
    path, path_key = _pick(config, "reward.custom_reward_function.path", "custom_reward_function.path")
    if path is None:
        return None
    section = path_key.rsplit(".", 1)[0]
    name = _select_or_default(config, f"{section}.name", _reward_config_classes().CustomRewardFunctionConfig, "name")
    reward_kwargs = _plain_dict(_select(config, f"{section}.reward_kwargs"))
    fn = _load_custom_fn(str(path), str(name), path_key)
    _check_signature(fn, BATCH_SIGNATURE if batch else SAMPLE_SIGNATURE, reward_kwargs, f"{name!r} in {path!r}")
    logger.info("using reward function %r from %s", name, path)
    return functools.partial(fn, **reward_kwargs) if reward_kwargs else fn


def _default_scorer(config: Any) -> Callable:
    """``default_compute_score``, with the sandbox URL / memory limit bound when a sandbox is configured."""
    url, _ = _pick(config, "reward.sandbox_fusion.url", "sandbox_fusion.url")
    if url is None:
        return default_compute_score
    default = field_default(_reward_config_classes().SandboxFusionConfig, "memory_limit_mb")
    memory_limit_mb, _ = _pick(
        config, "reward.sandbox_fusion.memory_limit_mb", "sandbox_fusion.memory_limit_mb", new_default=default
    )
    memory_limit_mb = default if memory_limit_mb is None else memory_limit_mb
    return functools.partial(default_compute_score, sandbox_fusion_url=url, memory_limit_mb=memory_limit_mb)


def _manager_class(config: Any) -> tuple[type, str]:
    """(reward-manager class, description) from ``reward.reward_manager`` (or legacy ``reward_model.reward_manager``)."""
    from verl.workers.reward_manager import get_reward_manager_cls

    classes = _reward_config_classes()
    source = _select_or_default(config, "reward.reward_manager.source", classes.RewardManagerConfig, "source")
    if source == "importlib":
        path = _select(config, "reward.reward_manager.module.path")
        name = _select_or_default(
            config, "reward.reward_manager.module.name", classes.RewardManagerModuleConfig, "name"
        )
        if path is None:
            raise ValueError("reward.reward_manager.source=importlib needs reward.reward_manager.module.path.")
        return load_extern_object(str(path), str(name)), f"{name} from {path}"
    if source != "register":
        raise ValueError(f"reward.reward_manager.source must be 'register' or 'importlib', got {source!r}.")
    default = field_default(classes.RewardManagerConfig, "name")
    name, _ = _pick(config, "reward.reward_manager.name", "reward_model.reward_manager", new_default=default)
    name = default if name is None else name
    return get_reward_manager_cls(str(name)), str(name)


def _accepts(cls: type, parameter: str) -> bool:
    """True when ``cls(...)`` takes a parameter of that name (explicitly, not via **kwargs)."""
    return parameter in inspect.signature(cls.__init__).parameters


def _scoring_setting(config: Any, key: str) -> Any:
    """``reward.<key>``, or its RewardConfig default when the config has no such key (a partial config)."""
    reward = _select(config, "reward")
    if reward is not None and key in reward.keys():
        return reward[key]
    return field_default(_reward_config_classes().RewardConfig, key)


def load_reward_manager(config: Any, tokenizer: Any, num_examine: int = 0, **reward_kwargs: Any) -> Any:
    """The configured reward manager, built as ``cls(tokenizer=, num_examine=, compute_score=, reward_fn_key=,
    **reward_kwargs)`` (upstream v0.6 contract).

    ``compute_score``: the custom function if configured, else ``default_compute_score``. Managers whose
    constructor takes ``num_workers`` / ``compute_score_timeout`` / ``batch_timeout`` get ``reward.<that key>``
    unless ``reward_kwargs`` sets it.
    """
    manager_cls, description = _manager_class(config)
    is_batch = description == "batch"
    compute_score = get_custom_reward_fn(config, batch=is_batch) or (None if is_batch else _default_scorer(config))
    from verl.trainer.config.data import DataConfig

    reward_fn_key = _select_or_default(config, "data.reward_fn_key", DataConfig, "reward_fn_key")
    kwargs = dict(reward_kwargs)
    for key in SCORING_KEYS:
        if key not in kwargs and _accepts(manager_cls, key):
            kwargs[key] = _scoring_setting(config, key)
    logger.info("reward manager: %s (reward_fn_key=%r, num_examine=%d)", description, reward_fn_key, num_examine)
    return manager_cls(
        tokenizer=tokenizer, num_examine=num_examine, compute_score=compute_score, reward_fn_key=reward_fn_key, **kwargs
    )


def _supports_return_dict(reward_fn: Any) -> bool:
    """True when ``reward_fn(data, return_dict=True)`` is part of its signature (all built-in managers)."""
    try:
        return "return_dict" in inspect.signature(reward_fn).parameters
    except (TypeError, ValueError):
        return False


def compute_reward(data: Any, reward_fn: Callable) -> tuple[torch.Tensor, dict[str, list]]:
    """``(reward_tensor (B, R), reward_extra_info)``; managers without ``return_dict`` give an empty extra dict."""
    if not _supports_return_dict(reward_fn):
        return reward_fn(data), {}
    result = reward_fn(data, return_dict=True)
    if not isinstance(result, dict) or "reward_tensor" not in result:
        raise TypeError(f"{type(reward_fn).__name__}(data, return_dict=True) must return a dict with 'reward_tensor'.")
    return result["reward_tensor"], dict(result.get("reward_extra_info") or {})


def reward_metrics_from_extra_info(reward_extra_info: dict[str, Any]) -> dict[str, int]:
    """``reward/num_failed`` and ``reward/num_timed_out`` for the step's metrics (0 when the columns are absent)."""
    return {
        "reward/num_failed": int(sum(bool(x) for x in reward_extra_info.get("reward_failed", []))),
        "reward/num_timed_out": int(sum(bool(x) for x in reward_extra_info.get("reward_timed_out", []))),
    }


def _compute_reward_async(data: Any, config: Any = None, tokenizer: Any = None, reward_fn: Callable | None = None):
    """Body of :data:`compute_reward_async`: build the manager from the config if none is given, then score."""
    if reward_fn is None:
        reward_kwargs = _plain_dict(_select(config, "reward_model.reward_kwargs"))
        reward_fn = load_reward_manager(config, tokenizer, num_examine=0, **reward_kwargs)
    return compute_reward(data, reward_fn)


class _LazyRayRemote:
    """``fn.remote(...)`` as a Ray task created on first use (no Ray import or registration at import time)."""

    def __init__(self, fn: Callable, **options: Any):
        self._fn, self._options, self._remote = fn, options, None
        functools.update_wrapper(self, fn)

    def remote(self, *args: Any, **kwargs: Any):
        if self._remote is None:
            import ray

            self._remote = ray.remote(**self._options)(self._fn)
        return self._remote.remote(*args, **kwargs)

    def __call__(self, *args: Any, **kwargs: Any):
        return self._fn(*args, **kwargs)


compute_reward_async = _LazyRayRemote(_compute_reward_async, num_cpus=1)
"""``compute_reward_async.remote(data, config=None, tokenizer=None, reward_fn=None)`` -> ObjectRef of
``(reward_tensor, reward_extra_info)``: scores on another CPU while the trainer continues (upstream name)."""
