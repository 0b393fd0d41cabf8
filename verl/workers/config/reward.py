"""Reward settings: `reward` (`reward/reward.yaml`, the layout since v0.7).

The legacy top-level keys (`custom_reward_function.*`, `reward_model.*`, `sandbox_fusion.*`) are still
accepted: `verl.trainer.config.legacy_reward.migrate_legacy_reward_impl` copies them in here.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

from verl.base_config import BaseConfig, ConfigError, require_choice, require_positive

__all__ = [
    "CustomRewardFunctionConfig",
    "RewardConfig",
    "RewardManagerConfig",
    "RewardManagerModuleConfig",
    "RewardModelConfig",
    "SandboxFusionConfig",
]


@dataclass
class CustomRewardFunctionConfig(BaseConfig):
    """`reward.custom_reward_function`: a user `compute_score(data_source, solution_str, ground_truth,
    extra_info=None)` loaded from a Python file."""

    path: Optional[str] = None
    """Python file that defines the function; null = verl.utils.reward_score.default_compute_score."""

    name: str = "compute_score"
    """Function name in that file."""

    reward_kwargs: dict[str, Any] = field(default_factory=dict)
    """Extra keyword arguments bound to the function (add with +reward.custom_reward_function.reward_kwargs.k=v)."""

    def __post_init__(self) -> None:
        if self.path is not None and not self.name:
            raise ConfigError("name", "is empty; set the function name defined in {node}.path.")


@dataclass
class RewardManagerModuleConfig(BaseConfig):
    """`reward.reward_manager.module`: where a user reward-manager class lives (source=importlib)."""

    path: Optional[str] = None
    """Python file that defines the class."""

    name: str = "custom_reward_manager"
    """Class name in that file."""


@dataclass
class RewardManagerConfig(BaseConfig):
    """`reward.reward_manager`: which reward manager turns scores into token-level rewards."""

    source: str = "register"
    """register = look `name` up in the reward-manager registry; importlib = load `module`."""

    name: str = "naive"
    """Registered manager: naive | prime | batch | dapo (or one registered by user code)."""

    module: RewardManagerModuleConfig = field(default_factory=RewardManagerModuleConfig)
    """User class, used when source=importlib."""

    def __post_init__(self) -> None:
        require_choice("source", self.source, ("register", "importlib"))
        if self.source == "importlib" and self.module.path is None:
            raise ConfigError("module.path", "source=importlib needs the Python file that defines the manager.")


@dataclass
class RewardModelConfig(BaseConfig):
    """`reward.reward_model`: a model-based reward served next to the policy."""

    enable: bool = False
    """Use a reward model (rule-based rewards need none)."""

    enable_resource_pool: bool = False
    """Run the reward model in its own resource pool instead of colocated."""

    n_gpus_per_node: int = 8
    """Devices per node of that pool."""

    nnodes: int = 0
    """Nodes of that pool."""

    model_path: Optional[str] = None
    """Reward model location."""


@dataclass
class SandboxFusionConfig(BaseConfig):
    """`reward.sandbox_fusion`: remote code execution for code-reward datasets."""

    url: Optional[str] = None
    """Sandbox endpoint; null = code rewards run locally."""

    max_concurrent: int = 64
    """Concurrent sandbox requests."""

    memory_limit_mb: int = 1024
    """Memory limit per execution."""

    def __post_init__(self) -> None:
        require_positive("max_concurrent", self.max_concurrent)
        require_positive("memory_limit_mb", self.memory_limit_mb)


@dataclass
class RewardConfig(BaseConfig):
    """Everything that produces rewards."""

    num_workers: int = 8
    """Worker processes scoring the samples of a batch in parallel. Each call runs in a worker process, so a hung
    call is killed with its process; scores come back in batch order, equal to serial scoring."""

    compute_score_timeout: Optional[float] = 300.0
    """Seconds one reward-function call may take. A call over it is killed with its worker process, reported at
    once (sample index, data source), scores 0.0 and counts in reward/num_timed_out; null = no limit."""

    batch_timeout: Optional[float] = None
    """Seconds the whole batch may take to score; samples unfinished then score 0.0 and count in
    reward/num_timed_out. null = no limit beyond the per-call one, whose worst case is
    ceil(batch / num_workers) x compute_score_timeout."""

    custom_reward_function: CustomRewardFunctionConfig = field(default_factory=CustomRewardFunctionConfig)
    """User scoring function."""

    reward_manager: RewardManagerConfig = field(default_factory=RewardManagerConfig)
    """Reward manager selection."""

    reward_model: RewardModelConfig = field(default_factory=RewardModelConfig)
    """Model-based reward."""

    sandbox_fusion: SandboxFusionConfig = field(default_factory=SandboxFusionConfig)
    """Remote sandbox for code rewards."""

    def __post_init__(self) -> None:
        require_positive("num_workers", self.num_workers)
        require_positive("compute_score_timeout", self.compute_score_timeout, allow_none=True)
        require_positive("batch_timeout", self.batch_timeout, allow_none=True)
