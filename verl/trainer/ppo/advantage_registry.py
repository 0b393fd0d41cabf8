"""Advantage-estimator registry: ``algorithm.adv_estimator`` names -> functions.

Users add an estimator with ``@register_adv_est("my_est")`` on a function that returns
``(advantages, returns)``, both ``(bs, response_length)``, and select it with ``algorithm.adv_estimator=my_est``.
The built-in estimators register themselves when their modules are imported; :func:`get_adv_estimator_fn`
imports them first, so looking up a built-in name works whichever module was imported.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from enum import Enum
from typing import Any

AdvantageEstimatorFn = Callable[..., tuple[Any, Any]]

ADV_ESTIMATOR_REGISTRY: dict[str, AdvantageEstimatorFn] = {}

# Modules whose import registers the built-in estimators (see get_adv_estimator_fn).
_BUILTIN_ESTIMATOR_MODULES = (
    "verl.trainer.ppo.advantage_estimators",
    "verl.trainer.ppo.group_advantages",
    "verl.trainer.ppo.optimal_token_baseline",
)


class AdvantageEstimator(str, Enum):
    """Names of the built-in advantage estimators (``algorithm.adv_estimator``).

    Custom estimators do not need a member here: register them under a plain string.
    """

    GAE = "gae"
    GRPO = "grpo"
    REINFORCE_PLUS_PLUS = "reinforce_plus_plus"
    REINFORCE_PLUS_PLUS_BASELINE = "reinforce_plus_plus_baseline"
    REMAX = "remax"
    RLOO = "rloo"
    OPO = "opo"
    GRPO_PASSK = "grpo_passk"
    GPG = "gpg"
    RLOO_VECTORIZED = "rloo_vectorized"
    GRPO_VECTORIZED = "grpo_vectorized"
    OPTIMAL_TOKEN_BASELINE = "optimal_token_baseline"
    TIR_OPTIMAL_TOKEN_BASELINE = "tir_optimal_token_baseline"
    GDPO = "gdpo"


def _name_of(name_or_enum: str | Enum) -> str:
    return name_or_enum.value if isinstance(name_or_enum, Enum) else name_or_enum


def register_adv_est(name_or_enum: str | AdvantageEstimator) -> Callable[[AdvantageEstimatorFn], AdvantageEstimatorFn]:
    """Decorator registering an advantage estimator under ``name_or_enum``.

    Registering the same function twice is a no-op; registering a *different* function under a taken name raises
    ``ValueError`` (two estimators silently fighting over one name is always a mistake).
    """
    name = _name_of(name_or_enum)

    def decorator(fn: AdvantageEstimatorFn) -> AdvantageEstimatorFn:
        existing = ADV_ESTIMATOR_REGISTRY.get(name)
        if existing is not None and existing is not fn:
            raise ValueError(
                f"Adv estimator {name} has already been registered: {existing.__module__}.{existing.__qualname__} vs "
                f"{fn.__module__}.{fn.__qualname__}. Pick another name."
            )
        ADV_ESTIMATOR_REGISTRY[name] = fn
        return fn

    return decorator


def _load_builtin_estimators() -> None:
    for module in _BUILTIN_ESTIMATOR_MODULES:
        importlib.import_module(module)


def get_adv_estimator_fn(name_or_enum: str | AdvantageEstimator) -> AdvantageEstimatorFn:
    """Return the estimator registered under ``name_or_enum``; ``ValueError`` listing the valid names if unknown."""
    _load_builtin_estimators()
    name = _name_of(name_or_enum)
    if name not in ADV_ESTIMATOR_REGISTRY:
        raise ValueError(
            f"Unknown advantage estimator simply: {name} (algorithm.adv_estimator); "
            f"valid choices: {sorted(ADV_ESTIMATOR_REGISTRY)}. "
            "A custom estimator must be registered with @register_adv_est before the trainer starts."
        )
    return ADV_ESTIMATOR_REGISTRY[name]
