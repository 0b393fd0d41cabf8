"""The building blocks under ``verl.protocol``: helpers on TensorDicts, numpy row arrays and serialized tensors,
and the whole-DataProto reshaping functions, none of which imports the ``DataProto`` class.

* union of tensor / numpy dicts with deep equality (NaN == NaN, object arrays compared element-wise), and the
  meta_info merge of ``DataProto.concat``; key-list checks;
* a dtype-exact tensor serialization (raw bytes + dtype + shape; bf16 included) used to pickle DataProtos
  without ``torch.load(weights_only=False)`` on the receiving side;
* row conversions: sequences -> 1-D object arrays, index normalization, near-equal chunk bounds;
* whole-DataProto reshaping (pad / unpad to a divisor, fold / unfold batch dims) through the DataProto's own
  public methods and ``type(data)``.

``verl.protocol`` imports this module, never the other way round; public names are re-exported from
``verl.protocol`` (their upstream home).
"""

from __future__ import annotations

import io
import logging
import numbers
from typing import Any

import numpy as np
import torch
from tensordict import TensorDict

logger = logging.getLogger(__name__)

# --------------------------------------------------------------------------------------------- union helpers


def union_tensor_dict(tensor_dict1: TensorDict, tensor_dict2: TensorDict) -> TensorDict:
    """Add the keys of ``tensor_dict2`` to ``tensor_dict1`` (in place) and return it.

    Raises:
        ValueError: if the batch sizes differ or a shared key holds different tensors.
    """
    if tensor_dict1.batch_size != tensor_dict2.batch_size:
        raise ValueError(
            f"union of DataProto batches needs identical batch sizes, got {tuple(tensor_dict1.batch_size)} "
            f"and {tuple(tensor_dict2.batch_size)}"
        )
    for key in tensor_dict2.keys():
        if key not in tensor_dict1.keys():
            tensor_dict1[key] = tensor_dict2[key]
        elif not _tensors_equal(tensor_dict1[key], tensor_dict2[key]):
            raise ValueError(
                f"union of DataProto batches: key {key!r} exists on both sides with different values; "
                "pop or rename it on one side first"
            )
    return tensor_dict1


def _tensors_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and a.dtype == b.dtype and bool(torch.equal(a, b.to(a.device)))


def _deep_equal(a: Any, b: Any) -> bool:
    """Structural equality where NaN == NaN, numpy arrays compare by dtype/shape/content (recursively for
    ``dtype=object``), dicts / lists / tuples compare element-wise, and real numbers compare by value
    (``1.0 == np.float64(1.0)``; bools only equal bools)."""
    if _is_real(a) and _is_real(b) and isinstance(a, bool | np.bool_) == isinstance(b, bool | np.bool_):
        return bool(a == b) or (a != a and b != b)  # NaN is the only value not equal to itself
    if type(a) is not type(b):
        return False
    if isinstance(a, np.ndarray):
        if a.dtype != b.dtype or a.shape != b.shape:
            return False
        if a.dtype == object:
            return all(_deep_equal(x, y) for x, y in zip(a.flat, b.flat))
        return bool(np.array_equal(a, b, equal_nan=a.dtype.kind in "fc"))
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_deep_equal(a[k], b[k]) for k in a)
    if isinstance(a, list | tuple):
        return len(a) == len(b) and all(_deep_equal(x, y) for x, y in zip(a, b))
    if isinstance(a, torch.Tensor):
        return _tensors_equal(a, b)
    return bool(a == b)


def _is_real(x: Any) -> bool:
    return isinstance(x, numbers.Real | np.bool_)


def union_numpy_dict(tensor_dict1: dict[str, np.ndarray], tensor_dict2: dict[str, np.ndarray]) -> dict:
    """Add the entries of ``tensor_dict2`` to ``tensor_dict1`` (in place) and return it.

    Raises:
        ValueError: if a shared key holds arrays that are not deeply equal (NaN counts as equal to NaN).
    """
    for key, val in tensor_dict2.items():
        if key in tensor_dict1 and not _deep_equal(tensor_dict1[key], val):
            raise ValueError(
                f"union of DataProto non_tensor_batch: key {key!r} exists on both sides with different values; "
                "pop or rename it on one side first"
            )
        tensor_dict1[key] = val
    return tensor_dict1


def _require_keys(keys: Any, available: Any, where: str) -> None:
    available = list(available)
    missing = [key for key in keys if key not in available]
    if missing:
        raise KeyError(f"{where} has no key(s) {missing}; available: {available}")


def _as_key_list(keys: str | list[str] | tuple | None) -> list[str]:
    if keys is None:
        return []
    if isinstance(keys, str):
        return [keys]
    if isinstance(keys, list | tuple):
        return list(keys)
    raise TypeError(f"keys must be a str or a list of str, got {type(keys).__name__}")


def _merge_meta_info(data: list[Any]) -> dict:
    """meta_info of concatenated parts: shared keys must agree; ``metrics`` become a dict of lists over parts
    (a part's ``metrics`` may be a dict or a list of dicts; keys missing from a part are simply not appended)."""
    merged: dict = {}
    all_metrics: list[dict] = []
    for part in data:
        for key, val in part.meta_info.items():
            if key == "metrics":
                if val is not None:
                    all_metrics.extend(val if isinstance(val, list) else [val])
            elif key in merged and not _deep_equal(merged[key], val):
                raise ValueError(
                    f"DataProto.concat: meta_info[{key!r}] differs between parts ({merged[key]!r} vs {val!r})"
                )
            else:
                merged[key] = val
    if all_metrics:
        metrics: dict[str, list] = {}
        for entry in all_metrics:
            for key, val in entry.items():
                metrics.setdefault(key, []).append(val)
        merged["metrics"] = metrics
    return merged


# ------------------------------------------------------------------------------------------- serialization


def serialize_single_tensor(tensor: torch.Tensor) -> tuple[str, tuple[int, ...], np.ndarray]:
    """``tensor -> (dtype name, shape, raw bytes as a uint8 numpy array)``; works for every dtype incl. bf16."""
    flat = tensor.detach().to("cpu").contiguous().reshape(-1)
    return str(flat.dtype).removeprefix("torch."), tuple(tensor.shape), flat.view(torch.uint8).numpy()


def deserialize_single_tensor(encoded: tuple[str, tuple[int, ...], np.ndarray]) -> torch.Tensor:
    """Inverse of ``serialize_single_tensor`` (the result is on the CPU)."""
    dtype_name, shape, raw = encoded
    raw = np.array(raw, dtype=np.uint8, copy=True)  # own, writable memory for torch.from_numpy
    return torch.from_numpy(raw).view(getattr(torch, dtype_name)).reshape(shape)


def serialize_tensordict(batch: TensorDict) -> tuple[tuple[int, ...], str | None, dict]:
    """``TensorDict -> (batch_size, device, {key: serialize_single_tensor(leaf)})``; nested keys are tuples."""
    encoded = {key: serialize_single_tensor(val) for key, val in batch.items(include_nested=True, leaves_only=True)}
    device = None if batch.device is None else str(batch.device)
    return tuple(batch.batch_size), device, encoded


def deserialize_tensordict(encoded: tuple[tuple[int, ...], str | None, dict]) -> TensorDict:
    """Inverse of ``serialize_tensordict``; tensors land on the CPU (see ``DataProto.__setstate__``)."""
    batch_size, _device, items = encoded
    batch = TensorDict({}, batch_size=batch_size)
    for key, val in items.items():
        batch[key] = deserialize_single_tensor(val)
    return batch


def _torch_save_bytes(obj: Any) -> bytes:
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    return buffer.getvalue()


def _restore_device(batch: TensorDict, device: str | None) -> TensorDict:
    # Go back to the sender's accelerator only if this process runs on that kind of device; a driver without
    # accelerators (or a CPU test) keeps the data on the CPU instead of failing.
    if device is None or device == "cpu":
        return batch
    from verl.utils.device import get_device_name

    return batch.to(device) if torch.device(device).type == get_device_name() else batch


# ------------------------------------------------------------------------------------------ row conversions


def _to_object_array(values: Any, key: str) -> np.ndarray:
    """A sequence of per-row values -> 1-D ``dtype=object`` array (rows stay whole, even if they are lists)."""
    if isinstance(values, str | bytes | dict) or not hasattr(values, "__len__"):
        raise ValueError(
            f"non_tensor_batch[{key!r}] must be a numpy array or a sequence with one entry per row, got "
            f"{type(values).__name__}"
        )
    out = np.empty(len(values), dtype=object)
    for i, value in enumerate(values):
        out[i] = value
    return out


def _stack_rows(rows: list[Any], key: str) -> np.ndarray:
    """Rows taken out of a non-tensor array -> array again, keeping the dtype when the rows are numpy values."""
    if rows and all(isinstance(row, np.ndarray) for row in rows):
        return np.stack(rows)
    if rows and all(isinstance(row, np.generic) for row in rows):
        return np.array(rows)
    return _to_object_array(rows, key)


def _as_index(idxs: Any, length: int) -> tuple[torch.Tensor, np.ndarray]:
    """list / np.ndarray / torch.Tensor of int indices or a bool mask -> (torch index, numpy index)."""
    if isinstance(idxs, list | tuple):
        is_bool = len(idxs) > 0 and all(isinstance(i, bool | np.bool_) for i in idxs)
        idxs = np.asarray(idxs, dtype=bool if is_bool else np.int64)
    if isinstance(idxs, np.ndarray):
        idx_np, idx_torch = idxs, torch.from_numpy(np.ascontiguousarray(idxs))
    elif isinstance(idxs, torch.Tensor):
        idx_torch, idx_np = idxs, idxs.detach().cpu().numpy()
    else:
        raise TypeError(f"DataProto indices must be a list, np.ndarray or torch.Tensor, got {type(idxs).__name__}")
    if idx_np.ndim != 1:
        raise ValueError(f"DataProto indices must be 1-D, got shape {idx_np.shape}")
    if idx_np.dtype == bool and idx_np.shape[0] != length:
        raise ValueError(f"DataProto bool mask has {idx_np.shape[0]} entries but the DataProto has {length} rows")
    if idx_np.dtype != bool and not np.issubdtype(idx_np.dtype, np.integer):
        raise TypeError(f"DataProto indices must be integers or bools, got dtype {idx_np.dtype}")
    return idx_torch, idx_np


def _split_bounds(length: int, chunks: int) -> list[tuple[int, int]]:
    """Row ranges of ``chunks`` near-equal parts (sizes differ by at most one, larger parts first)."""
    base, extra = divmod(length, chunks)
    bounds, start = [], 0
    for i in range(chunks):
        end = start + base + (1 if i < extra else 0)
        bounds.append((start, end))
        start = end
    return bounds


# ------------------------------------------------------------------------------- whole-DataProto reshaping
# These use only DataProto's public surface (len, slice, concat, the three fields, its constructor through
# ``type(data)``), so they need no import of the class and keep a subclass's type.


def is_dataproto_like(obj: Any) -> bool:
    """True for a ``DataProto`` (or anything with its three fields and row operations)."""
    return all(hasattr(obj, name) for name in ("batch", "non_tensor_batch", "meta_info", "slice", "concat"))


def pad_dataproto_to_divisor(data: Any, size_divisor: int) -> tuple[Any, int]:
    """Append copies of the leading rows until ``len(data) % size_divisor == 0``.

    Returns:
        (padded, pad_size): ``padded`` is a new DataProto (``data`` itself when no padding is needed);
        ``unpad_dataproto(padded, pad_size)`` gives the original rows back.
    """
    if not is_dataproto_like(data):
        raise TypeError(f"pad_dataproto_to_divisor expects a DataProto, got {type(data).__name__}")
    if size_divisor < 1:
        raise ValueError(f"size_divisor must be >= 1, got {size_divisor}")
    if len(data) % size_divisor == 0:
        if len(data) == 0:
            logger.warning("pad_dataproto_to_divisor: the DataProto is empty, nothing to pad")
        return data, 0
    pad_size = size_divisor - len(data) % size_divisor
    parts, remaining = [data], pad_size
    while remaining > 0:  # the pad can be longer than the data (e.g. 3 rows padded to 8)
        take = min(remaining, len(data))
        parts.append(data.slice(0, take))
        remaining -= take
    return type(data).concat(parts), pad_size


def unpad_dataproto(data: Any, pad_size: int) -> Any:
    """Drop the last ``pad_size`` rows (``data[:-pad_size]``)."""
    return data.slice(0, len(data) - pad_size) if pad_size != 0 else data


def fold_batch_dim(data: Any, new_batch_size: int) -> Any:
    """Rows ``(B, ...) -> (new_batch_size, B // new_batch_size, ...)``: each new row groups consecutive rows."""
    batch_size = len(data)
    if new_batch_size < 1 or batch_size % new_batch_size != 0:
        raise ValueError(f"fold_batch_dim: {batch_size} rows cannot be folded into {new_batch_size} equal groups")
    batch = None
    if data.batch is not None:
        folded = {key: val.reshape(new_batch_size, -1, *val.shape[1:]) for key, val in data.batch.items()}
        batch = TensorDict(folded, batch_size=(new_batch_size,))
    non_tensor = {key: val.reshape(new_batch_size, -1, *val.shape[1:]) for key, val in data.non_tensor_batch.items()}
    return type(data)(batch=batch, non_tensor_batch=non_tensor, meta_info=dict(data.meta_info))


def unfold_batch_dim(data: Any, batch_dims: int = 2) -> Any:
    """Merge the first ``batch_dims`` dims of every entry into the row dim (inverse of ``fold_batch_dim``)."""
    batch = None
    if data.batch is not None:
        tensors = dict(data.batch.items())
        leads = {tuple(val.shape[:batch_dims]) for val in tensors.values()}
        if len(leads) > 1:
            raise ValueError(f"unfold_batch_dim: tensors disagree on their first {batch_dims} dims: {sorted(leads)}")
        rows = int(np.prod(next(iter(leads)))) if leads else len(data)
        batch = TensorDict({k: v.reshape(rows, *v.shape[batch_dims:]) for k, v in tensors.items()}, batch_size=(rows,))
    non_tensor = {key: val.reshape(-1, *val.shape[batch_dims:]) for key, val in data.non_tensor_batch.items()}
    return type(data)(batch=batch, non_tensor_batch=non_tensor, meta_info=dict(data.meta_info))
