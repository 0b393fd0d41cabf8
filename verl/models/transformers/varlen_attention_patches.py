"""Registers the ``varlen-attention-<platform>`` model patches (:mod:`verl.models.transformers.varlen_attention`).

Imported by the patch registry's built-in list only, after the NPU patches, so that the patches apply (and are
reported) in that order: a fused ``npu-fusion-attention`` comes first and the lean attention then skips itself.
"""

from __future__ import annotations

import functools

from verl.models.transformers.patch_registry import ModelPatch, register_patch
from verl.models.transformers.varlen_attention import MODEL_TYPES, PROBE_KEY, apply_varlen_attention
from verl.utils.platform.registry import PlatformRegistry


def _register_platform_patches() -> None:
    for platform_name in PlatformRegistry.names():
        strategy = PlatformRegistry.platform_class(platform_name).long_segment_attention
        if strategy is None:
            continue
        register_patch(
            ModelPatch(
                name=f"varlen-attention-{platform_name}",
                model_types=MODEL_TYPES,
                platforms=(platform_name,),
                apply=functools.partial(apply_varlen_attention, long_segments=strategy),
                description=f"packed sdpa/eager attention per cu_seqlens segment, no T x T mask (long: {strategy})",
                probe_key=PROBE_KEY,
            )
        )


_register_platform_patches()
