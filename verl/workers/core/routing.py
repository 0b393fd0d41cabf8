"""Which forwards record and which replay the MoE routing (``actor.router_replay.mode``), for both worker paths.

* ``R2``: the old-log-prob forward records every token's experts into ``routed_experts`` ``(B, S, L, k)``; the
  trainer keeps it in the batch; every update forward replays it (the expert choice of the policy that produced
  the old log-probs, while the weights move).
* ``R3``: the rollout engine recorded ``routed_experts`` (``rollout.enable_rollout_routing_replay``); both the
  old-log-prob forward and the update replay it.

The routing maths (hooks on the gates, forced choice with the trained router's weights) is
:mod:`verl.models.transformers.router_replay`; the layout (gathered into the packed or padded token stream) is
:class:`verl.workers.core.model_forward.RoutingStep`.
"""

from __future__ import annotations

from typing import Any

import torch.nn as nn

__all__ = [
    "ROUTED_EXPERTS",
    "ROUTER_REPLAY_META_KEY",
    "engine_routing_mode",
    "replay_router",
    "router_replay_mode",
    "routing_keys",
]

ROUTED_EXPERTS = "routed_experts"
"""Batch key of the routing (upstream's name)."""

ROUTER_REPLAY_META_KEY = "router_replay"
"""``meta_info`` key telling an engine's forward to ``record`` or ``replay`` the routing (engine path)."""


def router_replay_mode(config: Any) -> str:
    """``config.router_replay.mode`` (``disabled`` for configs without the node, e.g. the reference policy's)."""
    node = getattr(config, "router_replay", None)
    return "disabled" if node is None else node.mode


def replay_router(config: Any, module: nn.Module):
    """The model's ``RouterReplay`` controller when replay is on, else None (a dense model raises, naming the key)."""
    if router_replay_mode(config) == "disabled":
        return None
    from verl.models.transformers.router_replay import install_router_replay

    return install_router_replay(module)


def routing_keys(config: Any, recording: bool = False) -> list[str]:
    """Batch keys a forward needs: ``routed_experts`` whenever it replays (R3 always, R2 in the update)."""
    mode = router_replay_mode(config)
    if mode == "R3" or (mode == "R2" and not recording):
        return [ROUTED_EXPERTS]
    return []


def engine_routing_mode(config: Any, recording: bool = False) -> str | None:
    """What the engine's forwards do with the routing: ``record`` (R2 old-log-prob pass), ``replay`` or None."""
    mode = router_replay_mode(config)
    if mode == "disabled":
        return None
    return "record" if (recording and mode == "R2") else "replay"
