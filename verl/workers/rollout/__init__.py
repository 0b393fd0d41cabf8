"""Rollout engines (upstream ``verl.workers.rollout``): ``BaseRollout``, ``get_rollout_class``, ``HFRollout``."""

from verl.workers.rollout.base import BaseRollout, get_rollout_class, register_rollout


def __getattr__(name: str):
    # HFRollout imports transformers' generation utilities; load it only when asked for
    if name == "HFRollout":
        from verl.workers.rollout.hf_rollout import HFRollout

        return HFRollout
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["BaseRollout", "HFRollout", "get_rollout_class", "register_rollout"]
