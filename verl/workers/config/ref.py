"""Reference-policy settings: `actor_rollout_ref.ref` (`ref/ref.yaml` + `ref/dp_ref.yaml`).

The reference policy only computes log-probs (for the KL loss or the KL reward penalty), so it has
log-prob batch settings and a forward-only FSDP engine, but no optimizer or loss settings.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar, Optional

from verl.base_config import BaseConfig, ConfigError, require_positive
from verl.workers.config.actor import check_offload_policy, check_strategy_family
from verl.workers.config.batch import check_micro_batch_settings
from verl.workers.config.engine import FSDP_STRATEGIES, FSDPEngineConfig, VeOmniEngineConfig, link_role_and_engine

__all__ = ["FSDPRefConfig", "RefConfig", "VeOmniRefConfig"]


@dataclass
class RefConfig(BaseConfig):
    """Log-prob settings of the frozen reference policy."""

    STRATEGIES: ClassVar[tuple[str, ...]] = FSDP_STRATEGIES
    """The strategies this config family serves (`veomni`: VeOmniRefConfig)."""

    strategy: str = "fsdp"
    """The YAML makes it follow actor_rollout_ref.actor.strategy; a different value raises."""

    rollout_n: int = 1
    """Responses per prompt; the YAML makes it follow actor_rollout_ref.rollout.n."""

    use_torch_compile: bool = False
    """Upstream: torch.compile the log-prob kernels (not applied here); follows the actor's."""

    log_prob_micro_batch_size: Optional[int] = None
    """Deprecated global micro-batch size; use log_prob_micro_batch_size_per_gpu."""

    log_prob_micro_batch_size_per_gpu: Optional[int] = None
    """RESPONSES per GPU per log-prob forward."""

    log_prob_use_dynamic_bsz: bool = False
    """Token-budget micro-batches; follows actor_rollout_ref.actor.use_dynamic_bsz."""

    log_prob_max_token_len_per_gpu: int = 16384
    """Token budget per GPU per forward; follows actor_rollout_ref.actor.ppo_max_token_len_per_gpu."""

    def __post_init__(self) -> None:
        check_strategy_family("strategy", self.strategy, self.STRATEGIES)
        require_positive("rollout_n", self.rollout_n)
        check_micro_batch_settings(
            "log_prob_micro_batch_size",
            self.log_prob_micro_batch_size,
            "log_prob_micro_batch_size_per_gpu",
            self.log_prob_micro_batch_size_per_gpu,
        )
        if self.log_prob_use_dynamic_bsz and not self.log_prob_max_token_len_per_gpu:
            raise ConfigError(
                "log_prob_max_token_len_per_gpu", "log_prob_use_dynamic_bsz=True needs a positive token budget."
            )

    @property
    def ulysses_sp_size(self) -> int:
        """Ulysses SP size of the reference's forward; 1 for backends without sequence parallelism."""
        return 1

    @property
    def engine_config(self) -> BaseConfig:
        """The forward-only engine settings of the reference (`fsdp_config` or `veomni`)."""
        raise NotImplementedError(f"{type(self).__name__} has no engine settings; use a backend subclass")


@dataclass
class FSDPRefConfig(RefConfig):
    """Reference policy run by FSDP1/FSDP2 (`ref/dp_ref.yaml`)."""

    ulysses_sequence_parallel_size: int = 1
    """Ulysses SP group size; follows actor_rollout_ref.actor.ulysses_sequence_parallel_size."""

    entropy_from_logits_with_chunking: bool = False
    """Chunked entropy (the reference never needs entropy; kept for key compatibility)."""

    entropy_from_logits_chunk_size: int = 2048
    """Tokens per chunk of the chunked log-prob."""

    entropy_checkpointing: bool = False
    """Recompute entropy in backward (unused: the reference has no backward)."""

    fsdp_config: FSDPEngineConfig = field(default_factory=lambda: FSDPEngineConfig(forward_only=True))
    """Forward-only FSDP engine (always CPU-offloaded between uses)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        require_positive("entropy_from_logits_chunk_size", self.entropy_from_logits_chunk_size)
        link_role_and_engine(self, "fsdp_config")
        check_offload_policy(self.fsdp_config, self.strategy)

    @property
    def ulysses_sp_size(self) -> int:
        return self.ulysses_sequence_parallel_size

    @property
    def engine_config(self) -> FSDPEngineConfig:
        return self.fsdp_config


@dataclass
class VeOmniRefConfig(RefConfig):
    """Reference policy built by the VeOmni engine (`model_engine=veomni`: `ref/veomni_ref.yaml`)."""

    STRATEGIES: ClassVar[tuple[str, ...]] = ("veomni",)

    strategy: str = "veomni"
    """Follows actor_rollout_ref.actor.strategy (veomni in this family)."""

    veomni: VeOmniEngineConfig = field(default_factory=lambda: VeOmniEngineConfig(forward_only=True))
    """Forward-only VeOmni engine; its kernel choices are the reference's own (not inherited from the actor)."""

    @property
    def engine_config(self) -> VeOmniEngineConfig:
        return self.veomni
