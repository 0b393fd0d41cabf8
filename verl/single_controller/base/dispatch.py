"""Dispatch / collect functions: how one driver-side call becomes one call per worker rank, and back.

A dispatch function has the signature ``dispatch_fn(worker_group, *args, **kwargs) -> (args, kwargs)``; when
the call runs on every rank (``Execute.ALL``) each returned arg is a list with one entry per rank. A collect
function ``collect_fn(worker_group, outputs) -> output`` turns the per-rank outputs (or object refs, for
non-blocking calls) into what the caller sees. All functions here are pure apart from reading the worker
group's ``world_size`` and its cached dispatch info; ``worker_group._share(obj)`` lets a Ray group store one
copy of a shard in the object store for all ranks that receive it.

Auto-padding: when a DataProto argument has padding enabled and its length is not divisible by the number of
shards, a padded copy (last row repeated) is split instead, and the pad size is handed to the worker group
under ``_padding_size_key``; the group strips that many rows from the collected output.
"""

from __future__ import annotations

from functools import partial
from types import FunctionType
from typing import Any

from tensordict import TensorDict

from verl.protocol import DataProto, DataProtoFuture, _padding_size_key
from verl.utils.tensordict_utils import chunk_tensordict, concat_tensordict

# ------------------------------------------------------------------------------------------- splitting data


def _pad_size(data: Any, chunks: int, allow_padding: bool) -> int:
    if not (allow_padding and isinstance(data, DataProto) and data.is_padding_enabled()):
        return 0
    return (chunks - len(data) % chunks) % chunks


def _chunk_one(data: Any, chunks: int, pad_size: int, where: str) -> list:
    if isinstance(data, DataProto):
        if pad_size:
            data = DataProto.concat([data, data.select_idxs([len(data) - 1]).repeat(pad_size)])
        return data.chunk(chunks)
    if isinstance(data, DataProtoFuture):
        return data.chunk(chunks)
    if isinstance(data, TensorDict):
        if data.batch_size[0] % chunks != 0:
            raise ValueError(f"{where}: TensorDict with {data.batch_size[0]} rows cannot be split into {chunks} shards")
        return chunk_tensordict(data, chunks)  # row-wise for jagged nested tensors too
    raise TypeError(
        f"{where} is a {type(data).__name__}; data-parallel dispatch needs a DataProto, DataProtoFuture or "
        "TensorDict (use Dispatch.ONE_TO_ALL to send the same value to every rank)"
    )


def split_data_args(chunks: int, args: tuple, kwargs: dict, allow_padding: bool = True) -> tuple[list, dict, int]:
    """Chunk every DataProto / DataProtoFuture / TensorDict argument into ``chunks`` shards.

    Returns:
        (args, kwargs, pad_size): each arg replaced by its list of shards; ``pad_size`` rows were appended before
        splitting (0 unless auto-padding applied). All padded DataProtos must have the same length.
    """
    values = list(args) + list(kwargs.values())
    lengths = {len(v) for v in values if isinstance(v, DataProto) and _pad_size(v, chunks, allow_padding)}
    if len(lengths) > 1:
        raise ValueError(f"auto-padded DataProto arguments must have equal lengths, got {sorted(lengths)}")
    pad_size = max((_pad_size(v, chunks, allow_padding) for v in values), default=0)
    split_args = [
        _chunk_one(a, chunks, _pad_size(a, chunks, allow_padding), f"argument {i}") for i, a in enumerate(args)
    ]
    split_kwargs = {
        k: _chunk_one(v, chunks, _pad_size(v, chunks, allow_padding), f"argument {k!r}") for k, v in kwargs.items()
    }
    return split_args, split_kwargs, pad_size


def concat_outputs(outputs: list) -> Any:
    """Per-rank DataProtos -> one DataProto; TensorDicts -> one TensorDict; object refs -> a DataProtoFuture."""
    if all(isinstance(o, DataProto) for o in outputs):
        return DataProto.concat(outputs)
    if all(isinstance(o, TensorDict) for o in outputs):
        return concat_tensordict(outputs)
    import ray

    if all(isinstance(o, ray.ObjectRef) for o in outputs):
        return DataProtoFuture.concat(outputs)
    kinds = sorted({type(o).__name__ for o in outputs})
    raise TypeError(f"a DataProto-collecting method returned {kinds}; every rank must return a DataProto")


# ------------------------------------------------------------------------------------------- predefined pairs


def dispatch_one_to_all(worker_group: Any, *args, **kwargs) -> tuple[tuple, dict]:
    """Every rank receives every argument unchanged."""
    n = worker_group.world_size
    return tuple([a] * n for a in args), {k: [v] * n for k, v in kwargs.items()}


def dispatch_all_to_all(worker_group: Any, *args, **kwargs) -> tuple[tuple, dict]:
    """Arguments pass through unchanged (lists of world_size entries are split per rank by ``execute_all``)."""
    return args, kwargs


def collect_all_to_all(worker_group: Any, output: Any) -> Any:
    """The per-rank outputs (or the single rank-zero output) unchanged."""
    return output


def collect_rank_zero(worker_group: Any, output: Any) -> Any:
    """Rank 0's output: the first entry of a per-rank list, or the single output of ``Execute.RANK_ZERO``."""
    return output[0] if isinstance(output, list) else output


def dispatch_dp_compute(worker_group: Any, *args, **kwargs) -> tuple[tuple, dict]:
    """Arguments are already per-rank lists; check their lengths."""
    n = worker_group.world_size
    for name, value in [*enumerate(args), *kwargs.items()]:
        if not isinstance(value, list | tuple) or len(value) != n:
            raise ValueError(f"Dispatch.DP_COMPUTE: argument {name!r} must be a list with one entry per rank ({n})")
    return args, kwargs


def collect_dp_compute(worker_group: Any, output: list) -> list:
    """The list of per-rank outputs (checked to have world_size entries)."""
    if len(output) != worker_group.world_size:
        raise RuntimeError(f"expected {worker_group.world_size} outputs, got {len(output)}")
    return output


def dispatch_dp_compute_data_proto(worker_group: Any, *args, **kwargs) -> tuple[list, dict]:
    """Split every data argument into world_size shards (auto-padding aware)."""
    split_args, split_kwargs, pad_size = split_data_args(worker_group.world_size, args, kwargs)
    if pad_size:
        split_kwargs[_padding_size_key] = pad_size
    return split_args, split_kwargs


def dispatch_dp_compute_data_proto_with_func(worker_group: Any, *args, **kwargs) -> tuple[list, dict]:
    """The first argument is a function sent to every rank; the rest are split like DP_COMPUTE_PROTO."""
    if not args or not isinstance(args[0], FunctionType):
        raise TypeError("Dispatch.DP_COMPUTE_PROTO_WITH_FUNC: the first argument must be a function")
    split_args, split_kwargs, pad_size = split_data_args(worker_group.world_size, args[1:], kwargs)
    if pad_size:
        split_kwargs[_padding_size_key] = pad_size
    return [[args[0]] * worker_group.world_size, *split_args], split_kwargs


def collect_dp_compute_data_proto(worker_group: Any, output: list) -> Any:
    """Concatenate the per-rank DataProtos (or wrap their refs into a DataProtoFuture)."""
    return concat_outputs(collect_dp_compute(worker_group, output))


def dispatch_direct_rollout_call(worker_group: Any, *args, **kwargs):
    raise NotImplementedError(
        "Dispatch.DIRECT_ROLLOUT_METHOD marks methods that are called on the rollout directly, not through a "
        "worker group"
    )


# ------------------------------------------------------------------------------------------- n-d mesh dispatch


def _mesh_layout(worker_group: Any, mesh_name: str) -> tuple[list[int], list[bool]]:
    """Per-rank (dp rank, is-collector) for ``mesh_name``, queried from the workers once and cached."""
    if mesh_name not in worker_group._dispatch_info:
        dp_ranks = list(worker_group._query_dispatch_info(mesh_name))
        collect = [bool(c) for c in worker_group._query_collect_info(mesh_name)]
        _check_mesh_layout(mesh_name, dp_ranks, collect)
        worker_group._dispatch_info[mesh_name] = dp_ranks
        worker_group._collect_info[mesh_name] = collect
    return worker_group._dispatch_info[mesh_name], worker_group._collect_info[mesh_name]


def _check_mesh_layout(mesh_name: str, dp_ranks: list[int], collect: list[bool]) -> None:
    dp_size = max(dp_ranks) + 1
    if sorted(set(dp_ranks)) != list(range(dp_size)):
        raise RuntimeError(f"mesh {mesh_name!r}: dp ranks {dp_ranks} do not cover 0..{dp_size - 1}")
    collected = sorted(dp for dp, c in zip(dp_ranks, collect) if c)
    if collected != list(range(dp_size)):
        raise RuntimeError(
            f"mesh {mesh_name!r}: exactly one collecting rank per dp rank is needed, got collectors for dp ranks "
            f"{collected}; register is_collect=True on one rank of each dp group (e.g. tp rank 0)"
        )


def dispatch_nd_compute_dataproto(mesh_name: str, worker_group: Any, *args, **kwargs) -> tuple[list, dict]:
    """Split data into dp_size shards; each rank receives the shard of its dp rank (shared via the object store)."""
    dp_ranks, _ = _mesh_layout(worker_group, mesh_name)
    split_args, split_kwargs, pad_size = split_data_args(max(dp_ranks) + 1, args, kwargs)
    share = getattr(worker_group, "_share", lambda obj: obj)

    def per_rank(shards: list) -> list:
        shared = [share(shard) for shard in shards]
        return [shared[dp] for dp in dp_ranks]

    out_kwargs = {k: per_rank(v) for k, v in split_kwargs.items()}
    if pad_size:
        out_kwargs[_padding_size_key] = pad_size
    return [per_rank(a) for a in split_args], out_kwargs


def collect_nd_compute_dataproto(mesh_name: str, worker_group: Any, output: list) -> Any:
    """Concatenate the outputs of the collecting ranks in dp-rank order."""
    dp_ranks, collect = _mesh_layout(worker_group, mesh_name)
    collect_dp_compute(worker_group, output)
    picked = sorted((dp, out) for dp, out, c in zip(dp_ranks, output, collect) if c)
    return concat_outputs([out for _, out in picked])


def make_nd_compute_dataproto_dispatch_fn(mesh_name: str) -> dict[str, Any]:
    """Dispatch mode for workers on an n-d device mesh: use as ``@register(dispatch_mode=make_nd_..._fn("actor"))``.

    Each worker declares, in its init, ``self._register_dispatch_collect_info(mesh_name, dp_rank, is_collect)``;
    ranks with the same dp rank (e.g. tensor / sequence parallel peers) receive the same shard, and only the
    collecting rank of each dp group returns output.
    """
    return {
        "dispatch_fn": partial(dispatch_nd_compute_dataproto, mesh_name),
        "collect_fn": partial(collect_nd_compute_dataproto, mesh_name),
    }
