"""DataProto: construction checks, row operations, key operations, (de)serialization and padding helpers.

Expected values are written out by hand from small inputs: rows are numbered 0..B-1 and every tensor
stores its row number so that a wrong row order shows up as a wrong number.
"""

import pickle

import numpy as np
import pytest
import torch
from tensordict import TensorDict

from verl import DataProto
from verl.protocol import (
    DataProtoConfig,
    DataProtoFuture,
    DataProtoItem,
    collate_fn,
    deserialize_tensordict,
    fold_batch_dim,
    pad_dataproto_to_divisor,
    serialize_tensordict,
    unfold_batch_dim,
    union_numpy_dict,
    union_tensor_dict,
    unpad_dataproto,
)


def make_data(rows: int = 3) -> DataProto:
    """x[i] = [2i, 2i+1] (int64), y[i] = i (float32), s[i] = "r<i>" (object), meta {"temperature": 1.0}."""
    return DataProto.from_dict(
        tensors={"x": torch.arange(2 * rows).view(rows, 2), "y": torch.arange(rows, dtype=torch.float32)},
        non_tensors={"s": np.array([f"r{i}" for i in range(rows)], dtype=object)},
        meta_info={"temperature": 1.0},
    )


def rows_of(data: DataProto) -> list[int]:
    """The original row numbers, read from y."""
    return [int(v) for v in data.batch["y"].tolist()]


# ----------------------------------------------------------------------------------------------- construction


def test_from_dict_builds_one_batch_dim_and_lengths_agree():
    """from_dict puts tensors in a 1-batch-dim TensorDict and keeps non-tensors as numpy; len is the row count."""
    data = make_data(3)
    assert data.batch.batch_size == torch.Size([3])
    assert len(data) == 3
    assert data.non_tensor_batch["s"].tolist() == ["r0", "r1", "r2"]
    assert data.meta_info == {"temperature": 1.0}


def test_len_without_tensors_and_when_empty():
    """len comes from the non-tensors when there is no tensor batch, and is 0 for an empty DataProto."""
    assert len(DataProto.from_dict(non_tensors={"s": ["a", "b"]})) == 2
    assert len(DataProto()) == 0


def test_from_dict_list_non_tensors_become_one_object_per_row():
    """Equal-length lists stay one object per row (np.array would have made a 2-D array)."""
    data = DataProto.from_dict(non_tensors={"ids": [[1, 2], [3, 4]]})
    assert data.non_tensor_batch["ids"].shape == (2,)
    assert data.non_tensor_batch["ids"][1] == [3, 4]


def test_from_dict_rejects_tensors_with_different_leading_dims():
    """Tensors that disagree on the batch dims raise ValueError naming both keys."""
    with pytest.raises(ValueError, match="'b'.*'a'"):
        DataProto.from_dict(tensors={"a": torch.zeros(3, 2), "b": torch.zeros(4, 2)})
    # with num_batch_dims=2 the second dim must agree too (3x2 vs 3x5)
    with pytest.raises(ValueError, match="num_batch_dims=2"):
        DataProto.from_dict(tensors={"a": torch.zeros(3, 2), "b": torch.zeros(3, 5)}, num_batch_dims=2)
    ok = DataProto.from_dict(tensors={"a": torch.zeros(3, 2, 4), "b": torch.zeros(3, 2)}, num_batch_dims=2)
    assert len(ok) == 3


def test_non_tensor_length_mismatch_names_the_key():
    """A non-tensor with a different row count raises ValueError naming the key."""
    with pytest.raises(ValueError, match=r"\['s'\] has 2 rows but the DataProto has 3"):
        DataProto.from_dict(tensors={"x": torch.zeros(3)}, non_tensors={"s": np.array(["a", "b"], dtype=object)})


def test_non_numpy_non_tensor_is_rejected_with_the_key():
    """Constructing with a non-numpy value in non_tensor_batch raises ValueError naming the key."""
    with pytest.raises(ValueError, match="non_tensor_batch\\['s'\\] must be a numpy array"):
        DataProto(batch=None, non_tensor_batch={"s": ["a", "b"]})
    with pytest.raises(ValueError, match="data\\['s'\\] is a list"):
        DataProto.from_single_dict({"x": torch.zeros(2), "s": ["a", "b"]})


def test_two_batch_dims_are_rejected():
    """batch must have exactly one batch dim."""
    with pytest.raises(ValueError, match="exactly one batch dim"):
        DataProto(batch=TensorDict({"x": torch.zeros(2, 3)}, batch_size=(2, 3)))


def test_from_single_dict_splits_tensors_and_arrays_and_sets_auto_padding():
    """from_single_dict sorts tensors and numpy arrays; auto_padding marks meta_info."""
    data = DataProto.from_single_dict(
        {"x": torch.zeros(2), "s": np.array(["a", "b"], dtype=object)}, meta_info={"m": 1}, auto_padding=True
    )
    assert list(data.batch.keys()) == ["x"]
    assert list(data.non_tensor_batch) == ["s"]
    assert data.meta_info == {"m": 1, DataProtoConfig.auto_padding_key: True}
    assert data.is_padding_enabled()


# ----------------------------------------------------------------------------------------------- indexing


def test_int_index_returns_item_with_row_values():
    """data[i] is a DataProtoItem holding row i (negative indices count from the end)."""
    item = make_data(3)[1]
    assert isinstance(item, DataProtoItem)
    assert item.batch["x"].tolist() == [2, 3]
    assert item.non_tensor_batch == {"s": "r1"}
    assert make_data(3)[-1].batch["x"].tolist() == [4, 5]


def test_slice_list_mask_and_tensor_indexing_select_rows():
    """Slices, int lists, numpy bool masks and torch indices pick the same rows from tensors and non-tensors."""
    data = make_data(4)
    assert rows_of(data[1:3]) == [1, 2]
    assert rows_of(data[::2]) == [0, 2]
    assert rows_of(data[[3, 0]]) == [3, 0]
    assert data[[3, 0]].non_tensor_batch["s"].tolist() == ["r3", "r0"]
    assert rows_of(data[np.array([True, False, False, True])]) == [0, 3]
    assert rows_of(data[torch.tensor([2, 2])]) == [2, 2]
    assert rows_of(data.select_idxs([False, True, True, False])) == [1, 2]
    assert len(data[[]]) == 0


def test_bad_indices_raise():
    """Unsupported index types raise TypeError; a mask of the wrong length raises ValueError."""
    data = make_data(3)
    with pytest.raises(TypeError):
        data["x"]
    with pytest.raises(ValueError, match="bool mask has 2 entries"):
        data[np.array([True, False])]


# ----------------------------------------------------------------------------------------------- serialization


def test_pickle_round_trip_is_exact_for_every_dtype():
    """Pickling keeps values and dtypes bit-exactly (bf16, bool, int, non-contiguous), plus non-tensors and meta."""
    x = torch.arange(6, dtype=torch.float32).view(2, 3).t()  # non-contiguous (3, 2)
    data = DataProto.from_dict(
        tensors={
            "x": x,
            "h": torch.tensor([0.1, 1e-3, 3.0], dtype=torch.bfloat16),
            "b": torch.tensor([True, False, True]),
        },
        non_tensors={"s": [{"k": 1}, None, "z"]},
        meta_info={"eos": [1, 2]},
    )
    back = pickle.loads(pickle.dumps(data))
    for key in ("x", "h", "b"):
        assert back.batch[key].dtype == data.batch[key].dtype
        assert torch.equal(back.batch[key], data.batch[key])
    assert back.non_tensor_batch["s"].tolist() == [{"k": 1}, None, "z"]
    assert back.meta_info == {"eos": [1, 2]}


def test_pickle_without_batch_and_save_load(tmp_path):
    """A DataProto without tensors pickles; save_to_disk / load_from_disk round-trips through a file."""
    only_np = DataProto.from_dict(non_tensors={"s": ["a"]})
    assert pickle.loads(pickle.dumps(only_np)).non_tensor_batch["s"].tolist() == ["a"]
    path = tmp_path / "batch.pkl"
    make_data(3).save_to_disk(str(path))
    loaded = DataProto.load_from_disk(str(path))
    assert loaded.batch["x"].tolist() == [[0, 1], [2, 3], [4, 5]]
    assert loaded.non_tensor_batch["s"].tolist() == ["r0", "r1", "r2"]


def test_serialize_tensordict_keeps_nested_keys():
    """serialize/deserialize_tensordict round-trips nested TensorDicts."""
    td = TensorDict(
        {"a": torch.ones(2, 1), "n": TensorDict({"b": torch.tensor([3, 4])}, batch_size=(2,))}, batch_size=(2,)
    )
    back = deserialize_tensordict(serialize_tensordict(td))
    assert back["n", "b"].tolist() == [3, 4]
    assert back["a"].tolist() == [[1.0], [1.0]]


def test_print_size_reports_bytes_in_gb(capsys):
    """print_size sums tensor bytes (x: 3*2*8 = 48, y: 3*4 = 12 -> 60) and numpy bytes (3 object pointers = 24)."""
    make_data(3).print_size(prefix="step")
    expected = f"step, Size of tensordict: {60 / 1024**3} GB, size of non_tensor_batch: {24 / 1024**3} GB"
    assert capsys.readouterr().out.strip() == expected


def test_to_and_from_tensordict_round_trip():
    """to_tensordict stores non-tensors as NonTensorStack and meta as NonTensorData; from_tensordict inverts it."""
    data = DataProto.from_dict(
        tensors={"x": torch.arange(3)}, non_tensors={"s": [[1], {"a": 2}, "c"]}, meta_info={"temperature": 0.5}
    )
    back = DataProto.from_tensordict(data.to_tensordict())
    assert back.batch["x"].tolist() == [0, 1, 2]
    assert back.non_tensor_batch["s"].tolist() == [[1], {"a": 2}, "c"]
    assert back.meta_info == {"temperature": 0.5}
    clash = DataProto.from_dict(tensors={"x": torch.arange(2)}, meta_info={"x": 1})
    with pytest.raises(ValueError, match="'x'"):
        clash.to_tensordict()


def test_get_data_info_lists_every_key():
    """get_data_info names each key with its shape / type."""
    info = make_data(3).get_data_info()
    assert "x: shape=(3, 2), dtype=torch.int64" in info
    assert "s: shape=(3,), dtype=object" in info
    assert "temperature: float" in info


# ----------------------------------------------------------------------------------------------- key operations


def test_select_shares_tensors_and_deepcopy_copies_non_tensors():
    """select keeps the chosen keys, shares tensor storage, and with deepcopy copies non-tensors and meta."""
    data = make_data(3)
    sub = data.select(batch_keys=["x"], non_tensor_batch_keys=["s"], meta_info_keys=["temperature"])
    assert list(sub.batch.keys()) == ["x"]
    assert sub.batch["x"].data_ptr() == data.batch["x"].data_ptr()
    copied = data.select(deepcopy=True)
    copied.non_tensor_batch["s"][0] = "changed"
    assert data.non_tensor_batch["s"][0] == "r0"
    with pytest.raises(KeyError, match="missing_key"):
        data.select(batch_keys=["missing_key"])
    with pytest.raises(KeyError, match="nope"):
        data.select(non_tensor_batch_keys=["nope"])


def test_pop_moves_keys_out():
    """pop removes keys from self and returns them as a DataProto; a missing key raises KeyError."""
    data = make_data(3)
    popped = data.pop(batch_keys=["x"], non_tensor_batch_keys=["s"], meta_info_keys=["temperature"])
    assert list(popped.batch.keys()) == ["x"] and list(popped.non_tensor_batch) == ["s"]
    assert popped.meta_info == {"temperature": 1.0}
    assert list(data.batch.keys()) == ["y"] and data.non_tensor_batch == {} and data.meta_info == {}
    with pytest.raises(KeyError, match="'x'"):
        data.pop(batch_keys=["x"])


def test_rename_in_place():
    """rename changes tensor key names and returns self; lengths must match."""
    data = make_data(2)
    assert data.rename("x", "z") is data
    assert sorted(data.batch.keys()) == ["y", "z"]
    data.rename(old_keys=["y", "z"], new_keys=["a", "b"])
    assert sorted(data.batch.keys()) == ["a", "b"]
    with pytest.raises(ValueError, match="2 old keys but 1 new keys"):
        data.rename(["a", "b"], ["c"])


def test_union_merges_and_rejects_conflicts():
    """union adds new keys; equal shared keys (NaN == NaN) are fine; differing ones raise ValueError naming the key."""
    left = make_data(2)
    right = DataProto.from_dict(
        tensors={"x": torch.tensor([[0, 1], [2, 3]]), "z": torch.tensor([7, 8])},
        non_tensors={"s": np.array(["r0", "r1"], dtype=object), "n": np.array([np.nan, 1.0])},
        meta_info={"temperature": 1.0, "extra": 3},
    )
    assert left.union(right) is left
    assert left.batch["z"].tolist() == [7, 8]
    assert sorted(left.meta_info) == ["extra", "temperature"]
    # same NaN-containing array again: equal, no error
    left.union(DataProto.from_dict(non_tensors={"n": np.array([np.nan, 1.0])}))
    with pytest.raises(ValueError, match="'x'"):
        make_data(2).union(DataProto.from_dict(tensors={"x": torch.zeros(2, 2, dtype=torch.long)}))
    with pytest.raises(ValueError, match="'s'"):
        make_data(2).union(DataProto.from_dict(non_tensors={"s": ["r0", "other"]}))
    with pytest.raises(ValueError, match="'temperature'"):
        make_data(2).union(DataProto(meta_info={"temperature": 0.7}))
    with pytest.raises(ValueError, match="3 rows"):
        make_data(2).union(DataProto.from_dict(non_tensors={"q": ["a", "b", "c"]}))


def test_union_helpers_directly():
    """union_tensor_dict needs equal batch sizes; union_numpy_dict compares object arrays deeply."""
    with pytest.raises(ValueError, match="identical batch sizes"):
        union_tensor_dict(TensorDict({}, batch_size=(2,)), TensorDict({}, batch_size=(3,)))
    # numbers compare by value across python / numpy types, NaN equals NaN, bools only equal bools
    assert union_numpy_dict({"n": np.array([1.0], dtype=object)}, {"n": np.array([np.float64(1.0)], dtype=object)})
    with pytest.raises(ValueError, match="'b'"):
        union_numpy_dict({"b": np.array([True], dtype=object)}, {"b": np.array([1], dtype=object)})
    a = {"o": np.array([{"k": [1, float("nan")]}], dtype=object)}
    b = {"o": np.array([{"k": [1, float("nan")]}], dtype=object)}
    assert union_numpy_dict(a, b) is a


# ----------------------------------------------------------------------------------------------- splitting


def test_chunk_equal_and_meta_copied():
    """6 rows in 3 chunks -> rows [0,1] [2,3] [4,5]; each chunk has its own copy of meta_info."""
    chunks = make_data(6).chunk(3)
    assert [rows_of(c) for c in chunks] == [[0, 1], [2, 3], [4, 5]]
    assert [c.non_tensor_batch["s"].tolist() for c in chunks][2] == ["r4", "r5"]
    chunks[0].meta_info["temperature"] = 9.0
    assert chunks[1].meta_info["temperature"] == 1.0


def test_chunk_uneven_needs_auto_padding():
    """5 rows / 3 chunks is an error unless padding is enabled; then sizes are 2, 2, 1."""
    with pytest.raises(ValueError, match="5 rows cannot be split into 3 equal chunks"):
        make_data(5).chunk(3)
    data = make_data(5)
    data.meta_info[DataProtoConfig.auto_padding_key] = True
    assert [rows_of(c) for c in data.chunk(3)] == [[0, 1], [2, 3], [4]]


def test_auto_padding_config_and_env(monkeypatch):
    """DataProtoConfig.auto_padding and env VERL_AUTO_PADDING=1 enable padding for every DataProto."""
    assert not make_data(2).is_padding_enabled()
    monkeypatch.setenv("VERL_AUTO_PADDING", "1")
    assert make_data(2).is_padding_enabled()
    monkeypatch.delenv("VERL_AUTO_PADDING")
    DataProtoConfig.auto_padding = True
    try:
        assert make_data(2).is_padding_enabled()
    finally:
        DataProtoConfig.auto_padding = False
    with pytest.raises(TypeError):
        DataProtoConfig.auto_padding = "yes"


def test_split_gives_fixed_size_pieces():
    """5 rows split by 2 -> [0,1] [2,3] [4]."""
    assert [rows_of(p) for p in make_data(5).split(2)] == [[0, 1], [2, 3], [4]]


def test_concat_rows_and_metrics_become_dict_of_lists():
    """concat joins rows in order; meta "metrics" from each part become lists, other meta must agree."""
    parts = make_data(4).chunk(2)
    parts[0].meta_info["metrics"] = {"loss": 1.0, "acc": 0.5}
    parts[1].meta_info["metrics"] = [{"loss": 2.0}, {"loss": 3.0}]
    merged = DataProto.concat(parts)
    assert rows_of(merged) == [0, 1, 2, 3]
    assert merged.non_tensor_batch["s"].tolist() == ["r0", "r1", "r2", "r3"]
    assert merged.meta_info == {"temperature": 1.0, "metrics": {"loss": [1.0, 2.0, 3.0], "acc": [0.5]}}
    parts[1].meta_info["temperature"] = 0.5
    with pytest.raises(ValueError, match="'temperature'"):
        DataProto.concat(parts)
    with pytest.raises(ValueError, match="some parts have a tensor batch"):
        DataProto.concat([make_data(1), DataProto.from_dict(non_tensors={"s": ["a"]})])


def test_padding_repeats_first_or_last_row():
    """padding(2) appends two copies of the last row; padding_candidate="first" copies row 0."""
    data = make_data(3)
    data.padding(2)
    assert rows_of(data) == [0, 1, 2, 2, 2]
    data = make_data(3)
    data.padding(1, padding_candidate="first")
    assert rows_of(data) == [0, 1, 2, 0]
    assert data.non_tensor_batch["s"].tolist() == ["r0", "r1", "r2", "r0"]


def test_pad_and_unpad_to_divisor():
    """3 rows padded to a multiple of 8 -> 5 pad rows cycling 0,1,2,0,1; unpad gives rows 0..2 back."""
    data = make_data(3)
    padded, pad_size = pad_dataproto_to_divisor(data, 8)
    assert pad_size == 5
    assert rows_of(padded) == [0, 1, 2, 0, 1, 2, 0, 1]
    assert len(data) == 3  # the input is untouched
    assert rows_of(unpad_dataproto(padded, pad_size)) == [0, 1, 2]
    same, zero = pad_dataproto_to_divisor(make_data(4), 2)
    assert zero == 0 and len(same) == 4


def test_pad_refuses_what_is_not_a_dataproto():
    """The padding helper lives below verl.protocol and checks its argument by DataProto's fields."""
    with pytest.raises(TypeError, match="pad_dataproto_to_divisor expects a DataProto, got dict"):
        pad_dataproto_to_divisor({"x": torch.zeros(3)}, 2)


# ----------------------------------------------------------------------------------------------- row reshaping


def test_reorder_permutes_in_place():
    """reorder([2,0,1]) makes row i the old row indices[i]; non-permutations raise ValueError."""
    data = make_data(3)
    data.reorder(torch.tensor([2, 0, 1]))
    assert rows_of(data) == [2, 0, 1]
    assert data.non_tensor_batch["s"].tolist() == ["r2", "r0", "r1"]
    with pytest.raises(ValueError, match="permutation"):
        data.reorder(torch.tensor([0, 0, 1]))


def test_repeat_interleave_and_tile():
    """repeat(2) -> 0 0 1 1; repeat(2, interleave=False) -> 0 1 0 1 (tensors and non-tensors alike)."""
    data = make_data(2)
    inter = data.repeat(2)
    assert rows_of(inter) == [0, 0, 1, 1]
    assert inter.batch["x"].tolist() == [[0, 1], [0, 1], [2, 3], [2, 3]]
    tiled = data.repeat(2, interleave=False)
    assert rows_of(tiled) == [0, 1, 0, 1]
    assert tiled.non_tensor_batch["s"].tolist() == ["r0", "r1", "r0", "r1"]
    with pytest.raises(ValueError):
        data.repeat(0)


def test_sample_level_repeat_per_row_counts():
    """Counts [0, 2, 1] -> rows 1 1 2 (row 0 dropped)."""
    data = make_data(3)
    out = data.sample_level_repeat([0, 2, 1])
    assert rows_of(out) == [1, 1, 2]
    assert out.non_tensor_batch["s"].tolist() == ["r1", "r1", "r2"]
    assert rows_of(data.sample_level_repeat(torch.tensor([1, 1, 1]))) == [0, 1, 2]
    with pytest.raises(ValueError, match="3 non-negative ints"):
        data.sample_level_repeat([1, 1])


def test_unfold_column_chunks_moves_column_pieces_into_rows():
    """x (2, 4) split in 2 -> rows x[0,:2], x[0,2:], x[1,:2], x[1,2:]; y (unsplit) repeats: 0 0 1 1."""
    data = DataProto.from_dict(
        tensors={"x": torch.tensor([[0, 1, 2, 3], [4, 5, 6, 7]]), "y": torch.tensor([0.0, 1.0])},
        non_tensors={"s": ["a", "b"]},
    )
    out = data.unfold_column_chunks(2, split_keys=["x"])
    assert out.batch["x"].tolist() == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert out.batch["y"].tolist() == [0.0, 0.0, 1.0, 1.0]
    assert out.non_tensor_batch["s"].tolist() == ["a", "a", "b", "b"]
    with pytest.raises(ValueError, match="dim 1 must divide by 3"):
        data.unfold_column_chunks(3, split_keys=["x"])


def test_fold_and_unfold_batch_dim():
    """fold 4 rows into 2 groups of 2 (x: (4,2) -> (2,2,2)), unfold gives the same rows back."""
    data = make_data(4)
    folded = fold_batch_dim(data, 2)
    assert folded.batch["x"].shape == (2, 2, 2)
    assert folded.batch["x"][1].tolist() == [[4, 5], [6, 7]]
    assert folded.non_tensor_batch["s"].tolist() == [["r0", "r1"], ["r2", "r3"]]
    assert len(data) == 4 and data.non_tensor_batch["s"].shape == (4,)  # input untouched
    unfolded = unfold_batch_dim(folded, batch_dims=2)
    assert rows_of(unfolded) == [0, 1, 2, 3]
    assert unfolded.non_tensor_batch["s"].tolist() == ["r0", "r1", "r2", "r3"]
    with pytest.raises(ValueError, match="4 rows cannot be folded into 3"):
        fold_batch_dim(data, 3)


# ----------------------------------------------------------------------------------------------- iteration


def test_make_iterator_epochs_and_seeded_shuffle():
    """Without shuffle: mini-batches in row order, repeated per epoch; with a seed: the same permutation twice,
    each epoch covering every row exactly once; meta_info travels with every mini-batch."""
    data = make_data(4)
    batches = list(data.make_iterator(mini_batch_size=2, epochs=2))
    assert [rows_of(b) for b in batches] == [[0, 1], [2, 3], [0, 1], [2, 3]]
    assert batches[0].non_tensor_batch["s"].tolist() == ["r0", "r1"]
    assert all(b.meta_info == {"temperature": 1.0} for b in batches)

    def shuffled():
        it = data.make_iterator(2, epochs=1, seed=7, dataloader_kwargs={"shuffle": True})
        return [r for b in it for r in rows_of(b)]

    first = shuffled()
    assert first == shuffled()
    assert sorted(first) == [0, 1, 2, 3]
    with pytest.raises(ValueError, match="not divisible by mini_batch_size=3"):
        data.make_iterator(3, epochs=1)


def test_collate_fn_keeps_numeric_dtypes():
    """collate_fn stacks items; numeric numpy non-tensors keep their dtype, objects stay one per row."""
    data = DataProto.from_dict(
        tensors={"x": torch.arange(2)}, non_tensors={"n": np.array([1.5, 2.5]), "o": [[1], [2, 3]]}
    )
    out = collate_fn([data[0], data[1]])
    assert out.batch["x"].tolist() == [0, 1]
    assert out.non_tensor_batch["n"].dtype == np.float64
    assert out.non_tensor_batch["n"].tolist() == [1.5, 2.5]
    assert out.non_tensor_batch["o"].tolist() == [[1], [2, 3]]


def test_to_moves_batch_and_returns_self():
    """to(device) moves tensors in place and returns the same object."""
    data = make_data(2)
    assert data.to("cpu") is data
    assert data.batch["x"].device.type == "cpu"


def test_data_proto_future_chunks_resolve_lazily(monkeypatch):
    """Future chunk i resolves to concat(parts).chunk(n)[i] (ray.get replaced by identity for this test)."""
    import ray

    monkeypatch.setattr(ray, "get", lambda refs: refs)
    future = DataProtoFuture.concat(make_data(4).chunk(2))
    pieces = future.chunk(2)
    assert [rows_of(p.get()) for p in pieces] == [[0, 1], [2, 3]]
    assert rows_of(future.get()) == [0, 1, 2, 3]
    with pytest.raises(TypeError, match="future 0 resolved to a int"):
        DataProtoFuture.concat([1]).get()
    with pytest.raises(ValueError, match="no futures to concatenate"):
        DataProtoFuture.concat([]).get()
