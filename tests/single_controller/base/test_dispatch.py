"""Dispatch / collect pairs as pure functions, on a fake worker group (no Ray, no workers).

Rows carry their own index in ``y`` so the expected shard contents can be written by hand.
"""

import pytest
import torch
from tensordict import TensorDict

from verl import DataProto
from verl.protocol import _padding_size_key
from verl.single_controller.base import dispatch as d
from verl.single_controller.base.decorator import Dispatch, get_predefined_dispatch_fn


class FakeGroup:
    """world_size ranks; mesh layouts given as {mesh: (dp ranks, collect flags)}."""

    def __init__(self, world_size, meshes=None):
        self.world_size = world_size
        self._dispatch_info, self._collect_info = {}, {}
        self._meshes = meshes or {}
        self.queries = 0
        self.shared = []

    def _query_dispatch_info(self, mesh):
        self.queries += 1
        return self._meshes[mesh][0]

    def _query_collect_info(self, mesh):
        return self._meshes[mesh][1]

    def _share(self, obj):
        self.shared.append(obj)
        return obj


def rows(n, padding=False):
    return DataProto.from_dict(
        tensors={"y": torch.arange(n)}, non_tensors={"s": [f"r{i}" for i in range(n)]}, auto_padding=padding
    )


def ys(data):
    return data.batch["y"].tolist()


def test_one_to_all_replicates_and_all_to_all_passes_through():
    """ONE_TO_ALL gives every rank every argument; ALL_TO_ALL and its collect leave values unchanged."""
    args, kwargs = d.dispatch_one_to_all(FakeGroup(3), 1, key="v")
    assert args == ([1, 1, 1],) and kwargs == {"key": ["v", "v", "v"]}
    assert d.dispatch_all_to_all(FakeGroup(3), 1, k=2) == ((1,), {"k": 2})
    assert d.collect_all_to_all(FakeGroup(3), [1, 2, 3]) == [1, 2, 3]


def test_rank_zero_collect_takes_first_output():
    """RANK_ZERO keeps rank 0's value whether it gets a per-rank list or a single output."""
    fns = get_predefined_dispatch_fn(Dispatch.RANK_ZERO)
    assert fns["collect_fn"](FakeGroup(2), ["a", "b"]) == "a"
    assert fns["collect_fn"](FakeGroup(2), "only") == "only"


def test_dp_compute_requires_per_rank_lists():
    """DP_COMPUTE args must already have one entry per rank; collect checks the count."""
    assert d.dispatch_dp_compute(FakeGroup(2), [1, 2], x=(3, 4)) == (([1, 2],), {"x": (3, 4)})
    with pytest.raises(ValueError, match="argument 0 must be a list with one entry per rank \\(2\\)"):
        d.dispatch_dp_compute(FakeGroup(2), [1, 2, 3])
    with pytest.raises(RuntimeError, match="expected 2 outputs, got 1"):
        d.collect_dp_compute(FakeGroup(2), [1])


def test_dp_compute_proto_splits_and_concats():
    """6 rows over 3 ranks -> [0,1] [2,3] [4,5]; collecting the shards gives rows 0..5 back."""
    group = FakeGroup(3)
    args, kwargs = d.dispatch_dp_compute_data_proto(group, rows(6), extra=rows(6))
    assert [ys(s) for s in args[0]] == [[0, 1], [2, 3], [4, 5]]
    assert [ys(s) for s in kwargs["extra"]] == [[0, 1], [2, 3], [4, 5]]
    assert _padding_size_key not in kwargs
    assert ys(d.collect_dp_compute_data_proto(group, args[0])) == [0, 1, 2, 3, 4, 5]


def test_dp_compute_proto_auto_padding_pads_a_copy():
    """5 padded rows over 2 ranks: one pad row (copy of row 4) -> shards [0,1,2] [3,4,4]; pad size 1 is
    reported; the caller's DataProto keeps 5 rows. Without padding enabled the same call raises."""
    data = rows(5, padding=True)
    args, kwargs = d.dispatch_dp_compute_data_proto(FakeGroup(2), data)
    assert [ys(s) for s in args[0]] == [[0, 1, 2], [3, 4, 4]]
    assert args[0][1].non_tensor_batch["s"].tolist() == ["r3", "r4", "r4"]
    assert kwargs[_padding_size_key] == 1
    assert len(data) == 5
    with pytest.raises(ValueError, match="5 rows cannot be split into 2 equal chunks"):
        d.dispatch_dp_compute_data_proto(FakeGroup(2), rows(5))


def test_dp_compute_proto_rejects_non_data_arguments():
    """A plain value in a DP_COMPUTE_PROTO call raises TypeError naming the argument."""
    with pytest.raises(TypeError, match="argument 'lr' is a float"):
        d.dispatch_dp_compute_data_proto(FakeGroup(2), rows(2), lr=0.1)


def test_dp_compute_proto_splits_tensordicts():
    """TensorDict arguments are chunked too, and TensorDict outputs concatenated."""
    td = TensorDict({"y": torch.arange(4)}, batch_size=(4,))
    args, _ = d.dispatch_dp_compute_data_proto(FakeGroup(2), td)
    assert [a["y"].tolist() for a in args[0]] == [[0, 1], [2, 3]]
    assert d.collect_dp_compute_data_proto(FakeGroup(2), args[0])["y"].tolist() == [0, 1, 2, 3]


def test_dp_compute_proto_with_func_broadcasts_the_function():
    """The first argument (a function) goes to every rank; the data is split."""

    def fn(worker, data):
        return data

    args, _ = d.dispatch_dp_compute_data_proto_with_func(FakeGroup(2), fn, rows(4))
    assert args[0] == [fn, fn]
    assert [ys(s) for s in args[1]] == [[0, 1], [2, 3]]
    with pytest.raises(TypeError, match="first argument must be a function"):
        d.dispatch_dp_compute_data_proto_with_func(FakeGroup(2), rows(4))


def test_dp_compute_metric_splits_in_and_lists_out():
    """DP_COMPUTE_METRIC splits data like DP_COMPUTE_PROTO and returns the per-rank outputs as a list."""
    fns = get_predefined_dispatch_fn(Dispatch.DP_COMPUTE_METRIC)
    args, _ = fns["dispatch_fn"](FakeGroup(2), rows(2))
    assert [ys(s) for s in args[0]] == [[0], [1]]
    assert fns["collect_fn"](FakeGroup(2), [{"loss": 1.0}, {"loss": 2.0}]) == [{"loss": 1.0}, {"loss": 2.0}]


def test_direct_rollout_method_is_forbidden():
    """DIRECT_ROLLOUT_METHOD cannot be called through a worker group."""
    with pytest.raises(NotImplementedError):
        get_predefined_dispatch_fn(Dispatch.DIRECT_ROLLOUT_METHOD)["dispatch_fn"](FakeGroup(1))


def test_concat_outputs_rejects_mixed_results():
    """A DataProto-collecting method whose ranks return other things raises TypeError."""
    with pytest.raises(TypeError, match="every rank must return a DataProto"):
        d.concat_outputs([rows(1), {"a": 1}])


# ------------------------------------------------------------------------------------------- n-d mesh


def test_nd_dispatch_sends_dp_shards_and_collects_once_per_dp_rank():
    """4 ranks as dp=2 x tp=2: dp ranks [0,0,1,1], collectors ranks 0 and 2.
    4 rows -> dp shard 0 = rows [0,1] to ranks 0,1; shard 1 = rows [2,3] to ranks 2,3 (each shard shared once).
    Collect keeps ranks 0 and 2 in dp order -> rows 0..3; the layout is queried once and cached."""
    group = FakeGroup(4, {"actor": ([0, 0, 1, 1], [True, False, True, False])})
    fns = d.make_nd_compute_dataproto_dispatch_fn("actor")
    args, kwargs = fns["dispatch_fn"](group, rows(4))
    assert [ys(s) for s in args[0]] == [[0, 1], [0, 1], [2, 3], [2, 3]]
    assert args[0][0] is args[0][1]  # one shared object per dp shard
    assert len(group.shared) == 2
    outputs = [args[0][0], "ignored", args[0][2], "ignored"]
    assert ys(fns["collect_fn"](group, outputs)) == [0, 1, 2, 3]
    fns["dispatch_fn"](group, rows(4))
    assert group.queries == 1


def test_nd_collect_orders_by_dp_rank_and_strips_nothing_without_padding():
    """Collectors listed in an order different from dp order are concatenated by dp rank."""
    group = FakeGroup(2, {"m": ([1, 0], [True, True])})
    fns = d.make_nd_compute_dataproto_dispatch_fn("m")
    args, _ = fns["dispatch_fn"](group, rows(4))
    assert [ys(s) for s in args[0]] == [[2, 3], [0, 1]]
    assert ys(fns["collect_fn"](group, args[0])) == [0, 1, 2, 3]


def test_nd_dispatch_pads_to_dp_size():
    """3 padded rows on dp=2: pad one row -> shards [0,1] and [2,2]; pad size 1 reported."""
    group = FakeGroup(2, {"m": ([0, 1], [True, True])})
    args, kwargs = d.make_nd_compute_dataproto_dispatch_fn("m")["dispatch_fn"](group, rows(3, padding=True))
    assert [ys(s) for s in args[0]] == [[0, 1], [2, 2]]
    assert kwargs[_padding_size_key] == 1


def test_nd_layout_errors_name_the_mesh():
    """A dp group without exactly one collector, or dp ranks with a gap, raise RuntimeError naming the mesh."""
    fns = d.make_nd_compute_dataproto_dispatch_fn("bad")
    with pytest.raises(RuntimeError, match="mesh 'bad': exactly one collecting rank per dp rank"):
        fns["dispatch_fn"](FakeGroup(2, {"bad": ([0, 0], [True, True])}), rows(2))
    with pytest.raises(RuntimeError, match="mesh 'bad': dp ranks \\[0, 2\\] do not cover 0..2"):
        fns["dispatch_fn"](FakeGroup(2, {"bad": ([0, 2], [True, True])}), rows(2))


def test_split_data_args_requires_equal_padded_lengths():
    """Two auto-padded DataProtos of different lengths in one call raise ValueError."""
    with pytest.raises(ValueError, match="equal lengths"):
        d.split_data_args(2, (rows(3, padding=True), rows(5, padding=True)), {})
