"""Activation offload: keep the tensors autograd saves for backward in host memory between forward and backward.

Driven by ``actor_rollout_ref.model.enable_activation_offload`` (upstream key). The model is split into *groups*:
every decoder layer and the LM head. While a group runs forward with grad enabled, a ``saved_tensors_hooks`` pack
hook copies each saved activation to the CPU; the unpack hook brings it back to the compute device on first use
in backward. Each group's output passes through an identity autograd Function (:class:`_GroupBoundary`) whose
backward runs just before the group's own backward and reloads the whole group at once (the point where an
asynchronous prefetch would be issued on an accelerator).

Scope and consequences:

* Parameters (and views of them) are never copied: they are owned by FSDP (or the model) and reloaded by it.
* Nothing happens under ``torch.no_grad()`` (log-prob recomputation, generation).
* With gradient checkpointing (transformers checkpoints a layer's ``forward``, inside the module hooks), the
  checkpoint saves nothing inside the layer, so only what is saved outside a checkpointed layer is offloaded.
* The group output is produced by a custom autograd Function that returns its input, so autograd treats it as a
  *view*: modifying it (or a view of it, e.g. ``logits.squeeze(0)``) in place raises a RuntimeError. This is
  field-report item 3 (``logits.div_(temperature)``); every consumer here scales out of place.
* On the CPU the "offload" is a copy into another host tensor: the mechanism is exercised, nothing is saved.
"""

from __future__ import annotations

import itertools
import logging
import weakref
from collections.abc import Iterable
from dataclasses import dataclass, field

import torch
import torch.nn as nn
from torch.autograd.graph import saved_tensors_hooks

logger = logging.getLogger(__name__)

__all__ = ["ActivationOffloadHandle", "enable_activation_offloading", "enable_activation_offload"]


class _Packed:
    """One offloaded activation: its host copy, and the device copy once reloaded for backward."""

    def __init__(self, tensor: torch.Tensor):
        self.device = tensor.device
        self.host = tensor.detach().to("cpu", copy=True)
        self.reloaded: torch.Tensor | None = None

    def restore(self) -> torch.Tensor:
        if self.reloaded is None:
            self.reloaded = self.host.to(self.device, copy=True)
        return self.reloaded


@dataclass
class _Offloader:
    """Pack/unpack hooks plus per-group bookkeeping (weak references: the autograd graph owns the copies)."""

    min_numel: int = 1
    groups: dict[int, weakref.WeakSet] = field(default_factory=dict)
    param_storages: set[int] = field(default_factory=set)
    current_group: int | None = None
    counter: itertools.count = field(default_factory=itertools.count)
    num_offloaded: int = 0  # tensors copied to the host so far (observability, tests)

    def pack(self, tensor: torch.Tensor):
        if not self._should_offload(tensor):
            return tensor
        record = _Packed(tensor)
        self.num_offloaded += 1
        self.groups.setdefault(self.current_group, weakref.WeakSet()).add(record)
        return record

    @staticmethod
    def unpack(saved):
        return saved.restore() if isinstance(saved, _Packed) else saved

    def reload_group(self, group_id: int) -> None:
        for record in list(self.groups.pop(group_id, ())):
            record.restore()

    def _should_offload(self, tensor: torch.Tensor) -> bool:
        from torch.distributed.tensor import DTensor

        if isinstance(tensor, (nn.Parameter, DTensor)) or not tensor.is_floating_point():
            return False
        if isinstance(tensor._base, nn.Parameter):  # a view of a parameter, e.g. FSDP1's views into a flat param
            return False
        if tensor.numel() < self.min_numel:
            return False
        return tensor.untyped_storage().data_ptr() not in self.param_storages


class _GroupBoundary(torch.autograd.Function):
    """Identity in forward; in backward, reloads the group whose output this was, before its backward runs."""

    @staticmethod
    def forward(ctx, tensor, offloader, group_id):
        ctx.offloader = offloader
        ctx.group_id = group_id
        return tensor  # returned as-is: autograd treats the output as a view (no in-place ops on it)

    @staticmethod
    def backward(ctx, grad):
        ctx.offloader.reload_group(ctx.group_id)
        return grad, None, None


def _map_tensors(output, fn):
    if isinstance(output, torch.Tensor):
        return fn(output)
    if isinstance(output, tuple) and not hasattr(output, "_fields"):
        return tuple(_map_tensors(o, fn) for o in output)
    if isinstance(output, dict):  # HF ModelOutput is an OrderedDict: rebuild it with the mapped tensors
        for key in list(output.keys()):
            output[key] = _map_tensors(output[key], fn)
        return output
    return output


@dataclass
class ActivationOffloadHandle:
    """What :func:`enable_activation_offloading` installed; ``remove()`` uninstalls it."""

    offloader: _Offloader
    hook_handles: list = field(default_factory=list)
    num_groups: int = 0

    def remove(self) -> None:
        for handle in self.hook_handles:
            handle.remove()
        self.hook_handles.clear()


def _install_group_hooks(module: nn.Module, offloader: _Offloader) -> list:
    state: dict[str, object] = {}

    def pre_hook(mod, _args):
        if not torch.is_grad_enabled():
            return
        offloader.param_storages = {p.untyped_storage().data_ptr() for p in mod.parameters() if p.numel()}
        group_id = next(offloader.counter)
        offloader.current_group = group_id
        ctx = saved_tensors_hooks(offloader.pack, offloader.unpack)
        ctx.__enter__()
        state["ctx"], state["group"] = ctx, group_id

    def post_hook(_mod, _args, output):
        ctx = state.pop("ctx", None)
        if ctx is None:
            return output
        ctx.__exit__(None, None, None)
        offloader.current_group = None
        group_id = state.pop("group")

        def boundary(t: torch.Tensor) -> torch.Tensor:
            return _GroupBoundary.apply(t, offloader, group_id) if t.requires_grad else t

        return _map_tensors(output, boundary)

    # always_call: leave the saved-tensor hooks even when the forward raises
    return [module.register_forward_pre_hook(pre_hook), module.register_forward_hook(post_hook, always_call=True)]


def _offload_groups(model: nn.Module, layer_class_names: Iterable[str] | None) -> list[nn.Module]:
    from verl.utils.fsdp_utils import layer_class_names as default_layer_names
    from verl.utils.fsdp_utils import resolve_wrap_classes

    if layer_class_names is None:
        names, source = default_layer_names(model, None)
    else:
        names, source = list(layer_class_names), "layer_class_names"
    classes = tuple(resolve_wrap_classes(model, names, source))
    groups = [m for m in model.modules() if isinstance(m, classes)]
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    if isinstance(head, nn.Module):
        groups.append(head)
    return groups


def enable_activation_offloading(
    model: nn.Module,
    strategy: str | None = None,
    enable_ckpt: bool = False,
    *,
    layer_class_names: Iterable[str] | None = None,
    min_numel: int = 1,
) -> ActivationOffloadHandle:
    """Offload the activations of every decoder layer and of the LM head of ``model`` to the CPU (upstream name).

    Call it on the HF model (before or after FSDP wrapping; the hooks sit on the inner modules either way).

    Args:
        model: the HF model; its decoder layers come from ``_no_split_modules`` unless ``layer_class_names``.
        strategy: ``"fsdp" | "fsdp2"``, accepted for upstream compatibility (parameters are never offloaded
            here, so the strategy changes nothing).
        enable_ckpt: whether gradient checkpointing is on (informational; see the module docstring).
        layer_class_names: class names of the layers forming groups.
        min_numel: saved tensors with fewer elements stay where they are.

    Returns:
        A handle whose ``remove()`` turns offloading off again.
    """
    offloader = _Offloader(min_numel=min_numel)
    handle = ActivationOffloadHandle(offloader)
    groups = _offload_groups(model, layer_class_names)
    for group in groups:
        handle.hook_handles.extend(_install_group_hooks(group, offloader))
    handle.num_groups = len(groups)
    logger.info(
        "activation offload: %d groups (strategy=%s, gradient checkpointing=%s)", len(groups), strategy, enable_ckpt
    )
    return handle


enable_activation_offload = enable_activation_offloading
