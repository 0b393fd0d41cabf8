"""``WorkerGroup``: the driver-side handle of N workers, with one group method per ``@register``-ed method.

Calling ``wg.method(*args)`` runs four steps, the same for every backend (Ray, local):

    dispatch_fn(wg, *args)  ->  per-rank args           (split / replicate, see dispatch.py)
    execute_fn(name, ...)   ->  per-rank results / refs ("execute_all" or "execute_rank_zero")
    wg._resolve(...)        ->  values                  (only if blocking; ray.get on Ray)
    collect_fn(wg, ...)     ->  what the caller gets     (then auto-padding rows are stripped)

Backends implement ``execute_all_async`` / ``execute_rank_zero_async`` and ``_resolve``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from verl.protocol import DataProto, DataProtoFuture, _padding_size_key, unpad_dataproto
from verl.single_controller.base.decorator import (
    MAGIC_ATTR,
    Dispatch,
    get_predefined_dispatch_fn,
    get_predefined_execute_fn,
)

__all__ = ["ClassWithInitArgs", "ResourcePool", "WorkerGroup"]


class ResourcePool:
    """How many worker processes run on each node: ``process_on_nodes=[8, 8]`` is 2 nodes x 8 processes.

    ``max_colocate_count`` is how many worker groups may share one process slot (device)."""

    def __init__(
        self, process_on_nodes: list[int] | None = None, max_colocate_count: int = 10, n_gpus_per_node: int = 8
    ) -> None:
        self._store = list(process_on_nodes or [])
        if any(not isinstance(n, int) or n < 1 for n in self._store):
            raise ValueError(f"process_on_nodes must be positive ints, got {self._store}")
        if max_colocate_count < 1:
            raise ValueError(f"max_colocate_count must be >= 1, got {max_colocate_count}")
        self.max_colocate_count = max_colocate_count
        self.n_gpus_per_node = n_gpus_per_node

    def add_node(self, process_count: int) -> None:
        self._store.append(process_count)

    @property
    def world_size(self) -> int:
        return sum(self._store)

    def __call__(self) -> list[int]:
        return self._store

    @property
    def store(self) -> list[int]:
        return self._store

    def local_world_size_list(self) -> list[int]:
        """Per global rank: the number of processes on that rank's node."""
        return [n for n in self._store for _ in range(n)]

    def local_rank_list(self) -> list[int]:
        """Per global rank: its index among the processes of its node."""
        return [i for n in self._store for i in range(n)]


class ClassWithInitArgs:
    """A worker class plus the arguments to construct it with (construction is deferred to the backend)."""

    def __init__(self, cls: type, *args, **kwargs) -> None:
        self.cls = cls
        self.args = args
        self.kwargs = kwargs
        self.fused_worker_used = False

    def __call__(self) -> Any:
        return self.cls(*self.args, **self.kwargs)


def _strip_padding(output: Any, pad_size: int) -> Any:
    # Rows appended by auto-padding come back at the end of the concatenated output.
    if pad_size == 0:
        return output
    if isinstance(output, DataProto):
        return unpad_dataproto(output, pad_size)
    if isinstance(output, DataProtoFuture):
        return output.then(_Unpad(pad_size))
    return output  # per-rank lists (e.g. DP_COMPUTE_METRIC) are not rows


class _Unpad:
    """Picklable ``unpad_dataproto(data, pad_size)``."""

    def __init__(self, pad_size: int) -> None:
        self.pad_size = pad_size

    def __call__(self, data: DataProto) -> DataProto:
        return unpad_dataproto(data, self.pad_size)


class WorkerGroup:
    """Driver-side handle of a group of workers (backend-independent part)."""

    fused_worker_execute_fn_name = "_fuw_execute"

    def __init__(self, resource_pool: ResourcePool | None, **kwargs) -> None:
        self._is_init_with_detached_workers = resource_pool is None
        self.fused_worker_used = False
        self._procecss_dispatch_config = resource_pool() if resource_pool is not None else None
        self._workers: list[Any] = []
        self._worker_names: list[str] = []
        # mesh name -> per-rank dp rank / collect flag, queried from the workers on first use
        self._dispatch_info: dict[str, list[int]] = {}
        self._collect_info: dict[str, list[bool]] = {}
        self._master_addr: str | None = None
        self._master_port: str | None = None
        self.method_names: list[str] = []

    @property
    def world_size(self) -> int:
        return len(self._workers)

    # ------------------------------------------------------------------------------ backend interface

    def execute_all_async(self, method_name: str, *args, **kwargs) -> list:
        raise NotImplementedError

    def execute_rank_zero_async(self, method_name: str, *args, **kwargs) -> Any:
        raise NotImplementedError

    def _resolve(self, output: Any) -> Any:
        """Turn futures into values (identity for in-process backends)."""
        return output

    def _share(self, obj: Any) -> Any:
        """Store ``obj`` once for several ranks (Ray: the object store); identity by default."""
        return obj

    def execute_all(self, method_name: str, *args, **kwargs) -> list:
        return self.execute_all_async(method_name, *args, **kwargs)

    def execute_all_sync(self, method_name: str, *args, **kwargs) -> list:
        return self._resolve(self.execute_all_async(method_name, *args, **kwargs))

    def execute_rank_zero(self, method_name: str, *args, **kwargs) -> Any:
        return self.execute_rank_zero_async(method_name, *args, **kwargs)

    def execute_rank_zero_sync(self, method_name: str, *args, **kwargs) -> Any:
        return self._resolve(self.execute_rank_zero_async(method_name, *args, **kwargs))

    def _per_rank_calls(self, args: tuple, kwargs: dict) -> list[tuple[tuple, dict]]:
        """Per-rank (args, kwargs): lists of world_size entries are split by rank, anything else is broadcast
        (upstream's rule; dispatch functions always produce per-rank lists)."""
        n = self.world_size
        values = list(args) + list(kwargs.values())
        if values and all(isinstance(v, list) and len(v) == n for v in values):
            return [(tuple(a[i] for a in args), {k: v[i] for k, v in kwargs.items()}) for i in range(n)]
        return [(args, kwargs)] * n

    # ------------------------------------------------------------------------------ binding

    def _bind_worker_method(self, user_defined_cls: type, func_generator: Callable | None = None) -> list[str]:
        """Attach one group method per ``@register``-ed method of ``user_defined_cls``; returns their names."""
        func_generator = func_generator or make_group_method
        method_names = []
        for method_name in dir(user_defined_cls):
            method = getattr(user_defined_cls, method_name, None)
            attrs = getattr(method, MAGIC_ATTR, None) if callable(method) else None
            if not isinstance(attrs, dict):
                continue
            mode = attrs["dispatch_mode"]
            fns = get_predefined_dispatch_fn(mode) if isinstance(mode, Dispatch) else mode
            execute_fn = getattr(self, get_predefined_execute_fn(attrs["execute_mode"])["execute_fn_name"])
            func = func_generator(
                self,
                method_name,
                dispatch_fn=fns["dispatch_fn"],
                collect_fn=fns["collect_fn"],
                execute_fn=execute_fn,
                blocking=attrs["blocking"],
            )
            setattr(self, method_name, func)
            method_names.append(method_name)
        self.method_names = method_names
        return method_names


def make_group_method(
    worker_group: WorkerGroup,
    method_name: str,
    dispatch_fn: Callable,
    collect_fn: Callable,
    execute_fn: Callable,
    blocking: bool,
) -> Callable:
    """The group method for ``method_name``: dispatch -> execute -> (resolve) -> collect -> strip padding."""

    def group_method(*args, **kwargs):
        args, kwargs = dispatch_fn(worker_group, *args, **kwargs)
        pad_size = kwargs.pop(_padding_size_key, 0)
        output = execute_fn(method_name, *args, **kwargs)
        if blocking:
            output = worker_group._resolve(output)
        output = collect_fn(worker_group, output)
        return _strip_padding(output, pad_size)

    group_method.__name__ = method_name
    group_method.__qualname__ = f"{type(worker_group).__name__}.{method_name}"
    return group_method
