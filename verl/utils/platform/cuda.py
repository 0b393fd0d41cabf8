"""CUDA platform: nccl collectives, ``CUDA_VISIBLE_DEVICES``, Ray resource ``GPU``."""

from __future__ import annotations

import importlib.util
import logging
import os
from typing import Any

import torch

from verl.utils.platform.base import Platform

logger = logging.getLogger(__name__)


class CudaPlatform(Platform):
    device_name = "cuda"
    vendor = "nvidia"
    comm_backend = "nccl"
    visible_devices_envvar = "CUDA_VISIBLE_DEVICES"
    ray_resource_name = "GPU"
    profiler_activity = "CUDA"
    ray_noset_envvars = ("RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES",)
    fla_kernels = True
    fallback_when_missing = True  # upstream's default trainer.device

    def is_available(self) -> bool:
        return torch.cuda.is_available()

    def missing_reason(self) -> str | None:
        if self.is_available():
            return None
        return (
            f"no CUDA device is visible (torch {torch.__version__} was built with CUDA {torch.version.cuda}, "
            f"CUDA_VISIBLE_DEVICES={self.visible_device_ids()}); install a CUDA build of torch, check "
            "`nvidia-smi`, or choose another device with trainer.device=cpu|npu"
        )

    def torch_module(self) -> Any:
        return torch.cuda

    def get_device_capability(self, device_id: int = 0) -> tuple[int, int] | None:
        if not self.is_available():
            return None
        return tuple(torch.cuda.get_device_capability(device_id))

    def default_attn_implementation(self) -> str:
        # flash-attn's varlen kernel runs packed rows without a mask; sdpa when the package is not installed
        return "flash_attention_2" if importlib.util.find_spec("flash_attn") is not None else "sdpa"

    def cross_entropy_kernel(self) -> str | None:
        # flash-attn's Triton cross-entropy, unless switched off with upstream's VERL_DISABLE_FLASH_ATTN_CE=1
        return None if os.environ.get("VERL_DISABLE_FLASH_ATTN_CE", "0") == "1" else "flash_attn"

    def set_expandable_segments(self, enable: bool) -> None:
        if not self.is_available():
            return
        try:
            torch.cuda.memory._set_allocator_settings(f"expandable_segments:{enable}")
        except (AttributeError, RuntimeError) as e:  # older torch: the setting is env-only
            logger.warning("could not set expandable_segments=%s on CUDA: %s", enable, e)

    def ray_actor_options(self, count: float) -> dict[str, Any]:
        # GPUs are a built-in Ray resource, requested through num_gpus.
        return {"num_gpus": count}

    def rollout_env_vars(self) -> dict[str, str]:
        return {}
