"""Process-group start-up of a worker, for both worker paths."""

from __future__ import annotations

import datetime
import os

import torch.distributed as dist

__all__ = ["init_process_group"]


def init_process_group(
    rank: int | None = None, world_size: int | None = None, local_rank: int | None = None, timeout_s: int = 600
) -> None:
    """Start ``torch.distributed`` for a worker, once per process (colocated workers share it).

    Uses the platform's backend (gloo / nccl / hccl) and binds the process to its local device first
    (``Platform.local_device_index``). ``rank``/``world_size``/``local_rank`` default to ``RANK``/``WORLD_SIZE``/
    ``LOCAL_RANK``; those and ``MASTER_ADDR``/``MASTER_PORT`` come from the worker group.
    """
    from verl.utils.device import get_device_name, get_local_device_index, get_nccl_backend, get_torch_device

    if dist.is_initialized():
        return
    if "MASTER_ADDR" not in os.environ or "MASTER_PORT" not in os.environ:
        raise RuntimeError(
            "MASTER_ADDR/MASTER_PORT are not set: workers are started by a worker group (RayWorkerGroup or "
            "LocalWorkerGroup), which sets them"
        )
    rank = int(os.environ.get("RANK", "0")) if rank is None else rank
    world_size = int(os.environ.get("WORLD_SIZE", "1")) if world_size is None else world_size
    local_rank = int(os.environ.get("LOCAL_RANK", "0")) if local_rank is None else local_rank
    if get_device_name() != "cpu":
        get_torch_device().set_device(get_local_device_index(local_rank))
    dist.init_process_group(
        backend=get_nccl_backend(), rank=rank, world_size=world_size, timeout=datetime.timedelta(seconds=timeout_s)
    )
