"""Grad norm, dict-of-tensor collectives and distributed statistics (verl.utils.tensor_collectives)."""

import os
import tempfile

import pytest
import torch
import torch.distributed as dist
from tensordict import TensorDict

from verl.utils.tensor_collectives import (
    allgather_dict_into_dict,
    allgather_dict_tensors,
    broadcast_dict_tensor,
    compute_grad_norm,
    distributed_masked_mean,
    distributed_mean_max_min_std,
    split_dict_tensor_into_batches,
)
from verl.utils.testing.dist import spawn


def test_compute_grad_norm_is_squared_sum():
    """Upstream returns the squared norm: grads [3, 4] and [1] -> 9 + 16 + 1 = 26 (parameters without grad skip)."""
    a, b, c = (torch.nn.Parameter(torch.zeros(n)) for n in (2, 1, 3))
    a.grad, b.grad = torch.tensor([3.0, 4.0]), torch.tensor([1.0])
    module = torch.nn.Module()
    module.a, module.b, module.c = a, b, c
    assert compute_grad_norm(module) == 26.0


def test_split_dict_tensor_into_batches():
    """6 rows split by 2 -> 3 batches; by 4 raises ValueError (upstream asserted)."""
    td = TensorDict({"x": torch.arange(6)}, batch_size=[6])
    assert [b["x"].tolist() for b in split_dict_tensor_into_batches(td, 2)] == [[0, 1], [2, 3], [4, 5]]
    with pytest.raises(ValueError, match="divide evenly"):
        split_dict_tensor_into_batches(td, 4)


def _worker(rank, init_file, out_dir):
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=2)
    results = {}
    shared = {"b": torch.full((2,), float(rank)), "a": torch.tensor([rank * 10])}
    broadcast_dict_tensor(shared, src=1, group=None)
    results["broadcast"] = (shared["a"].tolist(), shared["b"].tolist())
    td = TensorDict({"x": torch.tensor([[rank, rank]])}, batch_size=[1])
    gathered = allgather_dict_tensors(td, size=2, group=None)
    results["gather_td"] = (gathered["x"].tolist(), list(gathered.batch_size))
    results["gather_dim1"] = allgather_dict_tensors({"y": torch.tensor([[rank]])}, size=2, group=None, dim=1)[
        "y"
    ].tolist()
    results["objects"] = allgather_dict_into_dict({"r": rank, "s": f"rank{rank}"})
    # rank 0 holds [1, 2], rank 1 holds [3, 4, 6]: mean 16/5 = 3.2, max 6, min 1,
    # unbiased std = sqrt(((1-3.2)^2 + (2-3.2)^2 + (3-3.2)^2 + (4-3.2)^2 + (6-3.2)^2) / 4) = sqrt(14.8 / 4)
    local = torch.tensor([1.0, 2.0]) if rank == 0 else torch.tensor([3.0, 4.0, 6.0])
    results["stats"] = [v.item() for v in distributed_mean_max_min_std(local)]
    results["no_std"] = distributed_mean_max_min_std(local, compute_std=False)[3]
    # masked: rank 0 keeps [1], rank 1 keeps [3, 6] -> (1 + 3 + 6) / 3
    mask = torch.tensor([1.0, 0.0]) if rank == 0 else torch.tensor([1.0, 0.0, 1.0])
    results["masked_mean"] = distributed_masked_mean(local, mask).item()
    torch.save(results, os.path.join(out_dir, f"{rank}.pt"))
    dist.destroy_process_group()


@pytest.mark.dist
def test_collectives_on_two_gloo_ranks():
    """broadcast, all-gather (TensorDict and dict, dim 0 and 1), object gather and distributed mean/max/min/std and
    masked mean over two gloo ranks give the hand-computed values on both ranks."""
    with tempfile.TemporaryDirectory() as tmp:
        spawn(_worker, args=(os.path.join(tmp, "init"), tmp), nprocs=2)
        results = [torch.load(os.path.join(tmp, f"{rank}.pt")) for rank in range(2)]
    for res in results:
        assert res["broadcast"] == ([10], [1.0, 1.0])
        assert res["gather_td"] == ([[0, 0], [1, 1]], [2])
        assert res["gather_dim1"] == [[0, 1]]
        assert res["objects"] == {"r": [0, 1], "s": ["rank0", "rank1"]}
        mean, maximum, minimum, std = res["stats"]
        assert (mean, maximum, minimum) == pytest.approx((3.2, 6.0, 1.0), abs=1e-6)
        assert std == pytest.approx((14.8 / 4) ** 0.5, abs=1e-6)
        assert res["no_std"] is None
        assert res["masked_mean"] == pytest.approx(10.0 / 3.0, abs=1e-6)
