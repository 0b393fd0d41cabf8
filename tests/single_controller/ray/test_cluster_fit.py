"""The cluster-fit check of resource pools, on described clusters (no Ray needed: it is a pure function of the
nodes' resources).

Invariants:
* A pool is refused exactly when its per-node groups cannot be assigned to Ray nodes within the nodes' totals
  (STRICT_PACK: a group never spans nodes; two groups may share a node that holds both), and the refusal names,
  per Ray node, what it has of the resource the first unplaceable group needs.
* Groups that fit are never refused, whatever their order or sizes.
* Nodes are ordered by address, then the head first, then name: the same order in every run.
"""

from __future__ import annotations

import itertools
import re

import pytest

from verl.single_controller.ray.cluster_fit import check_cluster_fits, node_order_key, place_groups
from verl.utils.ray_cluster import NodeView


def node(name: str, head: bool = False, address: str = "127.0.0.1", **resources: float) -> NodeView:
    return NodeView(node_id=f"{name}-id-0123456789", address=address, name=name, is_head=head, resources=resources)


def pool(*slots_per_node: int, npu: bool = True) -> list[list[dict[str, float]]]:
    """Bundles of a pool: ``{"CPU": 1, "NPU": 1}`` per slot (max_colocate_count=1), one group per pool node."""
    bundle = {"CPU": 1.0, "NPU": 1.0} if npu else {"CPU": 1.0}
    return [[dict(bundle) for _ in range(n)] for n in slots_per_node]


TWO_NPU_NODES = [node("node0", head=True, CPU=16, NPU=8), node("node1", CPU=16, NPU=8)]


def test_pool_that_fits_passes():
    """2 nodes x 8 NPUs on two 8-NPU nodes; 4 groups of 4 (two per node); one group of 8."""
    for spec in ([8, 8], [4, 4, 4, 4], [8], [2, 6, 6, 2]):
        check_cluster_fits(pool(*spec), "STRICT_PACK", TWO_NPU_NODES)


def test_more_nodes_than_the_cluster_is_refused_per_node():
    """nnodes=3 x 8 NPUs on two 8-NPU nodes: short in total, and per node every node is taken by a pool node."""
    with pytest.raises(ValueError) as info:
        check_cluster_fits(pool(8, 8, 8), "STRICT_PACK", TWO_NPU_NODES)
    message = str(info.value)
    assert message.startswith("the resource pool needs 24 NPU in total but the Ray cluster has 16")
    assert "pool node 2 needs CPU 8, NPU 8 on one Ray node" in message
    for name, taken in (("node0", 0), ("node1", 1)):
        assert re.search(
            rf"name {name}, node id {name}-id(, head)?\) has only NPU 0 of the 8 needed once pool node\(s\) \[{taken}\]",
            message,
        ), message
    assert "trainer.nnodes" in message


def test_slots_split_over_nodes_is_refused_naming_each_node():
    """Totals fit (16 NPUs) but no node holds 16: the per-node branch alone refuses, naming both nodes' 8 NPUs."""
    with pytest.raises(ValueError) as info:
        check_cluster_fits(pool(16), "STRICT_PACK", TWO_NPU_NODES)
    message = str(info.value)
    assert "in total" not in message
    assert "pool node 0 needs CPU 16, NPU 16 on one Ray node" in message
    for name in ("node0", "node1"):
        assert re.search(rf"name {name}, node id {name}-id(, head)?\) has only NPU 8 of the 16 needed", message)


def test_uneven_nodes_refused_when_no_assignment_exists():
    """Two groups of 8 NPUs on nodes of 8, 4 and 4 NPUs: 16 in total, but only one node holds a group."""
    nodes = [node("a", head=True, CPU=8, NPU=8), node("b", CPU=8, NPU=4), node("c", CPU=8, NPU=4)]
    with pytest.raises(ValueError, match=r"pool node 1 needs CPU 8, NPU 8 on one Ray node"):
        check_cluster_fits(pool(8, 8), "STRICT_PACK", nodes)
    check_cluster_fits(pool(8, 4, 4), "STRICT_PACK", nodes)  # fits exactly: one group per node


def test_cpu_only_pool_names_the_cpu_short_node():
    """CPU slots: nnodes=2 x 2 on nodes of 2 and 1 CPUs (the e2e cluster): 4 > 3 in total, node1 has 1 of 2."""
    nodes = [node("node0", head=True, CPU=2, NPU=8), node("node1", CPU=1, NPU=8)]
    with pytest.raises(ValueError) as info:
        check_cluster_fits(pool(2, 2, npu=False), "STRICT_PACK", nodes)
    message = str(info.value)
    assert "the resource pool needs 4 CPU in total but the Ray cluster has 3" in message
    assert "(name node1, node id node1-id) has only CPU 1 of the 2 needed (it has CPU 1, NPU 8 in all)" in message


def test_non_strict_strategy_checks_totals_only():
    """PACK may span nodes: 16 slots over two 8-NPU nodes pass; 17 do not."""
    check_cluster_fits(pool(16), "PACK", TWO_NPU_NODES)
    with pytest.raises(ValueError, match="needs 17 NPU in total but the Ray cluster has 16"):
        check_cluster_fits(pool(17), "PACK", TWO_NPU_NODES)


def test_dead_nodes_do_not_count():
    dead = NodeView(node_id="x", address="127.0.0.1", name="dead", alive=False, resources={"CPU": 16, "NPU": 8})
    with pytest.raises(ValueError, match="needs 16 NPU in total but the Ray cluster has 8"):
        check_cluster_fits(pool(8, 8), "STRICT_PACK", [TWO_NPU_NODES[0], dead])


def brute_force_fits(needs: list[dict[str, float]], nodes: list[NodeView]) -> bool:
    """Independent reference: try every assignment of groups to nodes."""
    for assignment in itertools.product(range(len(nodes)), repeat=len(needs)):
        used = [dict.fromkeys(n.resources, 0.0) for n in nodes]
        for group, index in enumerate(assignment):
            for key, amount in needs[group].items():
                used[index][key] = used[index].get(key, 0.0) + amount
        if all(used[i].get(k, 0.0) <= n.resources.get(k, 0.0) + 1e-9 for i, n in enumerate(nodes) for k in used[i]):
            return True
    return False


def test_placement_search_agrees_with_brute_force():
    """place_groups finds an assignment exactly when one exists (every mix of 1..4 groups of 1..5 NPUs on nodes
    of 3, 5 and 6 NPUs)."""
    nodes = [node("a", NPU=3), node("b", NPU=5), node("c", NPU=6)]
    for count in range(1, 5):
        for sizes in itertools.product(range(1, 6), repeat=count):
            needs = [{"NPU": float(s)} for s in sizes]
            found = place_groups(needs, nodes)
            assert (found is not None) == brute_force_fits(needs, nodes), sizes
            if found:
                for index, n in enumerate(nodes):
                    assert sum(sizes[g] for g, i in enumerate(found) if i == index) <= n.resources["NPU"]


def test_node_order_is_address_then_head_then_name():
    nodes = [
        node("b", address="10.0.0.2"),
        node("z", address="10.0.0.1"),
        node("a", address="10.0.0.1"),
        node("y", head=True, address="10.0.0.1"),
    ]
    assert [n.name for n in sorted(nodes, key=node_order_key)] == ["y", "a", "z", "b"]
