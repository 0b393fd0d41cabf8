"""Optimizer and learning-rate schedule settings (`actor_rollout_ref.actor.optim`, `critic.optim`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

from verl.base_config import BaseConfig, ConfigError, require_choice

__all__ = ["LR_SCHEDULER_TYPES", "FSDPOptimizerConfig", "OptimizerConfig"]

LR_SCHEDULER_TYPES = ("constant", "cosine")


@dataclass
class OptimizerConfig(BaseConfig):
    """Learning rate, warmup and weight decay shared by every optimizer backend."""

    # The trainer writes total_training_steps once the dataloader length is known.
    _mutable_fields = frozenset({"total_training_steps"})

    lr: float = 1e-6
    """Peak learning rate."""

    lr_warmup_steps_ratio: float = 0.0
    """Warmup length as a fraction of total_training_steps (used when lr_warmup_steps <= 0)."""

    total_training_steps: int = -1
    """Set by the trainer at runtime from the dataloader length and trainer.total_epochs; -1 = not yet known."""

    weight_decay: float = 0.01
    """Decoupled weight decay (AdamW)."""

    lr_warmup_steps: int = -1
    """Warmup steps; <= 0 means derive it from lr_warmup_steps_ratio * total_training_steps."""

    betas: list[float] = field(default_factory=lambda: [0.9, 0.999])
    """Adam betas (beta1, beta2)."""

    clip_grad: float = 1.0
    """Gradient-norm clipping threshold (engine path). Linked to the role's `grad_clip`."""

    zero_indexed_step: bool = True
    """The scheduler counts steps from 0 (upstream v0.7 behaviour; false = from 1)."""

    def __post_init__(self) -> None:
        if self.lr < 0:
            raise ConfigError("lr", f"must be >= 0, got {self.lr}.")
        if not 0.0 <= self.lr_warmup_steps_ratio <= 1.0:
            raise ConfigError("lr_warmup_steps_ratio", f"must be in [0, 1], got {self.lr_warmup_steps_ratio}.")
        if len(self.betas) != 2:
            raise ConfigError("betas", f"needs exactly two values (beta1, beta2), got {self.betas}.")
        if self.clip_grad <= 0:
            raise ConfigError("clip_grad", f"must be > 0, got {self.clip_grad}.")


@dataclass
class FSDPOptimizerConfig(OptimizerConfig):
    """Optimizer of the FSDP engines (`optim/fsdp.yaml`)."""

    optimizer: str = "AdamW"
    """Optimizer class name, looked up in `optimizer_impl`."""

    optimizer_impl: str = "torch.optim"
    """Module that provides `optimizer` (e.g. torch.optim, bitsandbytes.optim)."""

    min_lr_ratio: Optional[float] = None
    """Cosine schedule: final lr as a fraction of `lr`; null = 0. Upstream's class default is null while its YAML
    writes 0.0 (the same schedule); both are kept as upstream's."""

    num_cycles: float = 0.5
    """Cosine schedule: number of half-waves (0.5 = decay once from peak to min)."""

    lr_scheduler_type: str = "constant"
    """constant | cosine (after warmup)."""

    warmup_style: Optional[str] = None
    """Deprecated alias of lr_scheduler_type; when set it is copied there."""

    override_optimizer_config: Optional[dict[str, Any]] = None
    """Extra keyword arguments passed to the optimizer constructor (e.g. {eps: 1e-6})."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.warmup_style is not None:
            if self.lr_scheduler_type not in ("constant", self.warmup_style):
                raise ConfigError(
                    "warmup_style",
                    f"({self.warmup_style!r}) contradicts {{node}}.lr_scheduler_type ({self.lr_scheduler_type!r}); "
                    f"warmup_style is its deprecated alias: set only lr_scheduler_type.",
                )
            self._normalize("lr_scheduler_type", self.warmup_style)
        require_choice("lr_scheduler_type", self.lr_scheduler_type, LR_SCHEDULER_TYPES)
        if self.min_lr_ratio is not None and not 0.0 <= self.min_lr_ratio <= 1.0:
            raise ConfigError("min_lr_ratio", f"must be in [0, 1], got {self.min_lr_ratio}.")
