"""Typed configs of the workers: actor, reference, critic, rollout, model, optimizer, FSDP/VeOmni engine, reward.

Each class is the single home of its defaults; `verl/trainer/config/*.yaml` mirrors them (a test keeps the
two equal) and `verl.utils.config.omega_conf_to_dataclass` builds them from Hydra nodes.

Upstream's Megatron-family classes (`McoreActorConfig`, ...) import from here but refuse to be built
(`unsupported.py`); `TrainingWorkerConfig` and `build_optimizer` (upstream paths) resolve on first access from
the engine worker / optimizer modules, which import torch-heavy code.
"""

import importlib

from verl.upstream_gaps import missing_name_getattr
from verl.workers.config.actor import (
    ActorConfig,
    FSDPActorConfig,
    PolicyLossConfig,
    RouterReplayConfig,
    VeOmniActorConfig,
)
from verl.workers.config.common import CheckpointConfig
from verl.workers.config.critic import CriticConfig, FSDPCriticConfig, FSDPCriticModelCfg
from verl.workers.config.engine import EngineConfig, EngineRouterReplayConfig, FSDPEngineConfig, VeOmniEngineConfig
from verl.workers.config.model import FusedKernelOptionsConfig, HFModelConfig, TiledMLPConfig
from verl.workers.config.optimizer import FSDPOptimizerConfig, OptimizerConfig
from verl.workers.config.ref import FSDPRefConfig, RefConfig, VeOmniRefConfig
from verl.workers.config.reward import (
    CustomRewardFunctionConfig,
    RewardConfig,
    RewardManagerConfig,
    RewardManagerModuleConfig,
    RewardModelConfig,
    SandboxFusionConfig,
)
from verl.workers.config.rollout import (
    AgentLoopConfig,
    CheckpointEngineConfig,
    CustomAsyncServerConfig,
    MultiTurnConfig,
    RolloutConfig,
    SamplingConfig,
)
from verl.workers.config.unsupported import (
    McoreActorConfig,
    McoreCriticConfig,
    McoreEngineConfig,
    McoreOptimizerConfig,
    MindSpeedEngineConfig,
)

__all__ = [
    "ActorConfig",
    "AgentLoopConfig",
    "CheckpointConfig",
    "CheckpointEngineConfig",
    "CriticConfig",
    "CustomAsyncServerConfig",
    "CustomRewardFunctionConfig",
    "EngineConfig",
    "FSDPActorConfig",
    "FSDPCriticConfig",
    "FSDPCriticModelCfg",
    "FSDPEngineConfig",
    "FSDPOptimizerConfig",
    "FSDPRefConfig",
    "FusedKernelOptionsConfig",
    "HFModelConfig",
    "McoreActorConfig",
    "McoreCriticConfig",
    "McoreEngineConfig",
    "McoreOptimizerConfig",
    "MindSpeedEngineConfig",
    "MultiTurnConfig",
    "OptimizerConfig",
    "PolicyLossConfig",
    "RefConfig",
    "RewardConfig",
    "RewardManagerConfig",
    "RewardManagerModuleConfig",
    "RewardModelConfig",
    "RolloutConfig",
    "RouterReplayConfig",
    "EngineRouterReplayConfig",
    "SamplingConfig",
    "SandboxFusionConfig",
    "TiledMLPConfig",
    "TrainingWorkerConfig",  # noqa: F822 - resolved lazily by __getattr__
    "VeOmniActorConfig",
    "VeOmniEngineConfig",
    "VeOmniRefConfig",
    "build_optimizer",  # noqa: F822 - resolved lazily by __getattr__
]

_LAZY = {
    "TrainingWorkerConfig": "verl.workers.engine_workers",
    "build_optimizer": "verl.workers.core.optimizer_step",
}
_missing = missing_name_getattr(__name__)  # upstream names missing here raise with the reason


def __getattr__(name: str):
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    return _missing(name)
