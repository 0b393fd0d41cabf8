"""Policy-loss registry (``actor_rollout_ref.actor.policy_loss.loss_mode`` -> function) and the actor-config
accessors the losses share.

Call convention of every registered loss::

    pg_loss, pg_metrics = fn(old_log_prob, log_prob, advantages, response_mask,
                             loss_agg_mode="token-mean", config=actor_config, rollout_is_weights=None)

tensors ``(bs, response_length)``, ``pg_loss`` a scalar with autograd, ``pg_metrics`` a dict of floats
(``actor/pg_clipfrac``, ``actor/ppo_kl``, ...). ``config`` is the actor config (``ActorConfig``); the losses read
``clip_ratio``, ``clip_ratio_low``, ``clip_ratio_high``, ``clip_ratio_c``, ``tau_pos``, ``tau_neg``,
``loss_scale_factor``, ``policy_loss.*`` and the runtime ``global_batch_info`` from it.
"""

from __future__ import annotations

import importlib
import logging
from collections.abc import Callable
from typing import Any, Optional

import torch

logger = logging.getLogger(__name__)

PolicyLossFn = Callable[
    [
        torch.Tensor,  # old_log_prob
        torch.Tensor,  # log_prob
        torch.Tensor,  # advantages
        torch.Tensor,  # response_mask
        str,  # loss_agg_mode
        Optional[Any],  # config (ActorConfig)
        Optional[torch.Tensor],  # rollout_is_weights
    ],
    tuple[torch.Tensor, dict[str, Any]],
]

POLICY_LOSS_REGISTRY: dict[str, PolicyLossFn] = {}

# Modules whose import registers the built-in losses (see get_policy_loss_fn).
_BUILTIN_LOSS_MODULES = (
    "verl.trainer.ppo.policy_losses",
    "verl.trainer.ppo.policy_losses_covariance",
    "verl.trainer.ppo.policy_losses_off_policy",
)


def register_policy_loss(name: str) -> Callable[[PolicyLossFn], PolicyLossFn]:
    """Decorator registering a policy loss under ``name`` (selected by ``policy_loss.loss_mode``).

    As upstream, registering under a taken name replaces the previous function (this is how a user overrides a
    built-in); the replacement is logged so it is never silent.
    """

    def decorator(fn: PolicyLossFn) -> PolicyLossFn:
        existing = POLICY_LOSS_REGISTRY.get(name)
        if existing is not None and existing is not fn:
            logger.warning(
                "policy loss %r: %s.%s replaces %s.%s",
                name,
                fn.__module__,
                fn.__qualname__,
                existing.__module__,
                existing.__qualname__,
            )
        POLICY_LOSS_REGISTRY[name] = fn
        return fn

    return decorator


def get_policy_loss_fn(name: str) -> PolicyLossFn:
    """Return the loss registered under ``name``; ``ValueError`` listing the valid names if unknown."""
    for module in _BUILTIN_LOSS_MODULES:
        importlib.import_module(module)
    if name not in POLICY_LOSS_REGISTRY:
        raise ValueError(
            f"Unsupported loss mode: {name}. Supported modes are: {sorted(POLICY_LOSS_REGISTRY)} "
            "(actor_rollout_ref.actor.policy_loss.loss_mode)."
        )
    return POLICY_LOSS_REGISTRY[name]


def require_config(where: str, config: Any) -> Any:
    """The actor config, or ``ValueError`` if a loss that needs it was called without one."""
    if config is None:
        raise ValueError(f"{where} needs the actor config (actor_rollout_ref.actor, an ActorConfig); pass config=...")
    return config


def clip_ratio_bounds(config: Any) -> tuple[float, float]:
    """``(ε_low, ε_high)``: ``clip_ratio_low`` / ``clip_ratio_high``, each falling back to ``clip_ratio``."""
    low = config.clip_ratio_low if config.clip_ratio_low is not None else config.clip_ratio
    high = config.clip_ratio_high if config.clip_ratio_high is not None else config.clip_ratio
    return low, high


def agg_kwargs(config: Any) -> dict[str, Any]:
    """Keyword arguments for ``agg_loss`` from the actor config.

    ``global_batch_info`` (``dp_size``, ``batch_num_tokens``, ``global_batch_size``) is runtime state the engine
    attaches to the config per mini-batch, not a YAML key, so a config that was never given one has none; it
    then falls back to local normalisation. ``loss_scale_factor`` is the ``actor.loss_scale_factor`` key.
    """
    kwargs = dict(getattr(config, "global_batch_info", None) or {})
    kwargs.setdefault("loss_scale_factor", config.loss_scale_factor)
    return kwargs
