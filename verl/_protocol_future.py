"""The parts of ``verl.protocol`` that talk to other processes: ``DataProtoFuture`` (Ray object refs of
DataProtos still being computed) and ``all_gather_data_proto`` (torch.distributed). Re-exported from
``verl.protocol``; Ray and torch.distributed are imported only when used."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from tensordict import TensorDict

from verl._protocol_utils import is_dataproto_like

if TYPE_CHECKING:  # annotations only: at run time this module never imports verl.protocol
    from verl.protocol import DataProto


def all_gather_data_proto(data: DataProto, process_group: Any = None) -> None:
    """All-gather ``data`` across ``process_group`` in place: afterwards every rank holds the rows of all ranks,
    in rank order. Tensors travel on the platform's device (CPU with gloo); every rank must hold the same
    number of rows and the same tensor shapes."""
    import torch.distributed as dist

    from verl.utils.device import get_device_id, get_device_name

    group_size = dist.get_world_size(group=process_group)
    if data.batch is not None:
        prev_device = data.batch.device or torch.device("cpu")
        comm_device = "cpu" if get_device_name() == "cpu" else f"{get_device_name()}:{get_device_id()}"
        gathered = {}
        for key, val in data.batch.items():
            val = val.to(comm_device).contiguous()
            parts = [torch.empty_like(val) for _ in range(group_size)]
            dist.all_gather(parts, val, group=process_group)
            gathered[key] = torch.cat(parts, dim=0).to(prev_device)
        data.batch = TensorDict(gathered, batch_size=(len(data) * group_size,))
    all_non_tensor: list[Any] = [None] * group_size
    dist.all_gather_object(all_non_tensor, data.non_tensor_batch, group=process_group)
    data.non_tensor_batch = {k: np.concatenate([part[k] for part in all_non_tensor]) for k in data.non_tensor_batch}


@dataclass
class DataProtoFuture:
    """A DataProto still being computed by remote workers (the result of a non-blocking worker-group call).

    ``get()`` waits for ``futures`` (Ray object refs), merges them with ``collect_fn`` (usually
    ``DataProto.concat``) and applies ``dispatch_fn`` (e.g. "take chunk i of n") if set. Passing a future to a
    ``@register``-ed method lets each worker fetch its data itself instead of through the driver.
    """

    collect_fn: Callable
    futures: list
    dispatch_fn: Callable | None = None

    @staticmethod
    def concat(data: list) -> DataProtoFuture:
        """A future of the concatenation of the DataProtos behind ``data`` (a list of object refs)."""
        return DataProtoFuture(collect_fn=_concat_parts, futures=data)

    def chunk(self, chunks: int) -> list[DataProtoFuture]:
        """``chunks`` futures; future ``i`` resolves to ``self.get().chunk(chunks)[i]``."""
        return [self.then(_ChunkPicker(i, chunks)) for i in range(chunks)]

    def then(self, fn: Callable[[DataProto], DataProto]) -> DataProtoFuture:
        """A future of ``fn(self.get())``."""
        previous = self.dispatch_fn
        return DataProtoFuture(self.collect_fn, self.futures, fn if previous is None else _Compose(previous, fn))

    def get(self) -> DataProto:
        import ray

        outputs = ray.get(self.futures)
        for i, out in enumerate(outputs):
            if not is_dataproto_like(out):
                raise TypeError(f"DataProtoFuture: future {i} resolved to a {type(out).__name__}, not a DataProto")
        output = self.collect_fn(outputs)
        return self.dispatch_fn(output) if self.dispatch_fn is not None else output


def _concat_parts(parts: list[Any]) -> Any:
    """``DataProto.concat`` of resolved parts, reached through their own type (this module imports no DataProto)."""
    if not parts:
        raise ValueError("DataProtoFuture.concat: no futures to concatenate")
    return type(parts[0]).concat(parts)


# Picklable callables (closures could not be sent to a Ray actor inside a DataProtoFuture).
@dataclass(frozen=True)
class _ChunkPicker:
    index: int
    chunks: int

    def __call__(self, data: DataProto) -> DataProto:
        return data.chunk(self.chunks)[self.index]


@dataclass(frozen=True)
class _Compose:
    first: Callable
    second: Callable

    def __call__(self, data: DataProto) -> DataProto:
        return self.second(self.first(data))
