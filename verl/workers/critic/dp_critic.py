"""``DataParallelPPOCritic``: the legacy FSDP critic (upstream name), a thin driver over ``verl.workers.core``.

The value model is the policy architecture with a one-unit output head (``verl.utils.model.attach_value_head``):
it runs through the same packed forward as the actor, and ``values[:, t]`` is the value of the state before
response token ``t`` (upstream's window ``[-R - 1, -1)``). The loops are the core's (``verl.workers.core.update_loop``);
per-rank sizes come from a ``BatchPlan`` (the worker's ``critic_update_plan``; ``meta_info`` for ``compute_values``).
"""

from __future__ import annotations

from functools import partial

import torch
import torch.distributed as dist
import torch.nn as nn

from verl.protocol import DataProto
from verl.workers.config.critic import CriticConfig
from verl.workers.core.batch_plan import BatchPlan, per_rank_update_plan
from verl.workers.core.losses import value_loss
from verl.workers.core.micro_forward import MODEL_INPUT_KEYS, select_inputs, value_forward
from verl.workers.core.update_loop import clipped_updates, forward_only, prefixed_engine_metrics
from verl.workers.critic.base import BasePPOCritic

__all__ = ["DataParallelPPOCritic"]


class DataParallelPPOCritic(BasePPOCritic):
    """PPO critic over an (FSDP-wrapped) value model.

    Args:
        config: ``FSDPCriticConfig``.
        critic_module: the value model (plain or FSDP1/FSDP2-wrapped).
        critic_optimizer: its optimizer.
        dp_group: data-parallel group for global token counts (default: the world).
        ulysses_group: Ulysses SP group (all its ranks hold the same data); None: no SP.
        update_plan: per-rank sizes of ``update_critic`` (the worker's ``critic_update_plan``); None reads them
            from ``config`` as per-rank values (upstream's contract for this class).
    """

    def __init__(
        self,
        config: CriticConfig,
        critic_module: nn.Module,
        critic_optimizer: torch.optim.Optimizer,
        dp_group: dist.ProcessGroup | None = None,
        ulysses_group: dist.ProcessGroup | None = None,
        update_plan: BatchPlan | None = None,
    ):
        super().__init__(config)
        self.critic_module = critic_module
        self.critic_optimizer = critic_optimizer
        self.use_remove_padding = config.model.use_remove_padding
        self.dp_group = dp_group
        self.ulysses_group = ulysses_group
        self.update_plan = update_plan if update_plan is not None else per_rank_update_plan(config)

    def _forward(self, micro_batch: DataProto) -> dict[str, torch.Tensor]:
        values = value_forward(
            self.critic_module,
            micro_batch,
            use_remove_padding=self.use_remove_padding,
            ulysses_group=self.ulysses_group,
        )
        return {"values": values}

    def compute_values(self, data: DataProto) -> torch.Tensor:
        """Values ``(B, R)`` without gradients, 0 outside the response. ``data.meta_info``: ``micro_batch_size``,
        ``use_dynamic_bsz``, ``max_token_len``."""
        self.critic_module.eval()
        outputs = forward_only(
            select_inputs(data, MODEL_INPUT_KEYS, "compute_values"),
            BatchPlan.from_meta_info(data.meta_info),
            self._forward,
            dp_group=self.dp_group,
            micro_batch_key="forward_micro_batch_size_per_gpu",
        )
        return outputs["values"]

    def update_critic(self, data: DataProto) -> dict[str, list[float]]:
        """``ppo_epochs`` passes, one clipped optimizer step per mini-batch, clipped value loss
        (``cliprange_value``). ``data.batch``: model inputs, response_mask, values (v_old), returns."""
        data = select_inputs(data, [*MODEL_INPUT_KEYS, "response_mask", "values", "returns"], "update_critic")
        self.critic_module.train()
        metrics = clipped_updates(
            data,
            self.update_plan,
            self._forward,
            partial(value_loss, self.config),
            self.critic_module,
            self.critic_optimizer,
            self.config.grad_clip,
            dp_group=self.dp_group,
            config_key="critic.grad_clip",
        )
        return prefixed_engine_metrics(metrics, "critic")
