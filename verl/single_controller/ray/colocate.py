"""``create_colocated_worker_cls``: several role workers (actor, critic, ref, ...) inside one Ray actor.

Colocated roles share the process, hence the device and the CUDA/NPU context, and can hand tensors to each
other without copies. The fused class holds one instance per role in ``worker_dict`` and exposes every
``@register``-ed method of role ``r`` as ``r_<method>`` with the same dispatch settings;
``RayWorkerGroup.spawn(prefix_set)`` then gives per-role views where ``<method>`` works again.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

from verl.single_controller.base.decorator import MAGIC_ATTR
from verl.single_controller.base.worker import Worker
from verl.single_controller.ray.worker_group import RayClassWithInitArgs, unwrap_actor_class

__all__ = ["create_colocated_worker_cls"]


def _forwarder(role: str, method_name: str, method: Callable) -> Callable:
    """A method of the fused class that calls ``self.worker_dict[role].<method_name>``."""
    if inspect.iscoroutinefunction(method):

        async def forward(self, *args, **kwargs):
            return await getattr(self.worker_dict[role], method_name)(*args, **kwargs)

    else:

        def forward(self, *args, **kwargs):
            return getattr(self.worker_dict[role], method_name)(*args, **kwargs)

    forward.__name__ = f"{role}_{method_name}"
    setattr(forward, MAGIC_ATTR, dict(getattr(method, MAGIC_ATTR)))
    return forward


def _bind_role_methods(fused_cls: type, role: str, role_cls: type) -> None:
    for method_name in dir(role_cls):
        method = getattr(role_cls, method_name, None)
        if callable(method) and isinstance(getattr(method, MAGIC_ATTR, None), dict):
            setattr(fused_cls, f"{role}_{method_name}", _forwarder(role, method_name, method))


def create_colocated_worker_cls(class_dict: dict[str, RayClassWithInitArgs]) -> RayClassWithInitArgs:
    """One ``RayClassWithInitArgs`` whose actor hosts an instance of every role in ``class_dict``.

    All roles must subclass ``Worker`` and carry the same Ray options (they share one actor).
    """
    if not class_dict:
        raise ValueError("create_colocated_worker_cls needs at least one role")
    role_classes: dict[str, type] = {}
    init_args: dict[str, tuple[tuple, dict]] = {}
    options = [cia._options for cia in class_dict.values()]
    if any(opt != options[0] for opt in options):
        raise ValueError(f"colocated roles {list(class_dict)} have different Ray options; they share one actor")
    for role, cia in class_dict.items():
        role_cls = unwrap_actor_class(cia.cls)
        if not (isinstance(role_cls, type) and issubclass(role_cls, Worker)):
            raise TypeError(f"role {role!r}: {role_cls!r} is not a subclass of verl.single_controller.base.Worker")
        role_classes[role], init_args[role] = role_cls, (cia.args, cia.kwargs)

    class WorkerDict(Worker):
        def __init__(self) -> None:
            super().__init__()
            # every role reads the same rank environment, set by the worker group for this actor
            self.worker_dict: dict[str, Any] = {
                role: cls(*init_args[role][0], **init_args[role][1]) for role, cls in role_classes.items()
            }

    for role, role_cls in role_classes.items():
        _bind_role_methods(WorkerDict, role, role_cls)
    fused = RayClassWithInitArgs(WorkerDict)
    fused.update_options(dict(options[0]))
    return fused
