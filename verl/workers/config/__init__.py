"""Typed configs of the workers: actor, reference, critic, rollout, model, optimizer, FSDP/VeOmni engine, reward.

Each class is the single home of its defaults; `verl/trainer/config/*.yaml` mirrors them (a test keeps the
two equal) and `verl.utils.config.omega_conf_to_dataclass` builds them from Hydra nodes.
"""

from verl.trainer.config.config import CheckpointConfig
from verl.workers.config.actor import (
    ActorConfig,
    FSDPActorConfig,
    PolicyLossConfig,
    RouterReplayConfig,
    VeOmniActorConfig,
)
from verl.workers.config.critic import CriticConfig, FSDPCriticConfig, FSDPCriticModelCfg
from verl.workers.config.engine import EngineConfig, FSDPEngineConfig, VeOmniEngineConfig
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
    "SamplingConfig",
    "SandboxFusionConfig",
    "TiledMLPConfig",
    "VeOmniActorConfig",
    "VeOmniEngineConfig",
    "VeOmniRefConfig",
]
