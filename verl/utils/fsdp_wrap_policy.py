"""FSDP wrap policy (field-report item 6): which submodules become FSDP units, for FSDP1 and FSDP2 alike.

The class names come from ``fsdp_config.wrap_policy.transformer_layer_cls_to_wrap`` when set, else from the
model's ``_no_split_modules``. Any iterable works (transformers 5 turns ``_no_split_modules`` into a set; Qwen3.5
lists a class that does not exist); names that do not resolve are skipped with a warning and only a list where none
resolves is an error. Re-exported by ``verl.utils.fsdp_utils`` (the upstream import path).
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Iterable, Mapping
from typing import Any

import torch.nn as nn

logger = logging.getLogger(__name__)

__all__ = [
    "get_fsdp_wrap_policy",
    "get_module_class_from_name",
    "layer_class_names",
    "resolve_wrap_classes",
    "select_fsdp2_wrap_targets",
]


def get_module_class_from_name(module: nn.Module, name: str) -> type[nn.Module] | None:
    """The class named ``name`` of the first submodule of ``module`` (itself included) that is one, else None.

    The class's bases count: FSDP2's ``fully_shard`` swaps a module's class for a subclass named ``FSDP<name>``,
    and code resolving layer classes after wrapping (activation offload) must still find ``<name>``."""
    for sub in module.modules():
        for cls in type(sub).__mro__:
            if cls.__name__ == name:
                return cls
    return None


def _normalise_class_names(names: str | Iterable[str] | None) -> list[str]:
    if names is None:
        return []
    if isinstance(names, str):
        return [names]
    # sets (transformers 5 `_no_split_modules`) have no order: sort so every rank wraps identically
    return sorted(set(names)) if isinstance(names, (set, frozenset)) else list(dict.fromkeys(names))


def layer_class_names(module: nn.Module, wrap_policy: Mapping | None) -> tuple[list[str], str]:
    """Class names to wrap and where they came from; the explicit config key wins over ``_no_split_modules``."""
    explicit = None if wrap_policy is None else _get_optional(wrap_policy, "transformer_layer_cls_to_wrap", None)
    if explicit:
        return _normalise_class_names(explicit), "fsdp_config.wrap_policy.transformer_layer_cls_to_wrap"
    return _normalise_class_names(getattr(module, "_no_split_modules", None)), "model._no_split_modules"


def resolve_wrap_classes(module: nn.Module, class_names: Iterable[str], source: str) -> set[type[nn.Module]]:
    """Resolve class names to classes present in ``module``.

    Names that do not resolve are skipped with a warning (Qwen3.5 lists ``Qwen3_5TextDecoderLayer``, which
    does not exist); a ValueError naming ``source`` is raised only when none resolves.
    """
    names = _normalise_class_names(class_names)
    if not names:
        raise ValueError(
            f"no layer class to wrap: {source} is empty; set "
            "fsdp_config.wrap_policy.transformer_layer_cls_to_wrap to the decoder layer class name(s)"
        )
    resolved, missing = set(), []
    for name in names:
        cls = get_module_class_from_name(module, name)
        if cls is None:
            missing.append(name)
        else:
            resolved.add(cls)
    if not resolved:
        raise ValueError(
            f"Could not find any of the transformer layer classes to wrap in the model: {names} (from {source}, "
            f"model {type(module).__name__}); set "
            "fsdp_config.wrap_policy.transformer_layer_cls_to_wrap to the decoder layer class name(s)"
        )
    if missing:
        logger.warning("FSDP wrap policy: skipping class names not found in the model: %s (from %s)", missing, source)
    return resolved


def get_fsdp_wrap_policy(module: nn.Module, config: Mapping | None = None, is_lora: bool = False):
    """FSDP1 ``auto_wrap_policy`` (upstream name); None when ``config.disable`` is set.

    ``min_num_params > 0`` selects a size-based policy, otherwise the transformer-layer policy over the
    classes from :func:`resolve_wrap_classes`; with LoRA, trainable leaf modules are wrapped too.
    """
    from torch.distributed.fsdp.wrap import (
        _or_policy,
        lambda_auto_wrap_policy,
        size_based_auto_wrap_policy,
        transformer_auto_wrap_policy,
    )

    if config is not None and _get_optional(config, "disable", False):
        return None
    min_num_params = 0 if config is None else _get_optional(config, "min_num_params", 0)
    if min_num_params > 0:
        return functools.partial(size_based_auto_wrap_policy, min_num_params=min_num_params)
    names, source = layer_class_names(module, config)
    layer_policy = functools.partial(
        transformer_auto_wrap_policy, transformer_layer_cls=resolve_wrap_classes(module, names, source)
    )
    if not is_lora:
        return layer_policy

    def _trainable_leaf(sub: nn.Module) -> bool:
        return (
            len(list(sub.named_children())) == 0
            and getattr(sub, "weight", None) is not None
            and sub.weight.requires_grad
        )

    lora_policy = functools.partial(lambda_auto_wrap_policy, lambda_fn=_trainable_leaf)
    return functools.partial(_or_policy, policies=[lora_policy, layer_policy])


def _get_optional(config: Mapping, key: str, default: Any) -> Any:
    # wrap_policy is a free-form dict in the upstream YAML (only `min_num_params` is declared), so absent keys
    # are legitimate here; typed configs elsewhere never need this.
    return config[key] if key in config and config[key] is not None else default


def select_fsdp2_wrap_targets(model: nn.Module, layer_classes: set[type[nn.Module]]) -> list[nn.Module]:
    """Modules to ``fully_shard`` before the root: every layer of ``layer_classes``; with untied word
    embeddings also the input embedding and the LM head, which are the largest single tensors."""
    targets = [m for m in model.modules() if isinstance(m, tuple(layer_classes))]
    tied = getattr(getattr(model, "config", None), "tie_word_embeddings", True)
    if not tied:
        for getter in ("get_input_embeddings", "get_output_embeddings"):
            emb = getattr(model, getter, lambda: None)()
            if isinstance(emb, nn.Module) and emb not in targets:
                targets.append(emb)
    return targets
