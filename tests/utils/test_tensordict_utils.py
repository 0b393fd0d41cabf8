"""verl.utils.tensordict_utils: upstream's TensorDict helpers (``from verl.utils import tensordict_utils``).

Behaviour is checked against upstream's documented contract: lists become one-object-per-row stacks, other
non-tensors one value per batch, ``get``/``pop`` return native values, jagged nested tensors survive chunking,
concatenation and row selection, padding repeats rows from the start. Expected values are written out by hand.
"""

import pickle

import pytest
import torch
from tensordict import TensorDict
from tensordict.tensorclass import NonTensorData, NonTensorStack

from verl.utils import tensordict_utils as tu


def jagged(*lengths, start=0):
    """Rows arange(start, start + n) of the given lengths as one jagged nested tensor."""
    rows, offset = [], start
    for n in lengths:
        rows.append(torch.arange(offset, offset + n))
        offset += n
    return torch.nested.as_nested_tensor(rows, layout=torch.jagged)


def rows_of(nested):
    return [row.tolist() for row in nested.unbind()]


def test_non_tensor_values_per_row_and_per_batch():
    """A list is one object per row (nested lists/dicts kept), anything else one value for the batch; get/pop
    return them natively and pop removes the key."""
    td = TensorDict({"obs": torch.zeros(3, 2)}, batch_size=[3])
    tu.assign_non_tensor(td, turn_scores=[[], [0.5, 0.8], [0.9]], name="run_001", meta=NonTensorData({"lr": 0.1}))
    assert isinstance(td.get("turn_scores"), NonTensorStack) and isinstance(td.get("name"), NonTensorData)
    assert tu.get(td, "turn_scores") == [[], [0.5, 0.8], [0.9]]
    assert tu.get(td, "name") == "run_001" and tu.get_non_tensor_data(td, "meta", None) == {"lr": 0.1}
    assert tu.get(td, "missing", "default") == "default" and tu.unwrap_non_tensor_data(42) == 42
    assert tu.pop(td, "name") == "run_001" and "name" not in td.keys()
    assert tu.pop(td, "name", "gone") == "gone"
    with pytest.raises(TypeError, match="expected a TensorDict"):
        tu.assign_non_tensor({"a": 1}, b=2)


def test_get_tensordict_rows_metadata_and_errors():
    """Tensors and lists give the rows, non_tensor_dict the per-batch values; mismatched rows, tensors inside a
    list and a key given twice are refused naming the key."""
    td = tu.get_tensordict(
        {"obs": torch.ones(2, 4), "chat": [[{"role": "user", "content": "hi"}], []], "ids": jagged(3, 1)},
        non_tensor_dict={"temperature": 0.7},
    )
    assert td.batch_size == torch.Size([2]) and tu.get(td, "temperature") == 0.7
    assert tu.get(td, "chat") == [[{"role": "user", "content": "hi"}], []]
    assert rows_of(td["ids"]) == [[0, 1, 2], [3]]
    assert tu.get_tensordict({}, {"only_meta": 1}).batch_size == torch.Size([])
    with pytest.raises(ValueError, match="different numbers of rows"):
        tu.get_tensordict({"a": torch.ones(2), "b": ["x", "y", "z"]})
    with pytest.raises(TypeError, match="list 'a' holds tensors"):
        tu.get_tensordict({"a": [torch.ones(1), torch.ones(1)]})
    with pytest.raises(ValueError, match="'a' is given both"):
        tu.get_tensordict({"a": torch.ones(1)}, {"a": 1})


def test_nested_tensor_from_rows_of_any_rank():
    """1-D rows -> (B, j); (4, L) rows (M-RoPE position ids) -> (B, 4, j), ragged along dim 2."""
    flat = tu.nested_tensor_from_tensor_list([torch.arange(3), torch.arange(2)])
    assert flat.is_nested and flat.shape[0] == 2 and rows_of(flat) == [[0, 1, 2], [0, 1]]
    mrope = tu.nested_tensor_from_tensor_list([torch.zeros(4, 3), torch.ones(4, 5)])
    assert mrope._ragged_idx == 2 and [r.shape for r in mrope.unbind()] == [(4, 3), (4, 5)]
    with pytest.raises(ValueError, match=r"ragged_idx must be in \[1, 2\]"):
        tu.nested_tensor_from_tensor_list([torch.zeros(4, 3)], ragged_idx=3)


def test_chunk_then_concat_round_trips_jagged_and_non_tensors():
    """4 rows in 2 chunks: rows 0-1 / 2-3 of every entry (jagged rows included), per-batch metadata in both;
    concatenating the chunks gives back the original."""
    td = tu.get_tensordict(
        {"y": torch.arange(4), "ids": jagged(1, 2, 3, 4), "s": ["a", "b", "c", "d"]}, non_tensor_dict={"t": 1.0}
    )
    first, second = tu.chunk_tensordict(td, 2)
    assert first["y"].tolist() == [0, 1] and rows_of(first["ids"]) == [[0], [1, 2]]
    assert rows_of(second["ids"]) == [[3, 4, 5], [6, 7, 8, 9]] and tu.get(second, "s") == ["c", "d"]
    assert tu.get(first, "t") == tu.get(second, "t") == 1.0
    tu.assert_tensordict_eq(tu.concat_tensordict([first, second]), td)
    with pytest.raises(ValueError, match="4 rows cannot be split into 3"):
        tu.chunk_tensordict(td, 3)


def test_chunk_and_concat_3d_jagged_position_ids():
    """3-D jagged (B, 4, j) position ids split into per-chunk rows (4, L_i) and join back."""
    pos = tu.nested_tensor_from_tensor_list([torch.full((4, n), float(n)) for n in (2, 3, 1, 4)])
    td = TensorDict({"position_ids": pos}, batch_size=[4])
    parts = tu.chunk_tensordict(td, 2)
    assert [r.shape for r in parts[1]["position_ids"].unbind()] == [(4, 1), (4, 4)]
    joined = tu.concat_tensordict(parts)["position_ids"]
    assert [r[0, 0].item() for r in joined.unbind()] == [2.0, 3.0, 1.0, 4.0]
    tu.assert_tensordict_eq(tu.concat_tensordict(parts), td)


def test_index_select_keeps_jagged_rows_and_metadata():
    """Rows [2, 0]: tensors, jagged rows and per-row objects in that order; per-batch values kept."""
    td = tu.get_tensordict({"y": torch.tensor([10, 11, 12]), "ids": jagged(1, 2, 3), "s": ["a", "b", "c"]}, {"t": 3})
    picked = tu.index_select_tensor_dict(td, [2, 0])
    assert picked["y"].tolist() == [12, 10] and rows_of(picked["ids"]) == [[3, 4, 5], [0]]
    assert tu.get(picked, "s") == ["c", "a"] and tu.get(picked, "t") == 3
    assert tu.index_select_tensor_dict(None, [0]) is None
    with pytest.raises(ValueError, match="must be 1-D"):
        tu.index_select_tensor_dict(td, torch.zeros(1, 1, dtype=torch.long))


def test_pad_to_divisor_repeats_rows_from_the_start_and_unpad_drops_them():
    """10 rows, divisor 4 -> 12 rows: 0..9 then 0, 1 (pad_size 2); unpad(…, 2) gives the 10 rows back.
    A divisor larger than the batch repeats it whole: 3 rows, divisor 8 -> 0,1,2,0,1,2,0,1."""
    td = TensorDict({"y": torch.arange(10)}, batch_size=[10])
    padded, pad_size = tu.pad_to_divisor(td, 4)
    assert pad_size == 2 and padded["y"].tolist() == [*range(10), 0, 1]
    assert tu.unpad(padded, pad_size)["y"].tolist() == list(range(10))
    small, pad = tu.pad_to_divisor(TensorDict({"y": torch.arange(3)}, batch_size=[3]), 8)
    assert pad == 5 and small["y"].tolist() == [0, 1, 2, 0, 1, 2, 0, 1]
    assert tu.pad_to_divisor(td, 5) == (td, 0) and tu.unpad(td, 0) is td


def test_make_iterator_epochs_and_seeded_shuffle():
    """6 rows, mini-batches of 2, 2 epochs -> 6 mini-batches; without shuffle in order, with shuffle and a seed the
    same order every time and every row once per epoch."""
    td = TensorDict({"y": torch.arange(6)}, batch_size=[6])
    plain = [b["y"].tolist() for b in tu.make_iterator(td, 2, epochs=2)]
    assert plain == [[0, 1], [2, 3], [4, 5]] * 2
    run = [b["y"].tolist() for b in tu.make_iterator(td, 2, 1, seed=7, dataloader_kwargs={"shuffle": True})]
    again = [b["y"].tolist() for b in tu.make_iterator(td, 2, 1, seed=7, dataloader_kwargs={"shuffle": True})]
    assert run == again and sorted(sum(run, [])) == list(range(6))
    with pytest.raises(ValueError, match="not divisible by mini_batch_size=4"):
        tu.make_iterator(td, 4, 1)


def test_union_get_keys_and_pop_keys():
    """union adds new keys and refuses a conflicting shared one; get_keys copies, pop_keys moves; a missing key is
    a KeyError naming it."""
    a = tu.get_tensordict({"x": torch.arange(2)})
    b = tu.get_tensordict({"x": torch.arange(2), "z": torch.ones(2)}, {"m": "meta"})
    assert set(tu.union_tensor_dict(a, b).keys()) == {"x", "z", "m"}
    with pytest.raises(ValueError, match="'x' differs"):
        tu.union_tensor_dict(a, tu.get_tensordict({"x": torch.tensor([5, 6])}))
    subset = tu.get_keys(a, ["x", "m"])
    assert set(subset.keys()) == {"x", "m"} and tu.get(subset, "m") == "meta" and "x" in a.keys()
    moved = tu.pop_keys(a, ["z"])
    assert "z" not in a.keys() and moved["z"].tolist() == [1.0, 1.0]
    with pytest.raises(KeyError, match="'nope' not in tensordict"):
        tu.get_keys(a, ["nope"])


def test_list_of_dicts_contiguous_and_3d_fix():
    """Per-row dicts: 0-d tensors stack, other tensors are always nested (even of equal length), the rest a stack.
    contiguous() keeps metadata as metadata. After a pickle round trip the 3-D position ids are indexable again."""
    td = tu.list_of_dict_to_tensordict(
        [
            {"r": torch.tensor(1.0), "ids": torch.arange(2), "tag": "a"},
            {"r": torch.tensor(2.0), "ids": torch.arange(2), "tag": "b"},
        ]
    )
    assert td["r"].tolist() == [1.0, 2.0] and td["ids"].is_nested and tu.get(td, "tag") == ["a", "b"]
    assert isinstance(tu.contiguous(tu.get_tensordict({"x": torch.ones(2)}, {"m": 1})).get("m"), NonTensorData)
    pos = tu.nested_tensor_from_tensor_list([torch.zeros(4, 2), torch.zeros(4, 3)])
    restored = pickle.loads(pickle.dumps(TensorDict({"position_ids": pos}, batch_size=[2])))
    tu.maybe_fix_3d_position_ids(restored)
    assert restored["position_ids"]._ragged_idx == 2
    assert [r.shape for r in restored["position_ids"].unbind()] == [(4, 2), (4, 3)]


def test_assert_tensordict_eq_names_the_difference():
    a = tu.get_tensordict({"ids": jagged(2, 1)})
    b = tu.get_tensordict({"ids": jagged(2, 1, start=1)})
    with pytest.raises(AssertionError, match="ids: row 0 differs"):
        tu.assert_tensordict_eq(a, b)
    with pytest.raises(AssertionError, match="key sets differ"):
        tu.assert_tensordict_eq(a, tu.get_tensordict({"other": torch.ones(2)}))


def test_dispatch_splits_and_joins_jagged_tensordicts():
    """The single-controller DP dispatch uses these helpers: a TensorDict with a jagged tensor is split row-wise
    over 2 ranks and the per-rank outputs join back to the input."""
    from verl.single_controller.base.dispatch import concat_outputs, split_data_args

    td = tu.get_tensordict({"ids": jagged(3, 1, 2, 2), "y": torch.arange(4)}, {"temperature": 1.0})
    (shards,), _, pad = split_data_args(2, (td,), {})
    assert pad == 0 and [rows_of(s["ids"]) for s in shards] == [[[0, 1, 2], [3]], [[4, 5], [6, 7]]]
    tu.assert_tensordict_eq(concat_outputs(shards), td)
