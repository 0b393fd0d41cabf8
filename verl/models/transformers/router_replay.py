"""MoE router replay: record the experts every token is routed to in one forward, force that choice in another.

Why: the old-log-prob forward (no gradient) and the update forward (with gradient) of the same weights route a
token to the same experts only as long as nothing differs between them; once the weights move in the first
optimizer step of a mini-batch loop, or the kernels differ (rollout engine vs trainer), the top-k choice of a token
near a tie flips, its log-prob jumps and the PPO ratio no longer measures the policy change. Router replay
(upstream's ``actor.router_replay.mode``: R2 = record in the old-log-prob forward, R3 = record in the rollout
engine) forces the recorded choice in training.

What is forced and what is not: only the expert *choice*. In replay the gate still computes its logits with the
trained router weight; the routing weights are the softmax probabilities of the recorded experts, renormalised
over the top-k as the native gate does (``Qwen3_5MoeTopKRouter``: softmax in fp32, top-k, divide by their sum), so
the gradient reaches the router through those probabilities, as upstream.

How: a forward hook on every MoE gate (``Qwen3_5MoeTopKRouter`` of HF transformers, under the project's patches,
which leave the gate alone), installed once by :func:`install_router_replay`. The hook keeps its per-layer state on
the gate, so a gradient-checkpointing recompute in the backward replays the same routing. Routing tensors are
``(T, L, k)``: per token of the forward's own token stream (the packed stream, or the padded ``B * S`` rows), per
MoE layer (in module order), the top-k expert ids; stored as ``uint8`` when the model has at most 256 experts
(``int16`` otherwise): ``L * k`` bytes per token (Qwen3.5-35B-A3B: 40 layers x top-8 = 320 B/token).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
import torch.nn as nn

__all__ = [
    "RouterReplay",
    "RouterReplayError",
    "RoutingStepRecorder",
    "install_router_replay",
    "moe_gates",
    "routing_dtype",
]

_ATTR = "_verl_router_replay"


class RouterReplayError(ValueError):
    """Router replay cannot run as configured (dense model, routing of another shape, ...); says what to fix."""


def moe_gates(model: nn.Module) -> list[nn.Module]:
    """The top-k MoE gates of ``model`` in layer order: modules with a ``top_k``, a ``num_experts`` and an
    ``(num_experts, hidden)`` router ``weight`` (HF's ``*TopKRouter`` classes)."""
    gates = []
    for module in model.modules():
        weight = getattr(module, "weight", None)
        if (
            isinstance(getattr(module, "top_k", None), int)
            and isinstance(getattr(module, "num_experts", None), int)
            and isinstance(weight, torch.Tensor)
            and weight.dim() == 2
            and type(module).__name__.endswith("TopKRouter")
        ):
            gates.append(module)
    return gates


def routing_dtype(num_experts: int) -> torch.dtype:
    """The smallest integer dtype holding expert ids ``0 .. num_experts - 1``."""
    return torch.uint8 if num_experts <= 256 else torch.int16


class _GateState:
    def __init__(self, layer: int):
        self.layer = layer
        self.mode: str | None = None
        self.recorded: torch.Tensor | None = None
        self.forced: torch.Tensor | None = None


def _replayed_output(gate: nn.Module, router_logits: torch.Tensor, forced: torch.Tensor):
    """The gate's output with the expert choice ``forced`` ``(T, k)``: scores = the trained router's softmax
    probabilities of those experts, renormalised over the k (HF's top-k maths with the choice fixed)."""
    probs = torch.softmax(router_logits, dtype=torch.float, dim=-1)
    scores = probs.gather(-1, forced)
    scores = scores / scores.sum(dim=-1, keepdim=True)
    return router_logits, scores.to(router_logits.dtype), forced


def _hook(gate: nn.Module, args, output):
    state: _GateState = getattr(gate, _ATTR)
    if state.mode is None:
        return None
    router_logits, _, indices = output
    if state.mode == "record":
        state.recorded = indices.detach()
        return None
    forced = state.forced
    if forced is None:
        raise RouterReplayError(f"router replay: no routing set for MoE layer {state.layer}")
    if forced.shape != indices.shape:
        raise RouterReplayError(
            f"router replay: MoE layer {state.layer} routes {tuple(indices.shape)} (tokens, top-k) in this forward, "
            f"but the replayed routing has {tuple(forced.shape)}: the routed_experts of the batch do not belong to "
            "these tokens or this model"
        )
    state.recorded = forced
    return _replayed_output(gate, router_logits, forced.to(indices.device, torch.long))


class RouterReplay:
    """Record / replay controller over the MoE gates of one model (see the module docstring)."""

    def __init__(self, model: nn.Module):
        self.gates = moe_gates(model)
        if not self.gates:
            raise RouterReplayError(
                f"router replay needs an MoE model, but {type(model).__name__} has no top-k MoE gate: set "
                "actor_rollout_ref.actor.router_replay.mode=disabled for a dense model"
            )
        self.top_k = self.gates[0].top_k
        self.num_experts = self.gates[0].num_experts
        self.dtype = routing_dtype(self.num_experts)
        for layer, gate in enumerate(self.gates):
            if not hasattr(gate, _ATTR):
                setattr(gate, _ATTR, _GateState(layer))
                gate.register_forward_hook(_hook)
            getattr(gate, _ATTR).layer = layer

    @property
    def num_layers(self) -> int:
        return len(self.gates)

    @property
    def bytes_per_token(self) -> int:
        """Memory of one token's routing: ``L * k`` expert ids of ``routing_dtype``."""
        return self.num_layers * self.top_k * torch.empty((), dtype=self.dtype).element_size()

    def _states(self) -> list[_GateState]:
        return [getattr(gate, _ATTR) for gate in self.gates]

    @contextlib.contextmanager
    def record(self) -> Iterator[RouterReplay]:
        """Within: every forward records its routing; read it with :meth:`recorded` before leaving."""
        for state in self._states():
            state.mode, state.recorded, state.forced = "record", None, None
        try:
            yield self
        finally:
            for state in self._states():
                state.mode = None

    def replay(self, routing: torch.Tensor) -> None:
        """Force ``routing`` ``(T, L, k)`` in the following forwards (and their checkpoint recomputes) until
        :meth:`stop`. The choice seen by each forward is also recorded (:meth:`recorded`)."""
        if routing.dim() != 3 or routing.shape[1:] != (self.num_layers, self.top_k):
            raise RouterReplayError(
                f"router replay: routed_experts has shape {tuple(routing.shape)}, the model needs (tokens, "
                f"{self.num_layers} MoE layers, top-{self.top_k})"
            )
        if int(routing.max()) >= self.num_experts or int(routing.min()) < 0:
            raise RouterReplayError(
                f"router replay: routed_experts holds expert ids outside 0..{self.num_experts - 1} of this model"
            )
        for layer, state in enumerate(self._states()):
            state.mode, state.recorded = "replay", None
            state.forced = routing[:, layer].to(torch.long).contiguous()

    def stop(self) -> None:
        """Back to native routing."""
        for state in self._states():
            state.mode, state.forced = None, None

    def recorded(self) -> torch.Tensor:
        """``(T, L, k)`` routing of the last forward (``routing_dtype``)."""
        per_layer = [state.recorded for state in self._states()]
        if any(r is None for r in per_layer):
            raise RouterReplayError("router replay: no forward ran under record()/replay() on every MoE layer")
        return torch.stack(per_layer, dim=1).to(self.dtype)


def install_router_replay(model: nn.Module) -> RouterReplay:
    """Hooks on every MoE gate of ``model`` (idempotent) and the controller over them."""
    return RouterReplay(model)


class RoutingStepRecorder:
    """Records the routing of every forward of a model in a ``with`` block: one ``(T, L, k)`` tensor per forward.

    For R3 with the HF rollout: ``generate`` with a KV cache runs one prefill forward (the ``B * P`` prompt
    tokens, row-major) and then one forward per decoding step (``B`` tokens: the token sampled in the step before);
    each is one entry of :attr:`steps`. Its own hooks (removed on exit) read the gates' top-k output without
    changing it, so generation routes natively, whatever the replay controller's state.
    """

    def __init__(self, model: nn.Module, key: str = "actor_rollout_ref.rollout.enable_rollout_routing_replay"):
        self.gates = moe_gates(model)
        if not self.gates:
            raise RouterReplayError(
                f"recording the rollout's MoE routing needs an MoE model, but {type(model).__name__} has no top-k "
                f"MoE gate: set {key}=False (and router_replay.mode=disabled) for a dense model"
            )
        self.dtype = routing_dtype(self.gates[0].num_experts)
        self._per_layer: list[list[torch.Tensor]] = [[] for _ in self.gates]
        self._handles: list = []

    def __enter__(self) -> RoutingStepRecorder:
        self._per_layer = [[] for _ in self.gates]
        self._handles = [gate.register_forward_hook(self._hook_for(layer)) for layer, gate in enumerate(self.gates)]
        return self

    def __exit__(self, *exc) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles = []

    def _hook_for(self, layer: int):
        def hook(gate, args, output):
            self._per_layer[layer].append(output[2].detach().to(self.dtype))

        return hook

    @property
    def num_forwards(self) -> int:
        return len(self._per_layer[0])

    @property
    def steps(self) -> list[torch.Tensor]:
        """``(T_i, L, k)`` per recorded forward, in call order."""
        counts = {len(calls) for calls in self._per_layer}
        if len(counts) != 1:
            raise RouterReplayError(f"routing recorder: the MoE layers ran different numbers of forwards {counts}")
        return [torch.stack(calls, dim=1) for calls in zip(*self._per_layer)]
