"""Small pieces the engine workers share: per-rank batch plans, process-group start-up, metric names.

Batch units (see ``verl.workers.config.actor``): the role configs give ``ppo_mini_batch_size`` in prompts, globally,
and micro-batches in responses per GPU; a :class:`BatchPlan` holds the per-rank numbers the engine runs with.
Example: ``ppo_mini_batch_size=4`` prompts, ``rollout.n=2``, 2 ranks → 4 * 2 / 2 = 4 responses per rank per step.
"""

from __future__ import annotations

import datetime
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch.distributed as dist

from verl.workers.config.batch import per_gpu_micro_batch

__all__ = [
    "BatchPlan",
    "actor_update_plan",
    "critic_update_plan",
    "forward_plan",
    "init_process_group",
    "prefixed_engine_metrics",
]

_ENGINE_METRICS = ("grad_norm", "skipped_steps")


@dataclass(frozen=True)
class BatchPlan:
    """Per-rank sizes of one engine call.

    Attributes:
        micro_batch_size: responses per forward/backward (None with ``use_dynamic_bsz``).
        use_dynamic_bsz: micro-batches by token budget ``max_token_len`` instead.
        max_token_len: tokens per micro-batch per rank (already multiplied by the Ulysses size).
        mini_batch_size: responses per optimizer step (training only).
        epochs, shuffle, seed: passes over the batch and the mini-batch shuffle (training only).
    """

    micro_batch_size: int | None
    use_dynamic_bsz: bool
    max_token_len: int | None
    mini_batch_size: int | None = None
    epochs: int = 1
    shuffle: bool = False
    seed: int = 42

    def meta_info(self) -> dict[str, Any]:
        """The ``DataProto.meta_info`` switches ``forward_backward_batch`` reads."""
        return {
            "micro_batch_size": self.micro_batch_size,
            "use_dynamic_bsz": self.use_dynamic_bsz,
            "max_token_len": self.max_token_len,
        }

    @classmethod
    def from_meta_info(cls, meta: Mapping[str, Any]) -> BatchPlan:
        """Upstream's ``train_mini_batch`` contract: per-call sizes travel in the batch's metadata."""
        if "mini_batch_size" not in meta:
            raise ValueError("train_mini_batch: data.meta_info['mini_batch_size'] (responses per rank) is missing")
        return cls(
            micro_batch_size=meta.get("micro_batch_size"),
            use_dynamic_bsz=bool(meta.get("use_dynamic_bsz", False)),
            max_token_len=meta.get("max_token_len"),
            mini_batch_size=meta["mini_batch_size"],
            epochs=meta.get("epochs", 1),
            shuffle=meta.get("shuffle", False),
            seed=meta.get("seed", 42),
        )


def forward_plan(
    key: str,
    global_micro: int | None,
    per_gpu_micro: int | None,
    use_dynamic_bsz: bool,
    max_token_len: int,
    dp_size: int,
) -> BatchPlan:
    """Plan of a forward-only pass from a role's ``<key>`` / ``<key>_per_gpu`` micro-batch keys."""
    micro = per_gpu_micro_batch(key, global_micro, per_gpu_micro, dp_size)
    if micro is None and not use_dynamic_bsz:
        raise ValueError(f"{key}_per_gpu is not set: set it (responses per GPU per forward) or use dynamic batch size")
    return BatchPlan(micro, use_dynamic_bsz, max_token_len)


def _update_plan(cfg: Any, dp_size: int, prefix: str) -> BatchPlan:
    micro = per_gpu_micro_batch(
        f"{prefix}.ppo_micro_batch_size", cfg.ppo_micro_batch_size, cfg.ppo_micro_batch_size_per_gpu, dp_size
    )
    return BatchPlan(
        micro_batch_size=micro,
        use_dynamic_bsz=cfg.use_dynamic_bsz,
        max_token_len=cfg.ppo_max_token_len_per_gpu * cfg.ulysses_sp_size,
        mini_batch_size=cfg.mini_batch_responses_per_rank(dp_size),
        epochs=cfg.ppo_epochs,
        shuffle=cfg.shuffle,
        seed=cfg.data_loader_seed,
    )


def actor_update_plan(actor_config: Any, dp_size: int) -> BatchPlan:
    """``update_actor`` sizes per rank from ``actor_rollout_ref.actor`` (``ppo_*`` keys)."""
    return _update_plan(actor_config, dp_size, "actor_rollout_ref.actor")


def critic_update_plan(critic_config: Any, dp_size: int) -> BatchPlan:
    """``update_critic`` sizes per rank from ``critic`` (``ppo_*`` keys)."""
    return _update_plan(critic_config, dp_size, "critic")


def prefixed_engine_metrics(metrics: dict[str, list[float]], prefix: str) -> dict[str, list[float]]:
    """Engine-level metric names (``grad_norm``, ``skipped_steps``) under the role prefix (``actor/grad_norm``);
    the loss terms already carry theirs (``actor/pg_loss``)."""
    return {(f"{prefix}/{key}" if key in _ENGINE_METRICS else key): value for key, value in metrics.items()}


def init_process_group(rank: int, world_size: int, local_rank: int, timeout_s: int = 600) -> None:
    """Start ``torch.distributed`` for a worker (once per process: colocated workers share it).

    Uses the platform's backend (gloo / nccl / hccl) and binds the process to its local device first.
    ``MASTER_ADDR``/``MASTER_PORT`` come from the worker group.
    """
    from verl.utils.device import get_device_name, get_local_device_index, get_nccl_backend, get_torch_device

    if dist.is_initialized():
        return
    if "MASTER_ADDR" not in os.environ or "MASTER_PORT" not in os.environ:
        raise RuntimeError(
            "MASTER_ADDR/MASTER_PORT are not set: engine workers are started by a worker group (RayWorkerGroup or "
            "LocalWorkerGroup), which sets them"
        )
    if get_device_name() != "cpu":
        get_torch_device().set_device(get_local_device_index(local_rank))
    dist.init_process_group(
        backend=get_nccl_backend(),
        rank=rank,
        world_size=world_size,
        timeout=datetime.timedelta(seconds=timeout_s),
    )
