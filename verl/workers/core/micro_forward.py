"""The model forward of one micro-batch (a ``DataProto``), as both worker paths call it.

:func:`policy_forward` (actor / reference: log-probs, entropy, routing) and :func:`value_forward` (critic) unpack a
micro-batch into the arguments of ``verl.workers.core.model_forward`` — response length, multimodal inputs, the
router-replay step — so the legacy ``DataParallelPPOActor``/``Critic`` and the engines' ``forward_step`` make the
same call. :func:`select_inputs` checks a batch has what a phase reads before the first forward.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.nn as nn
from torch.distributed import ProcessGroup

from verl.protocol import DataProto
from verl.workers.core.model_forward import (
    LogProbOptions,
    RoutingStep,
    forward_log_probs,
    forward_values,
    multi_modal_kwargs,
)
from verl.workers.core.routing import ROUTED_EXPERTS

__all__ = ["MODEL_INPUT_KEYS", "policy_forward", "select_inputs", "value_forward"]

MODEL_INPUT_KEYS = ("responses", "input_ids", "attention_mask", "position_ids")
"""Batch keys every forward reads."""


def select_inputs(data: DataProto, keys: Sequence[str], caller: str) -> DataProto:
    """``data`` reduced to ``keys`` (+ ``multi_modal_inputs`` when present); a missing key raises naming ``caller``."""
    missing = [k for k in keys if k not in data.batch.keys()]
    if missing:
        raise ValueError(f"{caller}: the batch lacks {missing} (has {sorted(data.batch.keys())})")
    non_tensor = ["multi_modal_inputs"] if "multi_modal_inputs" in data.non_tensor_batch else []
    return data.select(batch_keys=list(keys), non_tensor_batch_keys=non_tensor)


def policy_forward(
    module: nn.Module,
    micro_batch: DataProto,
    *,
    temperature: float,
    calculate_entropy: bool,
    options: LogProbOptions,
    ulysses_group: ProcessGroup | None = None,
    router: Any = None,
    routing_mode: str | None = None,
    routing_sp_group: ProcessGroup | None = None,
) -> dict[str, torch.Tensor]:
    """``{"log_probs": (b, R)}`` (+ ``"entropys"``, + ``"routed_experts"`` when routing) of one micro-batch.

    ``routing_mode`` (``record`` | ``replay`` | None, see ``core.routing.engine_routing_mode``) drives ``router``
    (the model's ``RouterReplay``); replay reads the micro-batch's ``routed_experts``. ``routing_sp_group``: the SP
    group an engine splits the stream over inside the model (VeOmni's collator), used when ``ulysses_group`` is None.
    """
    batch = micro_batch.batch
    routing = (
        None if routing_mode is None else RoutingStep(router, routing_mode, batch.get(ROUTED_EXPERTS), routing_sp_group)
    )
    return forward_log_probs(
        module,
        batch,
        response_length=batch["responses"].shape[-1],
        temperature=temperature,
        calculate_entropy=calculate_entropy,
        options=options,
        multi_modal_inputs=multi_modal_kwargs(micro_batch.non_tensor_batch),
        ulysses_group=ulysses_group,
        routing=routing,
    )


def value_forward(
    module: nn.Module, micro_batch: DataProto, *, use_remove_padding: bool, ulysses_group: ProcessGroup | None = None
) -> torch.Tensor:
    """Values ``(b, R)`` of one micro-batch, 0 where the response is padding."""
    batch = micro_batch.batch
    response_length = batch["responses"].shape[-1]
    values = forward_values(
        module,
        batch,
        response_length=response_length,
        use_remove_padding=use_remove_padding,
        multi_modal_inputs=multi_modal_kwargs(micro_batch.non_tensor_batch),
        ulysses_group=ulysses_group,
    )
    return values * batch["attention_mask"][:, -response_length:].to(values.dtype)
