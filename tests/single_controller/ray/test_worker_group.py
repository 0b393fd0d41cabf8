"""The Ray backend on a real local cluster (one Ray session for the module, 2 CPUs, 2 workers of 1 CPU).

Checked: placement-group bundles on a CPU-only platform, the per-rank environment (with the caller's
``worker_env``, and its refusal of the variables the group manages), a gloo all_reduce and an
all-gather of a DataProto using only that environment, DP_COMPUTE_PROTO splitting with auto-padding removal,
ONE_TO_ALL / RANK_ZERO, n-d mesh dispatch with collect flags, non-blocking calls returning DataProtoFutures,
pool-size errors, and colocated roles in one actor process. Workers add ``1000 * rank + offset`` to the rows
they process, so the outputs show which rank handled which row.
"""

import os
import sys

import numpy as np
import pytest
import ray
import torch

from verl import DataProto
from verl.protocol import DataProtoFuture
from verl.single_controller.base import Worker
from verl.single_controller.base.decorator import (
    Dispatch,
    Execute,
    make_nd_compute_dataproto_dispatch_fn,
    register,
)
from verl.single_controller.ray import (
    MANAGED_WORKER_ENV,
    RayClassWithInitArgs,
    RayResourcePool,
    RayWorkerGroup,
    ResourcePoolManager,
    create_colocated_worker_cls,
)

pytestmark = pytest.mark.dist


class ProbeWorker(Worker):
    def __init__(self, offset: int = 0):
        super().__init__()
        self.offset = offset
        # "pair": both ranks are one dp group (like tp=2), rank 0 collects; "dp": each rank its own dp group
        self._register_dispatch_collect_info("pair", dp_rank=0, is_collect=self.rank == 0)
        self._register_dispatch_collect_info("dp", dp_rank=self.rank, is_collect=True)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def env(self) -> dict:
        keys = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "VERL_PLATFORM")
        keys += ("VERL_TEST_WORKER_ENV",)
        return {**{k: os.environ.get(k) for k in keys}, "pid": os.getpid(), "rank_prop": self.rank}

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def all_reduce_and_gather(self) -> tuple[float, list[int], list[str]]:
        import torch.distributed as dist

        from verl.protocol import all_gather_data_proto
        from verl.utils.device import get_nccl_backend

        dist.init_process_group(backend=get_nccl_backend())  # env:// rendezvous from the group's env only
        try:
            value = torch.tensor([float(self.rank + 1)])
            dist.all_reduce(value)
            data = DataProto.from_dict(
                {"y": torch.tensor([2 * self.rank, 2 * self.rank + 1])}, {"s": [f"r{self.rank}a", f"r{self.rank}b"]}
            )
            all_gather_data_proto(data)
            return value.item(), data.batch["y"].tolist(), data.non_tensor_batch["s"].tolist()
        finally:
            dist.destroy_process_group()

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def mark(self, data: DataProto) -> DataProto:
        data.batch["y"] = data.batch["y"] + 1000 * self.rank + self.offset
        return data

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO, blocking=False)
    def mark_async(self, data: DataProto) -> DataProto:
        return self.mark(data)

    @register(dispatch_mode=make_nd_compute_dataproto_dispatch_fn("pair"))
    def mark_pair(self, data: DataProto) -> DataProto:
        return self.mark(data)

    @register(dispatch_mode=make_nd_compute_dataproto_dispatch_fn("dp"))
    def mark_dp(self, data: DataProto) -> DataProto:
        return self.mark(data)

    @register(dispatch_mode=Dispatch.ALL_TO_ALL, execute_mode=Execute.RANK_ZERO)
    def whoami(self, tag: str) -> str:
        return f"{tag}{self.rank}"


class CriticLike(Worker):
    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def mark(self, data: DataProto) -> DataProto:
        data.batch["y"] = -data.batch["y"]
        return data

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def pid(self) -> int:
        return os.getpid()


def rows(n, padding=False):
    return DataProto.from_dict(tensors={"y": torch.arange(n)}, auto_padding=padding)


@pytest.fixture(scope="module")
def pool():
    # The worker classes live in this test module, which Ray workers cannot import: ship them by value.
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        yield RayResourcePool(process_on_nodes=[2], use_gpu=True, max_colocate_count=1)
    finally:
        ray.shutdown()
        ray.cloudpickle.unregister_pickle_by_value(sys.modules[__name__])


@pytest.fixture(scope="module")
def probe_group(pool):
    worker_env = {"VERL_TEST_WORKER_ENV": "from-worker-env"}
    return RayWorkerGroup(pool, RayClassWithInitArgs(ray.remote(ProbeWorker), offset=10), worker_env=worker_env)


def test_cpu_platform_bundles_are_cpu_only(pool):
    """use_gpu=True on the CPU platform still reserves CPU-only bundles: {"CPU": max_colocate_count}."""
    assert pool.bundle_spec() == {"CPU": 1}
    pgs = pool.get_placement_groups()
    assert [pg.bundle_specs for pg in pgs] == [[{"CPU": 1.0}, {"CPU": 1.0}]]


def test_each_rank_gets_torchrun_env(probe_group):
    """Rank r sees RANK=r, WORLD_SIZE=2, LOCAL_RANK=r, LOCAL_WORLD_SIZE=2, one shared MASTER_ADDR/PORT and the
    driver's platform; the two ranks are different processes."""
    envs = probe_group.env()
    assert probe_group.world_size == 2 and len(probe_group.worker_names) == 2
    for rank, env in enumerate(envs):
        assert (env["RANK"], env["WORLD_SIZE"], env["rank_prop"]) == (str(rank), "2", rank)
        assert (env["LOCAL_RANK"], env["LOCAL_WORLD_SIZE"], env["VERL_PLATFORM"]) == (str(rank), "2", "cpu")
        assert (env["MASTER_ADDR"], env["MASTER_PORT"]) == (probe_group.master_address, probe_group.master_port)
        assert env["VERL_TEST_WORKER_ENV"] == "from-worker-env"  # worker_env reaches every rank
    assert envs[0]["pid"] != envs[1]["pid"]


@pytest.mark.parametrize("managed", ["WORLD_SIZE", "MASTER_PORT", "RANK"])
def test_worker_env_refuses_managed_variables(probe_group, managed):
    """Overriding a variable the group sets per rank raises ValueError naming it. RayWorkerGroup.__init__ checks
    worker_env before it touches the resource pool or the workers, on every construction path; it is exercised here
    on a group over probe_group's workers because the 2-CPU pool is taken by probe_group: a group on the pool would,
    without the check, wait for CPUs forever instead of failing."""
    with pytest.raises(ValueError, match=f"worker_env sets {managed}, which the worker group manages"):
        RayWorkerGroup(
            worker_handles=probe_group.workers,
            ray_cls_with_init=RayClassWithInitArgs(ProbeWorker),
            worker_env={managed: "100", "OK_KEY": "1"},
        )


def test_managed_list_is_what_each_rank_gets(probe_group):
    """MANAGED_WORKER_ENV (what worker_env may not set) is exactly the per-rank part of the environment: the rank
    env minus the platform's collective settings and the caller's worker_env."""
    env = probe_group._rank_env(rank=0, world_size=2, local_rank=0, local_world_size=2)
    assert set(env) - {"VERL_TEST_WORKER_ENV"} == set(MANAGED_WORKER_ENV)


def test_gloo_all_reduce_and_all_gather_from_group_env(probe_group):
    """init_process_group from the env alone works: all_reduce of (rank + 1) is 1 + 2 = 3 on both ranks, and
    all_gather_data_proto gives both ranks rows [0, 1] (rank 0) + [2, 3] (rank 1) with their strings."""
    results = probe_group.all_reduce_and_gather()
    assert results == [(3.0, [0, 1, 2, 3], ["r0a", "r0b", "r1a", "r1b"])] * 2


def test_dp_compute_proto_splits_and_strips_padding(probe_group):
    """4 rows -> rank 0 gets 0,1 (+10), rank 1 gets 2,3 (+1010). 3 padded rows -> shards [0,1] [2,2]; the pad
    row is dropped, so the output has 3 rows: 10, 11, 1012."""
    assert probe_group.mark(rows(4)).batch["y"].tolist() == [10, 11, 1012, 1013]
    assert probe_group.mark(rows(3, padding=True)).batch["y"].tolist() == [10, 11, 1012]


def test_one_to_all_rank_zero_and_execute_all(probe_group):
    """RANK_ZERO runs only on rank 0 and returns one value; execute_all_sync broadcasts plain args."""
    assert probe_group.whoami("rank") == "rank0"
    assert probe_group.execute_all_sync("whoami", "r") == ["r0", "r1"]
    assert probe_group.execute_rank_zero_sync("whoami", "z") == "z0"


def test_nd_mesh_dispatch_with_collect_flags(probe_group):
    """Mesh "pair" (dp=1): both ranks get all rows, only rank 0's output returns (+10).
    Mesh "dp" (dp=2): rows split by dp rank and both outputs concatenated."""
    assert probe_group.mark_pair(rows(4)).batch["y"].tolist() == [10, 11, 12, 13]
    assert probe_group.mark_dp(rows(4)).batch["y"].tolist() == [10, 11, 1012, 1013]
    assert probe_group._dispatch_info == {"pair": [0, 0], "dp": [0, 1]}
    assert probe_group._collect_info == {"pair": [True, False], "dp": [True, True]}


def test_non_blocking_call_returns_future_that_workers_resolve(probe_group):
    """blocking=False gives a DataProtoFuture; passing it on lets each worker fetch its own chunk.
    Padding is stripped from the future too (3 rows in, 3 rows out)."""
    future = probe_group.mark_async(rows(4))
    assert isinstance(future, DataProtoFuture)
    # first pass: [10, 11, 1012, 1013]; second pass adds +10 / +1010 again per half
    assert probe_group.mark(future).batch["y"].tolist() == [20, 21, 2022, 2023]
    padded = probe_group.mark_async(rows(3, padding=True))
    assert padded.get().batch["y"].tolist() == [10, 11, 1012]


def test_pool_larger_than_cluster_fails_fast(pool):
    """A pool needing 3 CPUs on a 2-CPU cluster raises ValueError before reserving anything."""
    with pytest.raises(ValueError, match="needs 3 CPU in total but the Ray cluster has 2"):
        RayResourcePool([3], max_colocate_count=1).get_placement_groups()
    manager = ResourcePoolManager(resource_pool_spec={"global_pool": [2]}, mapping={"actor": "global_pool"})
    manager.create_resource_pool()
    assert manager.get_n_gpus() == 2
    assert manager.get_resource_pool("actor").world_size == 2
    with pytest.raises(ValueError, match="role critic has no resource pool"):
        manager.get_resource_pool("critic")
    with pytest.raises(ValueError, match="needs 4 CPU"):
        ResourcePoolManager({"p": [4]}, {"actor": "p"}).create_resource_pool()


def test_colocated_roles_share_one_process(pool, probe_group):
    """Two roles fused in one actor per slot: both roles on a rank report the same pid, and each view calls its
    own role's method (probe: +1000 * rank + 5, critic: negation). Runs last: it frees the probe group's CPUs."""
    for worker in probe_group.workers:
        ray.kill(worker)
    fused_cls = create_colocated_worker_cls(
        {"probe": RayClassWithInitArgs(ProbeWorker, offset=5), "critic": RayClassWithInitArgs(CriticLike)}
    )
    fused = RayWorkerGroup(pool, fused_cls)
    views = fused.spawn(prefix_set={"probe", "critic"})
    probe_pids = [env["pid"] for env in views["probe"].env()]
    assert probe_pids == views["critic"].pid()
    assert views["probe"].mark(rows(2)).batch["y"].tolist() == [5, 1006]
    assert views["critic"].mark(rows(2)).batch["y"].tolist() == [0, -1]
    assert fused.probe_mark(rows(2)).batch["y"].tolist() == [5, 1006]
    fused.fuse({"probe", "critic"})
    assert fused.critic.mark(rows(2)).batch["y"].tolist() == [0, -1]
    assert np.array_equal(views["probe"].mark_dp(rows(2)).batch["y"].numpy(), np.array([5, 1006]))


def test_worker_env_check_refuses_the_visible_devices_variable():
    """On a platform with a visible-devices variable (Ascend: ASCEND_RT_VISIBLE_DEVICES) Ray assigns it per actor,
    so worker_env may not set it; other variables pass through as strings (Ray's env_vars are str -> str)."""
    from verl.single_controller.ray.worker_group import checked_worker_env

    with pytest.raises(ValueError, match="worker_env sets ASCEND_RT_VISIBLE_DEVICES"):
        checked_worker_env({"ASCEND_RT_VISIBLE_DEVICES": "0,1"}, "ASCEND_RT_VISIBLE_DEVICES")
    assert checked_worker_env({"HCCL_CONNECT_TIMEOUT": 1800}, "ASCEND_RT_VISIBLE_DEVICES") == {
        "HCCL_CONNECT_TIMEOUT": "1800"
    }
    assert checked_worker_env(None, None) == {}


def test_master_port_is_picked_here_when_rank0_is_on_this_node(pool, probe_group, monkeypatch):
    """Rank 0's slot on the caller's node: address and port come from this process (no Ray task, whose fresh worker
    process cost seconds at start-up); a slot on another node still gets them from a task scheduled into it."""
    from verl.single_controller.base.worker import get_node_ip
    from verl.single_controller.ray import worker_group
    from verl.single_controller.ray.worker_loss import slot_node_ids

    slots = pool.bundle_slots()
    here = slot_node_ids(slots)[0]
    task = worker_group._pick_master_addr_port

    class NoTask:
        def options(self, **kwargs):
            raise AssertionError("a Ray task was started to pick the port of a slot on this node")

    monkeypatch.setattr(worker_group, "_pick_master_addr_port", NoTask())
    addr, port = worker_group._master_addr_port(slots[0], here)
    assert addr == get_node_ip() and port.isdigit()
    assert probe_group.master_address == get_node_ip()  # the group built by the fixture took the same path
    monkeypatch.setattr(worker_group, "_pick_master_addr_port", task)
    addr, port = worker_group._master_addr_port(slots[0], "another-node")  # as if rank 0 were elsewhere
    assert addr == get_node_ip() and port.isdigit()
