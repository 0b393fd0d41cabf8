"""The simulated hccl backend on 2 processes: collective results, HCCL's device/contiguity rules, FSDP2 on npu."""

import os
import tempfile

import pytest
import torch
import torch.distributed as dist
import torch.nn as nn

from verl.utils.testing.dist import spawn

pytestmark = pytest.mark.dist
WORLD = 2


def _init(rank: int, init_file: str, backend: str) -> torch.device:
    from verl.utils.device import get_nccl_backend
    from verl.utils.platform.npu_sim import install

    install(device_count=WORLD)
    torch.npu.set_device(rank)
    backend = backend or get_nccl_backend()
    dist.init_process_group(backend, init_method=f"file://{init_file}", rank=rank, world_size=WORLD)
    return torch.device("npu", rank)


def _collectives_worker(rank: int, init_file: str, out_dir: str) -> None:
    device = _init(rank, init_file, backend="")
    results = {"backend": dist.get_backend()}
    t = torch.full((3,), float(rank + 1), device=device)
    dist.all_reduce(t)  # 1 + 2 = 3 everywhere
    results["all_reduce"] = (t.device.type, t.cpu().tolist())
    gathered = torch.empty(4, device=device)
    dist.all_gather_into_tensor(gathered, torch.full((2,), float(rank), device=device))  # [0,0 | 1,1]
    results["all_gather"] = gathered.cpu().tolist()
    scattered = torch.empty(2, device=device)
    dist.reduce_scatter_tensor(scattered, torch.arange(4.0, device=device))  # 2·[0,1,2,3] split by rank
    results["reduce_scatter"] = scattered.cpu().tolist()
    objects = [None] * WORLD
    dist.all_gather_object(objects, {"rank": rank})
    results["objects"] = objects
    for name, bad in (("cpu", torch.ones(2)), ("strided", torch.ones(2, 2, device=device).t()[0])):
        try:
            dist.all_reduce(bad)
            results[name] = "accepted"
        except RuntimeError as e:
            results[name] = str(e)
    dist.barrier()
    dist.destroy_process_group()
    torch.save(results, os.path.join(out_dir, f"collectives_{rank}.pt"))


def test_collectives_on_simulated_hccl():
    """hccl is the backend on npu; all_reduce/all_gather/reduce_scatter/objects give the hand-computed values; a CPU
    tensor or a non-contiguous tensor is refused, as HCCL refuses them."""
    with tempfile.TemporaryDirectory() as tmp:
        spawn(_collectives_worker, args=(os.path.join(tmp, "init"), tmp), nprocs=WORLD)
        results = [torch.load(os.path.join(tmp, f"collectives_{r}.pt")) for r in range(WORLD)]
    for rank, res in enumerate(results):
        assert res["backend"] == "hccl"
        assert res["all_reduce"] == ("npu", [3.0, 3.0, 3.0])
        assert res["all_gather"] == [0.0, 0.0, 1.0, 1.0]
        # sum over ranks of [0,1,2,3] = [0,2,4,6]; rank r keeps elements 2r, 2r+1
        assert res["reduce_scatter"] == [[0.0, 2.0], [4.0, 6.0]][rank]
        assert res["objects"] == [{"rank": 0}, {"rank": 1}]
        assert "expected npu tensors, got a tensor on cpu" in res["cpu"]
        assert "must be contiguous" in res["strided"]


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 4))


def _data() -> tuple[torch.Tensor, torch.Tensor]:
    torch.manual_seed(1)
    return torch.randn(4, 8), torch.randn(4, 4)


def _fsdp2_worker(rank: int, init_file: str, out_dir: str) -> None:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    device = _init(rank, init_file, backend="cpu:gloo,npu:hccl")
    mesh = init_device_mesh("npu", (WORLD,))
    model = _model().to(device)
    for layer in model:
        if isinstance(layer, nn.Linear):
            fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    x, y = (t.chunk(WORLD)[rank].to(device) for t in _data())
    ((model(x) - y) ** 2).mean().backward()
    optimizer.step()
    state = {k: v.full_tensor().cpu() for k, v in model.state_dict().items()}
    dist.destroy_process_group()
    if rank == 0:
        torch.save(state, os.path.join(out_dir, "fsdp2.pt"))


def test_fsdp2_step_on_two_simulated_npus_matches_single_cpu():
    """FSDP2 (sharded params, reduce-scatter of grads) on 2 simulated NPUs equals one CPU process on the full batch.

    Each rank's loss is the mean over its half; FSDP averages the two gradients, which equals the gradient of the
    mean of the two half-batch losses computed on one process. fp32, same kernels: agreement to 1e-6.
    """
    with tempfile.TemporaryDirectory() as tmp:
        spawn(_fsdp2_worker, args=(os.path.join(tmp, "init"), tmp), nprocs=WORLD)
        state = torch.load(os.path.join(tmp, "fsdp2.pt"))
    reference = _model()
    optimizer = torch.optim.AdamW(reference.parameters(), lr=1e-2)
    x, y = _data()
    loss = sum(((reference(xs) - ys) ** 2).mean() for xs, ys in zip(x.chunk(WORLD), y.chunk(WORLD))) / WORLD
    loss.backward()
    optimizer.step()
    for name, value in reference.state_dict().items():
        torch.testing.assert_close(state[name], value, atol=1e-6, rtol=1e-6, msg=name)
