"""Build an FSDP-wrapped HF model (policy, reference or value model) with its optimizer and lr schedule.

One recipe for every role and both worker paths::

    HF config (+ model.override_config, attention implementation)  ->  from_pretrained in fsdp_config.model_dtype
      -> [value model: LM head -> Linear(hidden, 1)]  ->  model patches (registry)
      -> [training: gradient checkpointing]  ->  FSDP1/FSDP2 wrap (adapter chosen by `strategy`)
      -> [training: activation offload]  ->  patch probe on the device (rank 0 prints the report)
      -> optimizer + lr schedule

The patch probe runs a tiny packed batch through the wrapped model, in train and eval mode, and stops the build when
a required patch's code is not on the call path (verl.models.transformers.patch_probe): a transformers release that
routes around a patch fails here, on every rank, before the first step.

Every rank loads the same weights from disk and shards them while wrapping (no broadcast: FSDP1 cannot
broadcast CPU parameters, docs/cpu_notes.md "FSDP on the CPU"); the value head is seeded so it is identical on
every rank.
"""

from __future__ import annotations

import importlib
import logging
import os
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.device_mesh import DeviceMesh

from verl.models.transformers.patch_registry import apply_patches, probe_patches
from verl.utils.activation_offload import enable_activation_offloading
from verl.utils.device import get_device_name
from verl.utils.fsdp_utils import get_fsdp_adapter, mixed_precision_dtypes, to_torch_dtype
from verl.utils.model import (
    attach_value_head,
    default_attn_implementation,
    load_causal_lm,
    load_hf_config,
    print_model_size,
    untie_word_embeddings,
)
from verl.utils.model import freeze_vision_tower as _freeze_vision_tower  # the parameter below has the plain name
from verl.utils.platform import get_platform
from verl.workers.core.optimizer_step import build_lr_scheduler, build_optimizer

logger = logging.getLogger(__name__)

__all__ = ["FSDPModel", "build_fsdp_model"]


@dataclass
class FSDPModel:
    """A built model: the wrapped module, its HF config, optimizer and lr scheduler (None when forward-only)."""

    module: nn.Module
    hf_config: Any
    optimizer: torch.optim.Optimizer | None = None
    lr_scheduler: Any = None


def _rank() -> int:
    return dist.get_rank() if dist.is_initialized() else 0


def _load_hf_model(model_config: Any, fsdp_config: Any, value_head: bool) -> tuple[nn.Module, Any]:
    if model_config.external_lib is not None:
        importlib.import_module(model_config.external_lib)
    path = os.path.expanduser(model_config.path)
    hf_config = load_hf_config(
        path,
        trust_remote_code=model_config.trust_remote_code,
        override_config=model_config.override_config,
        attn_implementation=default_attn_implementation(get_device_name()),
    )
    if value_head:
        untie_word_embeddings(hf_config)
    model = load_causal_lm(
        path, hf_config, dtype=to_torch_dtype(fsdp_config.model_dtype), trust_remote_code=model_config.trust_remote_code
    )
    if value_head:
        attach_value_head(model, seed=fsdp_config.seed)
    return model, hf_config


def build_fsdp_model(
    model_config: Any,
    fsdp_config: Any,
    *,
    strategy: str,
    mesh: DeviceMesh,
    optim_config: Any = None,
    forward_only: bool = False,
    value_head: bool = False,
    role: str = "actor",
    freeze_vision_tower: bool = False,
) -> FSDPModel:
    """Build, patch and wrap a model for ``role``.

    Args:
        model_config: ``actor_rollout_ref.model`` (``HFModelConfig``) or ``critic.model``: path,
            trust_remote_code, override_config, external_lib, enable_gradient_checkpointing,
            enable_activation_offload.
        fsdp_config: the role's ``fsdp_config`` (``FSDPEngineConfig``).
        strategy: ``fsdp`` | ``fsdp2`` (the role's ``strategy`` key).
        mesh: the FSDP device mesh.
        optim_config: the role's ``optim``; None builds no optimizer.
        forward_only: reference policy: no gradients, no checkpointing, parameters offloaded between uses.
        value_head: build a value model (see ``verl.utils.model.attach_value_head``).
        freeze_vision_tower: do not train the vision encoder (``actor.freeze_vision_tower``): its parameters are
            frozen before sharding; FSDP1 then keeps the original parameters (``use_orig_params``), since one flat
            parameter cannot mix frozen and trainable tensors.
    """
    adapter = get_fsdp_adapter(strategy, f"{role}.strategy")
    adapter.check_options(fsdp_config, f"{role}.model.fsdp_config" if value_head else f"{role}.fsdp_config")
    model, hf_config = _load_hf_model(model_config, fsdp_config, value_head)
    apply_patches(model, platform=get_device_name(), report=False, probe=False)
    if _rank() == 0:
        print_model_size(model, f"{role} model")
    training = not forward_only
    if training and model_config.enable_gradient_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    if forward_only:
        model.requires_grad_(False)
    elif freeze_vision_tower:
        frozen = _freeze_vision_tower(model, f"{role}.freeze_vision_tower")
        if _rank() == 0:
            logger.info("%s: vision tower frozen (%d tensors)", role, frozen)
    module = adapter.wrap(
        model,
        mesh=mesh,
        dtypes=mixed_precision_dtypes(fsdp_config.mixed_precision, default_param_dtype=fsdp_config.dtype),
        wrap_policy=fsdp_config.wrap_policy,
        # the reference policy keeps its parameters on the host between uses (upstream); with FSDP2 the
        # offload_policy key asks for the same on a trained model
        offload_params=fsdp_config.offload_policy or (forward_only and get_device_name() != "cpu"),
        reshard_after_forward=fsdp_config.reshard_after_forward,
        forward_prefetch=fsdp_config.forward_prefetch,
        use_orig_params=fsdp_config.use_orig_params or (freeze_vision_tower and not forward_only),
    )
    if _rank() == 0:
        # what the wrapper really does (not what was asked): mesh, dtypes, offload, resharding, prefetch
        logger.info("%s FSDP layout: %s", role, adapter.describe(module))
    if training and model_config.enable_activation_offload:
        enable_activation_offloading(module, strategy, model_config.enable_gradient_checkpointing)
    probe_patches(module, device=get_platform().device(), report=_rank() == 0, platform=get_device_name())
    adapter.reshard(module)  # the probe ran forwards without backward: shards back before the optimizer sees them
    built = FSDPModel(module=module, hf_config=hf_config)
    if optim_config is not None and training:
        built.optimizer = build_optimizer(module.parameters(), optim_config)
        built.lr_scheduler = build_lr_scheduler(built.optimizer, optim_config)
    return built
