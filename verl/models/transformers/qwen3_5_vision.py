"""Qwen3.5 vision patch embedding as a matmul (field-report item 5).

The vision tower embeds each flattened patch ``(C · t · p · p)`` with ``nn.Conv3d(C, E, kernel=(t, p, p),
stride=(t, p, p))``. With kernel == stride (and no padding/dilation/groups) the convolution visits each patch
exactly once, so it is the linear map::

    y = x @ W.reshape(E, C·t·p·p)ᵀ + b        x: (N, C·t·p·p)  ->  y: (N, E)

The Conv3d operator segfaults on Ascend with CANN older than 8.5.1; the field report's stop-gap returned random
hidden states instead. Here the equivalent matmul replaces the Conv3d on the model instance, chosen automatically on
Ascend when CANN < 8.5.1 (or unknown), and selectable anywhere with :func:`use_matmul_patch_embed`. The weights are
untouched (same parameter, same checkpoint layout); only the forward changes.
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F
from packaging.version import Version

from verl.models.registry import QWEN3_5_MODEL_TYPES, QWEN3_5_TRANSFORMERS
from verl.models.transformers.instance_patch import set_forward
from verl.models.transformers.patch_probe import record_call
from verl.models.transformers.patch_registry import ModelPatch, PatchSkipped, register_patch

__all__ = ["MIN_CANN_FOR_CONV3D", "matmul_patch_embed", "use_matmul_patch_embed", "VISION_PATCH_EMBED_PATCH"]

MIN_CANN_FOR_CONV3D = Version("8.5.1")
_PATCHED_ATTR = "_verl_matmul_patch_embed"
_PROBE_KEY = "qwen3_5-vision-patch-embed-matmul"


def matmul_patch_embed(patches: torch.Tensor, proj: nn.Conv3d) -> torch.Tensor:
    """Conv3d with kernel == stride as one matmul: patches ``(N, C·t·p·p)`` (any shape flattening to that) ->
    ``(N, E)``, computed in the weight's dtype like HF's forward."""
    weight = proj.weight
    flat = patches.reshape(-1, weight[0].numel()).to(weight.dtype)
    return F.linear(flat, weight.reshape(weight.shape[0], -1), proj.bias)


def _matmul_forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
    record_call(_PROBE_KEY)
    return matmul_patch_embed(hidden_states, self.proj)


def _check_is_linear(name: str, proj: nn.Conv3d) -> None:
    if (
        tuple(proj.kernel_size) != tuple(proj.stride)
        or any(proj.padding)
        or any(d != 1 for d in proj.dilation)
        or proj.groups != 1
    ):
        raise ValueError(
            f"{name}.proj is not a kernel == stride Conv3d (kernel {proj.kernel_size}, stride {proj.stride}, padding "
            f"{proj.padding}, dilation {proj.dilation}, groups {proj.groups}); the matmul form would not be equivalent"
        )


def use_matmul_patch_embed(model: nn.Module) -> int:
    """Replace the forward of every vision patch embedding (``*VisionPatchEmbed`` with a Conv3d ``proj``) of
    ``model`` by the exactly equivalent matmul. Returns how many were replaced (0 for a text-only model)."""
    count = 0
    for name, module in model.named_modules():
        proj = getattr(module, "proj", None)
        if not type(module).__name__.endswith("VisionPatchEmbed") or not isinstance(proj, nn.Conv3d):
            continue
        _check_is_linear(name, proj)
        if not getattr(module, _PATCHED_ATTR, False):
            set_forward(module, _matmul_forward)
            object.__setattr__(module, _PATCHED_ATTR, True)
        count += 1
    return count


def _apply_on_old_cann(model: nn.Module) -> None:
    from verl.utils.device import get_cann_version

    version = get_cann_version()
    if version is not None and version >= MIN_CANN_FOR_CONV3D:
        raise PatchSkipped(f"CANN {version} >= {MIN_CANN_FOR_CONV3D}: the Conv3d patch embedding is safe")
    if use_matmul_patch_embed(model) == 0:
        raise PatchSkipped("no vision patch embedding (text-only model)")


VISION_PATCH_EMBED_PATCH = register_patch(
    ModelPatch(
        name="qwen3_5-vision-patch-embed-matmul",
        model_types=QWEN3_5_MODEL_TYPES,
        platforms=("npu",),
        apply=_apply_on_old_cann,
        # without it an old CANN segfaults in the vision tower: fail at start-up instead, with the reason
        required=True,
        transformers=QWEN3_5_TRANSFORMERS,
        description=f"vision Conv3d patch embedding as an exact matmul (CANN older than {MIN_CANN_FOR_CONV3D} or unknown)",
        probe_key=_PROBE_KEY,
    )
)
