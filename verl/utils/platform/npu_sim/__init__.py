"""A simulated Ascend NPU for CPU-only CI — a **test fixture**, never imported by verl at run time.

What it is (docs/design.md "The simulated NPU"): a real PrivateUse1 backend named ``npu`` (C++ in
``csrc/npu_sim.cpp``, built on first use) whose memory is host memory, plus a fake ``torch_npu`` module
(:mod:`.fake_torch_npu`) with the documented semantics of the fused ops verl calls, and a ``torch.npu`` device module
(:mod:`.device_module`).

Properties tests rely on:

* ``tensor.to("npu")``, ``.npu()``, ``.cpu()``, ``torch.device("npu:0")``, ``Module.to("npu")``, ``param.data = t``,
  autograd, optimizers, ``torch.save``/``torch.load`` (``map_location`` included) behave as on hardware;
* an op mixing NPU tensors with (non-scalar) CPU tensors raises ``RuntimeError: Expected all tensors to be on the
  same device, but found at least two devices, npu:0 and cpu!`` exactly where hardware would;
* ``torch_npu`` imports, ``torch.npu.is_available()`` is True, so ``verl.utils.device`` selects the npu platform;
* random ops on NPU tensors draw from a per-device generator (``torch.npu.manual_seed``), not the CPU one;
* memory statistics count live NPU bytes (``torch.npu.memory_allocated``), so offload tests can assert that
  parameters really left the device.

* collectives: backend ``hccl`` (:mod:`.hccl`, gloo underneath) takes npu tensors only and only contiguous ones;
  FSDP2 over several processes works (``install(device_count=n)``; ``torch.npu.set_device(rank)``).

* streams: one in-order stream per device; ``torch.npu.Stream()`` is a ``torch.Stream`` on it, and
  ``Tensor.record_stream`` is accepted and does nothing — exact here, since nothing is ever queued and freed memory
  is returned to the host at once (no caching allocator could hand a block to another stream early). FSDP1 calls it.

Not simulated: asynchronous execution (every op completes before returning), autocast (a no-op on ``npu``),
dtype coverage of the real kernels (an op runs if its CPU kernel supports the dtype; ``histc`` on integers is
special-cased because HF's MoE relies on it), fp64 restrictions, HCCL topology. Usage::

    with simulated_ascend():
        ...  # get_device_name() == "npu"

or, in pytest, the ``npu_sim`` fixture from :mod:`verl.utils.platform.npu_sim.pytest_plugin`. A whole program,
Ray workers included: ``python -m verl.utils.platform.npu_sim.launch verl.trainer.main_ppo trainer.device=npu ...``
(:mod:`.launch`). Checkpoint device discipline: :func:`.placement_audit.audit_state_dict_devices`.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator

import torch

__all__ = ["install", "is_installed", "ray_worker_setup_hook", "simulated_ascend", "uninstall"]

_installed = False


def _ensure_backend_registered(device_count: int) -> None:
    from verl.utils.platform.npu_sim.build import load_backend

    load_backend()
    torch.ops.npu_sim.set_device_count(device_count)
    if torch._C._get_privateuse1_backend_name() != "npu":
        torch.utils.rename_privateuse1_backend("npu")
    if not hasattr(torch.Tensor, "npu"):  # generated once per process; they outlive uninstall (inert without torch.npu)
        torch.utils.generate_methods_for_privateuse1_backend(
            for_tensor=True, for_module=True, for_packed_sequence=True, for_storage=True
        )


def _visible_device_count() -> int:
    # Like the real runtime, a process sees the devices listed in ASCEND_RT_VISIBLE_DEVICES (all = 1 here).
    value = os.environ.get("ASCEND_RT_VISIBLE_DEVICES", "")
    return max(1, len([v for v in value.split(",") if v.strip()]))


def install(device_count: int | None = None) -> None:
    """Install the simulated Ascend in this process: ``torch.npu``, ``torch_npu``, the ``hccl`` stand-in.

    ``device_count`` defaults to the number of ids in ``ASCEND_RT_VISIBLE_DEVICES`` (1 when unset). Re-selects the
    platform (``verl.utils.platform.reset_platform``) so detection now finds ``npu``. Raises RuntimeError if a real
    ``torch_npu`` (or another ``torch.npu``) is already loaded: never mix the two.
    """
    global _installed
    device_count = _visible_device_count() if device_count is None else device_count
    if _installed:
        torch.ops.npu_sim.set_device_count(device_count)
        return
    from verl.utils.platform.npu_sim import device_module, fake_torch_npu, hccl

    existing = sys.modules.get("torch_npu")
    if existing is not None and existing is not fake_torch_npu:
        raise RuntimeError(f"a real torch_npu ({getattr(existing, '__file__', existing)}) is loaded; cannot simulate")
    if getattr(torch, "npu", device_module) is not device_module:
        raise RuntimeError(f"torch.npu is already {torch.npu!r}; cannot simulate")
    _ensure_backend_registered(device_count)
    if not hasattr(torch, "npu"):
        torch._register_device_module("npu", device_module)
        sys.modules["torch.npu.memory"] = device_module.memory
    device_module.set_enabled(True)
    sys.modules["torch_npu"] = fake_torch_npu
    hccl.register_hccl_backend()
    torch.ops.npu_sim.set_device(0)
    _installed = True
    _reset_platform()


def uninstall() -> None:
    """Make the simulation unreachable again: ``torch_npu`` is no longer importable and ``torch.npu`` /
    ``torch.accelerator`` report no device, so detection falls back to the real machine.

    What cannot be undone in a process stays, inert: the loaded C++ backend, the ``npu`` device name, the
    ``torch.npu`` module object (torch caches device modules) and the ``hccl`` backend registration.
    """
    global _installed
    if not _installed:
        return
    from verl.utils.platform.npu_sim import device_module

    device_module.set_enabled(False)
    sys.modules.pop("torch_npu", None)
    _installed = False
    _reset_platform()


def ray_worker_setup_hook() -> None:
    """For Ray: ``runtime_env={"worker_process_setup_hook": "verl.utils.platform.npu_sim.ray_worker_setup_hook"}``
    installs the simulation in every worker process before it runs user code."""
    install()


def is_installed() -> bool:
    return _installed


def _reset_platform() -> None:
    from verl.utils.platform.registry import reset_platform

    reset_platform()


@contextlib.contextmanager
def simulated_ascend(device_count: int | None = None) -> Iterator[None]:
    """Run the block with the simulated Ascend installed (and the platform re-detected as ``npu``)."""
    already = _installed
    install(device_count)
    try:
        yield
    finally:
        if not already:
            uninstall()
