"""Model loading helpers (upstream ``verl.utils.model`` names): config overrides, generation config, position ids,
model size, and the HF model classes the workers build (policy LM, value model).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import torch
import torch.nn as nn

from verl.upstream_gaps import missing_name_getattr
from verl.utils.platform.registry import PlatformRegistry

logger = logging.getLogger(__name__)

__all__ = [
    "attach_value_head",
    "compute_position_id_with_mask",
    "default_attn_implementation",
    "find_vision_tower",
    "freeze_vision_tower",
    "get_generation_config",
    "get_model_size",
    "load_causal_lm",
    "load_hf_config",
    "print_model_size",
    "update_model_config",
]


def update_model_config(module_config: Any, override_config_kwargs: Mapping[str, Any]) -> None:
    """Set every ``key: value`` of ``override_config_kwargs`` on the HF config; a dict value for a sub-config
    (e.g. ``text_config``) is applied recursively."""
    for key, value in override_config_kwargs.items():
        current = getattr(module_config, key, None)
        if isinstance(value, Mapping) and current is not None and not isinstance(current, Mapping):
            update_model_config(current, value)
        else:
            setattr(module_config, key, value)


def get_generation_config(model: str, trust_remote_code: bool = False) -> Any:
    """The model's ``GenerationConfig`` (from ``generation_config.json``, else derived from its config), or None."""
    from transformers import GenerationConfig

    from verl.utils.rope_utils import load_hf_config as read_config

    try:
        return GenerationConfig.from_pretrained(model)
    except OSError:
        try:
            return GenerationConfig.from_model_config(read_config(model, trust_remote_code=trust_remote_code))
        except OSError:
            return None


def compute_position_id_with_mask(mask: torch.Tensor) -> torch.Tensor:
    """``(B, S)`` position ids that restart at 0 at each row's first real token: ``clip(cumsum(mask) - 1, 0)``."""
    return torch.clip(torch.cumsum(mask, dim=-1) - 1, min=0)


def get_model_size(model: nn.Module, scale: str = "auto") -> tuple[float, str]:
    """Number of parameters in units of ``scale`` (``"B" | "M" | "K" | ""``; ``"auto"`` picks the largest)."""
    n = sum(p.numel() for p in model.parameters())
    divisors = {"B": 1e9, "M": 1e6, "K": 1e3, "": 1.0}
    if scale == "auto":
        scale = next(s for s, d in divisors.items() if n >= d or s == "")
    if scale not in divisors:
        raise ValueError(f"unknown scale {scale!r}; use one of {list(divisors)} or 'auto'")
    return n / divisors[scale], scale


def print_model_size(model: nn.Module, name: str | None = None) -> None:
    size, scale = get_model_size(model)
    print(f"{name or type(model).__name__} contains {size:.2f}{scale} parameters", flush=True)


def default_attn_implementation(device_name: str) -> str:
    """The platform's default (``Platform.default_attn_implementation``: ``sdpa`` on the CPU,
    ``flash_attention_2`` on NPU and on CUDA with flash-attn installed). ``model.override_config.attn_implementation``
    wins over it."""
    return PlatformRegistry.create(device_name).default_attn_implementation()


def load_hf_config(
    path: str, *, trust_remote_code: bool, override_config: Mapping[str, Any], attn_implementation: str
) -> Any:
    """The HF config of ``path`` with ``override_config`` applied and the attention implementation set (also on
    text/vision sub-configs, which multimodal models build their own attention from). Read through
    ``verl.utils.rope_utils.load_hf_config``, which also accepts list-typed rope-validation keys (transformers
    5.4.0)."""
    from verl.utils.rope_utils import load_hf_config as read_config

    config = read_config(path, trust_remote_code=trust_remote_code)
    overrides = dict(override_config)
    attn = overrides.pop("attn_implementation", attn_implementation)
    update_model_config(config, overrides)
    for node in (config, getattr(config, "text_config", None), getattr(config, "vision_config", None)):
        if node is not None:
            node._attn_implementation = attn
    return config


def _is_multimodal(config: Any) -> bool:
    return getattr(config, "vision_config", None) is not None


def load_causal_lm(path: str, config: Any, *, dtype: torch.dtype, trust_remote_code: bool) -> nn.Module:
    """The policy model: ``AutoModelForImageTextToText`` for configs with a vision tower (Qwen3.5 VL checkpoints),
    ``AutoModelForCausalLM`` otherwise."""
    from transformers import AutoModelForCausalLM, AutoModelForImageTextToText

    auto = AutoModelForImageTextToText if _is_multimodal(config) else AutoModelForCausalLM
    return auto.from_pretrained(path, config=config, dtype=dtype, trust_remote_code=trust_remote_code)


_VISION_TOWER_NAMES = ("visual", "vision_tower", "vision_model")


def find_vision_tower(model: nn.Module) -> nn.Module | None:
    """The vision encoder of a multimodal HF model (``model.visual`` for Qwen-VL / Qwen3.5, ``vision_tower`` for
    LLaVA-style models; on the model or its backbone ``model.model``), or None for a text-only model."""
    for owner in (model, getattr(model, "model", None)):
        for name in _VISION_TOWER_NAMES:
            tower = getattr(owner, name, None) if owner is not None else None
            if isinstance(tower, nn.Module):
                return tower
    return None


def freeze_vision_tower(model: nn.Module, key: str = "actor_rollout_ref.actor.freeze_vision_tower") -> int:
    """``requires_grad_(False)`` on the vision encoder (before sharding); returns the number of frozen tensors.

    Raises:
        ConfigError: naming ``key`` when the model has no vision tower (freezing nothing would be a silent no-op).
    """
    from verl.base_config import ConfigError

    tower = find_vision_tower(model)
    if tower is None:
        raise ConfigError(key, f"is set but {type(model).__name__} has no vision tower; remove the override.")
    tower.requires_grad_(False)
    return sum(1 for _ in tower.parameters())


def _hidden_size(config: Any) -> int:
    text = getattr(config, "text_config", None)
    return int((text if text is not None else config).hidden_size)


def untie_word_embeddings(config: Any) -> None:
    """A value model replaces the LM head, so it must not be tied to the input embedding."""
    for node in (config, getattr(config, "text_config", None)):
        if node is not None and hasattr(node, "tie_word_embeddings"):
            node.tie_word_embeddings = False


def attach_value_head(model: nn.Module, seed: int) -> nn.Module:
    """Turn a causal LM into a value model: its LM head becomes ``Linear(hidden, 1, bias=False)``.

    Why not ``AutoModelForTokenClassification(num_labels=1)`` as upstream: there is no token-classification class
    for Qwen3.5-MoE (nor for the multimodal wrappers), while every causal LM has a replaceable output projection,
    and its forward (packed, varlen-patched) then returns ``(..., 1)`` values unchanged. The head is initialised
    ``N(0, initializer_range)`` from ``seed`` so every rank builds the same weights.
    """
    config = model.config
    std = getattr(getattr(config, "text_config", None) or config, "initializer_range", 0.02)
    reference = model.get_output_embeddings().weight
    head = nn.Linear(_hidden_size(config), 1, bias=False, dtype=reference.dtype, device=reference.device)
    generator = torch.Generator(device="cpu").manual_seed(seed)
    with torch.no_grad():
        head.weight.copy_(torch.randn(head.weight.shape, generator=generator) * std)
    model.set_output_embeddings(head)
    return model


__getattr__ = missing_name_getattr(__name__)  # upstream names missing here raise with the reason (verl.upstream_gaps)
