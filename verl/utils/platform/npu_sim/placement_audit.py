"""Make the device discipline of checkpointing observable on the simulated Ascend (field-report item 10).

The contract (``verl/utils/checkpoint/fsdp_checkpoint_manager.py``, ``verl/workers/fsdp_workers.py``): every tensor a
checkpoint reads or writes — parameters, gradients, buffers, optimizer state — is on ONE device, the compute device,
when ``state_dict`` / ``load_state_dict`` runs. Hardware does not always enforce it: a sharded ``state_dict`` of a
module whose parameters were never reloaded (all on the host) succeeds on one rank and only fails later, when a full
state dict for the HF export needs a collective (HCCL refuses host tensors) on a multi-rank job. So the simulator
checks it where it is taken:

* :func:`audit_state_dict_devices` hooks one module and optionally its optimizer (their public state-dict pre-hooks,
  nothing global) and raises :class:`DeviceDisciplineError` — with the hardware's mixed-device wording — when the
  tensors behind a ``state_dict`` / ``load_state_dict`` span two devices, or are not on ``expect``;
* :func:`saved_tensor_devices` lists the devices of every tensor written by ``torch.save`` under a directory: the
  simulated npu keeps a tensor's device through ``torch.save``/``torch.load``, so this is exactly what was handed to
  ``torch.save``.

0-dim tensors are exempt, as in the device rule of real kernels (a CPU scalar may join any device's op; AdamW keeps
its ``step`` counter on the CPU). Test fixture: never imported by verl at run time.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.nn as nn

__all__ = ["DeviceAudit", "DeviceDisciplineError", "audit_state_dict_devices", "saved_tensor_devices"]


class DeviceDisciplineError(RuntimeError):
    """A checkpoint read or wrote tensors on more than one device (or not on the expected one)."""


@dataclass
class DeviceAudit:
    """What the audit saw: one ``(event, {device: example tensor name})`` per state-dict call, in call order."""

    expect: torch.device | None = None
    checks: list[tuple[str, dict[torch.device, str]]] = field(default_factory=list)

    def events(self) -> list[str]:
        return [event for event, _ in self.checks]

    def devices(self) -> set[torch.device]:
        return {device for _, seen in self.checks for device in seen}


def _local(t: torch.Tensor) -> torch.Tensor:
    # a DTensor's data is its local shard; that is what state_dict reads and what collectives send
    return t.to_local() if hasattr(t, "to_local") else t


def module_tensors(module: nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
    """Parameters, their gradients and buffers of ``module`` (local shards of DTensors), with their names."""
    for name, param in module.named_parameters():
        yield name, _local(param)
        if param.grad is not None:
            yield f"{name}.grad", _local(param.grad)
    for name, buffer in module.named_buffers():
        yield name, _local(buffer)


def optimizer_tensors(optimizer: torch.optim.Optimizer) -> Iterator[tuple[str, torch.Tensor]]:
    """The optimizer's parameters and state tensors, named ``param<i>`` / ``state<i>.<key>``."""
    params = [p for group in optimizer.param_groups for p in group["params"]]
    for i, param in enumerate(params):
        yield f"param{i}", _local(param)
        for key, value in optimizer.state.get(param, {}).items():
            if isinstance(value, torch.Tensor):
                yield f"state{i}.{key}", _local(value)


def check_one_device(
    event: str, tensors: Iterator[tuple[str, torch.Tensor]], expect: torch.device | None
) -> dict[torch.device, str]:
    """``{device: first tensor name}`` of the non-scalar tensors; raises DeviceDisciplineError on a second device
    or, with ``expect``, on any other device."""
    seen: dict[torch.device, str] = {}
    for name, tensor in tensors:
        if tensor.dim() > 0:
            seen.setdefault(tensor.device, name)
    if len(seen) > 1:
        (first, a), (second, b) = list(seen.items())[:2]
        raise DeviceDisciplineError(
            f"Expected all tensors to be on the same device, but found at least two devices, {first} and {second}! "
            f"(simulated Ascend, in {event}: {a} on {first}, {b} on {second}; load everything offloaded back "
            "before the checkpoint reads it)"
        )
    if expect is not None and seen and next(iter(seen)) != expect:
        device, name = next(iter(seen.items()))
        raise DeviceDisciplineError(
            f"{event} ran with its tensors on {device} (e.g. {name}), expected {expect}: the offloaded state was "
            "not loaded back onto the device before the checkpoint (simulated Ascend)"
        )
    return seen


@contextlib.contextmanager
def audit_state_dict_devices(
    module: nn.Module, optimizer: torch.optim.Optimizer | None = None, expect: torch.device | str | None = None
) -> Iterator[DeviceAudit]:
    """Inside the block, every ``state_dict()`` / ``load_state_dict()`` of ``module`` (the root: DCP's
    ``get_model_state_dict``/``set_model_state_dict`` and FSDP's full state dict call it) and of ``optimizer``
    first checks that the tensors behind it are on one device (``expect`` if given); yields the record."""
    audit = DeviceAudit(expect=None if expect is None else torch.device(expect))
    name = type(module).__name__

    def check(event: str, tensors: Iterator[tuple[str, torch.Tensor]]) -> None:
        audit.checks.append((event, check_one_device(event, tensors, audit.expect)))

    handles = [
        module.register_state_dict_pre_hook(lambda m, *_: check(f"state_dict of {name}", module_tensors(m))),
        module.register_load_state_dict_pre_hook(lambda m, *_: check(f"load_state_dict of {name}", module_tensors(m))),
    ]
    if optimizer is not None:
        opt = type(optimizer).__name__
        handles.append(
            optimizer.register_state_dict_pre_hook(lambda o: check(f"state_dict of {opt}", optimizer_tensors(o)))
        )
        handles.append(
            optimizer.register_load_state_dict_pre_hook(
                lambda o, sd: check(f"load_state_dict of {opt}", optimizer_tensors(o))
            )
        )
    try:
        yield audit
    finally:
        for handle in handles:
            handle.remove()


def _tensors_in(obj: Any) -> Iterator[torch.Tensor]:
    if isinstance(obj, torch.Tensor):
        yield _local(obj)
    elif isinstance(obj, dict):
        for value in obj.values():
            yield from _tensors_in(value)
    elif isinstance(obj, (list, tuple)):
        for value in obj:
            yield from _tensors_in(value)


def saved_tensor_devices(root: str | Path, pattern: str = "**/*.pt") -> dict[str, set[torch.device]]:
    """``{file: devices of its non-scalar tensors}`` for every ``torch.save`` file under ``root`` (loaded without
    ``map_location``, so each tensor comes back on the device it was saved from)."""
    found = {}
    for path in sorted(Path(root).glob(pattern)):
        state = torch.load(path, weights_only=False)
        found[str(path.relative_to(root))] = {t.device for t in _tensors_in(state) if t.dim() > 0}
    return found
