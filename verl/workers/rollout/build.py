"""Builds the rollout of an actor worker and the sharding manager that feeds it the trained weights.

Shared by both worker paths (``fsdp_workers`` and ``engine_workers``), so the wiring exists once.
"""

from __future__ import annotations

from typing import Any

import torch.nn as nn

from verl.utils.device import get_device_name
from verl.workers.rollout.base import get_rollout_class


def build_rollout(
    module: nn.Module,
    rollout_config: Any,
    model_config: Any,
    *,
    param_offload: bool,
    world_size: int,
    rank: int,
    seed: int,
) -> tuple[Any, Any]:
    """``(rollout, sharding_manager)`` for ``rollout_config.name``.

    ``hf`` generates with the (FSDP-wrapped) actor ``module`` itself, so no weights are copied; ``vllm`` gets its
    own engine on a ``(dp, infer_tp)`` mesh and a manager that streams the actor's weights into it.

    Raises:
        ValueError: ``rollout.tensor_model_parallel_size`` does not divide the number of ranks.
    """
    rollout_cls = get_rollout_class(rollout_config.name, rollout_config.mode)
    if rollout_config.name == "hf":
        from verl.workers.sharding_manager.fsdp_hf import FSDPHFShardingManager

        return rollout_cls(module, rollout_config, model_config), FSDPHFShardingManager(module, param_offload)
    from torch.distributed.device_mesh import init_device_mesh

    from verl.workers.sharding_manager.vllm_weight_sync import FSDPVLLMShardingManager

    tp = rollout_config.tensor_model_parallel_size
    if tp < 1 or world_size % tp:
        raise ValueError(
            f"actor_rollout_ref.rollout.tensor_model_parallel_size={tp} must divide the {world_size} ranks"
        )
    mesh = init_device_mesh(get_device_name(), (world_size // tp, tp), mesh_dim_names=("dp", "infer_tp"))
    rollout = rollout_cls(rollout_config, model_config, mesh)
    return rollout, FSDPVLLMShardingManager(module, rollout, dp_rank=rank // tp, seed=seed)
