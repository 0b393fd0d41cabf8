"""Where one model's parameters and optimizer state live between phases (offload), for both worker paths.

With ``param_offload`` / ``optimizer_offload`` they live on the host between phases and come to the device around
each phase (update, log-probs, checkpoint, weight sync), so every tensor a phase touches — ``state_dict`` in
checkpointing included — is on ONE device (field-report item 10, upstream #5995). FSDP's own CPU offload owns
parameter placement whenever it is on (FSDP2 ``offload_policy``, or the forward-only build of
``build_fsdp_model``): parameters are then never moved by hand.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass

import torch
import torch.nn as nn

from verl.utils.device import get_platform
from verl.utils.fsdp_utils import (
    load_fsdp_model_to_gpu,
    load_fsdp_optimizer,
    offload_fsdp_model_to_cpu,
    offload_fsdp_optimizer,
)
from verl.workers.config.engine import FSDPEngineConfig

__all__ = ["Placement"]


@dataclass
class Placement:
    """The offload rule of one model (+ optimizer) and the moves it implies.

    Attributes:
        param_offload: parameters live on the host between phases (moved by hand).
        optimizer_offload: optimizer state lives on the host between updates.
        params_movable: False when FSDP's own CPU offload owns parameter placement.
        module, optimizer: what is moved (set once built; ``optimizer`` None when forward-only).
    """

    param_offload: bool
    optimizer_offload: bool
    params_movable: bool = True
    module: nn.Module | None = None
    optimizer: torch.optim.Optimizer | None = None

    @classmethod
    def from_config(cls, fsdp_config: FSDPEngineConfig, forward_only: bool) -> Placement:
        """The rule of a role's ``fsdp_config`` (``param_offload``, ``optimizer_offload``, ``offload_policy``)."""
        fsdp_owns_params = bool(fsdp_config.offload_policy) or forward_only
        return cls(
            param_offload=fsdp_config.param_offload and not fsdp_owns_params,
            optimizer_offload=fsdp_config.optimizer_offload and not forward_only,
            params_movable=not fsdp_owns_params,
        )

    def bind(self, module: nn.Module, optimizer: torch.optim.Optimizer | None) -> Placement:
        self.module, self.optimizer = module, optimizer
        return self

    def to(self, device: str, model: bool = True, optimizer: bool = True) -> None:
        """Move the parameters (with their gradients) and/or the optimizer state to ``"cpu"`` or the device."""
        self._move(device != "cpu", model, optimizer)

    def load(self, optimizer: bool = False) -> None:
        """To the device what the rule offloads: parameters (and, with ``optimizer``, optimizer state)."""
        self._move(True, self.param_offload, optimizer and self.optimizer_offload)

    def offload(self, optimizer: bool = True) -> None:
        """Back to the host what the rule offloads: parameters (and, with ``optimizer``, optimizer state)."""
        self._move(False, self.param_offload, optimizer and self.optimizer_offload)

    def _move(self, to_device: bool, model: bool, optimizer: bool) -> None:
        if self.module is None:
            raise RuntimeError("the model is not built yet: call init_model (engine: initialize) first")
        if model and self.params_movable:
            if to_device:
                load_fsdp_model_to_gpu(self.module, get_platform().device())
            else:
                offload_fsdp_model_to_cpu(self.module)
        if optimizer and self.optimizer is not None:
            if to_device:
                load_fsdp_optimizer(self.optimizer, get_platform().device())
            else:
                offload_fsdp_optimizer(self.optimizer)

    @contextlib.contextmanager
    def on_device(self, optimizer: bool = False) -> Iterator[None]:
        """:meth:`load` for the block, :meth:`offload` after it."""
        self.load(optimizer)
        try:
            yield
        finally:
            self.offload(optimizer)
