"""Upstream training backends this distribution does not have, and the config classes upstream code imports for
them.

``verl.workers.config.McoreActorConfig`` & co. exist so that code written against upstream (type hints,
``isinstance`` checks, a module that supports several backends) imports unchanged; building one raises
``ConfigError`` naming the backend and what to use instead, as does selecting the backend by its strategy name
(``actor_rollout_ref.actor.strategy=megatron``). The reasons live in ``engine.UNSUPPORTED_BACKENDS``.
"""

from __future__ import annotations

from dataclasses import dataclass

from verl.workers.config.actor import ActorConfig
from verl.workers.config.critic import CriticConfig
from verl.workers.config.engine import UNSUPPORTED_BACKENDS, EngineConfig, refuse_unsupported_backend
from verl.workers.config.optimizer import OptimizerConfig

__all__ = [
    "UNSUPPORTED_BACKENDS",
    "McoreActorConfig",
    "McoreCriticConfig",
    "McoreEngineConfig",
    "McoreOptimizerConfig",
    "MindSpeedEngineConfig",
    "refuse_unsupported_backend",
]


@dataclass
class McoreEngineConfig(EngineConfig):
    """Upstream's Megatron parallelism config (importable; building one is refused)."""

    strategy: str = "megatron"
    """Always megatron upstream."""

    def __post_init__(self) -> None:
        refuse_unsupported_backend("strategy", self.strategy)


@dataclass
class MindSpeedEngineConfig(McoreEngineConfig):
    """Upstream's MindSpeed (Megatron on Ascend) config (importable; building one is refused)."""

    strategy: str = "mindspeed_llm"
    """mindspeed_llm | mindspeed_mm upstream."""


@dataclass
class McoreOptimizerConfig(OptimizerConfig):
    """Upstream's Megatron optimizer config (importable; building one is refused)."""

    optimizer: str = "adam"
    """Megatron optimizer name upstream."""

    def __post_init__(self) -> None:
        refuse_unsupported_backend("optimizer", "megatron")


@dataclass
class McoreActorConfig(ActorConfig):
    """Upstream's Megatron actor config (importable; building one is refused)."""

    strategy: str = "megatron"
    """Always megatron upstream."""

    def __post_init__(self) -> None:
        refuse_unsupported_backend("strategy", self.strategy)


@dataclass
class McoreCriticConfig(CriticConfig):
    """Upstream's Megatron critic config (importable; building one is refused)."""

    strategy: str = "megatron"
    """Always megatron upstream."""

    def __post_init__(self) -> None:
        refuse_unsupported_backend("strategy", self.strategy)
