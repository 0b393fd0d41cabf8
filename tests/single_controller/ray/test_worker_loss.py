"""A lost rank of a RayWorkerGroup surfaces as WorkerLostError naming the rank and its node, on a real one-node Ray.

Invariants:
* A rank whose process dies during a call (the others still waiting for it in a collective) fails the call within
  seconds with WorkerLostError naming that rank and its node — never a hang until the collective's timeout.
* When a surviving rank's broken collective fails first (what gloo does when a peer vanishes), the lost rank is
  still the one named.
* A rank's own exception (nothing lost) is raised unchanged; so is a failing constructor.
* Every rank's node is recorded at start-up (``worker_node_ids``), in rank order.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
from collections.abc import Iterator

import pytest
import ray
import torch

from verl.single_controller.base import Worker
from verl.single_controller.base.decorator import Dispatch, register
from verl.single_controller.ray import RayClassWithInitArgs, RayResourcePool, RayWorkerGroup, worker_loss
from verl.single_controller.ray.worker_loss import WorkerLostError

pytestmark = pytest.mark.dist


class Fragile(Worker):
    """Two ranks in a gloo group; ``vanish_on`` rank exits its process mid-call while the other waits for it."""

    def __init__(self, fail_init: bool = False):
        super().__init__()
        if fail_init:
            raise ValueError("constructor failed on purpose")
        import torch.distributed as dist

        dist.init_process_group("gloo", rank=self.rank, world_size=self.world_size)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def all_reduce_unless(self, vanish_on: int, raise_on: int = -1) -> float:
        import torch.distributed as dist

        if self.rank == vanish_on:
            time.sleep(0.5)
            os._exit(1)  # the process is gone, like a machine that lost power
        if self.rank == raise_on:
            raise RuntimeError(f"rank {self.rank} raised on purpose")
        value = torch.ones(1)
        dist.all_reduce(value)  # waits for the vanished peer: gloo fails the call once its connection drops
        return value.item()


@pytest.fixture(scope="module")
def local_ray():
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        yield
    finally:
        ray.shutdown()
        ray.cloudpickle.unregister_pickle_by_value(sys.modules[__name__])


@contextlib.contextmanager
def group(**kwargs) -> Iterator[RayWorkerGroup]:
    """A 2-rank group on a fresh pool; its actors and placement group are removed afterwards (the 2 CPUs free)."""
    pool = RayResourcePool([2], max_colocate_count=1)
    try:
        yield RayWorkerGroup(pool, RayClassWithInitArgs(ray.remote(Fragile), **kwargs))
    finally:
        for pg in pool.pgs or []:
            ray.util.remove_placement_group(pg)  # kills the group's actors with it


@pytest.mark.parametrize("vanishing", [0, 1])
def test_a_vanished_rank_is_named(local_ray, vanishing):
    """Rank ``vanishing`` exits mid-call while the other waits for it in all_reduce (and fails there once gloo
    sees the connection drop): WorkerLostError for that rank, on this node, which Ray still lists as alive."""
    this_node = ray.get_runtime_context().get_node_id()
    with group() as wg:
        assert wg.worker_node_ids == [this_node, this_node]
        with pytest.raises(WorkerLostError) as info:
            wg.all_reduce_unless(vanishing)
    error = info.value
    assert error.rank == vanishing and error.node.node_id == this_node and not error.node_dead
    assert f"rank {vanishing} of 2 of the worker group (on node {error.node.label}) died or stopped" in str(error)


def test_own_errors_and_constructor_errors_pass_unchanged(local_ray, monkeypatch):
    """Rank 0 raises while rank 1 waits for it: rank 0's RuntimeError, once the wait for a lost peer (shortened
    here to 3 s) finds none. A failing constructor raises Ray's actor error with the user's message."""
    monkeypatch.setattr(worker_loss, "NODE_DEATH_WAIT_S", 3.0)
    with group() as wg, pytest.raises(RuntimeError, match="rank 0 raised on purpose") as info:
        wg.all_reduce_unless(-1, raise_on=0)
    assert not isinstance(info.value, WorkerLostError)
    with pytest.raises(ray.exceptions.RayActorError, match="constructor failed on purpose"), group(fail_init=True):
        pass
