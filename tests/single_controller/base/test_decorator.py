"""@register stores the dispatch settings upstream's worker groups read, resolves DataProtoFuture arguments,
supports async methods, and rejects malformed modes; custom dispatch modes can be registered."""

import asyncio
import pickle

import pytest
import torch

from verl import DataProto
from verl.single_controller.base.decorator import (
    DISPATCH_MODE_FN_REGISTRY,
    MAGIC_ATTR,
    Dispatch,
    Execute,
    get_predefined_execute_fn,
    register,
    register_dispatch_mode,
    update_dispatch_mode,
)


def test_register_stores_attributes_under_magic_attr():
    """The decorated method carries {dispatch_mode, execute_mode, blocking} and still works."""

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO, execute_mode=Execute.RANK_ZERO, blocking=False)
    def method(x):
        return x + 1

    assert getattr(method, MAGIC_ATTR) == {
        "dispatch_mode": Dispatch.DP_COMPUTE_PROTO,
        "execute_mode": Execute.RANK_ZERO,
        "blocking": False,
    }
    assert method(1) == 2
    assert method.__name__ == "method"


def test_register_defaults_and_async_methods():
    """Defaults are ALL_TO_ALL / ALL / blocking; async methods stay coroutines."""

    @register()
    async def method(x):
        return x * 2

    assert getattr(method, MAGIC_ATTR)["dispatch_mode"] is Dispatch.ALL_TO_ALL
    assert asyncio.run(method(3)) == 6


def test_register_materializes_futures(monkeypatch):
    """DataProtoFuture arguments are resolved before the method body runs (unless disabled)."""
    import ray

    from verl.protocol import DataProtoFuture

    monkeypatch.setattr(ray, "get", lambda refs: refs)
    future = DataProtoFuture.concat([DataProto.from_dict({"x": torch.arange(2)})])

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def method(data):
        return data

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO, materialize_futures=False)
    def lazy(data):
        return data

    assert method(data=future).batch["x"].tolist() == [0, 1]
    assert lazy(future) is future


def test_register_rejects_bad_modes():
    """A non-Dispatch mode, a dict without collect_fn, or a bad execute mode raise at decoration time."""
    with pytest.raises(TypeError, match="dispatch_mode must be"):
        register(dispatch_mode="DP_COMPUTE")
    with pytest.raises(ValueError, match="collect_fn"):
        register(dispatch_mode={"dispatch_fn": lambda wg: None})
    with pytest.raises(TypeError, match="execute_mode"):
        register(execute_mode="ALL")


def test_custom_dispatch_mode_register_and_update():
    """register_dispatch_mode adds a member with its functions; update_dispatch_mode replaces them."""

    def dispatch(wg, *args, **kwargs):
        return args, kwargs

    def collect(wg, out):
        return out

    mode = register_dispatch_mode("TEST_CUSTOM_MODE", dispatch, collect)
    try:
        assert Dispatch.TEST_CUSTOM_MODE is mode
        assert DISPATCH_MODE_FN_REGISTRY[mode] == {"dispatch_fn": dispatch, "collect_fn": collect}
        update_dispatch_mode(mode, dispatch, dispatch)
        assert DISPATCH_MODE_FN_REGISTRY[mode]["collect_fn"] is dispatch
        with pytest.raises(ValueError, match="already registered"):
            register_dispatch_mode("TEST_CUSTOM_MODE", dispatch, collect)
    finally:
        DISPATCH_MODE_FN_REGISTRY.pop(mode)
        Dispatch.remove("TEST_CUSTOM_MODE")


def test_enum_members_survive_pickling_and_execute_names():
    """Dispatch members unpickle to the same object (they travel to Ray workers); Execute maps to method names."""
    assert pickle.loads(pickle.dumps(Dispatch.DP_COMPUTE_PROTO)) is Dispatch.DP_COMPUTE_PROTO
    assert get_predefined_execute_fn(Execute.ALL) == {"execute_fn_name": "execute_all"}
    assert get_predefined_execute_fn(Execute.RANK_ZERO) == {"execute_fn_name": "execute_rank_zero"}
    assert [m.name for m in Dispatch][:8] == [
        "RANK_ZERO",
        "ONE_TO_ALL",
        "ALL_TO_ALL",
        "DP_COMPUTE",
        "DP_COMPUTE_PROTO",
        "DP_COMPUTE_PROTO_WITH_FUNC",
        "DP_COMPUTE_METRIC",
        "DIRECT_ROLLOUT_METHOD",
    ]
