"""``FSDPHFShardingManager``: the HF rollout generates with the FSDP actor module itself, so there is no weight
copy; the manager only makes sure the actor's parameters are on the device while it generates (and returns them
to the host afterwards when ``fsdp_config.param_offload`` keeps them there between phases)."""

from __future__ import annotations

import torch.nn as nn

from verl.utils.fsdp_utils import load_fsdp_model_to_gpu, offload_fsdp_model_to_cpu
from verl.workers.sharding_manager.base import BaseShardingManager

__all__ = ["FSDPHFShardingManager"]


class FSDPHFShardingManager(BaseShardingManager):
    """Args: ``module`` the FSDP actor; ``param_offload`` whether its parameters live on the host between phases."""

    def __init__(self, module: nn.Module, param_offload: bool = False):
        self.module = module
        self.param_offload = param_offload

    def __enter__(self) -> FSDPHFShardingManager:
        if self.param_offload:
            load_fsdp_model_to_gpu(self.module)
        return self

    def __exit__(self, exc_type, exc_value, traceback) -> None:
        if self.param_offload:
            offload_fsdp_model_to_cpu(self.module)
