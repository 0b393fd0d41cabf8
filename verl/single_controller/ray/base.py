"""Upstream's module path for the Ray backend (``verl.single_controller.ray.base``); the code lives in
``resource_pool.py``, ``worker_group.py`` and ``colocate.py``."""

from verl.single_controller.ray.colocate import create_colocated_worker_cls
from verl.single_controller.ray.resource_pool import (
    RayResourcePool,
    ResourcePoolManager,
    SubRayResourcePool,
    merge_resource_pool,
    sort_placement_group_by_node_ip,
    split_resource_pool,
)
from verl.single_controller.ray.worker_group import (
    MANAGED_WORKER_ENV,
    RayClassWithInitArgs,
    RayWorkerGroup,
    get_random_string,
)
from verl.upstream_gaps import missing_name_getattr

__all__ = [
    "MANAGED_WORKER_ENV",
    "RayClassWithInitArgs",
    "RayResourcePool",
    "RayWorkerGroup",
    "ResourcePoolManager",
    "SubRayResourcePool",
    "create_colocated_worker_cls",
    "get_random_string",
    "merge_resource_pool",
    "sort_placement_group_by_node_ip",
    "split_resource_pool",
]


__getattr__ = missing_name_getattr(__name__)  # upstream names missing here raise with the reason (verl.upstream_gaps)
