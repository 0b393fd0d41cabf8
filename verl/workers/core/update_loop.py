"""The loops of both worker paths (the legacy ``DataParallelPPOActor``/``Critic`` and the engine's
``TrainingWorker.run_mini_batches`` / ``BaseEngine.train_batch`` / ``FSDPEngine.forward_backward_batch``)::

    run_mini_batches   plan.epochs passes, one train_step per mini-batch of plan.mini_batch_size rows
      optimizer_step   zero_grad → forward_backward → clipped step
        forward_backward   every micro-batch: forward → loss → backward (gradients accumulate)
    forward_only       every micro-batch: forward without a graph; outputs in input row order

The paths pass the same per-micro-batch ``forward`` (``core.micro_forward``) and ``loss_fn`` (``core.losses``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

from verl.protocol import DataProto
from verl.utils.py_functional import append_to_dict
from verl.workers.core.batch_plan import BatchPlan
from verl.workers.core.losses import MetricAccumulator
from verl.workers.core.micro_batching import GlobalBatchInfo, global_batch_info, iter_mini_batches, restore_order
from verl.workers.core.optimizer_step import StepResult, clip_grad_and_step

__all__ = [
    "clipped_updates",
    "forward_backward",
    "forward_only",
    "optimizer_step",
    "prefixed_engine_metrics",
    "run_mini_batches",
    "scheduled_update",
]

ForwardFn = Callable[[DataProto], dict[str, torch.Tensor]]
"""The model forward of one micro-batch: ``{name: (b, R) tensor}``."""

LossFn = Callable[[dict[str, torch.Tensor], Any, GlobalBatchInfo], tuple[torch.Tensor, dict[str, float]]]
"""``(model_output, micro_batch.batch, global_batch_info) -> (loss, metrics)``."""

ENGINE_METRICS = ("grad_norm", "skipped_steps")
"""Metrics of the optimizer step itself (not of a loss term); the roles report them under their prefix."""


def forward_backward(
    data: DataProto,
    plan: BatchPlan,
    forward: ForwardFn,
    loss_fn: LossFn | None = None,
    *,
    backward: bool = True,
    dp_group: dist.ProcessGroup | None = None,
    micro_batch_key: str = "micro_batch_size_per_gpu (ppo_/log_prob_/forward_ prefixed)",
) -> tuple[dict[str, torch.Tensor], dict[str, float]]:
    """Forward (with ``backward``: and backward) every micro-batch of ``data``. Loss terms are normalised by the
    global counts of the whole ``data`` (``micro_batching``), so the accumulated gradient is exact for any split.

    Returns the detached outputs ``{name: (B, R)}`` in ``data``'s row order (none when training) and the loss
    metrics of ``data`` (``MetricAccumulator``).
    """
    micro_batches, indices = plan.split(data, dp_group, micro_batch_key)
    info = global_batch_info(data.batch["response_mask"], dp_group) if loss_fn is not None else None
    accumulator, outputs = MetricAccumulator(), {}
    for micro_batch in micro_batches:
        output = forward(micro_batch)
        if loss_fn is not None:
            loss, metrics = loss_fn(output, micro_batch.batch, info)
            accumulator.add(metrics)
            if backward:
                loss.backward()
        if not backward:
            for key, value in output.items():
                outputs.setdefault(key, []).append(value.detach())
    model_output = {key: restore_order(torch.cat(values), indices) for key, values in outputs.items()}
    return model_output, accumulator.result()


def forward_only(
    data: DataProto,
    plan: BatchPlan,
    forward: ForwardFn,
    *,
    dp_group: dist.ProcessGroup | None = None,
    micro_batch_key: str = "micro_batch_size_per_gpu (log_prob_/forward_ prefixed)",
) -> dict[str, torch.Tensor]:
    """Outputs ``{name: (B, R)}`` of every micro-batch of ``data`` without gradients, in ``data``'s row order."""
    with torch.no_grad():
        outputs, _ = forward_backward(
            data, plan, forward, backward=False, dp_group=dp_group, micro_batch_key=micro_batch_key
        )
    return outputs


def optimizer_step(
    forward_backward_fn: Callable[[], dict[str, float]],
    zero_grad: Callable[[], None],
    step: Callable[[], StepResult],
) -> dict[str, float]:
    """One optimizer step: the loss metrics plus ``grad_norm`` (before clipping) and ``skipped_steps`` (1.0 when a
    non-finite norm skipped the step, ``clip_grad_and_step``)."""
    zero_grad()
    metrics = forward_backward_fn()
    result = step()
    metrics["grad_norm"] = result.grad_norm
    metrics["skipped_steps"] = 0.0 if result.stepped else 1.0
    return metrics


def run_mini_batches(
    data: DataProto,
    plan: BatchPlan,
    train_step: Callable[[DataProto], dict[str, float]],
    zero_grad: Callable[[], None],
) -> dict[str, list[float]]:
    """``plan.epochs`` passes over ``data`` in mini-batches of ``plan.mini_batch_size`` rows (shuffled per epoch
    with ``plan.shuffle``), one ``train_step`` each; gradients are dropped afterwards. Returns the per-mini-batch
    metrics as lists."""
    metrics: dict[str, list[float]] = {}
    for _, mini_batch in iter_mini_batches(data, plan.mini_batch_size, plan.epochs, plan.shuffle, plan.seed):
        append_to_dict(metrics, train_step(mini_batch))
    zero_grad()
    return metrics


def clipped_updates(
    data: DataProto,
    plan: BatchPlan,
    forward: ForwardFn,
    loss_fn: LossFn,
    module: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    grad_clip: float,
    *,
    dp_group: dist.ProcessGroup | None = None,
    config_key: str = "actor.grad_clip",
) -> dict[str, list[float]]:
    """:func:`run_mini_batches` with one :func:`optimizer_step` (:func:`forward_backward`, then
    ``clip_grad_and_step`` to ``grad_clip``) per mini-batch: the update of a model the caller holds directly (the
    legacy actor and critic; an engine steps its own optimizer, ``BaseEngine.train_batch``)."""

    def zero_grad() -> None:
        optimizer.zero_grad(set_to_none=True)

    def train_step(mini_batch: DataProto) -> dict[str, float]:
        return optimizer_step(
            lambda: forward_backward(mini_batch, plan, forward, loss_fn, dp_group=dp_group)[1],
            zero_grad,
            lambda: clip_grad_and_step(module, optimizer, grad_clip, config_key=config_key),
        )

    return run_mini_batches(data, plan, train_step, zero_grad)


def prefixed_engine_metrics(metrics: dict[str, list[float]], prefix: str) -> dict[str, list[float]]:
    """Step-level metric names (``grad_norm``, ``skipped_steps``) under the role prefix (``actor/grad_norm``); the
    loss terms already carry theirs (``actor/pg_loss``)."""
    return {(f"{prefix}/{key}" if key in ENGINE_METRICS else key): value for key, value in metrics.items()}


def scheduled_update(update: Callable[[], dict[str, Any]], lr_scheduler: Any, prefix: str) -> dict[str, Any]:
    """``update()``'s metrics plus ``<prefix>/lr``, the learning rate the update used; the schedule then steps once
    (one step per ``update_actor``/``update_critic`` call, on both worker paths)."""
    lr = lr_scheduler.get_last_lr()[0]
    metrics = update()
    lr_scheduler.step()
    return {**metrics, f"{prefix}/lr": lr}
