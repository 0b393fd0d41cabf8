"""Loss functions of the engine path (upstream names): the shared core's losses.

``ppo_loss`` and ``value_loss`` are the functions upstream binds with ``functools.partial(fn, config)`` and hands to
``engine.forward_backward_batch``: ``(config, model_output, micro_batch, global_batch_info) -> (loss, metrics)``.
They are ``verl.workers.core.losses``' own functions, the ones the legacy ``DataParallelPPOActor``/critic bind, so
both worker paths optimise the same objective.
"""

from __future__ import annotations

from verl.workers.core.losses import actor_loss as ppo_loss
from verl.workers.core.losses import value_loss

__all__ = ["ppo_loss", "value_loss"]
