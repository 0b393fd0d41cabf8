"""TensorDict helpers under upstream's names (``verl.utils.tensordict_utils``).

Upstream's engine path passes ``TensorDict`` batches between the trainer and the workers, next to (and converted
from) ``DataProto``: tensors (possibly jagged nested tensors for packed sequences), per-row Python objects as a
``NonTensorStack`` and per-call switches (``temperature``, ``calculate_entropy``, ...) as ``NonTensorData``. These
helpers build, split, join and read such batches; the single-controller dispatch uses ``chunk_tensordict`` /
``concat_tensordict`` for TensorDict arguments, so jagged tensors survive data-parallel splitting.

Conventions, as upstream:
* a Python ``list`` value becomes a ``NonTensorStack`` (one entry per row), any other non-tensor a
  ``NonTensorData`` (one value for the whole batch);
* ``get`` / ``pop`` return native values: tensors as they are, a stack as a list, ``NonTensorData`` unwrapped;
* nested tensors are jagged (``layout=torch.jagged``) and ragged along one dimension (``_ragged_idx``).
Misuse raises ``ValueError`` / ``TypeError`` / ``KeyError`` naming the key, not an ``assert``.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator
from typing import Any

import numpy as np
import torch
from tensordict import TensorDict
from tensordict.tensorclass import NonTensorData, NonTensorStack

__all__ = [
    "assert_tensordict_eq",
    "assign_non_tensor",
    "assign_non_tensor_data",
    "assign_non_tensor_stack",
    "chunk_tensordict",
    "concat_nested_tensors",
    "concat_tensordict",
    "concat_tensordict_with_none_bsz",
    "contiguous",
    "get",
    "get_keys",
    "get_non_tensor_data",
    "get_tensordict",
    "index_select_tensor_dict",
    "list_of_dict_to_tensordict",
    "make_iterator",
    "maybe_fix_3d_position_ids",
    "nested_tensor_from_tensor_list",
    "pad_to_divisor",
    "pop",
    "pop_keys",
    "union_tensor_dict",
    "unpad",
    "unwrap_non_tensor_data",
]

logger = logging.getLogger(__name__)


def _require_tensordict(value: Any, where: str) -> None:
    if not isinstance(value, TensorDict):
        raise TypeError(f"{where}: expected a TensorDict, got {type(value).__name__}")


def _is_nested(value: Any) -> bool:
    return isinstance(value, torch.Tensor) and value.is_nested


def _ragged_idx(nested: torch.Tensor) -> int:
    return getattr(nested, "_ragged_idx", nested.dim() - 1)


def _stack(values: Iterable[Any]) -> NonTensorStack:
    return NonTensorStack.from_list([NonTensorData(v) for v in values])


# ------------------------------------------------------------------------------------------- non-tensor values


def assign_non_tensor_data(tensor_dict: TensorDict, key: str, val: Any) -> None:
    """Store one value for the whole batch (``NonTensorData``), e.g. ``temperature`` or an experiment name."""
    _require_tensordict(tensor_dict, "assign_non_tensor_data")
    tensor_dict[key] = NonTensorData(val)


def assign_non_tensor_stack(tensor_dict: TensorDict, key: str, val: list) -> None:
    """Store one Python object per row (``NonTensorStack``); nested lists/dicts are kept as they are."""
    _require_tensordict(tensor_dict, "assign_non_tensor_stack")
    tensor_dict[key] = _stack(val)


def assign_non_tensor(tensor_dict: TensorDict, **kwargs: Any) -> TensorDict:
    """Store each keyword: NonTensorData/NonTensorStack as given, a list per row, anything else per batch."""
    _require_tensordict(tensor_dict, "assign_non_tensor")
    for key, val in kwargs.items():
        if isinstance(val, NonTensorData | NonTensorStack):
            tensor_dict[key] = val
        elif isinstance(val, list):
            assign_non_tensor_stack(tensor_dict, key, val)
        else:
            assign_non_tensor_data(tensor_dict, key, val)
    return tensor_dict


def unwrap_non_tensor_data(data: Any) -> Any:
    """The value inside a ``NonTensorData``; anything else unchanged."""
    return data.data if isinstance(data, NonTensorData) else data


def get_non_tensor_data(data: TensorDict, key: str, default: Any) -> Any:
    """``data[key]`` unwrapped from its ``NonTensorData``, or ``default`` when the key is absent."""
    return unwrap_non_tensor_data(data.get(key, default))


def _native(value: Any) -> Any:
    """Tensors as they are, a NonTensorStack as a list, NonTensorData unwrapped."""
    if isinstance(value, torch.Tensor):
        return value
    if isinstance(value, NonTensorStack):
        return value.tolist()
    return unwrap_non_tensor_data(value)


def get(tensordict: TensorDict, key: str, default: Any = None) -> Any:
    """``tensordict[key]`` as a native value (see ``_native``), or ``default`` when absent."""
    return _native(tensordict.get(key)) if key in tensordict.keys() else default


def pop(tensordict: TensorDict, key: str, default: Any = None) -> Any:
    """Remove ``key`` and return its native value, or ``default`` when absent (nothing removed)."""
    return _native(tensordict.pop(key)) if key in tensordict.keys() else default


def _split_by_kind(tensordict: TensorDict, keys: Iterable[str], remove: bool) -> TensorDict:
    tensors, non_tensors = {}, {}
    for key in keys:
        if key not in tensordict.keys():
            raise KeyError(f"key {key!r} not in tensordict (keys: {sorted(tensordict.keys())})")
        value = tensordict.pop(key) if remove else tensordict.get(key)
        if isinstance(value, NonTensorData):
            non_tensors[key] = value.data
        else:
            tensors[key] = value
    return get_tensordict(tensors, non_tensors)


def get_keys(tensordict: TensorDict, keys: Iterable[str]) -> TensorDict:
    """A new TensorDict holding only ``keys`` (KeyError naming a missing one)."""
    return _split_by_kind(tensordict, keys, remove=False)


def pop_keys(tensordict: TensorDict, keys: Iterable[str]) -> TensorDict:
    """Remove ``keys`` from ``tensordict`` and return them as a new TensorDict (KeyError naming a missing one)."""
    return _split_by_kind(tensordict, keys, remove=True)


# ------------------------------------------------------------------------------------------- construction


def _rows_of(key: str, val: Any) -> int:
    if isinstance(val, torch.Tensor):
        if val.is_nested and (not val.is_contiguous() or val.layout != torch.jagged):
            raise ValueError(f"get_tensordict: nested tensor {key!r} must be jagged and contiguous")
        return val.size(0)
    if isinstance(val, NonTensorStack | list | np.ndarray):
        return len(val)
    raise TypeError(f"get_tensordict: {key!r} is a {type(val).__name__}; expected a tensor, list or numpy array")


def get_tensordict(tensor_dict: dict[str, Any], non_tensor_dict: dict[str, Any] | None = None) -> TensorDict:
    """A TensorDict from per-row values and per-batch values.

    ``tensor_dict``: tensors (also jagged nested ones), and lists / numpy arrays of Python objects, which become a
    ``NonTensorStack`` (a list must not hold tensors: convert those to a nested tensor). Every entry needs the
    same number of rows. ``non_tensor_dict``: values stored as ``NonTensorData``. The batch size is ``[rows]``, or
    ``[]`` when there are no per-row entries.
    """
    rows: dict[str, int] = {}
    source: dict[str, Any] = {}
    for key, val in tensor_dict.items():
        rows[key] = _rows_of(key, val)
        if isinstance(val, list | np.ndarray):
            if any(isinstance(v, torch.Tensor) for v in val):
                raise TypeError(f"get_tensordict: list {key!r} holds tensors; pass a (nested) tensor instead")
            val = _stack(val)
        source[key] = val
    if len(set(rows.values())) > 1:
        raise ValueError(f"get_tensordict: entries have different numbers of rows: {rows}")
    for key, val in (non_tensor_dict or {}).items():
        if key in source:
            raise ValueError(f"get_tensordict: {key!r} is given both per row and per batch")
        source[key] = NonTensorData(val)
    batch_size = [next(iter(rows.values()))] if rows else []
    return TensorDict(source, batch_size=batch_size)


def nested_tensor_from_tensor_list(tensors: list[torch.Tensor], ragged_idx: int | None = None) -> torch.Tensor:
    """A jagged nested tensor of ``tensors`` (one per row), ragged along dim ``ragged_idx`` of the result.

    Rows are ``(L_i,)`` or ``(d, L_i)`` etc.; ``ragged_idx`` counts the row dim, so it defaults to the last dim
    (``x.dim()`` of a row). Example: rows ``(4, 3)`` and ``(4, 5)`` (M-RoPE position ids) -> ``(2, 4, j)`` with
    ``ragged_idx=2``.
    """
    if not tensors:
        raise ValueError("nested_tensor_from_tensor_list: needs at least one tensor")
    sample_dim = tensors[0].dim()
    ragged_idx = sample_dim if ragged_idx is None else ragged_idx
    if not 1 <= ragged_idx <= sample_dim:
        raise ValueError(f"ragged_idx must be in [1, {sample_dim}] for {sample_dim}-d rows, got {ragged_idx}")
    if sample_dim == 1:
        return torch.nested.as_nested_tensor(list(tensors), layout=torch.jagged)
    values = torch.cat(list(tensors), dim=ragged_idx - 1)
    lengths = torch.tensor([t.shape[ragged_idx - 1] for t in tensors], device=values.device)
    offsets = torch.cat([lengths.new_zeros(1), lengths.cumsum(0)])
    return torch.nested.nested_tensor_from_jagged(values, offsets, jagged_dim=ragged_idx)


def list_of_dict_to_tensordict(list_of_dicts: list[dict[str, Any]]) -> TensorDict:
    """One TensorDict from per-row dicts (same keys): 0-d tensors stack, other tensors form a nested tensor (rows
    may differ in length), anything else a NonTensorStack."""
    if not list_of_dicts:
        raise ValueError("list_of_dict_to_tensordict: needs at least one row")
    columns = {key: [row[key] for row in list_of_dicts] for key in list_of_dicts[0]}

    def pack(values: list[Any]) -> Any:
        if not all(isinstance(v, torch.Tensor) for v in values):
            return _stack(values)
        if all(v.dim() == 0 for v in values):
            return torch.stack(values)
        # Always nested, even when the lengths happen to agree: the caller treats the column as ragged.
        return nested_tensor_from_tensor_list(values)

    return TensorDict({key: pack(values) for key, values in columns.items()}, batch_size=[len(list_of_dicts)])


# ------------------------------------------------------------------------------------------- rows


def index_select_tensor_dict(batch: TensorDict | None, indices: torch.Tensor | list[int]) -> TensorDict | None:
    """Rows ``indices`` (1-D) of ``batch``: tensors indexed, nested tensors rebuilt from their rows, stacks
    indexed, per-batch ``NonTensorData`` kept. None stays None."""
    if batch is None:
        return None
    indices = torch.as_tensor(indices, dtype=torch.long)
    if indices.dim() != 1:
        raise ValueError(f"index_select_tensor_dict: indices must be 1-D, got shape {tuple(indices.shape)}")
    out = {}
    for key, value in batch.items():
        if _is_nested(value):
            rows = value.unbind()
            out[key] = nested_tensor_from_tensor_list([rows[i] for i in indices.tolist()], _ragged_idx(value))
        elif isinstance(value, torch.Tensor) or value.shape:
            out[key] = value[indices]
        else:
            out[key] = value
    return TensorDict(out, batch_size=[indices.numel()])


def _without_nested(td: TensorDict, nested_keys: set[str]) -> TensorDict:
    return TensorDict({k: v for k, v in td.items() if k not in nested_keys}, batch_size=td.batch_size, device=td.device)


def chunk_tensordict(td: TensorDict, chunks: int) -> list[TensorDict]:
    """Split ``td`` into ``chunks`` TensorDicts of equal length (ValueError when ``len(td)`` is not divisible).

    Nested tensors are split by rows and rebuilt per chunk (through a padded copy when ``unbind`` cannot split a
    3-D jagged tensor, pytorch/pytorch#153238); everything else uses ``TensorDict.chunk``.
    """
    _require_tensordict(td, "chunk_tensordict")
    if chunks < 1 or len(td) % chunks:
        raise ValueError(f"chunk_tensordict: {len(td)} rows cannot be split into {chunks} equal chunks")
    size = len(td) // chunks
    nested_keys = {k for k, v in td.items() if _is_nested(v)}
    parts = list(_without_nested(td, nested_keys).chunk(chunks=chunks))
    for key in nested_keys:
        rows = _nested_rows(td[key])
        for i, part in enumerate(parts):
            part[key] = nested_tensor_from_tensor_list(rows[i * size : (i + 1) * size], _ragged_idx(td[key]))
    return parts


def _nested_rows(nested: torch.Tensor) -> list[torch.Tensor]:
    try:
        return list(nested.unbind(0))
    except RuntimeError:
        padded = nested.to_padded_tensor(0)
        lengths = nested.offsets().diff().tolist()
        ragged = _ragged_idx(nested) - 1
        return [row.narrow(ragged, 0, n) for row, n in zip(padded.unbind(0), lengths, strict=True)]


def concat_nested_tensors(tensors: list[torch.Tensor]) -> torch.Tensor:
    """Concatenate contiguous jagged nested tensors (2-D or more) along the batch dim."""
    for t in tensors:
        if not (_is_nested(t) and t.is_contiguous() and t.dim() >= 2):
            raise ValueError("concat_nested_tensors: every input must be a contiguous nested tensor with >= 2 dims")
    rows = [row for t in tensors for row in t.unbind(0)]
    return nested_tensor_from_tensor_list(rows, _ragged_idx(tensors[0]))


def concat_tensordict_with_none_bsz(data: list[TensorDict]) -> TensorDict:
    """Batch-less TensorDicts (only per-batch metadata) concatenate to the first one."""
    if any(len(d.batch_size) for d in data):
        raise ValueError("concat_tensordict_with_none_bsz: every TensorDict must have an empty batch size")
    return data[0]


def concat_tensordict(data: list[TensorDict]) -> TensorDict:
    """Concatenate TensorDicts with the same keys along dim 0; nested tensors row by row."""
    if not data:
        raise ValueError("concat_tensordict: needs at least one TensorDict")
    nested_keys = {k for k, v in data[0].items() if _is_nested(v)}
    if not nested_keys:
        if len(data[0].batch_size) == 0:
            return concat_tensordict_with_none_bsz(data)
        return TensorDict.cat(data, dim=0)
    for td in data:
        if {k for k, v in td.items() if _is_nested(v)} != nested_keys:
            raise ValueError(f"concat_tensordict: every TensorDict must hold the same nested tensors {nested_keys}")
    out = TensorDict.cat([_without_nested(td, nested_keys) for td in data], dim=0)
    for key in nested_keys:
        out[key] = concat_nested_tensors([td[key] for td in data])
    return out


def union_tensor_dict(tensor_dict1: TensorDict, tensor_dict2: TensorDict) -> TensorDict:
    """Add the keys of ``tensor_dict2`` to ``tensor_dict1`` (in place, returned); a shared key must hold equal
    values, tensors compared element-wise."""
    if tensor_dict1.batch_size != tensor_dict2.batch_size:
        raise ValueError(
            f"union_tensor_dict: batch sizes differ ({tensor_dict1.batch_size} vs {tensor_dict2.batch_size})"
        )
    for key in tensor_dict2.keys():
        if key not in tensor_dict1.keys():
            tensor_dict1[key] = tensor_dict2.get(key)
            continue
        a, b = tensor_dict1[key], tensor_dict2[key]
        same = a.equal(b) if isinstance(b, torch.Tensor) else a == b
        if not same:
            raise ValueError(f"union_tensor_dict: {key!r} differs between the two TensorDicts")
    return tensor_dict1


def make_iterator(
    tensordict: TensorDict,
    mini_batch_size: int,
    epochs: int,
    seed: int | None = None,
    dataloader_kwargs: dict[str, Any] | None = None,
) -> Iterator[TensorDict]:
    """Mini-batches of ``mini_batch_size`` rows, ``epochs`` passes; ``dataloader_kwargs`` go to the DataLoader
    over row indices (e.g. ``shuffle=True``), shuffled reproducibly by ``seed``."""
    from torch.utils.data import DataLoader

    rows = tensordict.batch_size[0]
    if rows % mini_batch_size:
        raise ValueError(f"make_iterator: {rows} rows are not divisible by mini_batch_size={mini_batch_size}")
    generator = torch.Generator().manual_seed(seed) if seed is not None else None
    kwargs = dict(dataloader_kwargs or {})
    loader = DataLoader(
        torch.arange(rows), batch_size=mini_batch_size, collate_fn=_identity, generator=generator, **kwargs
    )

    def batches() -> Iterator[TensorDict]:
        for _ in range(epochs):
            for idx in loader:
                yield index_select_tensor_dict(tensordict, idx)

    return batches()


def _identity(batch: Any) -> Any:
    return batch


def pad_to_divisor(data: TensorDict, size_divisor: int) -> tuple[TensorDict, int]:
    """Pad the rows to a multiple of ``size_divisor`` by repeating rows from the start; returns
    ``(padded, pad_size)``. Example: 10 rows, divisor 4 -> rows 0..9 then 0, 1; pad_size 2."""
    _require_tensordict(data, "pad_to_divisor")
    if len(data) % size_divisor == 0:
        if len(data) == 0:
            logger.warning("pad_to_divisor: the TensorDict has no rows; nothing padded")
        return data, 0
    pad_size = size_divisor - len(data) % size_divisor
    pieces, remaining = [data], pad_size
    while remaining > 0:
        take = min(remaining, len(data))
        pieces.append(data[:take])
        remaining -= take
    return torch.cat(pieces), pad_size


def unpad(data: TensorDict, pad_size: int) -> TensorDict:
    """Drop the last ``pad_size`` rows (the padding of :func:`pad_to_divisor`)."""
    return data[:-pad_size] if pad_size else data


def contiguous(data: TensorDict) -> TensorDict:
    """A new TensorDict with contiguous tensors (``TensorDict.contiguous`` would turn metadata into stacks)."""
    tensors, non_tensors = {}, {}
    for key in data.keys():
        value = data.get(key)
        if isinstance(value, NonTensorData):
            non_tensors[key] = value.data
        elif isinstance(value, NonTensorStack):
            tensors[key] = value
        else:
            tensors[key] = value.contiguous()
    return get_tensordict(tensors, non_tensors)


def maybe_fix_3d_position_ids(data: TensorDict) -> None:
    """Restore the ragged dim of 3-D nested ``position_ids`` (M-RoPE) after a pickle round trip, which tensordict
    resets; without it indexing the rows fails."""
    position_ids = data.get("position_ids", None)
    if _is_nested(position_ids) and position_ids.dim() == 3:
        position_ids._ragged_idx = 2


def _check(condition: bool, message: str) -> None:
    if not condition:  # an explicit raise: this helper must also fail under ``python -O``
        raise AssertionError(message)


def assert_tensordict_eq(tensordict1: TensorDict, tensordict2: TensorDict) -> None:
    """Assert equal keys, value types and values (nested tensors row by row); AssertionError says what differs."""
    keys1, keys2 = set(tensordict1.keys()), set(tensordict2.keys())
    _check(keys1 == keys2, f"key sets differ: {sorted(keys1 ^ keys2)}")
    for key in keys1:
        a, b = tensordict1[key], tensordict2[key]
        _check(type(a) is type(b), f"{key}: {type(a).__name__} vs {type(b).__name__}")
        if _is_nested(a):
            rows_a, rows_b = a.unbind(), b.unbind()
            _check(len(rows_a) == len(rows_b), f"{key}: {len(rows_a)} vs {len(rows_b)} rows")
            for i, (x, y) in enumerate(zip(rows_a, rows_b, strict=True)):
                _check(torch.equal(x, y), f"{key}: row {i} differs")
        elif isinstance(a, torch.Tensor):
            _check(torch.equal(a, b), f"{key}: values differ")
        else:
            _check(a == b, f"{key}: {a!r} vs {b!r}")
