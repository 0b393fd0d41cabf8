"""The readiness check of ``python -m verl.utils.ray_cluster wait``, on described clusters (a pure function of the
nodes; the CLI itself runs against a real two-node cluster in tests/e2e/test_multinode.py).

Invariants: ready exactly when at least ``num_nodes`` alive nodes each have every requested resource; otherwise the
problems name the nodes that have not joined, and per joined node each resource it has too little of; dead nodes are
reported and never counted. Bad ``--resource`` values are refused with the expected form.
"""

from __future__ import annotations

import pytest

from verl.utils.ray_cluster import NodeView, format_resources, main, missing_resources, node_view


def node(name: str, alive: bool = True, head: bool = False, **resources: float) -> NodeView:
    return NodeView(f"{name}-0123456789", "10.0.0.1", name=name, is_head=head, alive=alive, resources=resources)


def test_ready_when_enough_nodes_have_the_resources():
    nodes = [node("a", head=True, CPU=8, NPU=8), node("b", CPU=8, NPU=8), node("c", CPU=8)]
    assert missing_resources(nodes, 2, {"NPU": 8}) == []
    assert missing_resources(nodes, 3, {"CPU": 1}) == []


def test_missing_node_and_short_resource_are_named():
    nodes = [node("a", head=True, CPU=8, NPU=8), node("b", CPU=8, NPU=4), node("gone", alive=False, NPU=8)]
    problems = missing_resources(nodes, 3, {"NPU": 8, "CPU": 2})
    assert problems == [
        "Ray sees 1 of 3 node(s) with CPU 2, NPU 8",
        "node 10.0.0.1 (name b, node id b-012345) has only NPU 4 of the 8 needed",
        "1 more node(s) must join (Ray sees 2 alive)",
        "node 10.0.0.1 (name gone, node id gone-012) is dead",
    ]


def test_node_view_reads_ray_nodes_entry():
    entry = {
        "NodeID": "abcdef0123456789",
        "Alive": True,
        "NodeManagerAddress": "10.0.0.7",
        "NodeName": "10.0.0.7",
        "Resources": {"CPU": 4.0, "NPU": 8.0, "node:__internal_head__": 1.0, "node:10.0.0.7": 1.0, "memory": 1e9},
    }
    view = node_view(entry)
    assert view.is_head and view.alive and view.label == "10.0.0.7 (node id abcdef01, head)"
    assert format_resources(view.resources) == "CPU 4, NPU 8"


@pytest.mark.parametrize("bad", ["NPU", "NPU=eight", "=8"])
def test_bad_resource_flag_is_refused(bad, capsys):
    with pytest.raises(SystemExit) as info:
        main(["wait", "--nodes", "1", "--resource", bad])
    assert info.value.code == 2
    assert "expected NAME=AMOUNT, e.g. NPU=8" in capsys.readouterr().err
