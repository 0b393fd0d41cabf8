"""Loss functions of the engine path: the shared core's losses bound to a role config (upstream names).

``ppo_loss`` and ``value_loss`` are the functions upstream binds with ``functools.partial(fn, config)`` and hands to
``engine.forward_backward_batch``. They add nothing to the maths: they call ``verl.workers.core.losses``, the same
functions the legacy ``DataParallelPPOActor``/critic call, so both worker paths optimise the same objective.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from verl.workers.core.losses import actor_loss, critic_loss
from verl.workers.core.micro_batching import GlobalBatchInfo

__all__ = ["ppo_loss", "value_loss"]


def ppo_loss(
    config: Any, model_output: Mapping[str, torch.Tensor], data: Mapping[str, torch.Tensor], info: GlobalBatchInfo
) -> tuple[torch.Tensor, dict[str, float]]:
    """Policy loss (+ entropy bonus, + KL loss) of one micro-batch; ``config`` is the actor config.

    ``model_output``: ``log_probs`` (b, R) and, when computed, ``entropys`` (b, R); ``data``: ``old_log_probs``,
    ``advantages``, ``response_mask`` (b, R) (+ ``ref_log_prob`` with ``use_kl_loss``).
    """
    return actor_loss(config, model_output, data, info)


def value_loss(
    config: Any, model_output: Mapping[str, torch.Tensor], data: Mapping[str, torch.Tensor], info: GlobalBatchInfo
) -> tuple[torch.Tensor, dict[str, float]]:
    """Clipped value loss of one micro-batch; ``config`` is the critic config, ``model_output["values"]`` (b, R)."""
    return critic_loss(config, model_output["values"], data, info)
