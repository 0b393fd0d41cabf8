"""Rollout engines (upstream ``verl.workers.rollout``): ``BaseRollout``, ``get_rollout_class``, ``HFRollout``."""

from verl.workers.rollout.registry import register_rollout


def __getattr__(name: str):
    # HFRollout imports transformers' generation utilities, base torch and DataProto: load them only when asked for
    # (the driver imports verl.workers.rollout.registry before Ray starts)
    if name == "HFRollout":
        from verl.workers.rollout.hf_rollout import HFRollout

        return HFRollout
    if name in ("BaseRollout", "get_rollout_class"):
        from verl.workers.rollout import base

        return getattr(base, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["BaseRollout", "HFRollout", "get_rollout_class", "register_rollout"]
