"""``Worker``: base class of every process a worker group drives (actor, critic, rollout, ...).

A worker learns its place in the group from the environment the worker group sets for it, with the
torchrun names: ``WORLD_SIZE``, ``RANK``, ``LOCAL_WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR``,
``MASTER_PORT``, plus the platform's visible-devices variable (``CUDA_VISIBLE_DEVICES`` /
``ASCEND_RT_VISIBLE_DEVICES``). So ``torch.distributed.init_process_group(backend, rank=..., world_size=...)``
with the default ``env://`` rendezvous works as-is inside a worker. Constructed outside a worker group with none
of ``RANK`` / ``WORLD_SIZE`` set, a worker is rank 0 of 1 (handy for single-process tests).

Under Ray each worker sees exactly the devices Ray assigned to it, so its device index is 0
(``verl.utils.device.get_device_id()``); ``LOCAL_RANK`` is the rank among the group's processes on its node.
"""

from __future__ import annotations

import os
import socket
from typing import Any

from verl.single_controller.base.decorator import Dispatch, Execute, register
from verl.upstream_gaps import missing_name_getattr

__all__ = ["Worker", "WorkerHelper", "get_free_port", "get_node_ip"]


def get_free_port() -> int:
    """A TCP port that is free right now on this host (the OS picks it)."""
    with socket.socket() as sock:
        sock.bind(("", 0))
        return sock.getsockname()[1]


def get_node_ip() -> str:
    """This node's IP as Ray sees it (brackets of IPv6 literals removed), or 127.0.0.1 outside Ray."""
    try:
        import ray

        if ray.is_initialized():
            return ray.util.get_node_ip_address().strip("[]")
    except ImportError:
        pass
    return "127.0.0.1"


class WorkerHelper:
    """Upstream's helper mixin: node IP and a free port for a rendezvous."""

    def _get_node_ip(self) -> str:
        return get_node_ip()

    def _get_free_port(self) -> int:
        return get_free_port()

    def get_availale_master_addr_port(self) -> tuple[str, str]:  # upstream spelling, kept for compatibility
        return self._get_node_ip(), str(self._get_free_port())

    def _get_pid(self) -> int:
        return os.getpid()


def _int_env(key: str, default: int) -> int:
    value = os.environ.get(key)
    if value is None or value == "":
        return default
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"environment variable {key}={value!r} must be an integer") from None


def read_rank_env() -> dict[str, Any]:
    """The worker's rank info from the environment (see the module docstring); validated."""
    has_rank, has_world = "RANK" in os.environ, "WORLD_SIZE" in os.environ
    if has_rank != has_world:
        raise ValueError("set both RANK and WORLD_SIZE (or neither, for a single-process worker)")
    info = {
        "world_size": _int_env("WORLD_SIZE", 1),
        "rank": _int_env("RANK", 0),
        "local_world_size": _int_env("LOCAL_WORLD_SIZE", 1),
        "local_rank": _int_env("LOCAL_RANK", 0),
        "master_addr": os.environ.get("MASTER_ADDR"),
        "master_port": os.environ.get("MASTER_PORT"),
    }
    if not 0 <= info["rank"] < info["world_size"]:
        raise ValueError(f"RANK={info['rank']} is outside [0, WORLD_SIZE={info['world_size']})")
    if not 0 <= info["local_rank"] < info["local_world_size"]:
        raise ValueError(f"LOCAL_RANK={info['local_rank']} is outside [0, LOCAL_WORLD_SIZE={info['local_world_size']})")
    return info


def _visible_devices_keyword() -> str:
    from verl.utils.device import get_visible_devices_keyword

    return get_visible_devices_keyword()


class Worker(WorkerHelper):
    """A process of a worker group. Subclasses call ``super().__init__()`` and mark remote methods with
    ``@register``."""

    fused_worker_attr_name = "fused_worker_dict"

    @classmethod
    def env_keys(cls) -> list[str]:
        """Environment variables that configure a worker."""
        return ["WORLD_SIZE", "RANK", "LOCAL_WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"] + [
            _visible_devices_keyword()
        ]

    def __init__(self, cuda_visible_devices: str | None = None) -> None:
        from verl.utils.driver_watch import start_driver_watch

        # Under main_ppo: stop this process as soon as the run's driver dies (verl.utils.driver_watch).
        start_driver_watch(type(self).__name__)
        info = read_rank_env()
        self._world_size: int = info["world_size"]
        self._rank: int = info["rank"]
        self._local_world_size: int = info["local_world_size"]
        self._local_rank: int = info["local_rank"]
        self._master_addr: str | None = info["master_addr"]
        self._master_port: str | None = info["master_port"]
        self._cuda_visible_devices = cuda_visible_devices or os.environ.get(_visible_devices_keyword())
        self.fused_worker_dict: dict[str, Worker] = {}
        # mesh name -> this rank's dp rank / whether this rank returns output (see make_nd_compute_dataproto_dispatch_fn)
        self._dispatch_dp_rank: dict[str, int] = {}
        self._collect_dp_rank: dict[str, bool] = {}

    @property
    def world_size(self) -> int:
        return self._world_size

    @property
    def rank(self) -> int:
        return self._rank

    def get_master_addr_port(self) -> tuple[str | None, str | None]:
        return self._master_addr, self._master_port

    def get_cuda_visible_devices(self) -> str:
        """The platform's visible-devices variable as this process sees it (``"not set"`` if unset)."""
        return os.environ.get(_visible_devices_keyword(), "not set")

    def get_fused_worker_by_name(self, worker_name: str) -> Worker | None:
        return self.fused_worker_dict.get(worker_name)

    # ------------------------------------------------------------------------------ n-d mesh dispatch info

    def _register_dispatch_collect_info(self, mesh_name: str, dp_rank: int, is_collect: bool) -> None:
        """Declare this rank's dp rank on ``mesh_name`` and whether it returns output (once per mesh)."""
        if mesh_name in self._dispatch_dp_rank:
            raise ValueError(f"mesh {mesh_name!r} is already registered on rank {self.rank}")
        self._dispatch_dp_rank[mesh_name] = int(dp_rank)
        self._collect_dp_rank[mesh_name] = bool(is_collect)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def _query_dispatch_info(self, mesh_name: str) -> int:
        if mesh_name not in self._dispatch_dp_rank:
            raise ValueError(
                f"mesh {mesh_name!r} is not registered on rank {self.rank} of {type(self).__name__}; call "
                f"self._register_dispatch_collect_info({mesh_name!r}, dp_rank, is_collect) when the mesh is built"
            )
        return self._dispatch_dp_rank[mesh_name]

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def _query_collect_info(self, mesh_name: str) -> bool:
        self._query_dispatch_info(mesh_name)  # same error if the mesh is unknown
        return self._collect_dp_rank[mesh_name]

    def get_dispatch_collect(self) -> dict[str, dict]:
        return {"dispatch_dp_rank": dict(self._dispatch_dp_rank), "collect_dp_rank": dict(self._collect_dp_rank)}

    def set_dispatch_collect(self, mesh_name: str, dispatch_dp_rank: dict, collect_dp_rank: dict) -> None:
        """Copy ``mesh_name``'s entries from another worker's ``get_dispatch_collect()`` (fused workers)."""
        self._dispatch_dp_rank[mesh_name] = dispatch_dp_rank[mesh_name]
        self._collect_dp_rank[mesh_name] = collect_dp_rank[mesh_name]

    # ------------------------------------------------------------------------------ generic remote helpers

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO_WITH_FUNC)
    def execute_with_func_generator(self, func, *args, **kwargs):
        """Run ``func(self, shard, ...)`` on every rank with this rank's shard of the data arguments."""
        return func(self, *args, **kwargs)

    @register(dispatch_mode=Dispatch.ALL_TO_ALL, execute_mode=Execute.RANK_ZERO)
    def execute_func_rank_zero(self, func, *args, **kwargs):
        """Run ``func(*args, **kwargs)`` on rank 0 only."""
        return func(*args, **kwargs)


__getattr__ = missing_name_getattr(__name__)  # upstream names missing here raise with the reason (verl.upstream_gaps)
