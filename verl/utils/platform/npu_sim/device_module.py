"""The simulated ``torch.npu`` module: the subset of torch_npu's device module that frameworks call.

Registered as ``torch.npu`` by :func:`verl.utils.platform.npu_sim.install`. State (current device, memory
statistics, per-device RNG) lives in the C++ backend and is reached through ``torch.ops.npu_sim``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch

from verl.utils.platform.npu_sim import memory  # noqa: F401  (torch.npu.memory)

TOTAL_MEMORY_BYTES = 64 * 1024**3  # one Atlas 800T A2 (910B) NPU has 64 GB of HBM
DEVICE_NAME = "Ascend910B (simulated)"


def _ops() -> Any:
    return torch.ops.npu_sim


def _npu_device_type() -> int:
    # c10::DeviceType of the backend named "npu" (PrivateUse1), as the integer torch.Stream's constructor takes.
    return torch.Stream(device=torch.device("npu", current_device())).device_type


def _index(device: Any = None) -> int:
    if device is None:
        return current_device()
    if isinstance(device, int):
        return device
    device = torch.device(device)
    if device.type != "npu":
        raise ValueError(f"expected an npu device, got {device}")
    return current_device() if device.index is None else device.index


# ---- availability and devices --------------------------------------------------------------------------------


_enabled = False  # set by install()/uninstall(); the module stays registered as torch.npu once registered


def set_enabled(enabled: bool) -> None:
    global _enabled
    _enabled = enabled
    _ops().set_enabled(enabled)


def is_available() -> bool:
    return _enabled


def is_initialized() -> bool:
    return True


def init() -> None:
    return None


def _lazy_init() -> None:
    return None


def _is_in_bad_fork() -> bool:
    return False


def device_count() -> int:
    return int(_ops().device_count()) if _enabled else 0


def current_device() -> int:
    return int(_ops().current_device())


def set_device(device: Any) -> None:
    _ops().set_device(_index(device))


class device:  # noqa: N801  (torch.npu.device, like torch.cuda.device)
    """Context manager selecting a device (used by storage moves and torch.load)."""

    def __init__(self, device: Any):
        self.idx = -1 if device is None else _index(device)
        self.prev_idx = -1

    def __enter__(self) -> device:
        self.prev_idx = current_device()
        if self.idx >= 0:
            set_device(self.idx)
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.idx >= 0:
            set_device(self.prev_idx)


def synchronize(device: Any = None) -> None:
    return None  # every simulated kernel has completed when it returns


def get_device_name(device: Any = None) -> str:
    return DEVICE_NAME


@dataclass(frozen=True)
class _DeviceProperties:
    name: str
    total_memory: int


def get_device_properties(device: Any = None) -> _DeviceProperties:
    return _DeviceProperties(DEVICE_NAME, TOTAL_MEMORY_BYTES)


def get_device_capability(device: Any = None) -> None:
    return None


def get_amp_supported_dtype() -> list[torch.dtype]:
    return [torch.float16, torch.bfloat16]


# ---- memory -------------------------------------------------------------------------------------------------------


def memory_allocated(device: Any = None) -> int:
    return int(_ops().memory_allocated(_index(device)))


def max_memory_allocated(device: Any = None) -> int:
    return int(_ops().max_memory_allocated(_index(device)))


# No caching allocator: reserved == allocated.
memory_reserved = memory_allocated
max_memory_reserved = max_memory_allocated


def reset_peak_memory_stats(device: Any = None) -> None:
    _ops().reset_peak_memory_stats(_index(device))


reset_max_memory_allocated = reset_peak_memory_stats


def mem_get_info(device: Any = None) -> tuple[int, int]:
    return TOTAL_MEMORY_BYTES - memory_allocated(device), TOTAL_MEMORY_BYTES


def memory_stats(device: Any = None) -> dict[str, int]:
    return {
        "allocated_bytes.all.current": memory_allocated(device),
        "allocated_bytes.all.peak": max_memory_allocated(device),
        "reserved_bytes.all.current": memory_reserved(device),
        "reserved_bytes.all.peak": max_memory_reserved(device),
    }


def empty_cache() -> None:
    return None


# ---- RNG (one generator per simulated device, separate from the CPU one) --------------------------------------------


def manual_seed(seed: int) -> None:
    _ops().manual_seed(current_device(), int(seed))


def manual_seed_all(seed: int) -> None:
    for i in range(device_count()):
        _ops().manual_seed(i, int(seed))


def seed() -> None:
    manual_seed(int(torch.randint(0, 2**62, (1,), generator=torch.Generator()).item()))


def initial_seed() -> int:
    return int(_ops().initial_seed(current_device()))


def get_rng_state(device: Any = "npu") -> torch.Tensor:
    return _ops().get_rng_state(_index(device))


def set_rng_state(new_state: torch.Tensor, device: Any = "npu") -> None:
    _ops().set_rng_state(_index(device), new_state)


def get_rng_state_all() -> list[torch.Tensor]:
    return [get_rng_state(i) for i in range(device_count())]


def set_rng_state_all(new_states: list[torch.Tensor]) -> None:
    for i, state in enumerate(new_states):
        set_rng_state(state, i)


# ---- streams and events (one in-order stream: every call completes synchronously) -------------------------------------


class Stream(torch.Stream):
    """A ``torch.Stream`` on ``npu:<i>`` (as torch_npu's streams are), so ``Tensor.record_stream`` accepts it.

    The simulated device has one in-order stream per device, the default one; every ``Stream()`` is that stream.
    """

    def __new__(cls, device: Any = None, priority: int = 0) -> Stream:
        return super().__new__(cls, stream_id=0, device_index=_index(device), device_type=_npu_device_type())

    def __init__(self, device: Any = None, priority: int = 0):
        super().__init__()

    def synchronize(self) -> None:
        return None

    def wait_stream(self, stream: Stream) -> None:
        return None

    def wait_event(self, event: Event) -> None:
        return None

    def record_event(self, event: Event | None = None) -> Event:
        return event or Event()

    def query(self) -> bool:
        return True


class Event:
    def __init__(self, enable_timing: bool = False, blocking: bool = False):
        self.enable_timing = enable_timing

    def record(self, stream: Stream | None = None) -> None:
        return None

    def wait(self, stream: Stream | None = None) -> None:
        return None

    def synchronize(self) -> None:
        return None

    def query(self) -> bool:
        return True


def current_stream(device: Any = None) -> Stream:
    return Stream(device)


def default_stream(device: Any = None) -> Stream:
    return Stream(device)


@contextlib.contextmanager
def stream(stream: Stream | None) -> Iterator[Stream | None]:
    yield stream
