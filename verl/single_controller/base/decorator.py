"""``@register``: declare how a worker method is called from the driver through a worker group.

    class ActorWorker(Worker):
        @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
        def compute_log_prob(self, data: DataProto) -> DataProto: ...

    actor_wg.compute_log_prob(batch)   # split batch over ranks -> run on every rank -> concat outputs

``Dispatch`` names a (dispatch_fn, collect_fn) pair (see ``dispatch.py``); ``Execute`` says which ranks run the
method; ``blocking=False`` returns futures (a ``DataProtoFuture`` for DataProto outputs) instead of waiting.
The worker group reads the attributes stored under ``MAGIC_ATTR`` to build its group methods.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from functools import wraps
from typing import Any

from verl.protocol import DataProtoFuture
from verl.single_controller.base import dispatch as _d
from verl.single_controller.base.dispatch import make_nd_compute_dataproto_dispatch_fn
from verl.upstream_gaps import missing_name_getattr
from verl.utils.py_functional import DynamicEnum

__all__ = [
    "MAGIC_ATTR",
    "Dispatch",
    "Execute",
    "get_predefined_dispatch_fn",
    "get_predefined_execute_fn",
    "make_nd_compute_dataproto_dispatch_fn",
    "register",
    "register_dispatch_mode",
    "update_dispatch_mode",
]

# Attribute under which @register stores its settings on the method (upstream's name and value).
MAGIC_ATTR = "attrs_3141562937"


class Dispatch(DynamicEnum):
    """How arguments are distributed to ranks and outputs gathered; extend with ``register_dispatch_mode``."""

    _registry: dict[str, Dispatch] = {}
    _next_value = 0


class Execute(DynamicEnum):
    """Which ranks run the method: ``ALL`` or ``RANK_ZERO``."""

    _registry: dict[str, Execute] = {}
    _next_value = 0


for _name in (
    "RANK_ZERO",
    "ONE_TO_ALL",
    "ALL_TO_ALL",
    "DP_COMPUTE",
    "DP_COMPUTE_PROTO",
    "DP_COMPUTE_PROTO_WITH_FUNC",
    "DP_COMPUTE_METRIC",
    "DIRECT_ROLLOUT_METHOD",
):
    Dispatch.register(_name)
for _name in ("ALL", "RANK_ZERO"):
    Execute.register(_name)


def _pair(dispatch_fn: Callable, collect_fn: Callable) -> dict[str, Callable]:
    return {"dispatch_fn": dispatch_fn, "collect_fn": collect_fn}


DISPATCH_MODE_FN_REGISTRY: dict[Dispatch, dict[str, Callable]] = {
    Dispatch.RANK_ZERO: _pair(_d.dispatch_all_to_all, _d.collect_rank_zero),
    Dispatch.ONE_TO_ALL: _pair(_d.dispatch_one_to_all, _d.collect_all_to_all),
    Dispatch.ALL_TO_ALL: _pair(_d.dispatch_all_to_all, _d.collect_all_to_all),
    Dispatch.DP_COMPUTE: _pair(_d.dispatch_dp_compute, _d.collect_dp_compute),
    Dispatch.DP_COMPUTE_PROTO: _pair(_d.dispatch_dp_compute_data_proto, _d.collect_dp_compute_data_proto),
    Dispatch.DP_COMPUTE_PROTO_WITH_FUNC: _pair(
        _d.dispatch_dp_compute_data_proto_with_func, _d.collect_dp_compute_data_proto
    ),
    Dispatch.DP_COMPUTE_METRIC: _pair(_d.dispatch_dp_compute_data_proto, _d.collect_dp_compute),
    Dispatch.DIRECT_ROLLOUT_METHOD: _pair(_d.dispatch_direct_rollout_call, _d.dispatch_direct_rollout_call),
}

EXECUTE_MODE_FN_NAME: dict[Execute, str] = {Execute.ALL: "execute_all", Execute.RANK_ZERO: "execute_rank_zero"}


def get_predefined_dispatch_fn(dispatch_mode: Dispatch) -> dict[str, Callable]:
    """``{"dispatch_fn": ..., "collect_fn": ...}`` registered for ``dispatch_mode``."""
    return DISPATCH_MODE_FN_REGISTRY[dispatch_mode]


def get_predefined_execute_fn(execute_mode: Execute) -> dict[str, str]:
    """``{"execute_fn_name": "execute_all" | "execute_rank_zero"}``: the worker-group method that runs the call."""
    return {"execute_fn_name": EXECUTE_MODE_FN_NAME[execute_mode]}


def register_dispatch_mode(name: str, dispatch_fn: Callable, collect_fn: Callable) -> Dispatch:
    """Add a new ``Dispatch`` member ``name`` with its dispatch / collect functions and return it."""
    mode = Dispatch.register(name)
    DISPATCH_MODE_FN_REGISTRY[mode] = _pair(dispatch_fn, collect_fn)
    return mode


def update_dispatch_mode(dispatch_mode: Dispatch, dispatch_fn: Callable, collect_fn: Callable) -> None:
    """Replace the functions of an existing dispatch mode."""
    if dispatch_mode not in DISPATCH_MODE_FN_REGISTRY:
        raise ValueError(f"{dispatch_mode!r} is not a registered dispatch mode; use register_dispatch_mode")
    DISPATCH_MODE_FN_REGISTRY[dispatch_mode] = _pair(dispatch_fn, collect_fn)


def _check_dispatch_mode(dispatch_mode: Any) -> None:
    if isinstance(dispatch_mode, Dispatch):
        return
    if isinstance(dispatch_mode, dict):
        missing = {"dispatch_fn", "collect_fn"} - dispatch_mode.keys()
        if missing:
            raise ValueError(f"a dict dispatch_mode needs the keys {sorted(missing)}")
        return
    raise TypeError(f"dispatch_mode must be a Dispatch member or a dict of functions, got {dispatch_mode!r}")


def _materialize_futures(args: tuple, kwargs: dict) -> tuple[tuple, dict]:
    # DataProtoFuture arguments are resolved inside the worker, so the data never passes through the driver.
    args = tuple(a.get() if isinstance(a, DataProtoFuture) else a for a in args)
    kwargs = {k: v.get() if isinstance(v, DataProtoFuture) else v for k, v in kwargs.items()}
    return args, kwargs


def register(
    dispatch_mode: Dispatch | dict = Dispatch.ALL_TO_ALL,
    execute_mode: Execute = Execute.ALL,
    blocking: bool = True,
    materialize_futures: bool = True,
) -> Callable[[Callable], Callable]:
    """Mark a worker method as callable through a worker group (sync or ``async def``).

    Args:
        dispatch_mode: a ``Dispatch`` member or ``{"dispatch_fn": f, "collect_fn": g}``
            (e.g. ``make_nd_compute_dataproto_dispatch_fn("actor")``).
        execute_mode: ``Execute.ALL`` (every rank) or ``Execute.RANK_ZERO``.
        blocking: wait for the results (True) or return futures (False).
        materialize_futures: resolve ``DataProtoFuture`` arguments before the method runs.
    """
    _check_dispatch_mode(dispatch_mode)
    if not isinstance(execute_mode, Execute):
        raise TypeError(f"execute_mode must be an Execute member, got {execute_mode!r}")

    def decorator(func: Callable) -> Callable:
        if inspect.iscoroutinefunction(func):

            @wraps(func)
            async def wrapper(*args, **kwargs):
                if materialize_futures:
                    args, kwargs = _materialize_futures(args, kwargs)
                return await func(*args, **kwargs)

        else:

            @wraps(func)
            def wrapper(*args, **kwargs):
                if materialize_futures:
                    args, kwargs = _materialize_futures(args, kwargs)
                return func(*args, **kwargs)

        setattr(
            wrapper, MAGIC_ATTR, {"dispatch_mode": dispatch_mode, "execute_mode": execute_mode, "blocking": blocking}
        )
        return wrapper

    return decorator


__getattr__ = missing_name_getattr(__name__)  # upstream names missing here raise with the reason (verl.upstream_gaps)
