"""Where each rank of a worker group runs, and a clear error when one is lost (its process, or its whole node).

A worker group records the Ray node of every rank when it starts (:func:`slot_node_ids`, from the placement
groups), so that a failure can name the machine: when a call to the group fails because an actor died or became
unreachable, :func:`worker_lost_error` turns Ray's actor error into a :class:`WorkerLostError` that names the rank,
its node (address, name, id) and whether Ray has declared that node dead.

Bounded: ``ray.get`` on the ranks' results raises as soon as ONE call fails, even while other ranks still wait
in a collective, so a lost node surfaces within Ray's failure notice (seconds: the actor's connection closes)
plus at most :data:`NODE_DEATH_WAIT_S`, shared by the two waits of :func:`resolve` (for the lost rank's own error
when a survivor's broken collective failed first, and for the GCS to declare the node dead: its health check
misses 5 beats of 3 s by default). The surviving ranks are cleaned up with the job when the driver exits.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import ray

from verl.utils.ray_cluster import NodeView, cluster_nodes

__all__ = [
    "NODE_DEATH_WAIT_S",
    "WorkerLostError",
    "describe_placement",
    "resolve",
    "slot_node_ids",
    "worker_lost_error",
]

# Ray's GCS declares a node dead after health_check_failure_threshold (5) x health_check_period_ms (3 s) missed
# beats; 30 s covers that with margin and bounds how long a lost node can keep the driver waiting.
NODE_DEATH_WAIT_S = 30.0


class WorkerLostError(RuntimeError):
    """A rank of a worker group died or became unreachable (``rank``, its ``node``; ``node_dead`` when Ray has
    declared the whole node dead)."""

    def __init__(self, message: str, rank: int | None = None, node: NodeView | None = None, node_dead: bool = False):
        super().__init__(message)
        self.rank = rank
        self.node = node
        self.node_dead = node_dead


def slot_node_ids(slots: Sequence[Any]) -> list[str]:
    """The Ray node id of every slot (``BundleSlot``: placement group + bundle index), in rank order."""
    tables: dict[Any, dict] = {}
    ids = []
    for slot in slots:
        pg = slot.placement_group
        if pg.id not in tables:
            tables[pg.id] = ray.util.placement_group_table(pg)
        ids.append(tables[pg.id]["bundles_to_node_id"][slot.bundle_index])
    return ids


def _views(node_ids: Sequence[str]) -> dict[str, NodeView]:
    known = {node.node_id: node for node in cluster_nodes()}
    return {node_id: known.get(node_id, NodeView(node_id=node_id, address="?")) for node_id in node_ids}


def describe_placement(node_ids: Sequence[str]) -> str:
    """``rank 0 -> 10.0.0.1 (node id 1a2b3c4d, head); rank 1 -> 10.0.0.2 (node id 5e6f7a8b)``."""
    views = _views(node_ids)
    return "; ".join(f"rank {rank} -> {views[node_id].label}" for rank, node_id in enumerate(node_ids))


def _wait_node_death(node_id: str, deadline: float) -> NodeView | None:
    """The node once Ray declares it dead, or None if it is still alive at ``deadline`` (``time.monotonic``)."""
    while True:
        node = _views([node_id])[node_id]
        if not node.alive:
            return node
        if time.monotonic() >= deadline:
            return None
        time.sleep(1.0)


def _lost_peer(refs: Sequence[Any], deadline: float) -> ray.exceptions.RayActorError | None:
    """The actor error of another rank's call, if one arrives before ``deadline``; None when every other call ends
    without one (or is still running at the deadline)."""
    pending = list(refs)
    while pending:
        ready, pending = ray.wait(pending, num_returns=1, timeout=max(0.0, deadline - time.monotonic()))
        if not ready:
            return None
        try:
            ray.get(ready[0])
        except ray.exceptions.RayActorError as exc:
            return exc
        except Exception:  # noqa: BLE001 - another rank's own error: not the loss we look for
            continue
    return None


def resolve(output: Any, workers: Sequence[Any], node_ids: Sequence[str], wait_s: float | None = None) -> Any:
    """``ray.get(output)`` for a call to the ranks ``workers``; a lost rank raises :class:`WorkerLostError`.

    Two ways a lost rank shows: its own call fails with Ray's actor error, or a surviving rank's call fails first,
    its collective broken by the vanished peer (gloo: "Connection closed by peer"). In the second case the other
    calls get up to ``wait_s`` to reveal an actor error; if none does, the surviving rank's error is the cause and
    is raised unchanged. ``wait_s`` defaults to :data:`NODE_DEATH_WAIT_S`.
    """
    deadline = time.monotonic() + (NODE_DEATH_WAIT_S if wait_s is None else wait_s)
    try:
        return ray.get(output)
    except ray.exceptions.RayActorError as exc:
        error = worker_lost_error(exc, workers, node_ids, deadline)
        if error is exc:
            raise
        raise error from exc
    except ray.exceptions.RayTaskError as exc:
        lost = _lost_peer(output, deadline) if isinstance(output, list) else None
        if lost is None:
            raise
        error = worker_lost_error(lost, workers, node_ids, deadline)
        raise error from exc


def worker_lost_error(
    exc: ray.exceptions.RayActorError, workers: Sequence[Any], node_ids: Sequence[str], deadline: float
) -> BaseException:
    """The :class:`WorkerLostError` for Ray's actor error ``exc`` raised by a call to ``workers`` (``exc`` itself
    when the actor's constructor failed: that error is the user's and must surface unchanged).

    An unreachable actor (``ActorUnavailableError``: its connection closed) waits until ``deadline`` for Ray to
    decide whether the node is gone; a dead actor (``ActorDiedError``) is already decided: its node is looked up once.
    """
    if getattr(exc, "actor_init_failed", False):
        return exc
    failed = getattr(exc, "actor_id", None)
    rank = next((r for r, w in enumerate(workers) if w._actor_id.hex() == failed), None)
    if rank is None or rank >= len(node_ids):
        return WorkerLostError(f"a worker of the group (actor {failed}) died or became unreachable: {exc}")
    unreachable = isinstance(exc, ray.exceptions.ActorUnavailableError)
    dead = _wait_node_death(node_ids[rank], deadline if unreachable else time.monotonic())
    node = dead or _views([node_ids[rank]])[node_ids[rank]]
    if dead is not None:
        reason = f" ({dead.death_reason})" if dead.death_reason else ""
        message = f"node {node.label} was lost{reason}: it ran rank {rank} of {len(workers)} of the worker group"
    else:
        message = (
            f"rank {rank} of {len(workers)} of the worker group (on node {node.label}) died or stopped answering "
            "while Ray lists its node as alive (the worker process was killed, e.g. out of memory, or the node is "
            f"unreachable): {_first_line(exc)}"
        )
    return WorkerLostError(message, rank=rank, node=node, node_dead=dead is not None)


def _first_line(exc: BaseException) -> str:
    return str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
