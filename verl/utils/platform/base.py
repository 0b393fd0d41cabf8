"""The device contract: one object per accelerator family (docs/design.md "Devices: one contract").

Everything the framework needs to know about a device lives on a :class:`Platform`: its torch device name and
``torch.<device>`` module, the collective backend, the visible-devices environment variable, the Ray resource
name, memory statistics, RNG and synchronisation. ``verl.utils.device`` exposes upstream verl's function names
as thin adapters onto the selected platform; no other module names a device family.
"""

from __future__ import annotations

import contextlib
import os
import types
from collections.abc import Iterator
from typing import Any

import torch


class Platform:
    """Base class of the device contract; subclasses set the class attributes and override the hooks.

    Attributes:
        device_name: torch device type string (``"cpu" | "cuda" | "npu"``).
        vendor: upstream verl's vendor name (``"intel" | "nvidia" | "huawei"``), used only for display.
        comm_backend: ``torch.distributed`` backend for this device (``"gloo" | "nccl" | "hccl"``).
        visible_devices_envvar: env var that restricts which devices a process sees (None on CPU).
        ray_resource_name: Ray resource that counts these devices (``"CPU" | "GPU" | "NPU"``).
        ray_noset_envvars: env vars that stop Ray from rewriting ``visible_devices_envvar`` in workers.
        vllm_sleep_level: the level the colocated vLLM engine sleeps at between rollouts: 2 drops weights and KV
            cache (the next sync refills the weights), 1 moves the weights to host memory (vllm-ascend has no 2).
        profiler_activity: ``torch.profiler.ProfilerActivity`` member that records this device's kernels
            (``"CUDA"``; ``"PrivateUse1"`` for out-of-tree devices such as Ascend), None when the CPU activity
            covers it.
        long_segment_attention: how the memory-lean packed attention (``verl.ops.varlen_attention``) runs a
            sequence longer than one chunk: ``"sdpa"`` where torch's fused ``scaled_dot_product_attention`` keeps
            only O(T) state for backward (the CPU flash kernel), ``"chunked"`` (blocked online softmax in plain
            torch ops) elsewhere; None where the model's configured attention (flash-attention, a fused NPU
            kernel) already runs packed input without a ``T x T`` mask, so the lean attention is not installed.
        fla_kernels: whether flash-linear-attention's fused kernels exist for this family (Triton on CUDA,
            triton-ascend on NPU); where False, ``verl.ops`` never imports fla (on a CPU-only machine with triton
            installed, importing it crashes) and runs the pure-torch reference kernels.
        vllm_platform_plugin: the module of the vLLM platform plugin this family needs next to ``vllm``
            (``"vllm_ascend"`` on NPU), None where vLLM supports the family itself.
        fallback_when_missing: True for the family that upstream's default ``trainer.device`` value names
            (``cuda``): that value means "the default accelerator", so on a machine without one the detected
            platform is used with a warning; other families are explicit choices and fail when missing.
    """

    device_name: str = ""
    vendor: str = ""
    comm_backend: str = ""
    visible_devices_envvar: str | None = None
    ray_resource_name: str = ""
    ray_noset_envvars: tuple[str, ...] = ()
    vllm_sleep_level: int = 2
    profiler_activity: str | None = None
    long_segment_attention: str | None = None
    fla_kernels: bool = False
    vllm_platform_plugin: str | None = None
    fallback_when_missing: bool = False

    # ---- availability -------------------------------------------------------------------------------------

    def is_available(self) -> bool:
        """True when this process can run tensors on this device family."""
        raise NotImplementedError

    def missing_reason(self) -> str | None:
        """None when usable; otherwise one paragraph naming what is missing and how to fix it."""
        return None if self.is_available() else f"no {self.device_name} device is available"

    # ---- the torch module and devices ---------------------------------------------------------------------

    def torch_module(self) -> Any:
        """The ``torch.<device>`` module (``torch.cuda``, ``torch.npu``) or a module-like stand-in."""
        raise NotImplementedError

    def device_count(self) -> int:
        return int(self.torch_module().device_count())

    def current_device_id(self) -> int:
        return int(self.torch_module().current_device())

    def set_device(self, device_id: int) -> None:
        self.torch_module().set_device(device_id)

    def local_device_index(self, local_rank: int) -> int:
        """Index, among the devices this process sees, of the device of local rank ``local_rank``.

        Under Ray a worker that asks for one device sees only that one (Ray sets ``visible_devices_envvar`` to
        it): index 0. When Ray is told to leave the variable alone (``RAY_EXPERIMENTAL_NOSET_<var>=1``, which the
        Ascend recipes export), or under torchrun, every process of a node sees all of its devices and local rank
        ``r`` takes device ``r``. Binding every rank to device 0 there would stack a node's ranks on one device.
        """
        count = self.device_count()
        if count <= 1:
            return 0
        if not 0 <= local_rank < count:
            visible = os.environ.get(self.visible_devices_envvar or "", "<unset>")
            raise RuntimeError(
                f"LOCAL_RANK={local_rank} but this process sees {count} {self.device_name} device(s) "
                f"({self.visible_devices_envvar}={visible}); give each node at least trainer.n_gpus_per_node "
                "devices, or let Ray assign one device per worker (unset RAY_EXPERIMENTAL_NOSET_*)"
            )
        return local_rank

    def device(self, index: int | None = None) -> torch.device:
        """``torch.device`` of this family; ``index=None`` means the current device."""
        return torch.device(self.device_name, self.current_device_id() if index is None else index)

    def synchronize(self) -> None:
        self.torch_module().synchronize()

    def get_device_capability(self, device_id: int = 0) -> tuple[int, int] | None:
        """(major, minor) compute capability where the family has one, else None."""
        return None

    # ---- kernel choices -----------------------------------------------------------------------------------

    def default_attn_implementation(self) -> str:
        """The HF ``attn_implementation`` a model gets unless ``model.override_config.attn_implementation`` says
        otherwise: torch's ``sdpa``, which runs everywhere; accelerator families override it."""
        return "sdpa"

    def cross_entropy_kernel(self) -> str | None:
        """The fused log-prob kernel ``verl.utils.torch_functional.logprobs_from_logits`` tries on this family
        (``"flash_attn" | "torch_npu"``), or None for the plain torch formula; the caller falls back to torch when
        the kernel's package does not import."""
        return None

    def supports_ipc(self) -> bool:
        """Whether the rollout can share weights with the trainer through device IPC handles on this machine."""
        return True

    # ---- memory -------------------------------------------------------------------------------------------

    def memory_allocated(self) -> int:
        return int(self.torch_module().memory_allocated())

    def max_memory_allocated(self) -> int:
        return int(self.torch_module().max_memory_allocated())

    def memory_reserved(self) -> int:
        return int(self.torch_module().memory_reserved())

    def max_memory_reserved(self) -> int:
        return int(self.torch_module().max_memory_reserved())

    def reset_peak_memory_stats(self) -> None:
        self.torch_module().reset_peak_memory_stats()

    def mem_get_info(self) -> tuple[int, int]:
        """(free_bytes, total_bytes) of the current device."""
        free, total = self.torch_module().mem_get_info()
        return int(free), int(total)

    def empty_cache(self) -> None:
        self.torch_module().empty_cache()

    def set_expandable_segments(self, enable: bool) -> None:
        """Turn the caching allocator's expandable segments on or off (no-op where unsupported)."""

    # ---- RNG ----------------------------------------------------------------------------------------------

    def manual_seed(self, seed: int) -> None:
        self.torch_module().manual_seed(seed)

    def manual_seed_all(self, seed: int) -> None:
        self.torch_module().manual_seed_all(seed)

    def get_rng_state(self) -> torch.Tensor:
        return self.torch_module().get_rng_state()

    def set_rng_state(self, state: torch.Tensor) -> None:
        self.torch_module().set_rng_state(state)

    @contextlib.contextmanager
    def fork_rng(self, seed: int) -> Iterator[None]:
        """Run the block on the current device's generator seeded with ``seed``; restore its state afterwards.

        The rollout samples inside such a block, seeded from (seed, step, rank): what it draws then depends on
        nothing that ran before (model building, training, a restart from a checkpoint), and a CPU run and a run
        on a device whose generator has the CPU's algorithm (the simulated Ascend) sample the same tokens.
        """
        saved = self.get_rng_state()
        self.manual_seed(seed)
        try:
            yield
        finally:
            self.set_rng_state(saved)

    # ---- processes, Ray and collectives -------------------------------------------------------------------

    def ray_actor_options(self, count: float) -> dict[str, Any]:
        """Keyword arguments for Ray's ``.options(...)`` asking for ``count`` devices of this family."""
        return {"resources": {self.ray_resource_name: count}}

    def comm_env_vars(self, connect_timeout_s: int | None = None, exec_timeout_s: int | None = None) -> dict[str, str]:
        """Environment for worker processes that use the collective backend (timeouts, socket ranges).

        Values the user already exported win; None timeouts mean the platform's default.
        """
        return {}

    def rollout_env_vars(self) -> dict[str, str]:
        """Environment the inference engine needs on this family (e.g. vLLM-Ascend switches)."""
        return {}

    def visible_device_ids(self) -> list[str] | None:
        """Ids listed in ``visible_devices_envvar``, or None when it is unset (all devices visible)."""
        if self.visible_devices_envvar is None:
            return None
        value = os.environ.get(self.visible_devices_envvar)
        if value is None or value.strip() == "":
            return None
        return [v.strip() for v in value.split(",") if v.strip()]

    def __repr__(self) -> str:
        return f"{type(self).__name__}(device_name={self.device_name!r}, comm_backend={self.comm_backend!r})"


def module_like(name: str, base: types.ModuleType, **extra: Any) -> types.ModuleType:
    """A new module holding the public attributes of ``base`` overlaid with ``extra`` (completes ``torch.cpu``)."""
    module = types.ModuleType(name, base.__doc__)
    for key in dir(base):
        if not key.startswith("__"):
            setattr(module, key, getattr(base, key))
    for key, value in extra.items():
        setattr(module, key, value)
    return module
