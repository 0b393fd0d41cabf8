"""Which forwards record and which replay the MoE routing (``actor.router_replay.mode``), for both worker paths.

* ``R2``: the old-log-prob forward records every token's experts into ``routed_experts`` ``(B, S, L, k)``; the
  trainer keeps it in the batch; every update forward replays it (the expert choice of the policy that produced
  the old log-probs, while the weights move).
* ``R3``: the rollout engine recorded ``routed_experts`` (``rollout.enable_rollout_routing_replay``); both the
  old-log-prob forward and the update replay it.

The routing maths (hooks on the gates, forced choice with the trained router's weights) is
:mod:`verl.models.transformers.router_replay`; the layout (gathered into the packed or padded token stream) is
:class:`verl.workers.core.model_forward.RoutingStep`.

Under Ulysses SP each rank's decoder (and so each MoE gate) runs only its slice of the packed stream: the stream is
right-padded to a multiple of SP and rank ``r`` holds tokens ``[r * T_pad / sp, (r + 1) * T_pad / sp)``
(:func:`verl.utils.ulysses.shard_packed_batch`). :func:`shard_routing` cuts the whole stream's routing the same
way, so every rank forces the experts of exactly the tokens it holds; :func:`gather_routing` puts the slices the
gates recorded back into the whole stream (every SP rank returns the same ``routed_experts``, like the
log-probs). Memory: the whole stream's ``(T, L, k)`` routing (``L * k`` bytes a token in ``uint8``) on every SP
rank, plus this rank's ``T_pad / sp`` slice while the forward runs.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn as nn
from torch.distributed import ProcessGroup

__all__ = [
    "ROUTED_EXPERTS",
    "ROUTER_REPLAY_META_KEY",
    "engine_routing_mode",
    "gather_routing",
    "replay_router",
    "router_replay_mode",
    "routing_keys",
    "shard_routing",
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


def shard_routing(routing: torch.Tensor, group: ProcessGroup | None = None) -> torch.Tensor:
    """This SP rank's slice of the packed stream's routing ``(T, L, k)``, padded and cut exactly like the input
    ids (:func:`verl.utils.ulysses.ulysses_pad_and_slice_inputs`); unchanged without SP (``group`` None: the
    installed SP group, as ``forward_packed`` resolves it).

    The padding tokens are a sequence of their own that no real token attends to, and HF's MoE computes every token
    on its own, so their forced experts cannot change a real token; they get experts ``0 .. k-1`` (k distinct ids,
    a valid top-k of any model).
    """
    from verl.utils.ulysses import get_ulysses_sequence_parallel_world_size, slice_input_tensor

    sp_size = get_ulysses_sequence_parallel_world_size(group)
    if sp_size == 1:
        return routing
    pad = -routing.shape[0] % sp_size
    if pad:
        top_k = routing.shape[-1]
        filler = torch.arange(top_k, dtype=routing.dtype, device=routing.device).expand(pad, routing.shape[1], top_k)
        routing = torch.cat([routing, filler], dim=0)
    return slice_input_tensor(routing, dim=0, padding=False, group=group)


def gather_routing(local: torch.Tensor, total_tokens: int, group: ProcessGroup | None = None) -> torch.Tensor:
    """The whole stream's ``(T, L, k)`` routing from every SP rank's ``(T_pad / sp, L, k)`` slice (rank order,
    the padding dropped); unchanged without SP. The inverse of :func:`shard_routing`."""
    from verl.utils.ulysses import all_gather_tensor, get_ulysses_sequence_parallel_world_size

    if get_ulysses_sequence_parallel_world_size(group) == 1:
        return local
    return all_gather_tensor(local, group)[:total_tokens]
