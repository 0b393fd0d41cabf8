"""The FSDP runtime internals the adapters in :mod:`verl.utils.fsdp_utils` reach into, in one module.

Each helper here calls a private torch API (``torch.distributed.fsdp._runtime_utils``, a handle's training
state, FSDP2's lazy init), so a torch upgrade is checked against this file alone; the adapters stay on public
calls and pick among these helpers per strategy.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
import torch.nn as nn


@contextlib.contextmanager
def fsdp2_root_unsharded(module: nn.Module) -> Iterator[None]:
    """The FSDP2 root's parameters gathered for the block (generate calls the model outside a root forward)."""
    if not hasattr(module, "unshard"):  # not an FSDP2 module (e.g. a single-process model)
        yield
        return
    # The root must initialise first: otherwise the first nested unit to run (a vision block, called by generate's
    # image encoding) would take itself for the root and the next root forward fails (torch's FSDP2 lazy init).
    module._get_fsdp_state()._lazy_init()
    module.unshard()
    try:
        yield
    finally:
        module.reshard()


@contextlib.contextmanager
def fsdp1_root_unsharded(module: nn.Module) -> Iterator[None]:
    """The FSDP1 root unit's parameters gathered exactly as its forward gathers them: in ``param_dtype``.

    Not ``summon_full_params``: that always gathers in full precision, so under bf16 mixed precision the root's
    modules (embeddings, final norm, lm_head, the vision tower's patch embed/merger) would run in fp32 while the
    nested units (decoder layers) run in bf16, and the first bf16 layer fails on the fp32 hidden states ("expected
    ... the same dtype, but got: float != c10::BFloat16") -- and even where it ran, generate would sample from
    other numerics than the forward that scores the samples. Only the root: the nested units gather theirs in
    their own forward, which needs their handles idle. The handle calls are the ones FSDP1's pre-forward makes
    (torch.distributed.fsdp._runtime_utils); the handle is in its FORWARD state while it unshards because only then
    does FSDP1 (``use_orig_params=False``) point the modules' parameters at the gathered low-precision data --
    otherwise they keep their construction-time fp32 tensors (or a freed earlier gather)."""
    from torch.distributed.fsdp._common_utils import HandleTrainingState
    from torch.distributed.fsdp._runtime_utils import _lazy_init, _reshard, _unshard

    _lazy_init(module, module)
    handle = module._handle
    if handle is None:  # the root holds no parameters of its own
        yield
        return
    free_after = handle.needs_unshard()  # NO_SHARD keeps its (full-size) shard
    stream = module._device_handle.current_stream()
    handle._training_state = HandleTrainingState.FORWARD
    try:
        _unshard(module, handle, stream, stream)
    finally:
        handle._training_state = HandleTrainingState.IDLE
    try:
        yield
    finally:
        _reshard(module, handle, free_after)


@contextlib.contextmanager
def fsdp2_grad_sync(module: nn.Module, enabled: bool) -> Iterator[None]:
    """FSDP2's counterpart of FSDP1's ``no_sync()``: with ``enabled=False`` the block accumulates unreduced grads."""
    if enabled:
        yield
        return
    module.set_requires_gradient_sync(False)
    try:
        yield
    finally:
        module.set_requires_gradient_sync(True)


def move_fsdp1_flat_params(module: nn.Module, device: torch.device) -> None:
    """Move every FSDP1 flat parameter (and its gradient) to ``device``; FSDP1 has no ``module.to`` for shards."""
    from torch.distributed.fsdp._runtime_utils import _lazy_init

    _lazy_init(module, module)
    for handle in module._all_handles:
        if handle._offload_params:
            continue  # FSDP1 CPUOffload owns placement
        flat = handle.flat_param
        handle.flat_param_to(device, non_blocking=False)
        # the local shard aliases the flat parameter's storage; keep them one tensor on one device
        flat._local_shard = flat.data
        if flat.grad is not None:
            flat.grad = flat.grad.to(device)
