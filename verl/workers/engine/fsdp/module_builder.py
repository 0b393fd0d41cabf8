"""Build the HF module of an FSDP engine: load, patch, gradient checkpointing, FSDP1/FSDP2 wrap.

Every FSDP1/FSDP2 difference is behind ``verl.utils.fsdp_utils.get_fsdp_adapter(strategy)``; this module only
decides *what* to build from the model and engine configs:

* ``language_model`` → ``AutoModelForCausalLM`` (``AutoModelForImageTextToText`` when the config has a vision tower);
* ``value_model`` → ``AutoModelForTokenClassification`` with one label (the ``(…, 1)`` head the shared core's
  ``forward_values`` reads).

Model patches (varlen GDN for Qwen3.5, NPU kernels) are applied through the patch registry for the current platform
and reported once; nothing is patched globally.
"""

from __future__ import annotations

import importlib
import logging
import os
from typing import Any

import torch
import torch.distributed as dist
import torch.nn as nn

from verl.utils.device import get_device_name
from verl.utils.fsdp_utils import create_device_mesh, get_fsdp_adapter, mixed_precision_dtypes, to_torch_dtype

logger = logging.getLogger(__name__)

__all__ = ["MODEL_TYPES", "build_hf_module", "load_hf_config", "wrap_fsdp_module"]

MODEL_TYPES = ("language_model", "value_model")


def load_hf_config(model_config: Any) -> Any:
    """The HF ``PretrainedConfig`` at ``model_config.path`` with ``override_config`` applied (``use_cache`` off)."""
    from transformers import AutoConfig

    if model_config.external_lib is not None:
        importlib.import_module(model_config.external_lib)
    path = os.path.expanduser(model_config.path)
    hf_config = AutoConfig.from_pretrained(path, trust_remote_code=model_config.trust_remote_code)
    for key, value in dict(model_config.override_config).items():
        if not hasattr(hf_config, key):
            raise ValueError(
                f"model.override_config.{key}: {type(hf_config).__name__} has no attribute {key!r}; remove it or use a "
                "key of the model's config.json"
            )
        setattr(hf_config, key, value)
    hf_config.use_cache = False  # a cache would disable packed-sequence masking (packed_forward docstring)
    return hf_config


def _auto_class(hf_config: Any, model_type: str) -> Any:
    import transformers

    if model_type == "value_model":
        return transformers.AutoModelForTokenClassification
    if getattr(hf_config, "vision_config", None) is not None:
        return transformers.AutoModelForImageTextToText
    return transformers.AutoModelForCausalLM


def build_hf_module(model_config: Any, *, model_type: str, torch_dtype: str | torch.dtype) -> nn.Module:
    """Load the (unwrapped) HF module with its platform patches and gradient checkpointing.

    Args:
        model_config: ``HFModelConfig`` (actor/ref) or the critic's ``model`` block: ``path``, ``override_config``,
            ``trust_remote_code``, ``external_lib``, ``enable_gradient_checkpointing``.
        model_type: ``language_model`` or ``value_model``.
        torch_dtype: dtype of the loaded weights (``fsdp_config.model_dtype``).
    """
    from verl.models.transformers.patch_registry import apply_patches

    if model_type not in MODEL_TYPES:
        raise ValueError(f"model_type={model_type!r}: use one of {MODEL_TYPES}")
    hf_config = load_hf_config(model_config)
    kwargs: dict[str, Any] = {}
    if model_type == "value_model":
        kwargs["num_labels"] = 1
    auto_cls = _auto_class(hf_config, model_type)
    module = auto_cls.from_pretrained(
        os.path.expanduser(model_config.path),
        config=hf_config,
        dtype=to_torch_dtype(torch_dtype),
        trust_remote_code=model_config.trust_remote_code,
        **kwargs,
    )
    rank0 = not dist.is_initialized() or dist.get_rank() == 0
    apply_patches(module, platform=get_device_name(), report=rank0)
    if model_config.enable_gradient_checkpointing:
        module.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    return module


def _explicit_wrap_policy(wrap_policy: dict[str, Any]) -> dict[str, Any]:
    # `fsdp_config.wrap_policy` is free-form upstream (the YAML declares only min_num_params); the adapter indexes
    # transformer_layer_cls_to_wrap, so absent keys are given their meaning (None = the model's _no_split_modules)
    return {"transformer_layer_cls_to_wrap": None, "min_num_params": 0, "disable": False, **dict(wrap_policy)}


def wrap_fsdp_module(module: nn.Module, engine_config: Any) -> nn.Module:
    """Shard ``module`` over all ranks with the strategy of ``engine_config`` (``fsdp_config``).

    Mixed precision: ``fsdp_config.mixed_precision`` (any subset of param/reduce/buffer dtypes), params default
    to ``fsdp_config.dtype``. ``offload_policy`` (FSDP2) keeps parameters on the CPU between uses.
    """
    if not dist.is_initialized():
        raise RuntimeError(
            "the FSDP engine needs torch.distributed: the engine worker initialises it (a test must call "
            "dist.init_process_group first)"
        )
    adapter = get_fsdp_adapter(engine_config.strategy, "fsdp_config.strategy")
    mesh = create_device_mesh(dist.get_world_size(), engine_config.fsdp_size)
    return adapter.wrap(
        module,
        mesh=mesh,
        dtypes=mixed_precision_dtypes(engine_config.mixed_precision, default_param_dtype=engine_config.dtype),
        wrap_policy=_explicit_wrap_policy(engine_config.wrap_policy),
        offload_params=engine_config.offload_policy,
        reshard_after_forward=engine_config.reshard_after_forward,
        forward_prefetch=engine_config.forward_prefetch,
        use_orig_params=engine_config.use_orig_params,
    )
