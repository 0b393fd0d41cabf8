"""Critic (value model) settings: `critic` (`critic/critic.yaml` + `critic/dp_critic.yaml`).

Batch units are the actor's (see verl.workers.config.actor): ppo_mini_batch_size counts prompts globally,
*_micro_batch_size_per_gpu counts responses per GPU. The YAML makes most keys follow the actor's.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Optional, Union

from verl.base_config import BaseConfig, ConfigError, require_choice, require_positive
from verl.workers.config.actor import LOSS_AGG_MODES, check_offload_policy, check_sequence_parallel
from verl.workers.config.batch import check_micro_batch_settings, mini_batch_responses_per_rank, validate_ppo_batch
from verl.workers.config.common import BaseModelConfig, CheckpointConfig
from verl.workers.config.engine import (
    FSDP_STRATEGIES,
    FSDPEngineConfig,
    link_role_and_engine,
    refuse_unsupported_backend,
)
from verl.workers.config.optimizer import FSDPOptimizerConfig

__all__ = ["CriticConfig", "FSDPCriticConfig", "FSDPCriticModelCfg"]


@dataclass
class FSDPCriticModelCfg(BaseModelConfig):
    """`critic.model`: the value model (a causal LM with a scalar value head) and its FSDP engine."""

    tokenizer_path: Optional[str] = "~/models/deepseek-llm-7b-chat"
    """Tokenizer location; the YAML makes it follow actor_rollout_ref.model.path."""

    use_shm: bool = False
    """Upstream copies the model to /dev/shm first; accepted for compatibility."""

    enable_gradient_checkpointing: bool = True
    """Recompute decoder-layer activations in backward."""

    enable_activation_offload: bool = False
    """Offload saved activations to CPU during forward."""

    use_remove_padding: bool = False
    """Packed (remove-padding) forward; required for Ulysses SP."""

    fsdp_config: FSDPEngineConfig = field(default_factory=FSDPEngineConfig)
    """FSDP engine of the critic (strategy follows critic.strategy)."""

    lora_rank: int = 0
    """LoRA rank; 0 = full fine-tuning."""

    lora_alpha: int = 16
    """LoRA scaling alpha."""

    target_modules: Union[str, list[str]] = "all-linear"
    """LoRA target modules."""


@dataclass
class CriticConfig(BaseConfig):
    """Value-function training settings common to every critic backend."""

    enable: Optional[bool] = None
    """Use a critic. null = exactly when algorithm.adv_estimator == gae."""

    strategy: str = "fsdp"
    """fsdp | fsdp2; the YAML makes it follow actor_rollout_ref.actor.strategy (a different value raises)."""

    rollout_n: int = 1
    """Responses per prompt; follows actor_rollout_ref.rollout.n."""

    optim: FSDPOptimizerConfig = field(default_factory=lambda: FSDPOptimizerConfig(lr=1e-5))
    """Optimizer of the value model (lr 1e-5 by default)."""

    ppo_mini_batch_size: int = 256
    """PROMPTS per optimizer step, global; follows actor_rollout_ref.actor.ppo_mini_batch_size."""

    ppo_micro_batch_size: Optional[int] = None
    """Deprecated global micro-batch size; use ppo_micro_batch_size_per_gpu."""

    ppo_micro_batch_size_per_gpu: Optional[int] = None
    """RESPONSES per GPU per forward/backward."""

    use_dynamic_bsz: bool = False
    """Token-budget micro-batches; follows actor_rollout_ref.actor.use_dynamic_bsz."""

    ppo_max_token_len_per_gpu: int = 32768
    """Token budget per GPU per training micro-batch when use_dynamic_bsz."""

    forward_max_token_len_per_gpu: int = 32768
    """Token budget per GPU per value-computation micro-batch; follows ppo_max_token_len_per_gpu."""

    ppo_epochs: int = 1
    """Passes over each batch; follows actor_rollout_ref.actor.ppo_epochs."""

    shuffle: bool = False
    """Shuffle between mini-batches; follows actor_rollout_ref.actor.shuffle."""

    data_loader_seed: int = 42
    """Seed of that shuffle."""

    cliprange_value: float = 0.5
    """Value clipping: v is clipped to v_old +/- cliprange_value."""

    loss_agg_mode: str = "token-mean"
    """Loss reduction; follows actor_rollout_ref.actor.loss_agg_mode."""

    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    """What the critic saves and loads."""

    forward_micro_batch_size: Optional[int] = None
    """Deprecated global micro-batch size of compute_values; follows ppo_micro_batch_size."""

    forward_micro_batch_size_per_gpu: Optional[int] = None
    """RESPONSES per GPU per compute_values forward; follows ppo_micro_batch_size_per_gpu."""

    ulysses_sequence_parallel_size: int = 1
    """Ulysses SP group size; linked to model.fsdp_config.ulysses_sequence_parallel_size."""

    grad_clip: float = 1.0
    """Gradient-norm clipping threshold; linked to optim.clip_grad."""

    def __post_init__(self) -> None:
        refuse_unsupported_backend("strategy", self.strategy)
        require_choice("strategy", self.strategy, FSDP_STRATEGIES)
        require_positive("rollout_n", self.rollout_n)
        require_positive("ppo_mini_batch_size", self.ppo_mini_batch_size)
        require_positive("ppo_epochs", self.ppo_epochs)
        require_positive("cliprange_value", self.cliprange_value)
        require_choice("loss_agg_mode", self.loss_agg_mode, LOSS_AGG_MODES)
        check_micro_batch_settings(
            "ppo_micro_batch_size",
            self.ppo_micro_batch_size,
            "ppo_micro_batch_size_per_gpu",
            self.ppo_micro_batch_size_per_gpu,
        )
        check_micro_batch_settings(
            "forward_micro_batch_size",
            self.forward_micro_batch_size,
            "forward_micro_batch_size_per_gpu",
            self.forward_micro_batch_size_per_gpu,
        )
        if self.use_dynamic_bsz:
            for key in ("ppo_max_token_len_per_gpu", "forward_max_token_len_per_gpu"):
                if not getattr(self, key) or getattr(self, key) <= 0:
                    raise ConfigError(key, "use_dynamic_bsz=True needs a positive token budget per GPU.")
        if self.grad_clip != self.optim.clip_grad:
            self._link_grad_clip()

    def _link_grad_clip(self) -> None:
        """critic.grad_clip (legacy worker) and critic.optim.clip_grad (engine path) are one setting."""
        if self.optim.clip_grad == 1.0:
            self._normalize("optim", replace(self.optim, clip_grad=self.grad_clip))
        elif self.grad_clip == 1.0:
            self._normalize("grad_clip", self.optim.clip_grad)
        else:
            raise ConfigError(
                "optim.clip_grad",
                f"({self.optim.clip_grad}) contradicts {{node}}.grad_clip ({self.grad_clip}); they are one setting: "
                f"set only {{node}}.grad_clip.",
            )

    @property
    def ulysses_sp_size(self) -> int:
        return self.ulysses_sequence_parallel_size

    def mini_batch_responses_per_rank(self, dp_size: int) -> int:
        """Responses per data-parallel rank in one optimizer step (see batch.mini_batch_responses_per_rank)."""
        return mini_batch_responses_per_rank(self, dp_size)

    def validate(self, n_gpus: int, train_batch_size: int) -> None:
        """Batch arithmetic that needs the cluster size (called by verl.utils.config.validate_config)."""
        validate_ppo_batch(self, n_gpus, train_batch_size)


@dataclass
class FSDPCriticConfig(CriticConfig):
    """Critic trained with FSDP1/FSDP2 (`critic/dp_critic.yaml`)."""

    model: FSDPCriticModelCfg = field(default_factory=FSDPCriticModelCfg)
    """Value model and its FSDP engine."""

    def __post_init__(self) -> None:
        super().__post_init__()
        link_role_and_engine(self, "model.fsdp_config", keys=("ulysses_sequence_parallel_size",))
        check_sequence_parallel(
            self.ulysses_sequence_parallel_size, self.model.use_remove_padding, "critic.model.use_remove_padding"
        )
        try:
            check_offload_policy(self.model.fsdp_config, self.strategy)
        except ConfigError as err:
            raise ConfigError(f"model.{err.name}", err.detail) from None
