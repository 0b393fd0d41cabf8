"""``DataProto``: the batch that travels between the trainer (driver) and the workers.

A ``DataProto`` holds three things, all indexed by the same leading *row* dimension (one row = one sample):

* ``batch``: a ``TensorDict`` with exactly one batch dim, e.g. ``input_ids (B, S)``, ``attention_mask (B, S)``;
* ``non_tensor_batch``: ``{key: np.ndarray}`` whose first dim is ``B`` (usually ``dtype=object``: strings,
  dicts, ragged lists);
* ``meta_info``: a plain dict that is *not* indexed by row (temperature, ``metrics`` reported by workers, ...).

Every row operation (index, slice, chunk, concat, repeat, reorder) applies to ``batch`` and ``non_tensor_batch``
together, so the two never drift apart; ``check_consistency`` enforces it on construction and raises
``ValueError`` naming the offending key. Derived DataProtos get a shallow copy of ``meta_info``. The upstream
verl API (names, signatures, behaviour) is kept; where upstream mutated an argument as a side effect
(``padding`` inside DP dispatch, ``fold_batch_dim``) this module does not.

Import has no side effects: tensordict >= 0.10 already defaults to non-lazy stacking, which upstream had to
switch on globally.
"""

from __future__ import annotations

import copy
import io
import os
import pickle
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from tensordict import NonTensorData, NonTensorStack, TensorDict
from torch.utils.data import DataLoader

# Upstream helpers importable from here (``name as name`` marks a re-export). They live in verl._protocol_utils
# (TensorDict / row / serialization helpers, padding and folding) and verl._protocol_future (cross-process), which
# never import this module: the dependency runs one way.
from verl._protocol_future import DataProtoFuture as DataProtoFuture
from verl._protocol_future import all_gather_data_proto as all_gather_data_proto
from verl._protocol_utils import (
    _as_index,
    _as_key_list,
    _merge_meta_info,
    _require_keys,
    _restore_device,
    _split_bounds,
    _stack_rows,
    _to_object_array,
    _torch_save_bytes,
)
from verl._protocol_utils import deserialize_single_tensor as deserialize_single_tensor
from verl._protocol_utils import deserialize_tensordict as deserialize_tensordict
from verl._protocol_utils import fold_batch_dim as fold_batch_dim
from verl._protocol_utils import pad_dataproto_to_divisor as pad_dataproto_to_divisor
from verl._protocol_utils import serialize_single_tensor as serialize_single_tensor
from verl._protocol_utils import serialize_tensordict as serialize_tensordict
from verl._protocol_utils import unfold_batch_dim as unfold_batch_dim
from verl._protocol_utils import union_numpy_dict as union_numpy_dict
from verl._protocol_utils import union_tensor_dict as union_tensor_dict
from verl._protocol_utils import unpad_dataproto as unpad_dataproto
from verl.upstream_gaps import missing_name_getattr
from verl.utils.py_functional import list_of_dict_to_dict_of_list, union_two_dict

__all__ = ["DataProto", "union_tensor_dict"]

# Name of the dispatch-internal kwarg that carries the number of padded rows (popped by the worker group).
_padding_size_key = "_padding_size_key_x123d"


class _DataProtoConfigMeta(type):
    _config: dict[str, bool] = {}

    auto_padding_key = "_verl_auto_padding"

    @property
    def auto_padding(cls) -> bool:
        # VERL_AUTO_PADDING is upstream's process-wide switch; kept for compatibility.
        enabled_by_env = os.getenv("VERL_AUTO_PADDING", "FALSE").upper() in ("TRUE", "1")
        return enabled_by_env or cls._config.get(cls.auto_padding_key, False)

    @auto_padding.setter
    def auto_padding(cls, enabled: bool) -> None:
        if not isinstance(enabled, bool):
            raise TypeError(f"DataProtoConfig.auto_padding must be a bool, got {enabled!r}")
        cls._config[cls.auto_padding_key] = enabled


class DataProtoConfig(metaclass=_DataProtoConfigMeta):
    """Process-wide DataProto settings: ``DataProtoConfig.auto_padding = True`` lets ``chunk`` split unevenly
    and makes DP dispatch pad every batch to a multiple of the data-parallel size."""


@dataclass
class DataProtoItem:
    """One row of a DataProto: ``batch`` is a TensorDict with an empty batch size, values are per-row."""

    batch: TensorDict | None = None
    non_tensor_batch: dict = field(default_factory=dict)
    meta_info: dict = field(default_factory=dict)


@dataclass
class DataProto:
    """Rows of tensors (``batch``) and of numpy values (``non_tensor_batch``) plus row-free ``meta_info``."""

    batch: TensorDict | None = None
    non_tensor_batch: dict = field(default_factory=dict)
    meta_info: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.check_consistency()

    def __len__(self) -> int:
        if self.batch is not None:
            return self.batch.batch_size[0]
        if self.non_tensor_batch:
            return next(iter(self.non_tensor_batch.values())).shape[0]
        return 0

    def __getitem__(self, item: Any) -> DataProto | DataProtoItem:
        """``int`` -> DataProtoItem; ``slice`` -> ``slice()``; list / np.ndarray / tensor -> ``select_idxs()``."""
        if isinstance(item, slice):
            return self.slice(item.start, item.stop, item.step)
        if isinstance(item, list | np.ndarray | torch.Tensor):
            return self.select_idxs(item)
        if isinstance(item, int | np.integer):
            return DataProtoItem(
                batch=self.batch[item] if self.batch is not None else None,
                non_tensor_batch={key: val[item] for key, val in self.non_tensor_batch.items()},
                meta_info=self.meta_info,
            )
        raise TypeError(f"DataProto indexing with {type(item).__name__} is not supported")

    # ----------------------------------------------------------------------------------------- pickling

    def __getstate__(self) -> tuple:
        # Tensors travel as raw bytes + dtype + shape (see serialize_single_tensor): exact for every dtype and
        # loadable without torch.load(weights_only=False). Nested (jagged) tensors fall back to torch.save.
        batch_state = None
        if self.batch is not None:
            leaves = self.batch.values(include_nested=True, leaves_only=True)
            if all(t.layout == torch.strided for t in leaves):
                batch_state = ("raw", serialize_tensordict(self.batch))
            else:
                batch_state = ("torch", _torch_save_bytes(self.batch.contiguous()))
        return batch_state, self.non_tensor_batch, self.meta_info

    def __setstate__(self, state: tuple) -> None:
        batch_state, self.non_tensor_batch, self.meta_info = state
        self.batch = None
        if batch_state is not None:
            kind, payload = batch_state
            if kind == "raw":
                self.batch = _restore_device(deserialize_tensordict(payload), payload[1])
            else:
                self.batch = torch.load(io.BytesIO(payload), weights_only=False, map_location="cpu")

    def save_to_disk(self, filepath: str) -> None:
        """Pickle this DataProto to ``filepath``."""
        with open(filepath, "wb") as f:
            pickle.dump(self, f)

    @staticmethod
    def load_from_disk(filepath: str) -> DataProto:
        """Load a DataProto written by ``save_to_disk``."""
        with open(filepath, "rb") as f:
            return pickle.load(f)

    def print_size(self, prefix: str = "") -> None:
        """Print the memory held by the tensors and by the numpy arrays, in GB."""
        tensor_bytes = 0
        if self.batch is not None:
            tensor_bytes = sum(t.element_size() * t.numel() for t in self.batch.values(True, True))
        numpy_bytes = sum(val.nbytes for val in self.non_tensor_batch.values())
        message = (
            f"Size of tensordict: {tensor_bytes / 1024**3} GB, size of non_tensor_batch: {numpy_bytes / 1024**3} GB"
        )
        print(f"{prefix}, {message}" if prefix else message)

    # -------------------------------------------------------------------------------------- construction

    def check_consistency(self) -> None:
        """Check that ``batch`` has one batch dim and every non-tensor entry is a numpy array with one entry per
        row. Raises ``ValueError`` naming the offending key."""
        if self.batch is not None:
            if not isinstance(self.batch, TensorDict):
                raise ValueError(f"DataProto.batch must be a TensorDict or None, got {type(self.batch).__name__}")
            if len(self.batch.batch_size) != 1:
                raise ValueError(
                    f"DataProto.batch must have exactly one batch dim, got batch_size={tuple(self.batch.batch_size)}"
                    "; merge the extra dims with unfold_batch_dim or keep them as feature dims"
                )
        if not isinstance(self.non_tensor_batch, dict) or not isinstance(self.meta_info, dict):
            raise ValueError("DataProto.non_tensor_batch and DataProto.meta_info must be dicts")
        for key, val in self.non_tensor_batch.items():
            if not isinstance(val, np.ndarray) or val.ndim == 0:
                raise ValueError(
                    f"non_tensor_batch[{key!r}] must be a numpy array with one entry per row (e.g. "
                    f"np.array(values, dtype=object)), got {type(val).__name__}"
                )
        expected = len(self)
        for key, val in self.non_tensor_batch.items():
            if val.shape[0] != expected:
                raise ValueError(
                    f"non_tensor_batch[{key!r}] has {val.shape[0]} rows but the DataProto has "
                    f"{expected} (batch size); every entry needs one value per row"
                )

    @classmethod
    def from_single_dict(
        cls, data: dict[str, torch.Tensor | np.ndarray], meta_info: dict | None = None, auto_padding: bool = False
    ) -> DataProto:
        """Build from one dict: tensors go to ``batch``, numpy arrays to ``non_tensor_batch``."""
        tensors, non_tensors = {}, {}
        for key, val in data.items():
            if isinstance(val, torch.Tensor):
                tensors[key] = val
            elif isinstance(val, np.ndarray):
                non_tensors[key] = val
            else:
                raise ValueError(
                    f"from_single_dict: data[{key!r}] is a {type(val).__name__}; only torch.Tensor and np.ndarray "
                    "values are allowed (wrap lists with np.array(values, dtype=object))"
                )
        return cls.from_dict(tensors=tensors, non_tensors=non_tensors, meta_info=meta_info, auto_padding=auto_padding)

    @classmethod
    def from_dict(
        cls,
        tensors: dict[str, torch.Tensor] | None = None,
        non_tensors: dict[str, Any] | None = None,
        meta_info: dict | None = None,
        num_batch_dims: int = 1,
        auto_padding: bool = False,
    ) -> DataProto:
        """Build from tensors and non-tensors that share their leading ``num_batch_dims`` dims.

        The first dim becomes the row dim; further batch dims are only checked and stay feature dims (flatten them
        with ``unfold_batch_dim``). Non-numpy non-tensors (lists) become 1-D object arrays, one entry per row.
        ``auto_padding=True`` marks this batch for padding in DP dispatch.
        """
        if num_batch_dims < 1:
            raise ValueError(f"num_batch_dims must be >= 1, got {num_batch_dims}")
        tensors = dict(tensors or {})
        meta_info = dict(meta_info or {})
        non_tensors = {
            k: v if isinstance(v, np.ndarray) else _to_object_array(v, k) for k, v in (non_tensors or {}).items()
        }
        pivot_key, lead = None, None
        for key, tensor in tensors.items():
            if not isinstance(tensor, torch.Tensor):
                raise ValueError(f"from_dict: tensors[{key!r}] is a {type(tensor).__name__}, not a torch.Tensor")
            if tensor.dim() < num_batch_dims:
                raise ValueError(
                    f"from_dict: tensors[{key!r}] has {tensor.dim()} dims < num_batch_dims={num_batch_dims}"
                )
            if lead is None:
                pivot_key, lead = key, tuple(tensor.shape[:num_batch_dims])
            elif tuple(tensor.shape[:num_batch_dims]) != lead:
                raise ValueError(
                    f"from_dict: tensors[{key!r}] has leading dims {tuple(tensor.shape[:num_batch_dims])} but "
                    f"tensors[{pivot_key!r}] has {lead} (num_batch_dims={num_batch_dims}); all must agree"
                )
        batch = TensorDict(source=tensors, batch_size=lead[:1]) if tensors else None
        if auto_padding:
            meta_info[DataProtoConfig.auto_padding_key] = True
        return cls(batch=batch, non_tensor_batch=non_tensors, meta_info=meta_info)

    @classmethod
    def from_tensordict(
        cls, tensor_dict: TensorDict | None = None, meta_info: dict | None = None, num_batch_dims: int = 1
    ) -> DataProto:
        """Inverse of ``to_tensordict``: tensors -> batch, ``NonTensorStack`` -> object arrays,
        ``NonTensorData`` -> ``meta_info``."""
        tensors, non_tensors, meta_info = {}, {}, dict(meta_info or {})
        for key, val in tensor_dict.items() if tensor_dict is not None else []:
            if isinstance(val, NonTensorStack):
                non_tensors[key] = _to_object_array(val.tolist(), key)
            elif isinstance(val, NonTensorData):
                meta_info[key] = val.data
            elif isinstance(val, torch.Tensor):
                tensors[key] = val
            else:
                raise ValueError(
                    f"from_tensordict: entry {key!r} is a {type(val).__name__}; expected a tensor, NonTensorStack "
                    "or NonTensorData (flatten nested TensorDicts first)"
                )
        return cls.from_dict(
            tensors=tensors, non_tensors=non_tensors, meta_info=meta_info, num_batch_dims=num_batch_dims
        )

    def to_tensordict(self) -> TensorDict:
        """One TensorDict: tensors as-is, non-tensors as ``NonTensorStack``, meta_info as ``NonTensorData``."""
        tensors = dict(self.batch.items()) if self.batch is not None else {}
        clashes = (set(tensors) & set(self.non_tensor_batch)) | (set(tensors) | set(self.non_tensor_batch)) & set(
            self.meta_info
        )
        if clashes:
            raise ValueError(f"to_tensordict: keys {sorted(clashes)} appear in more than one part of the DataProto")
        out = TensorDict(tensors, batch_size=(len(self),))
        for key, val in self.non_tensor_batch.items():
            out[key] = NonTensorStack(*[NonTensorData(v) for v in val.tolist()], stack_dim=0)
        for key, val in self.meta_info.items():
            out[key] = NonTensorData(val)
        return out

    # -------------------------------------------------------------------------------------- key selection

    def to(self, device: str | torch.device) -> DataProto:
        """Move ``batch`` to ``device`` in place; returns self."""
        if self.batch is not None:
            self.batch = self.batch.to(device)
        return self

    def select(
        self,
        batch_keys: list[str] | None = None,
        non_tensor_batch_keys: list[str] | None = None,
        meta_info_keys: list[str] | None = None,
        deepcopy: bool = False,
    ) -> DataProto:
        """A DataProto with a subset of the keys (None = all). Tensors are shared with self; ``deepcopy`` copies the
        non-tensors and meta_info. Missing batch / non-tensor keys raise KeyError; missing meta keys are skipped."""
        sub_batch = self.batch
        if batch_keys is not None:
            _require_keys(batch_keys, self.batch.keys() if self.batch is not None else [], "batch")
            sub_batch = self.batch.select(*batch_keys) if self.batch is not None else None
        non_tensor = self.non_tensor_batch
        if non_tensor_batch_keys is not None:
            _require_keys(non_tensor_batch_keys, self.non_tensor_batch.keys(), "non_tensor_batch")
            non_tensor = {key: self.non_tensor_batch[key] for key in non_tensor_batch_keys}
        meta = self.meta_info
        if meta_info_keys is not None:
            meta = {key: val for key, val in self.meta_info.items() if key in meta_info_keys}
        if deepcopy:
            non_tensor, meta = copy.deepcopy(non_tensor), copy.deepcopy(meta)
        return type(self)(batch=sub_batch, non_tensor_batch=dict(non_tensor), meta_info=dict(meta))

    def pop(
        self,
        batch_keys: list[str] | None = None,
        non_tensor_batch_keys: list[str] | None = None,
        meta_info_keys: list[str] | None = None,
    ) -> DataProto:
        """Remove the given keys from self and return them as a new DataProto (KeyError if one is missing)."""
        batch_keys, non_tensor_batch_keys, meta_info_keys = (
            batch_keys or [],
            non_tensor_batch_keys or [],
            meta_info_keys or [],
        )
        _require_keys(batch_keys, self.batch.keys() if self.batch is not None else [], "batch")
        _require_keys(non_tensor_batch_keys, self.non_tensor_batch.keys(), "non_tensor_batch")
        _require_keys(meta_info_keys, self.meta_info.keys(), "meta_info")
        tensors = {key: self.batch.pop(key) for key in batch_keys}
        non_tensors = {key: self.non_tensor_batch.pop(key) for key in non_tensor_batch_keys}
        meta_info = {key: self.meta_info.pop(key) for key in meta_info_keys}
        return type(self).from_dict(tensors=tensors, non_tensors=non_tensors, meta_info=meta_info)

    def rename(self, old_keys: str | list[str] | None = None, new_keys: str | list[str] | None = None) -> DataProto:
        """Rename tensor keys of ``batch`` in place; returns self."""
        old_keys, new_keys = _as_key_list(old_keys), _as_key_list(new_keys)
        if len(old_keys) != len(new_keys):
            raise ValueError(
                f"rename: {len(old_keys)} old keys but {len(new_keys)} new keys; give one new name per key"
            )
        _require_keys(old_keys, self.batch.keys() if self.batch is not None else [], "batch")
        for old, new in zip(old_keys, new_keys):
            self.batch.rename_key_(old, new)
        return self

    def union(self, other: DataProto) -> DataProto:
        """Merge ``other`` into self in place (shared keys must be equal, sizes must match); returns self."""
        if self.batch is None:
            self.batch = other.batch
        elif other.batch is not None:
            self.batch = union_tensor_dict(self.batch, other.batch)
        if len(other) != len(self) and (other.batch is not None or other.non_tensor_batch):
            raise ValueError(f"union: DataProtos have {len(self)} and {len(other)} rows; they must be equal")
        self.non_tensor_batch = union_numpy_dict(self.non_tensor_batch, other.non_tensor_batch)
        self.meta_info = union_two_dict(self.meta_info, other.meta_info)
        self.check_consistency()
        return self

    # -------------------------------------------------------------------------------------- row selection

    def select_idxs(self, idxs: list | np.ndarray | torch.Tensor) -> DataProto:
        """Rows by integer indices or a bool mask (list, numpy or torch)."""
        idx_torch, idx_np = _as_index(idxs, len(self))
        batch = self.batch[idx_torch.to(self.batch.device or "cpu")] if self.batch is not None else None
        non_tensor = {key: val[idx_np] for key, val in self.non_tensor_batch.items()}
        return type(self)(batch=batch, non_tensor_batch=non_tensor, meta_info=dict(self.meta_info))

    def slice(self, start: int | None = None, end: int | None = None, step: int | None = None) -> DataProto:
        """Rows ``start:end:step`` as a DataProto (``data[start:end]`` does the same)."""
        rows = slice(start, end, step)
        batch = self.batch[rows] if self.batch is not None else None
        non_tensor = {key: val[rows] for key, val in self.non_tensor_batch.items()}
        return type(self)(batch=batch, non_tensor_batch=non_tensor, meta_info=dict(self.meta_info))

    def make_iterator(
        self, mini_batch_size: int, epochs: int, seed: int | None = None, dataloader_kwargs: dict | None = None
    ):
        """Iterate ``epochs`` times over mini-batches of ``mini_batch_size`` rows (a DataLoader over the rows;
        pass ``dataloader_kwargs={"shuffle": True}`` and a ``seed`` for a reproducible shuffle)."""
        if mini_batch_size < 1 or len(self) % mini_batch_size != 0:
            raise ValueError(f"make_iterator: {len(self)} rows are not divisible by mini_batch_size={mini_batch_size}")
        if dataloader_kwargs is not None and not isinstance(dataloader_kwargs, dict):
            raise ValueError(f"make_iterator: dataloader_kwargs must be a dict, got {type(dataloader_kwargs).__name__}")
        generator = torch.Generator().manual_seed(seed) if seed is not None else None
        loader = DataLoader(
            self, batch_size=mini_batch_size, collate_fn=collate_fn, generator=generator, **(dataloader_kwargs or {})
        )

        def batches():
            for _ in range(epochs):
                for mini_batch in loader:
                    mini_batch.meta_info = dict(self.meta_info)
                    yield mini_batch

        return iter(batches())

    # -------------------------------------------------------------------------------------- splitting

    def is_padding_enabled(self) -> bool:
        """True if this batch (``meta_info``) or the process (``DataProtoConfig.auto_padding``) allows padding."""
        return bool(self.meta_info.get(DataProtoConfig.auto_padding_key, False)) or DataProtoConfig.auto_padding

    def padding(self, padding_size: int, padding_candidate: str = "") -> None:
        """Append ``padding_size`` copies of the first (``padding_candidate="first"``) or last row, in place."""
        if padding_size == 0:
            return
        if len(self) == 0:
            raise ValueError("padding: cannot pad an empty DataProto (there is no row to repeat)")
        candidate = self.select_idxs([0 if padding_candidate == "first" else len(self) - 1])
        padded = DataProto.concat([self, candidate.repeat(padding_size)])
        self.batch, self.non_tensor_batch = padded.batch, padded.non_tensor_batch

    def chunk(self, chunks: int) -> list[DataProto]:
        """Split rows into ``chunks`` parts; each gets a copy of meta_info. Uneven splits (sizes differing by one,
        larger first) are only allowed when padding is enabled."""
        if not isinstance(chunks, int) or chunks < 1:
            raise ValueError(f"chunk: chunks must be a positive int, got {chunks!r}")
        if len(self) % chunks != 0 and not self.is_padding_enabled():
            raise ValueError(
                f"chunk: {len(self)} rows cannot be split into {chunks} equal chunks; make the batch size divisible, "
                "pad it (pad_dataproto_to_divisor) or enable auto padding (DataProto.from_dict(..., auto_padding=True))"
            )
        return [self.slice(start, end) for start, end in _split_bounds(len(self), chunks)]

    def split(self, split_size: int) -> list[DataProto]:
        """Consecutive pieces of ``split_size`` rows (the last one may be shorter)."""
        if split_size < 1:
            raise ValueError(f"split: split_size must be >= 1, got {split_size}")
        return [self.slice(i, i + split_size) for i in range(0, len(self), split_size)]

    @staticmethod
    def concat(data: list[DataProto]) -> DataProto:
        """Concatenate rows. meta_info is merged: equal keys must agree, except ``"metrics"``, which are gathered
        from every part into one dict of lists (``[{"loss": 1}, {"loss": 2}] -> {"loss": [1, 2]}``)."""
        if len(data) == 0:
            raise ValueError("DataProto.concat needs at least one DataProto")
        has_batch = {d.batch is not None for d in data}
        if len(has_batch) > 1:
            raise ValueError("DataProto.concat: some parts have a tensor batch and some do not")
        batch = torch.cat([d.batch for d in data], dim=0) if True in has_batch else None
        non_tensor = list_of_dict_to_dict_of_list([d.non_tensor_batch for d in data])
        non_tensor = {key: np.concatenate(parts, axis=0) for key, parts in non_tensor.items()}
        return type(data[0])(batch=batch, non_tensor_batch=non_tensor, meta_info=_merge_meta_info(data))

    # -------------------------------------------------------------------------------------- reshaping rows

    def reorder(self, indices: torch.Tensor | np.ndarray | list) -> None:
        """Permute the rows in place: row ``i`` becomes old row ``indices[i]``."""
        idx_torch, idx_np = _as_index(indices, len(self))
        if idx_np.dtype == bool or not np.array_equal(np.sort(idx_np), np.arange(len(self))):
            raise ValueError(f"reorder: indices must be a permutation of range({len(self)})")
        reordered = self.select_idxs(idx_torch)
        self.batch, self.non_tensor_batch = reordered.batch, reordered.non_tensor_batch

    def repeat(self, repeat_times: int = 2, interleave: bool = True) -> DataProto:
        """Repeat every row: ``interleave`` gives ``a a b b``, otherwise the whole batch is tiled ``a b a b``."""
        if not isinstance(repeat_times, int) or repeat_times < 1:
            raise ValueError(f"repeat: repeat_times must be a positive int, got {repeat_times!r}")

        def rep_tensor(t: torch.Tensor) -> torch.Tensor:
            return (
                t.repeat_interleave(repeat_times, dim=0) if interleave else t.repeat(repeat_times, *[1] * (t.dim() - 1))
            )

        def rep_array(a: np.ndarray) -> np.ndarray:
            return (
                np.repeat(a, repeat_times, axis=0) if interleave else np.tile(a, (repeat_times,) + (1,) * (a.ndim - 1))
            )

        return self._map_rows(rep_tensor, rep_array, len(self) * repeat_times)

    def sample_level_repeat(self, repeat_times: list[int] | tuple | np.ndarray | torch.Tensor) -> DataProto:
        """Repeat row ``i`` ``repeat_times[i]`` times (consecutively; 0 drops the row)."""
        counts = np.asarray(repeat_times.tolist() if isinstance(repeat_times, torch.Tensor) else repeat_times)
        if (
            counts.ndim != 1
            or counts.shape[0] != len(self)
            or not np.issubdtype(counts.dtype, np.integer)
            or (counts < 0).any()
        ):
            raise ValueError(
                f"sample_level_repeat: repeat_times must be {len(self)} non-negative ints (one per row), got {repeat_times!r}"
            )
        counts_t = torch.as_tensor(counts, dtype=torch.long)
        return self._map_rows(
            lambda t: t.repeat_interleave(counts_t.to(t.device), dim=0),
            lambda a: np.repeat(a, counts, axis=0),
            int(counts.sum()),
        )

    def unfold_column_chunks(self, n_split: int, split_keys: list[str] | None = None) -> DataProto:
        """Cut dim 1 of each ``split_keys`` entry into ``n_split`` pieces that become rows; other entries repeat.

        Example: ``x (B, L)`` -> ``(B * n_split, L / n_split)`` with new row ``b * n_split + j = x[b, j*L/n:(j+1)*L/n]``,
        while an unsplit ``y (B, ...)`` becomes ``y.repeat_interleave(n_split)``.
        """
        split_keys = list(split_keys or [])
        _require_keys(
            split_keys, [*(self.batch.keys() if self.batch is not None else []), *self.non_tensor_batch], "DataProto"
        )

        def unfold(key: str, val: Any) -> Any:
            if key not in split_keys:
                return (
                    val.repeat_interleave(n_split, dim=0)
                    if isinstance(val, torch.Tensor)
                    else np.repeat(val, n_split, axis=0)
                )
            if val.ndim < 2 or val.shape[1] % n_split != 0:
                raise ValueError(
                    f"unfold_column_chunks: {key!r} has shape {tuple(val.shape)}; dim 1 must divide by {n_split}"
                )
            return val.reshape(val.shape[0] * n_split, val.shape[1] // n_split, *val.shape[2:])

        rows = len(self) * n_split
        batch = None
        if self.batch is not None:
            batch = TensorDict({k: unfold(k, v) for k, v in self.batch.items()}, batch_size=(rows,))
        non_tensor = {k: unfold(k, v) for k, v in self.non_tensor_batch.items()}
        return type(self)(batch=batch, non_tensor_batch=non_tensor, meta_info=dict(self.meta_info))

    def _map_rows(self, tensor_fn: Callable, array_fn: Callable, new_len: int) -> DataProto:
        batch = None
        if self.batch is not None:
            batch = TensorDict(
                {k: tensor_fn(v) for k, v in self.batch.items()}, batch_size=(new_len,), device=self.batch.device
            )
        non_tensor = {key: array_fn(val) for key, val in self.non_tensor_batch.items()}
        return type(self)(batch=batch, non_tensor_batch=non_tensor, meta_info=dict(self.meta_info))

    def get_data_info(self) -> str:
        """A human-readable listing of keys with their shapes / dtypes / types."""
        lines = [f"DataProto with {len(self)} rows", "batch:"]
        for key, val in self.batch.items() if self.batch is not None else []:
            lines.append(f"  {key}: shape={tuple(val.shape)}, dtype={val.dtype}, device={val.device}")
        lines.append("non_tensor_batch:")
        for key, val in self.non_tensor_batch.items():
            lines.append(f"  {key}: shape={val.shape}, dtype={val.dtype}")
        lines.append("meta_info:")
        for key, val in self.meta_info.items():
            lines.append(f"  {key}: {type(val).__name__}")
        return "\n".join(lines)


# ------------------------------------------------------------------------------------------ DataLoader


def collate_fn(x: list[DataProtoItem]) -> DataProto:
    """Stack DataProtoItems (e.g. from a DataLoader over a DataProto) back into one DataProto."""
    batch = None
    if x and x[0].batch is not None:
        batch = torch.stack([item.batch for item in x]).contiguous()
    non_tensor = list_of_dict_to_dict_of_list([item.non_tensor_batch for item in x])
    return DataProto(batch=batch, non_tensor_batch={k: _stack_rows(v, k) for k, v in non_tensor.items()})


__getattr__ = missing_name_getattr(__name__)  # upstream names missing here raise with the reason (verl.upstream_gaps)
