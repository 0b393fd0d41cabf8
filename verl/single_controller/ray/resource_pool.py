"""Ray resource pools: placement groups that reserve one slot (bundle) per worker process.

One placement group per node, one bundle per process: ``{"CPU": max_colocate_count, <accelerator>: 1}`` where
the accelerator is the platform's Ray resource (``GPU`` on CUDA, ``NPU`` on Ascend; none on a CPU-only
platform, whose bundles are CPU-only). Each worker actor takes ``num_cpus=1`` and ``1 / max_colocate_count``
of the accelerator, so up to ``max_colocate_count`` worker groups can share one slot.

Before reserving anything the pool checks that the cluster can ever satisfy it (:mod:`.cluster_fit`: in total and
node by node), and raises ``ValueError`` naming the shortfall instead of waiting forever for resources that do
not exist.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import ray
from ray.util.placement_group import PlacementGroup, placement_group

from verl.single_controller.base.worker_group import ResourcePool
from verl.single_controller.ray.cluster_fit import check_cluster_fits, describe_free, free_shortfall, node_order_key
from verl.utils.ray_cluster import cluster_nodes

logger = logging.getLogger(__name__)

__all__ = [
    "RayResourcePool",
    "check_cluster_fits",
    "ResourcePoolManager",
    "SubRayResourcePool",
    "merge_resource_pool",
    "sort_placement_group_by_node_ip",
    "split_resource_pool",
]


class BundleSlot(NamedTuple):
    """Where one worker process runs: a bundle of a placement group, and its rank among its node's processes."""

    placement_group: PlacementGroup
    bundle_index: int
    local_rank: int
    local_world_size: int


def platform_for(device_name: str | None) -> Any:
    """The device platform named ``device_name`` (``cpu | cuda | npu``), or this process's platform if None."""
    from verl.utils.device import get_platform
    from verl.utils.platform.registry import PlatformRegistry, normalize_platform_name

    return get_platform() if device_name is None else PlatformRegistry.create(normalize_platform_name(device_name))


def _resource_name(device_name: str | None) -> str:
    return platform_for(device_name).ray_resource_name


def sort_placement_group_by_node_ip(pgs: list[PlacementGroup]) -> list[PlacementGroup]:
    """Placement groups ordered by their node (IP, then the head first, then node name: several nodes of one host
    share an IP), so ranks map to nodes the same way in every run (sharded checkpoints saved per rank stay
    loadable after a restart)."""
    nodes = {node.node_id: node for node in cluster_nodes()}

    def key(indexed: tuple[int, PlacementGroup]) -> tuple:
        node_id = ray.util.placement_group_table(indexed[1])["bundles_to_node_id"][0]
        node = nodes.get(node_id)
        return (node_order_key(node) if node is not None else ("", True, "", node_id)), indexed[0]

    return [pg for _, pg in sorted(enumerate(pgs), key=key)]


class RayResourcePool(ResourcePool):
    """``process_on_nodes[i]`` worker slots on node ``i``, reserved as Ray placement groups on first use."""

    def __init__(
        self,
        process_on_nodes: list[int] | None = None,
        use_gpu: bool = True,
        name_prefix: str | None = None,
        max_colocate_count: int = 10,
        detached: bool = False,
        accelerator_type: str | None = None,
        ready_timeout_s: float = 600.0,
    ) -> None:
        super().__init__(process_on_nodes, max_colocate_count)
        self.use_gpu = use_gpu
        self.name_prefix = name_prefix or ""
        self.detached = detached
        self.accelerator_type = accelerator_type
        self.ready_timeout_s = ready_timeout_s
        self.pgs: list[PlacementGroup] | None = None

    def bundle_spec(self, device_name: str | None = None) -> dict[str, float]:
        """The resources of one slot."""
        bundle: dict[str, float] = {"CPU": self.max_colocate_count}
        resource = _resource_name(device_name)
        if self.use_gpu and resource != "CPU":
            bundle[resource] = 1
        if self.accelerator_type is not None:
            bundle[f"accelerator_type:{self.accelerator_type}"] = 1e-3
        return bundle

    def get_placement_groups(
        self, strategy: str = "STRICT_PACK", name: str | None = None, device_name: str | None = None
    ) -> list[PlacementGroup]:
        """Create (once) and return the placement groups, one per node, sorted by node IP."""
        if self.pgs is not None:
            return self.pgs
        prefix = name or f"{self.name_prefix}verl_group_{'_'.join(map(str, self._store))}:"
        pg_bundles = [[self.bundle_spec(device_name) for _ in range(count)] for count in self._store]
        check_cluster_fits(pg_bundles, strategy)
        waiting = free_shortfall(pg_bundles, strategy)
        if waiting is not None:
            logger.warning(
                "the resource pool fits the Ray cluster but not what is free now; waiting up to %gs for it (%s)",
                self.ready_timeout_s,
                waiting,
            )
        lifetime = "detached" if self.detached else None
        pgs = [
            placement_group(bundles=bundles, strategy=strategy, name=f"{prefix}{i}", lifetime=lifetime)
            for i, bundles in enumerate(pg_bundles)
        ]
        ready, _ = ray.wait([pg.ready() for pg in pgs], num_returns=len(pgs), timeout=self.ready_timeout_s)
        if len(ready) != len(pgs):
            raise RuntimeError(
                f"placement groups {pg_bundles} were not ready after {self.ready_timeout_s:g}s: the resources exist "
                f"but other actors or pools hold them ({describe_free(pg_bundles)}); free them or lower "
                "max_colocate_count"
            )
        self.pgs = sort_placement_group_by_node_ip(pgs)
        return self.pgs

    def bundle_slots(self) -> list[BundleSlot]:
        """One slot per worker rank, in rank order (node by node)."""
        slots = []
        for pg in self.get_placement_groups():
            slots.extend(BundleSlot(pg, b, b, pg.bundle_count) for b in range(pg.bundle_count))
        return slots


class SubRayResourcePool(RayResourcePool):
    """``subgroup_world_size`` consecutive slots (from ``start_bundle_index``, counted over all nodes) of
    existing placement groups, e.g. to give part of a pool to another role."""

    def __init__(
        self, placement_groups: list[PlacementGroup], start_bundle_index: int, subgroup_world_size: int, **kwargs
    ) -> None:
        super().__init__(**kwargs)
        self.pgs = placement_groups
        self.start_bundle_index = start_bundle_index
        self.subgroup_world_size = subgroup_world_size

    @property
    def world_size(self) -> int:
        return self.subgroup_world_size

    def bundle_slots(self) -> list[BundleSlot]:
        all_slots = [(pg, b) for pg in self.pgs for b in range(pg.bundle_count)]
        chosen = all_slots[self.start_bundle_index : self.start_bundle_index + self.subgroup_world_size]
        if len(chosen) != self.subgroup_world_size:
            raise ValueError(
                f"sub-pool [{self.start_bundle_index}, +{self.subgroup_world_size}) exceeds the {len(all_slots)} slots"
            )
        per_pg: dict[Any, list[int]] = {}
        for pg, b in chosen:
            per_pg.setdefault(pg.id, []).append(b)
        return [BundleSlot(pg, b, per_pg[pg.id].index(b), len(per_pg[pg.id])) for pg, b in chosen]


def split_resource_pool(resource_pool: RayResourcePool, split_size: int | list[int]) -> list[SubRayResourcePool]:
    """Split a pool into consecutive sub-pools of ``split_size`` slots (an int: equal parts)."""
    total = resource_pool.world_size
    sizes = split_size if isinstance(split_size, list) else [split_size] * (total // max(split_size, 1))
    if sum(sizes) != total or any(s < 1 for s in sizes):
        raise ValueError(f"split sizes {split_size} do not partition the pool's {total} slots")
    pgs = resource_pool.get_placement_groups()
    starts = [sum(sizes[:i]) for i in range(len(sizes))]
    return [
        SubRayResourcePool(
            pgs,
            start,
            size,
            use_gpu=resource_pool.use_gpu,
            max_colocate_count=resource_pool.max_colocate_count,
            name_prefix=f"{resource_pool.name_prefix}split{i}_",
        )
        for i, (start, size) in enumerate(zip(starts, sizes))
    ]


def merge_resource_pool(rp1: RayResourcePool, rp2: RayResourcePool) -> RayResourcePool:
    """One pool with the slots of both (their placement groups are created if needed)."""
    for attr in ("use_gpu", "max_colocate_count", "detached"):
        if getattr(rp1, attr) != getattr(rp2, attr):
            raise ValueError(f"cannot merge resource pools with different {attr}")
    merged = RayResourcePool(
        rp1.store + rp2.store,
        use_gpu=rp1.use_gpu,
        name_prefix=f"{rp1.name_prefix}_{rp2.name_prefix}",
        max_colocate_count=rp1.max_colocate_count,
        detached=rp1.detached,
    )
    merged.pgs = rp1.get_placement_groups() + rp2.get_placement_groups()
    return merged


@dataclass
class ResourcePoolManager:
    """Maps roles (``Role.ActorRollout``, ``Role.Critic``, ...) to named resource pools.

    ``resource_pool_spec = {"global_pool": [n_gpus_per_node] * nnodes}``, ``mapping = {Role.Critic: "global_pool"}``.
    ``max_colocate_count`` defaults to 1: the trainer puts all roles of a pool into one colocated worker class
    (one actor per slot), so one slot share is enough; upstream HEAD's 3 would also reserve 3 CPUs per slot.
    """

    resource_pool_spec: dict[str, list[int]]
    mapping: dict[Any, str]
    max_colocate_count: int = 1
    resource_pool_dict: dict[str, RayResourcePool] = field(default_factory=dict)

    def create_resource_pool(self) -> None:
        """Create one RayResourcePool per spec entry (placement groups are reserved on first use)."""
        for role, pool_name in self.mapping.items():
            if pool_name not in self.resource_pool_spec:
                raise ValueError(f"role {role} maps to pool {pool_name!r}, which is not in resource_pool_spec")
        for pool_name, process_on_nodes in self.resource_pool_spec.items():
            self.resource_pool_dict[pool_name] = RayResourcePool(
                process_on_nodes=process_on_nodes,
                use_gpu=True,
                max_colocate_count=self.max_colocate_count,
                name_prefix=pool_name,
            )
        self._check_resource_available()

    def get_resource_pool(self, role: Any) -> RayResourcePool:
        if role not in self.mapping:
            raise ValueError(f"role {role} has no resource pool; mapping covers {list(self.mapping)}")
        return self.resource_pool_dict[self.mapping[role]]

    def get_n_gpus(self) -> int:
        """Total worker slots (accelerators) over all pools."""
        return sum(n for nodes in self.resource_pool_spec.values() for n in nodes)

    def _check_resource_available(self) -> None:
        pg_bundles = [
            [pool.bundle_spec() for _ in range(count)]
            for pool in self.resource_pool_dict.values()
            for count in pool.store
        ]
        check_cluster_fits(pg_bundles, "STRICT_PACK")
