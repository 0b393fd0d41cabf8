"""Optimizer construction, lr schedules, and the clipped optimizer step that skips non-finite gradients."""

from __future__ import annotations

import importlib
import logging
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn as nn

from verl.utils.fsdp_utils import adapter_for
from verl.utils.lr_schedules import get_constant_schedule_with_warmup, get_cosine_schedule_with_warmup

logger = logging.getLogger(__name__)

__all__ = ["StepResult", "build_lr_scheduler", "build_optimizer", "clip_grad_and_step", "warmup_steps"]


@dataclass(frozen=True)
class StepResult:
    """``grad_norm``: total L2 norm before clipping; ``stepped``: False when the step was skipped (non-finite)."""

    grad_norm: float
    stepped: bool


def clip_grad_and_step(
    model: nn.Module, optimizer: torch.optim.Optimizer, max_norm: float, *, config_key: str = "actor.grad_clip"
) -> StepResult:
    """Clip the gradients to ``max_norm`` and step, unless their norm is inf/NaN.

    A non-finite norm means at least one gradient is unusable; stepping would write NaN into the weights and
    the optimizer state for good. The step is skipped (gradients dropped), a warning names the cause, and the
    caller reports it (``actor/grad_norm`` is then non-finite and ``*/skipped_steps`` counts it). The norm is
    reduced over all ranks, so every rank takes the same decision.
    """
    adapter = adapter_for(model)
    if adapter is not None:
        norm = adapter.clip_grad_norm(model, max_norm)
    else:
        params = [p for p in model.parameters() if p.grad is not None]
        norm = torch.nn.utils.clip_grad_norm_(params, max_norm=max_norm).detach().float()
    if not torch.isfinite(norm):
        logger.warning(
            "gradient norm is %s: skipping this optimizer step (%s=%s). Persistent skips mean the loss overflows; "
            "lower the learning rate or check the inputs",
            norm.item(),
            config_key,
            max_norm,
        )
        optimizer.zero_grad(set_to_none=True)
        return StepResult(norm.item(), False)
    optimizer.step()
    return StepResult(norm.item(), True)


def build_optimizer(params: Any, optim_config: Any) -> torch.optim.Optimizer:
    """``optim.optimizer`` from ``optim.optimizer_impl`` with lr, betas, weight decay and
    ``override_optimizer_config`` (e.g. ``{eps: 1e-6}``)."""
    try:
        module = importlib.import_module(optim_config.optimizer_impl)
        optimizer_cls = getattr(module, optim_config.optimizer)
    except (ImportError, AttributeError) as err:
        raise ValueError(
            f"optim.optimizer={optim_config.optimizer!r} is not found in optim.optimizer_impl="
            f"{optim_config.optimizer_impl!r} ({err})"
        ) from err
    kwargs = {
        "lr": optim_config.lr,
        "betas": tuple(optim_config.betas),
        "weight_decay": optim_config.weight_decay,
    }
    kwargs.update(optim_config.override_optimizer_config or {})
    return optimizer_cls(params, **kwargs)


def warmup_steps(optim_config: Any) -> int:
    """``lr_warmup_steps`` if positive, else ``lr_warmup_steps_ratio * total_training_steps``."""
    if optim_config.lr_warmup_steps is not None and optim_config.lr_warmup_steps > 0:
        return optim_config.lr_warmup_steps
    total = max(optim_config.total_training_steps, 0)
    return int(optim_config.lr_warmup_steps_ratio * total)


def build_lr_scheduler(optimizer: torch.optim.Optimizer, optim_config: Any) -> torch.optim.lr_scheduler.LambdaLR:
    """Warmup then constant or cosine (``optim.lr_scheduler_type``), from ``verl.utils.torch_functional``."""
    warmup = warmup_steps(optim_config)
    if optim_config.lr_scheduler_type == "constant":
        return get_constant_schedule_with_warmup(optimizer, num_warmup_steps=warmup)
    if optim_config.lr_scheduler_type == "cosine":
        if optim_config.total_training_steps <= 0:
            raise ValueError(
                "optim.lr_scheduler_type=cosine needs optim.total_training_steps (the trainer sets it from the "
                "dataloader length and trainer.total_epochs)"
            )
        return get_cosine_schedule_with_warmup(
            optimizer,
            num_warmup_steps=warmup,
            num_training_steps=optim_config.total_training_steps,
            min_lr_ratio=optim_config.min_lr_ratio,
            num_cycles=optim_config.num_cycles,
            zero_indexed_step=optim_config.zero_indexed_step,
        )
    raise ValueError(f"optim.lr_scheduler_type={optim_config.lr_scheduler_type!r}: use constant or cosine")
