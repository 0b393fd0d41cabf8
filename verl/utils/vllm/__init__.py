"""vLLM helpers: MoE weight-loader repair (``patch``) and optional-import / engine helpers (``utils``).

Importing this package never imports vLLM and patches nothing.
"""

from verl.utils.vllm.patch import (
    WeightLoaderRepair,
    patch_vllm_moe_model_weight_loader,
    repair_moe_weight_loaders,
)
from verl.utils.vllm.utils import get_vllm_model, is_vllm_available, require_vllm

__all__ = [
    "WeightLoaderRepair",
    "get_vllm_model",
    "is_vllm_available",
    "patch_vllm_moe_model_weight_loader",
    "repair_moe_weight_loaders",
    "require_vllm",
]
