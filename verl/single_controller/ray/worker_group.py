"""``RayWorkerGroup``: one Ray actor per resource-pool slot, driven through ``@register``-ed group methods.

Rank ``r`` runs in slot ``r`` of the pool and gets the torchrun-style environment (``RANK``, ``WORLD_SIZE``,
``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT``) plus ``VERL_PLATFORM`` (so workers use
the driver's device platform) and the platform's collective-backend variables, plus the caller's ``worker_env``. Ray sets the visible-devices
variable (``CUDA_VISIBLE_DEVICES`` / ``ASCEND_RT_VISIBLE_DEVICES``) from the accelerator share the actor asks
for. ``MASTER_ADDR`` / ``MASTER_PORT`` are picked on rank 0's node before any worker starts: by the caller when
rank 0's slot is on the caller's own node (the one-node case), else by a tiny task there.
"""

from __future__ import annotations

import random
import re
import string
from typing import Any

import ray
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from verl.single_controller.base.worker import get_free_port, get_node_ip
from verl.single_controller.base.worker_group import ClassWithInitArgs, WorkerGroup
from verl.single_controller.ray.resource_pool import RayResourcePool, platform_for
from verl.single_controller.ray.worker_loss import resolve, slot_node_ids

__all__ = ["MANAGED_WORKER_ENV", "RayClassWithInitArgs", "RayWorkerGroup"]

MANAGED_WORKER_ENV = (
    "WORLD_SIZE",
    "RANK",
    "LOCAL_WORLD_SIZE",
    "LOCAL_RANK",
    "RAY_LOCAL_WORLD_SIZE",
    "RAY_LOCAL_RANK",
    "MASTER_ADDR",
    "MASTER_PORT",
    "WG_PREFIX",
    "WG_BACKEND",
    "VERL_PLATFORM",
)
"""Variables the worker group sets per rank; ``worker_env`` may not override them (nor the platform's
visible-devices variable, which Ray sets from the accelerator share each actor gets)."""


def get_random_string(length: int) -> str:
    return "".join(random.choices(string.ascii_letters + string.digits, k=length))


def unwrap_actor_class(cls: Any) -> type:
    """The user class behind ``ray.remote(cls)`` (or ``cls`` itself)."""
    return getattr(cls, "__ray_actor_class__", cls)


@ray.remote(num_cpus=0)
def _pick_master_addr_port() -> tuple[str, str]:
    return get_node_ip(), str(get_free_port())


def _master_addr_port(slot: Any, node_id: str) -> tuple[str, str]:
    """Address and a free port on ``node_id``, rank 0's node: picked here when that is this process's node (no
    task, whose fresh worker process costs seconds at start-up), else by a task scheduled into rank 0's slot."""
    try:
        here = ray.get_runtime_context().get_node_id()
    except Exception:  # a Ray client driver has no node of its own
        here = None
    if here == node_id:
        return get_node_ip(), str(get_free_port())
    first = PlacementGroupSchedulingStrategy(slot.placement_group, slot.bundle_index)
    return ray.get(_pick_master_addr_port.options(scheduling_strategy=first).remote())


def checked_worker_env(worker_env: dict[str, Any] | None, visible_devices_envvar: str | None) -> dict[str, str]:
    """``worker_env`` as Ray ``env_vars`` (str -> str); ValueError naming any variable the group manages itself."""
    worker_env = dict(worker_env or {})
    managed = set(MANAGED_WORKER_ENV) | ({visible_devices_envvar} if visible_devices_envvar else set())
    clash = sorted(managed & set(worker_env))
    if clash:
        raise ValueError(
            f"worker_env sets {', '.join(clash)}, which the worker group manages itself for every rank "
            f"({', '.join(sorted(managed))}); overriding {clash[0]} would break the process group or device "
            "assignment. Remove it from worker_env."
        )
    not_str = sorted(k for k in worker_env if not isinstance(k, str))
    if not_str:
        raise ValueError(f"worker_env keys must be variable names (str), got {not_str}")
    return {key: str(value) for key, value in worker_env.items()}


def _merge_runtime_env(options: dict, env_vars: dict[str, str]) -> dict:
    runtime_env = dict(options.get("runtime_env") or {})
    runtime_env["env_vars"] = {**(runtime_env.get("env_vars") or {}), **env_vars}
    return {**options, "runtime_env": runtime_env}


class RayClassWithInitArgs(ClassWithInitArgs):
    """A worker class (plain or ``ray.remote``-wrapped) with its init args and Ray actor options."""

    def __init__(self, cls: Any, *args, **kwargs) -> None:
        super().__init__(cls, *args, **kwargs)
        self._options: dict[str, Any] = {}
        self._additional_resource: dict[str, float] = {}

    def set_additional_resource(self, additional_resource: dict[str, float]) -> None:
        """Extra custom Ray resources every actor of this class asks for."""
        self._additional_resource = dict(additional_resource)

    def update_options(self, options: dict[str, Any]) -> None:
        """Extra ``actor.options(...)`` (e.g. ``runtime_env``); merged into every actor's options."""
        self._options.update(options)

    def __call__(
        self,
        placement_group: Any,
        placement_group_bundle_idx: int,
        use_gpu: bool = True,
        num_gpus: float = 1,
        sharing_with: Any = None,
        device_name: str | None = None,
        env_vars: dict[str, str] | None = None,
        name: str | None = None,
        detached: bool = False,
    ) -> Any:
        """Start one actor in bundle ``placement_group_bundle_idx`` and return its handle."""
        if sharing_with is not None:
            raise NotImplementedError("sharing_with is not supported; colocate roles with create_colocated_worker_cls")
        options: dict[str, Any] = {
            "scheduling_strategy": PlacementGroupSchedulingStrategy(
                placement_group=placement_group, placement_group_bundle_index=placement_group_bundle_idx
            ),
            "num_cpus": 1,
        }
        platform = platform_for(device_name)
        if use_gpu and platform.ray_resource_name != "CPU":
            # e.g. {"num_gpus": 0.5} on CUDA, {"resources": {"NPU": 0.5}} on Ascend; Ray then sets the
            # visible-devices variable of the actor to the device it was given.
            options.update(platform.ray_actor_options(num_gpus))
        if self._additional_resource:
            options["resources"] = {**options.get("resources", {}), **self._additional_resource}
        options = _merge_runtime_env({**options, **self._options}, env_vars or {})
        if name is not None:
            options["name"] = name
        if detached:
            options["lifetime"] = "detached"
        remote_cls = self.cls if hasattr(self.cls, "__ray_actor_class__") else ray.remote(self.cls)
        return remote_cls.options(**options).remote(*self.args, **self.kwargs)


class RayWorkerGroup(WorkerGroup):
    """A group of Ray actors, one per slot of ``resource_pool``, with the user class's ``@register`` methods
    bound as group methods (``wg.compute_values(batch)``)."""

    def __init__(
        self,
        resource_pool: RayResourcePool | None = None,
        ray_cls_with_init: RayClassWithInitArgs | None = None,
        bin_pack: bool = True,
        name_prefix: str | None = None,
        detached: bool = False,
        worker_names: list[str] | None = None,
        worker_handles: list[Any] | None = None,
        ray_wait_register_center_timeout: int = 300,
        worker_env: dict[str, Any] | None = None,
        **kwargs,
    ) -> None:
        """``worker_env``: extra environment variables every worker process gets (checked before any worker
        starts: ValueError naming a variable in ``MANAGED_WORKER_ENV``). kwargs: upstream's device_name /
        profile_steps / worker_nsight_options are accepted and ignored, except device_name, which selects the
        accelerator resource (default: this process's platform)."""
        super().__init__(resource_pool=resource_pool if worker_handles is None and worker_names is None else None)
        self.ray_cls_with_init = ray_cls_with_init
        self.name_prefix = get_random_string(6) if name_prefix is None else name_prefix
        self.device_name = kwargs.get("device_name")
        self.worker_env = checked_worker_env(worker_env, platform_for(self.device_name).visible_devices_envvar)
        self.fused_worker_used = bool(ray_cls_with_init is not None and ray_cls_with_init.fused_worker_used)
        self.sub_cls_name = ""
        self.wg_dict: dict[str, RayWorkerGroup] | None = None
        self._worker_node_ids: list[str] = []  # Ray node of each rank, to name it when the rank is lost
        if worker_handles is not None or worker_names is not None:
            self._workers = (
                list(worker_handles) if worker_handles is not None else [ray.get_actor(n) for n in worker_names]
            )
            self._worker_names = list(worker_names or [])
        else:
            if resource_pool is None or ray_cls_with_init is None:
                raise ValueError("RayWorkerGroup needs resource_pool and ray_cls_with_init (or existing workers)")
            self._init_with_resource_pool(resource_pool, ray_cls_with_init, bin_pack, detached)
        if ray_cls_with_init is not None:
            self._bind_worker_method(unwrap_actor_class(ray_cls_with_init.cls))

    def _init_with_resource_pool(
        self, resource_pool: RayResourcePool, ray_cls_with_init: RayClassWithInitArgs, bin_pack: bool, detached: bool
    ) -> None:
        resource_pool.get_placement_groups(strategy="STRICT_PACK" if bin_pack else "PACK", device_name=self.device_name)
        slots = resource_pool.bundle_slots()
        self._worker_node_ids = slot_node_ids(slots)
        self._master_addr, self._master_port = _master_addr_port(slots[0], self._worker_node_ids[0])
        cls_name = re.sub(r"^ActorClass\((.*)\)$", r"\1", unwrap_actor_class(ray_cls_with_init.cls).__name__)
        for rank, slot in enumerate(slots):
            name = f"{self.name_prefix}{cls_name}_{rank}:{slot.local_rank}"
            worker = ray_cls_with_init(
                placement_group=slot.placement_group,
                placement_group_bundle_idx=slot.bundle_index,
                use_gpu=resource_pool.use_gpu,
                num_gpus=1 / resource_pool.max_colocate_count,
                device_name=self.device_name,
                env_vars=self._rank_env(rank, len(slots), slot.local_rank, slot.local_world_size),
                name=name,
                detached=detached,
            )
            self._workers.append(worker)
            self._worker_names.append(name)
        # Wait for every constructor, so a failing __init__ surfaces here and not at the first method call.
        ray.get([worker.__ray_ready__.remote() for worker in self._workers])

    def _rank_env(self, rank: int, world_size: int, local_rank: int, local_world_size: int) -> dict[str, str]:
        platform = platform_for(self.device_name)
        return {
            **platform.comm_env_vars(),
            **self.worker_env,
            "WORLD_SIZE": str(world_size),
            "RANK": str(rank),
            "LOCAL_WORLD_SIZE": str(local_world_size),
            "LOCAL_RANK": str(local_rank),
            "RAY_LOCAL_WORLD_SIZE": str(local_world_size),
            "RAY_LOCAL_RANK": str(local_rank),
            "MASTER_ADDR": self._master_addr,
            "MASTER_PORT": self._master_port,
            "WG_PREFIX": self.name_prefix,
            "WG_BACKEND": "ray",
            "VERL_PLATFORM": platform.device_name,
        }

    # ------------------------------------------------------------------------------ execution

    def execute_all_async(self, method_name: str, *args, **kwargs) -> list:
        calls = self._per_rank_calls(args, kwargs)
        return [getattr(w, method_name).remote(*a, **k) for w, (a, k) in zip(self._workers, calls)]

    def execute_rank_zero_async(self, method_name: str, *args, **kwargs) -> Any:
        return getattr(self._workers[0], method_name).remote(*args, **kwargs)

    def _resolve(self, output: Any) -> Any:
        # ray.get, with a lost rank (its process or its node) raised as WorkerLostError naming the node
        return resolve(output, self._workers, self._worker_node_ids)

    def _share(self, obj: Any) -> Any:
        return ray.put(obj)

    # ------------------------------------------------------------------------------ properties

    @property
    def worker_names(self) -> list[str]:
        return self._worker_names

    @property
    def workers(self) -> list[Any]:
        return self._workers

    @property
    def worker_node_ids(self) -> list[str]:
        """The Ray node id of each rank (empty for a group built from existing actors)."""
        return self._worker_node_ids

    @property
    def master_address(self) -> str | None:
        return self._master_addr

    @property
    def master_port(self) -> str | None:
        return self._master_port

    # ------------------------------------------------------------------------------ colocated roles

    @classmethod
    def from_detached(
        cls,
        name_prefix: str | None = None,
        worker_names: list[str] | None = None,
        worker_handles: list[Any] | None = None,
        ray_cls_with_init: RayClassWithInitArgs | None = None,
        **kwargs,
    ) -> RayWorkerGroup:
        """A group over existing actors (by name or handle)."""
        return cls(
            name_prefix=name_prefix,
            worker_names=worker_names,
            worker_handles=worker_handles,
            ray_cls_with_init=ray_cls_with_init,
            **kwargs,
        )

    def spawn(self, prefix_set: set[str] | list[str]) -> dict[str, RayWorkerGroup]:
        """Per-role views of a group built from ``create_colocated_worker_cls``: in view ``role``, the group
        method ``role_<method>`` is also reachable as ``<method>``. Views share this group's actors."""
        views = {}
        for prefix in prefix_set:
            view = self.from_detached(
                name_prefix=self.name_prefix,
                worker_names=self._worker_names,
                worker_handles=self._workers,
                ray_cls_with_init=self.ray_cls_with_init,
                device_name=self.device_name,
            )
            view._master_addr, view._master_port = self._master_addr, self._master_port
            view._worker_node_ids = self._worker_node_ids
            view.sub_cls_name = prefix
            for method_name in list(view.method_names):
                if method_name.startswith(prefix + "_"):
                    setattr(view, method_name.removeprefix(prefix + "_"), getattr(view, method_name))
            views[prefix] = view
        return views

    def fuse(self, prefix_set: set[str] | list[str]) -> None:
        """Attach the per-role views as attributes: ``wg.actor.update_actor(...)``."""
        if self.wg_dict is None:
            self.wg_dict = self.spawn(prefix_set)
        for role, view in self.wg_dict.items():
            setattr(self, role, view)
