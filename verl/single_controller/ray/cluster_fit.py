"""Can the Ray cluster ever hold these placement groups? Checked before any is reserved or any worker starts.

A resource pool reserves one placement group per pool node (``process_on_nodes[i]`` bundles, ``STRICT_PACK``: all
on one Ray node). Two checks, both against the nodes' total resources (what the cluster could ever give; what is
free right now may be held by actors that will finish, and Ray waits for it):

* totals: every resource the groups ask for, summed, must exist in the cluster;
* per node (``STRICT_PACK``): the groups must be assignable to Ray nodes so that no node is asked for more than
  it has. Two groups may share a Ray node that holds both (Ray places them so); a group never spans nodes.

A refusal raises ``ValueError`` that names, per Ray node, what it has of the resource the groups need, instead of
Ray waiting forever for resources that do not exist.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace

from verl.utils.ray_cluster import NodeView, cluster_nodes, format_resources

__all__ = ["check_cluster_fits", "describe_free", "free_shortfall", "node_order_key", "place_groups"]

_EPS = 1e-9
# Backtracking steps before the per-node check gives up and lets Ray try (never refuse what might fit).
_SEARCH_BUDGET = 20_000
_FIX = (
    "Lower trainer.nnodes / trainer.n_gpus_per_node (or max_colocate_count) to what the nodes hold, or add nodes "
    "with `ray start --address=<head-ip>:<port> --resources='{...}'` declaring their devices"
)


def node_order_key(node: NodeView) -> tuple[str, bool, str, str]:
    """Deterministic node order: by address, then the head first, then by node name (several nodes of one host
    share an address), then by id."""
    return node.address, not node.is_head, node.name, node.node_id


def _group_needs(bundles: Sequence[Mapping[str, float]]) -> dict[str, float]:
    need: dict[str, float] = {}
    for bundle in bundles:
        for key, amount in bundle.items():
            need[key] = need.get(key, 0.0) + amount
    return need


def _fits(need: Mapping[str, float], free: Mapping[str, float]) -> bool:
    return all(free.get(key, 0.0) + _EPS >= amount for key, amount in need.items())


def place_groups(needs: Sequence[Mapping[str, float]], nodes: Sequence[NodeView]) -> list[int] | None:
    """An assignment group -> index into ``nodes`` respecting every node's totals, None if there is none, and
    ``[]`` when the search budget ran out before deciding (the caller must then not refuse).

    Depth-first over groups (largest first); nodes with the same remaining resources are tried once per level.
    """
    order = sorted(range(len(needs)), key=lambda g: -sum(needs[g].values()))
    free = [dict(node.resources) for node in nodes]
    assignment: dict[int, int] = {}
    steps = 0

    def place(depth: int) -> bool | None:
        nonlocal steps
        if depth == len(order):
            return True
        group, tried = order[depth], set()
        for index, node_free in enumerate(free):
            signature = tuple(sorted(node_free.items()))
            if signature in tried or not _fits(needs[group], node_free):
                continue
            tried.add(signature)
            steps += 1
            if steps > _SEARCH_BUDGET:
                return None
            for key, amount in needs[group].items():
                node_free[key] = node_free.get(key, 0.0) - amount
            assignment[group] = index
            result = place(depth + 1)
            for key, amount in needs[group].items():
                node_free[key] += amount
            if result is not False:
                return result
        return False

    result = place(0)
    if result is None:
        return []
    return [assignment[g] for g in range(len(needs))] if result else None


def _first_fit_report(needs: Sequence[Mapping[str, float]], nodes: Sequence[NodeView]) -> str:
    """Greedy placement in pool order up to the first group that fits nowhere, and what each node lacks for it."""
    free = [dict(node.resources) for node in nodes]
    taken: list[list[int]] = [[] for _ in nodes]
    for group, need in enumerate(needs):
        index = next((i for i, node_free in enumerate(free) if _fits(need, node_free)), None)
        if index is None:
            lacks = []
            for i, node in enumerate(nodes):
                short = ", ".join(
                    f"{key} {max(free[i].get(key, 0.0), 0.0):g} of the {amount:g} needed"
                    for key, amount in sorted(need.items())
                    if free[i].get(key, 0.0) + _EPS < amount
                )
                held = f" once pool node(s) {taken[i]} are placed there" if taken[i] else ""
                total = format_resources(node.resources)
                lacks.append(f"node {node.label} has only {short}{held} (it has {total} in all)")
            return f"pool node {group} needs {format_resources(need)} on one Ray node: " + "; ".join(lacks)
        for key, amount in need.items():
            free[index][key] = free[index].get(key, 0.0) - amount
        taken[index].append(group)
    return "greedy placement in pool order fails only on ordering; no exact placement exists"


def check_cluster_fits(
    pg_bundles: list[list[dict[str, float]]], strategy: str, nodes: Sequence[NodeView] | None = None
) -> None:
    """Raise ValueError if the Ray cluster (``nodes``: the alive nodes of the connected cluster by default) can
    never host these placement groups: in total, or (``STRICT_PACK``) each group on one node.

    The message starts with the first resource short in total (``needs 4 CPU in total but the Ray cluster has 3``)
    and, for ``STRICT_PACK``, goes on node by node: the first pool node that fits nowhere and, per Ray node, how
    much it has of what that pool node needs."""
    nodes = sorted(
        (n for n in (cluster_nodes() if nodes is None else nodes) if n.alive),
        key=node_order_key,
    )
    needs = [_group_needs(bundles) for bundles in pg_bundles]
    short_in_total = _short_in_total(needs, nodes)
    per_node = strategy == "STRICT_PACK" and place_groups(needs, nodes) is None
    if per_node:
        head = short_in_total or (
            f"the resource pool's {len(needs)} pool node(s) ({', '.join(format_resources(n) for n in needs)}) cannot "
            f"each be placed on one of the {len(nodes)} alive Ray node(s)"
        )
        raise ValueError(f"{head}: {_first_fit_report(needs, nodes)}. {_FIX}.")
    if short_in_total:
        raise ValueError(f"{short_in_total}. {_FIX}, or start Ray with more resources (e.g. ray.init(num_cpus=...)).")


def _short_in_total(needs: Sequence[Mapping[str, float]], nodes: Sequence[NodeView]) -> str | None:
    for key, amount in _group_needs(needs).items():
        have = sum(node.resources.get(key, 0.0) for node in nodes)
        if amount > have + _EPS:
            per_node = ", ".join(f"{node.label}: {node.resources.get(key, 0.0):g}" for node in nodes) or "no nodes"
            return f"the resource pool needs {amount:g} {key} in total but the Ray cluster has {have:g} ({per_node})"
    return None


def free_shortfall(pg_bundles: list[list[dict[str, float]]], strategy: str) -> str | None:
    """Why these groups cannot be placed on what the cluster has free right now (None if they can): they fit its
    totals (:func:`check_cluster_fits` passed), so Ray will wait for actors or other groups to release resources."""
    free_nodes = [replace(n, resources=dict(n.free or {})) for n in cluster_nodes(with_free=True) if n.alive]
    try:
        check_cluster_fits(pg_bundles, strategy, free_nodes)
    except ValueError as exc:
        return str(exc).replace(f" {_FIX}", "")
    return None


def describe_free(pg_bundles: list[list[dict[str, float]]]) -> str:
    """What each alive node has free of the resources these groups ask for (``node X: CPU 0 of 2 free``), for a
    placement that waits: other actors or placement groups hold the rest."""
    keys = sorted(_group_needs([_group_needs(b) for b in pg_bundles]))
    parts = []
    for node in sorted((n for n in cluster_nodes(with_free=True) if n.alive), key=node_order_key):
        free = node.free or {}
        amounts = ", ".join(f"{k} {free.get(k, 0.0):g} of {node.resources.get(k, 0.0):g} free" for k in keys)
        parts.append(f"node {node.label}: {amounts}")
    return "; ".join(parts)
