"""Learning-rate schedules with linear warmup (upstream names, re-exported by `verl.utils.torch_functional`).

Each returns a `torch.optim.lr_scheduler.LambdaLR` whose factor multiplies the optimizer's initial lr.
Selected by `actor_rollout_ref.actor.optim.lr_scheduler_type` (constant | cosine | wsd).
"""

from __future__ import annotations

import math
from collections.abc import Callable

from torch.optim import Optimizer
from torch.optim.lr_scheduler import LambdaLR

__all__ = [
    "get_constant_schedule_with_warmup",
    "get_cosine_schedule_with_warmup",
    "get_wsd_schedule_with_warmup",
]


def _check_ratio(name: str, value: float) -> None:
    if not 0.0 <= value <= 1.0:
        raise ValueError(f"{name} must be in [0, 1], got {value} (config key: actor_rollout_ref.actor.optim.{name}).")


def _cosine_factor(progress: float, num_cycles: float) -> float:
    """0.5 * (1 + cos(2 pi num_cycles progress)): 1 at progress 0, 0 at progress 1 for half a cycle."""
    return 0.5 * (1.0 + math.cos(math.pi * float(num_cycles) * 2.0 * progress))


def cosine_warmup_factor(
    step: int,
    num_warmup_steps: int,
    num_training_steps: int,
    min_lr_ratio: float,
    num_cycles: float,
    init_lr_ratio: float,
) -> float:
    """Factor at `step` (0-based): linear init_lr_ratio -> 1 during warmup, then cosine from 1 down to min_lr_ratio.

    The decay is min + (1 - min) * 0.5 * (1 + cos(...)), floored at min_lr_ratio (num_cycles > 0.5 would rise again).
    """
    if step < num_warmup_steps:
        return init_lr_ratio + (1.0 - init_lr_ratio) * step / max(1, num_warmup_steps)
    progress = (step - num_warmup_steps) / max(1, num_training_steps - num_warmup_steps)
    return max(min_lr_ratio, min_lr_ratio + (1.0 - min_lr_ratio) * _cosine_factor(progress, num_cycles))


def get_cosine_schedule_with_warmup(
    optimizer: Optimizer,
    num_warmup_steps: int,
    num_training_steps: int,
    min_lr_ratio: float = 0.0,
    num_cycles: float = 0.5,
    last_epoch: int = -1,
    init_lr_ratio: float | None = None,
    zero_indexed_step: bool = True,
) -> LambdaLR:
    """Linear warmup from init_lr_ratio (default 0) to the initial lr, then cosine decay to min_lr_ratio.

    zero_indexed_step=False counts the scheduler's steps from 1 (so the first warmup step is not lr 0).
    """
    min_lr_ratio = 0.0 if min_lr_ratio is None else min_lr_ratio
    init_lr_ratio = 0.0 if init_lr_ratio is None else init_lr_ratio
    _check_ratio("min_lr_ratio", min_lr_ratio)
    _check_ratio("init_lr_ratio", init_lr_ratio)
    offset = 0 if zero_indexed_step else 1

    def lr_lambda(current_step: int) -> float:
        return cosine_warmup_factor(
            current_step + offset, num_warmup_steps, num_training_steps, min_lr_ratio, num_cycles, init_lr_ratio
        )

    return LambdaLR(optimizer, lr_lambda, last_epoch)


def _linear_warmup(num_warmup_steps: int) -> Callable[[int], float]:
    def factor(step: int) -> float:
        return step / max(1, num_warmup_steps) if step < num_warmup_steps else 1.0

    return factor


def get_constant_schedule_with_warmup(optimizer: Optimizer, num_warmup_steps: int, last_epoch: int = -1) -> LambdaLR:
    """Linear warmup from 0 to the initial lr over num_warmup_steps, then constant."""
    return LambdaLR(optimizer, _linear_warmup(num_warmup_steps), last_epoch)


def wsd_factor(
    step: int,
    num_warmup_steps: int,
    num_training_steps: int,
    min_lr_ratio: float,
    num_cycles: float,
    stable_ratio: float,
) -> float:
    """Warmup-stable-decay factor: linear 0 -> 1, hold 1 for stable_ratio of the rest, cosine decay to min."""
    remaining = max(0, num_training_steps - num_warmup_steps)
    num_stable_steps = int(remaining * stable_ratio)
    num_decay_steps = remaining - num_stable_steps
    if step < num_warmup_steps:
        return step / max(1, num_warmup_steps)
    if step < num_warmup_steps + num_stable_steps:
        return 1.0
    if step < num_training_steps:
        progress = (step - num_warmup_steps - num_stable_steps) / max(1, num_decay_steps)
        return (1.0 - min_lr_ratio) * max(0.0, _cosine_factor(progress, num_cycles)) + min_lr_ratio
    return min_lr_ratio


def get_wsd_schedule_with_warmup(
    optimizer: Optimizer,
    num_warmup_steps: int,
    num_training_steps: int,
    min_lr_ratio: float = 0.0,
    num_cycles: float = 0.5,
    last_epoch: int = -1,
    stable_ratio: float = 0.9,
) -> LambdaLR:
    """Warmup-Stable-Decay: linear warmup, constant for stable_ratio of the remaining steps, cosine to min_lr_ratio."""
    _check_ratio("min_lr_ratio", min_lr_ratio)
    if not 0.0 <= stable_ratio <= 1.0:
        raise ValueError(
            f"stable_ratio must be in [0, 1], got {stable_ratio} "
            "(config key: actor_rollout_ref.actor.optim.lr_wsd_stable_steps_ratio)."
        )

    def lr_lambda(current_step: int) -> float:
        return wsd_factor(current_step, num_warmup_steps, num_training_steps, min_lr_ratio, num_cycles, stable_ratio)

    return LambdaLR(optimizer, lr_lambda, last_epoch)
