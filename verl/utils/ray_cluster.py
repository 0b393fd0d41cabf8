"""What a Ray cluster looks like, node by node, and a readiness wait for multi-node launches.

After ``ray start`` on every node, wait until Ray sees them all with their devices before launching training::

    python -m verl.utils.ray_cluster wait --address <head-ip>:6379 --nodes 2 --resource NPU=8 --timeout 600
    python -m verl.utils.ray_cluster nodes --address <head-ip>:6379      # one line per node: id, address, resources

``wait`` exits 0 once at least ``--nodes`` alive nodes each have every ``--resource NAME=N`` (per node; repeat the
flag for several resources), and exits 1 after ``--timeout`` seconds with a message that names what is missing:
nodes that have not joined, and per joined node the resource it lacks. It may run before the head is up (it keeps
trying to reach it until the timeout). ``--address`` defaults to ``$RAY_ADDRESS``, else ``auto``.

From code: :func:`wait_for_cluster` (needs ``ray.init``), :func:`cluster_nodes`, :func:`missing_resources`.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

__all__ = [
    "ClusterNotReadyError",
    "NodeView",
    "cluster_nodes",
    "format_resources",
    "main",
    "missing_resources",
    "wait_for_cluster",
]

# Resources Ray adds to every node by itself; never worth printing.
_INTERNAL_PREFIXES = ("node:", "accelerator_type:", "object_store_memory", "memory", "bundle_group_")
_EPS = 1e-9


class ClusterNotReadyError(TimeoutError):
    """The cluster did not reach the requested nodes and resources in time; the message says what is missing."""


@dataclass(frozen=True)
class NodeView:
    """One Ray node as the GCS reports it (``ray.nodes()``)."""

    node_id: str
    address: str
    name: str = ""
    is_head: bool = False
    alive: bool = True
    resources: Mapping[str, float] = field(default_factory=dict)
    death_reason: str = ""
    free: Mapping[str, float] | None = None  # unreserved now (cluster_nodes(with_free=True)); None: not asked

    @property
    def label(self) -> str:
        """``10.0.0.2 (node id 1a2b3c4d, head)``; the node name too when it differs from the address."""
        parts = [f"node id {self.node_id[:8]}"]
        if self.name and self.name != self.address:
            parts.insert(0, f"name {self.name}")
        if self.is_head:
            parts.append("head")
        return f"{self.address} ({', '.join(parts)})"

    def has(self, resources: Mapping[str, float]) -> bool:
        return all(self.resources.get(key, 0.0) + _EPS >= amount for key, amount in resources.items())


def node_view(node: Mapping, free: Mapping[str, float] | None = None) -> NodeView:
    """A :class:`NodeView` of one entry of ``ray.nodes()`` (and its free resources, when given)."""
    resources = dict(node.get("Resources") or {})
    return NodeView(
        node_id=node["NodeID"],
        address=node.get("NodeManagerAddress", ""),
        name=node.get("NodeName", ""),
        is_head="node:__internal_head__" in resources,
        alive=bool(node.get("Alive")),
        resources=resources,
        death_reason=node.get("DeathReasonMessage") or "",
        free=None if free is None else dict(free),
    )


def cluster_nodes(with_free: bool = False) -> list[NodeView]:
    """Every node the connected Ray cluster knows, alive or dead (``ray.init`` must have run); ``with_free`` also
    reads what each alive node has unreserved right now."""
    import ray

    free: dict[str, Mapping[str, float]] = {}
    if with_free:
        # Ray has no public per-node availability call; this is the one `ray status` and upstream verl's resource
        # check read (refreshed by the raylets' resource reports, i.e. at most a second old).
        from ray._private.state import available_resources_per_node

        free = available_resources_per_node()
    return [node_view(node, free.get(node["NodeID"], {}) if with_free else None) for node in ray.nodes()]


def format_resources(resources: Mapping[str, float]) -> str:
    """``CPU 2, NPU 8`` (sorted; Ray's internal bookkeeping resources left out)."""
    shown = {k: v for k, v in resources.items() if not k.startswith(_INTERNAL_PREFIXES)}
    return ", ".join(f"{key} {amount:g}" for key, amount in sorted(shown.items())) or "no resources"


def missing_resources(nodes: Sequence[NodeView], num_nodes: int, per_node: Mapping[str, float]) -> list[str]:
    """What keeps ``nodes`` from holding ``num_nodes`` alive nodes that each have ``per_node``; [] when ready."""
    alive = [n for n in nodes if n.alive]
    ready = [n for n in alive if n.has(per_node)]
    if len(ready) >= num_nodes:
        return []
    wanted = format_resources(per_node) if per_node else "any resources"
    problems = [f"Ray sees {len(ready)} of {num_nodes} node(s) with {wanted}"]
    for node in alive:
        if node in ready:
            continue
        short = [
            f"{key} {node.resources.get(key, 0.0):g} of the {amount:g} needed"
            for key, amount in sorted(per_node.items())
            if node.resources.get(key, 0.0) + _EPS < amount
        ]
        problems.append(f"node {node.label} has only {', '.join(short)}")
    if len(alive) < num_nodes:
        problems.append(f"{num_nodes - len(alive)} more node(s) must join (Ray sees {len(alive)} alive)")
    problems += [f"node {node.label} is dead" for node in nodes if not node.alive]
    return problems


def wait_for_cluster(
    num_nodes: int, per_node: Mapping[str, float] | None = None, timeout_s: float = 300.0, poll_s: float = 1.0
) -> list[NodeView]:
    """Block until the connected cluster has ``num_nodes`` alive nodes each with ``per_node``; returns the nodes.

    Raises:
        ClusterNotReadyError: after ``timeout_s``, naming the nodes that have not joined and what each joined node
            lacks.
    """
    per_node = dict(per_node or {})
    deadline = time.monotonic() + timeout_s
    while True:
        nodes = cluster_nodes()
        problems = missing_resources(nodes, num_nodes, per_node)
        if not problems:
            return nodes
        if time.monotonic() >= deadline:
            raise ClusterNotReadyError(
                f"the Ray cluster is not ready after {timeout_s:g}s: " + "; ".join(problems) + ". Start the missing "
                "nodes with `ray start --address=<head-ip>:<port> --resources='{...}'` (each declaring its devices), "
                "or wait longer (--timeout)."
            )
        time.sleep(poll_s)


# ------------------------------------------------------------------------------------------------ the CLI


def _parse_resource(text: str) -> tuple[str, float]:
    name, sep, amount = text.partition("=")
    try:
        if not sep or not name:
            raise ValueError
        return name, float(amount)
    except ValueError:
        raise argparse.ArgumentTypeError(f"--resource {text!r}: expected NAME=AMOUNT, e.g. NPU=8") from None


def _wait_for_head(address: str, deadline: float) -> None:
    """Poll the head's GCS port until it accepts a connection (``ray start --head`` may still be starting)."""
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit():
        return  # "auto" or a ray:// address: left to ray.init
    while True:
        try:
            socket.create_connection((host, int(port)), timeout=2.0).close()
            return
        except OSError as exc:
            if time.monotonic() >= deadline:
                raise ClusterNotReadyError(
                    f"no Ray head answers at {address} ({exc}); start it with `ray start --head --port={port}` "
                    "or fix --address"
                ) from exc
            time.sleep(1.0)


def _connect(address: str, deadline: float) -> None:
    import ray

    _wait_for_head(address, deadline)
    ray.init(address=address, log_to_driver=False, logging_level="WARNING", include_dashboard=False)


def _print_nodes(nodes: Sequence[NodeView], as_json: bool) -> None:
    if as_json:
        rows = [{**node.__dict__, "resources": dict(node.resources)} for node in nodes]
        print(json.dumps(rows))
        return
    for node in nodes:
        state = "alive" if node.alive else "DEAD"
        print(f"{node.label}: {state}, {format_resources(node.resources)}")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m verl.utils.ray_cluster", description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    wait = commands.add_parser("wait", help="wait until Ray sees every node and device")
    wait.add_argument("--nodes", type=int, required=True, help="alive nodes required")
    wait.add_argument(
        "--resource", type=_parse_resource, action="append", default=[], help="NAME=N each of those nodes needs"
    )
    wait.add_argument("--timeout", type=float, default=300.0, help="seconds before giving up (default 300)")
    nodes = commands.add_parser("nodes", help="print every node Ray knows, with its resources")
    nodes.add_argument("--json", action="store_true", help="one JSON list instead of one line per node")
    for sub in (wait, nodes):
        sub.add_argument("--address", default=os.environ.get("RAY_ADDRESS", "auto"), help="head's host:port")
    args = parser.parse_args(argv)
    deadline = time.monotonic() + (args.timeout if args.command == "wait" else 60.0)
    try:
        _connect(args.address, deadline)
        if args.command == "nodes":
            _print_nodes(cluster_nodes(), args.json)
            return 0
        ready = wait_for_cluster(args.nodes, dict(args.resource), timeout_s=max(0.0, deadline - time.monotonic()))
    except ClusterNotReadyError as exc:
        print(f"[verl] {exc}", file=sys.stderr)
        return 1
    print(f"[verl] Ray cluster ready: {sum(n.alive for n in ready)} alive node(s)")
    _print_nodes([n for n in ready if n.alive], as_json=False)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
