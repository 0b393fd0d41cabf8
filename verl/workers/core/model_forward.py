"""The model forward of both worker paths: a micro-batch in, per-response-token log-probs/entropy or values out.

Data flow of :func:`forward_log_probs` (shapes: B sequences, S padded length, R response length, T real tokens,
N = tokens whose next token is a response token, V vocabulary, H hidden size)::

    input_ids, attention_mask, position_ids (B, S)
      │ remove padding (default): pack_padded_batch → input_ids (1, T), cu_seqlens (B+1,)
      │ model forward (forward_packed / forward_padded); the LM head sees only the N response-window rows
      │   fused:   (N, H) ─ fused_linear_log_probs_and_entropy ─▶ log_prob (N), entropy (N)   [no (N, V)]
      │   chunked: (N, H) ─ LM head ─▶ logits (N, V) ─ log_probs_and_entropy_chunked ─▶ log_prob, entropy
      ▼ scatter back to the response window
    log_probs (B, R), entropys (B, R) only when asked for

Temperature divides the logits out of place inside the kernels (field-report item 3). Entropy is computed only
when the caller asks for it (field-report item 2): a loss term or a logged metric; nothing is faked.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.nn as nn
import torch.utils.checkpoint
from torch.distributed import ProcessGroup

from verl.models.transformers.packed_forward import forward_packed, forward_padded, get_lm_head
from verl.utils.logprob import log_probs_and_entropy_chunked
from verl.utils.packing import PackedBatch, pack_padded_batch, unpack_to_padded
from verl.workers.core.lm_head import LMHeadPlan, lm_head_scope, split_fused_output

__all__ = ["LogProbOptions", "RoutingStep", "forward_log_probs", "forward_values", "multi_modal_kwargs"]

FUSED_BY_DEFAULT = True
"""The fused LM-head path is our default whenever the model has a plain ``nn.Linear`` LM head: it is exact (same
maths, fp32 per chunk) and never holds a ``(tokens, V)`` tensor (docs/design.md "Memory"). Upstream's
``use_fused_kernels`` (default False) therefore only *forces* it; ``entropy_from_logits_with_chunking=True``
asks for the logits path explicitly (chunked with ``entropy_from_logits_chunk_size``)."""


@dataclass(frozen=True)
class LogProbOptions:
    """How the log-prob forward runs (from the actor/ref config keys of the same meaning).

    Attributes:
        use_remove_padding: packed forward (``actor_rollout_ref.model.use_remove_padding``).
        use_fused_kernels: force the fused LM-head path (``actor_rollout_ref.model.use_fused_kernels``).
        entropy_from_logits_with_chunking: choose the logits path, chunked by ``chunk_size``.
        chunk_size: tokens per chunk (``entropy_from_logits_chunk_size``).
        entropy_checkpointing: recompute the log-prob/entropy step in backward (logits path).
        fused_chunk_size: tokens per chunk of the fused kernel.
    """

    use_remove_padding: bool = True
    use_fused_kernels: bool = False
    entropy_from_logits_with_chunking: bool = False
    chunk_size: int = 2048
    entropy_checkpointing: bool = False
    fused_chunk_size: int = 512

    @classmethod
    def from_config(cls, config: Any, use_remove_padding: bool, use_fused_kernels: bool) -> LogProbOptions:
        """From an actor/ref config (``FSDPActorConfig`` / ``FSDPRefConfig``) and the model block's flags."""
        return cls(
            use_remove_padding=use_remove_padding,
            use_fused_kernels=use_fused_kernels,
            entropy_from_logits_with_chunking=config.entropy_from_logits_with_chunking,
            chunk_size=config.entropy_from_logits_chunk_size,
            entropy_checkpointing=config.entropy_checkpointing,
        )

    def use_fused(self, lm_head: nn.Module | None) -> bool:
        if lm_head is None:
            return False
        return self.use_fused_kernels or (FUSED_BY_DEFAULT and not self.entropy_from_logits_with_chunking)


def multi_modal_kwargs(non_tensor_batch: Mapping[str, np.ndarray] | None) -> dict[str, torch.Tensor]:
    """Concatenate the per-sample ``multi_modal_inputs`` dicts of a micro-batch along dim 0 (upstream format)."""
    if not non_tensor_batch or "multi_modal_inputs" not in non_tensor_batch:
        return {}
    samples = [s for s in non_tensor_batch["multi_modal_inputs"] if s]
    if not samples:
        return {}
    return {key: torch.cat([s[key] for s in samples if key in s], dim=0) for key in samples[0]}


def _model_position_ids(position_ids: torch.Tensor) -> torch.Tensor:
    # the batch stores M-RoPE ids as (B, C, S); the model and pack_padded_batch take (C, B, S)
    return position_ids.transpose(0, 1) if position_ids.dim() == 3 else position_ids


def _window_rows(packed: PackedBatch, response_length: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Packed positions whose next token is a response token, and their flat index in the padded (B, S) grid.

    Position ``col`` of a row predicts token ``col + 1``; the response occupies the last R columns, so the window
    is ``S - R - 1 <= col <= S - 2``.
    """
    cols = packed.indices % packed.seqlen
    in_window = (cols >= packed.seqlen - response_length - 1) & (cols <= packed.seqlen - 2)
    rows = in_window.nonzero().flatten()
    return rows, packed.indices[rows]


def _to_window(values: torch.Tensor, flat_idx: torch.Tensor, batch_size: int, seqlen: int, response_length: int):
    """Scatter ``(N,)`` values at padded flat indices into the ``(B, R)`` response window, zero elsewhere."""
    grid = values.new_zeros(batch_size * seqlen).index_copy(0, flat_idx, values)
    return grid.view(batch_size, seqlen)[:, seqlen - response_length - 1 : seqlen - 1]


def _log_probs_from_logits(logits, labels, temperature, options, compute_entropy):
    def step(lg):
        return log_probs_and_entropy_chunked(
            lg, labels, temperature=temperature, chunk_size=options.chunk_size, compute_entropy=compute_entropy
        )

    if options.entropy_checkpointing and torch.is_grad_enabled():
        return torch.utils.checkpoint.checkpoint(step, logits, use_reentrant=False)
    return step(logits)


def _run(model, lm_head, plan, call):
    """One model forward with the LM-head plan installed; returns (log_probs, entropy) over the plan's rows."""
    if lm_head is None:
        raise ValueError(
            f"{type(model).__name__} has no nn.Linear LM head (get_output_embeddings); log-probs need a causal LM"
        )
    with lm_head_scope(lm_head, plan):
        output = call()
    if plan.fused:
        fused = split_fused_output(output, plan)
        return fused.log_probs, fused.entropy
    return output, None  # logits of the selected rows


class RoutingStep:
    """What one forward does with the MoE routing (router replay): ``"record"`` it, or ``"replay"`` the batch's.

    The batch carries routing as ``routed_experts`` ``(B, S, L, k)`` aligned with ``input_ids`` (so it follows
    the rows through micro-batching, dynamic batch size and reordering like every other per-token key); here it is
    gathered into the forward's own token stream (packed: the non-padding tokens in order; padded: all ``B * S``)
    and, after a forward, scattered back (padding positions 0). ``recorded`` is the ``(B, S, L, k)`` routing the
    forward used (in replay: the forced choice as the gates applied it).

    ``sp_group``: the Ulysses group the model splits a packed stream over when the forward is given none (VeOmni's
    own SP, which slices inside the model exactly like the core's: right-padded to a multiple of SP, contiguous
    slices); the forward's own ``ulysses_group`` wins when it has one.
    """

    def __init__(
        self,
        router: Any,
        mode: str,
        routed_experts: torch.Tensor | None = None,
        sp_group: ProcessGroup | None = None,
    ):
        if mode not in ("record", "replay"):
            raise ValueError(f"RoutingStep mode must be record or replay, got {mode!r}")
        if mode == "replay" and routed_experts is None:
            raise ValueError(
                "router replay: the batch has no routed_experts (R2 records them in compute_log_prob, R3 gets them "
                "from the rollout with actor_rollout_ref.rollout.enable_rollout_routing_replay=True)"
            )
        self.router, self.mode, self.routed_experts, self.sp_group = router, mode, routed_experts, sp_group
        self.recorded: torch.Tensor | None = None

    def run(self, call, token_index: torch.Tensor, batch_size: int, seqlen: int, sp_group: ProcessGroup | None = None):
        """``call()`` with the routing recorded or forced on the tokens ``token_index`` (flat in ``B * S``); a
        packed forward under Ulysses SP (``sp_group``) forces and records this rank's slice of the stream
        (:func:`verl.workers.core.routing.shard_routing`)."""
        from verl.models.transformers.router_replay import RouterReplayError
        from verl.workers.core.routing import gather_routing, shard_routing

        sp_group = sp_group if sp_group is not None else self.sp_group
        flat_shape = (batch_size * seqlen, self.router.num_layers, self.router.top_k)
        if self.mode == "replay":
            if tuple(self.routed_experts.shape) != (batch_size, seqlen, *flat_shape[1:]):
                raise RouterReplayError(
                    f"router replay: routed_experts has shape {tuple(self.routed_experts.shape)}, the micro-batch "
                    f"needs {(batch_size, seqlen, *flat_shape[1:])} (rows, tokens, MoE layers, top-k)"
                )
            self.router.replay(shard_routing(self.routed_experts.reshape(flat_shape)[token_index], sp_group))
            output = call()
            recorded = self.router.recorded()
        else:
            with self.router.record():
                output = call()
                recorded = self.router.recorded()
        recorded = gather_routing(recorded, token_index.numel(), sp_group)
        padded = torch.zeros(flat_shape, dtype=recorded.dtype, device=recorded.device)
        padded[token_index] = recorded
        self.recorded = padded.reshape(batch_size, seqlen, *flat_shape[1:])
        return output


def forward_log_probs(
    model: nn.Module,
    batch: Mapping[str, torch.Tensor],
    *,
    response_length: int,
    temperature: float | torch.Tensor,
    calculate_entropy: bool,
    options: LogProbOptions,
    multi_modal_inputs: Mapping[str, torch.Tensor] | None = None,
    ulysses_group: ProcessGroup | None = None,
    routing: RoutingStep | None = None,
) -> dict[str, torch.Tensor]:
    """Log-probs (and entropy when asked) of the response tokens of one micro-batch.

    Args:
        model: HF causal LM, plain or FSDP-wrapped.
        batch: ``input_ids``, ``attention_mask`` (B, S), ``position_ids`` (B, S) or (B, C, S).
        response_length: R; the response occupies the last R columns.
        temperature: divisor of the logits (float, or a (B, 1) per-sample tensor).
        calculate_entropy: also return ``entropys``.
        options: see :class:`LogProbOptions`.
        multi_modal_inputs: extra model kwargs (e.g. ``pixel_values``).
        ulysses_group: Ulysses SP group (packed path): every rank of it passes the same micro-batch; the stream is
            split over the group inside the model and gathered before the LM head.
        routing: record or replay the MoE routing (:class:`RoutingStep`); ``routed_experts`` is then returned.

    Returns:
        ``{"log_probs": (B, R) fp32}`` plus ``"entropys": (B, R) fp32`` when ``calculate_entropy``, and
        ``"routed_experts": (B, S, L, k)`` with ``routing``.
    """
    input_ids, attention_mask = batch["input_ids"], batch["attention_mask"]
    lm_head = get_lm_head(model)
    fused = options.use_fused(lm_head)
    layout = _packed_window if options.use_remove_padding else _padded_window
    window = layout(
        model,
        input_ids,
        attention_mask,
        _model_position_ids(batch["position_ids"]),
        response_length,
        temperature,
        dict(multi_modal_inputs or {}),
        ulysses_group,
    )
    call = window.call
    if routing is not None:
        batch_size, seqlen = input_ids.shape
        call = lambda: routing.run(window.call, window.token_index, batch_size, seqlen, window.sp_group)  # noqa: E731
    plan = LMHeadPlan(
        select=window.select,
        labels=window.labels,
        temperature=window.temperature,
        fused=fused,
        compute_entropy=calculate_entropy,
        chunk_size=options.fused_chunk_size,
    )
    log_probs, entropy = _run(model, lm_head, plan, call)
    if not fused:
        log_probs, entropy = _log_probs_from_logits(
            log_probs, window.labels, window.temperature, options, calculate_entropy
        )
    out = {"log_probs": window.finish(log_probs)}
    if calculate_entropy:
        out["entropys"] = window.finish(entropy)
    if routing is not None:
        out["routed_experts"] = routing.recorded
    return out


def _row_temperature(temperature, index: torch.Tensor, seqlen: int):
    """A per-sample (B, 1) temperature gathered for the selected rows; floats pass through."""
    if not isinstance(temperature, torch.Tensor) or temperature.numel() == 1:
        return temperature
    return temperature.reshape(-1)[index // seqlen]


@dataclass
class _Window:
    """Where one forward's response window lies: the LM head's rows and labels, the model call, and how its
    ``(N,)``/``(B, R)`` results go back to the ``(B, R)`` window (packed: scattered; padded: masked)."""

    select: Any
    labels: torch.Tensor
    temperature: float | torch.Tensor
    call: Any
    token_index: torch.Tensor
    sp_group: ProcessGroup | None
    finish: Any


def _packed_window(model, input_ids, attention_mask, position_ids, response_length, temperature, mm, ulysses_group):
    batch_size, seqlen = input_ids.shape
    packed = pack_padded_batch(input_ids, attention_mask, position_ids)
    rows, flat_idx = _window_rows(packed, response_length)
    return _Window(
        select=lambda hidden: hidden[:, rows],
        labels=input_ids.reshape(-1)[flat_idx + 1].unsqueeze(0),  # (1, N)
        temperature=_row_temperature(temperature, flat_idx, seqlen),
        call=lambda: forward_packed(model, packed, ulysses_group=ulysses_group, **mm),
        token_index=packed.indices,
        sp_group=ulysses_group,
        finish=lambda v: _to_window(v.reshape(-1), flat_idx, batch_size, seqlen, response_length),
    )


def _padded_window(model, input_ids, attention_mask, position_ids, response_length, temperature, mm, ulysses_group):
    batch_size, seqlen = input_ids.shape
    window = slice(seqlen - response_length - 1, seqlen - 1)
    valid = attention_mask[:, window]  # zero at padding, like the packed path, so both layouts return the same
    return _Window(
        select=lambda hidden: hidden[:, window],
        labels=input_ids[:, window.start + 1 :],  # (B, R): the response tokens
        temperature=temperature,
        call=lambda: forward_padded(model, input_ids, attention_mask, position_ids, **mm),
        token_index=torch.arange(batch_size * seqlen, device=input_ids.device),
        sp_group=None,
        finish=lambda v: v * valid.to(v.dtype),
    )


def forward_values(
    model: nn.Module,
    batch: Mapping[str, torch.Tensor],
    *,
    response_length: int,
    use_remove_padding: bool,
    multi_modal_inputs: Mapping[str, torch.Tensor] | None = None,
    ulysses_group: ProcessGroup | None = None,
) -> torch.Tensor:
    """Values ``(B, R)`` of a critic whose output head has one unit (see ``verl.workers.critic``).

    Position ``col`` gives the value of the state before token ``col + 1``, as upstream: the window is
    ``[S - R - 1, S - 1)``. Padding positions hold 0.
    """
    input_ids, attention_mask = batch["input_ids"], batch["attention_mask"]
    position_ids = _model_position_ids(batch["position_ids"])
    mm = dict(multi_modal_inputs or {})
    seqlen = input_ids.shape[1]
    if use_remove_padding:
        packed = pack_padded_batch(input_ids, attention_mask, position_ids)
        values = unpack_to_padded(forward_packed(model, packed, ulysses_group=ulysses_group, **mm)[..., 0], packed)
    else:
        values = forward_padded(model, input_ids, attention_mask, position_ids, **mm)[..., 0]
        values = values * attention_mask.to(values.dtype)
    return values[:, seqlen - response_length - 1 : seqlen - 1].float()
