"""``DataParallelPPOCritic``: the legacy FSDP critic (upstream name), a thin driver over ``verl.workers.core``.

The value model is the policy architecture with a one-unit output head (``verl.utils.model.attach_value_head``):
it runs through the same packed forward as the actor, and ``values[:, t]`` is the value of the state before
response token ``t`` (upstream's window ``[-R - 1, -1)``). Batch sizes are per data-parallel rank, in responses
(the worker normalises the global config values).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
import torch.nn as nn

from verl.protocol import DataProto
from verl.utils.py_functional import append_to_dict
from verl.workers.core.losses import MetricAccumulator, critic_loss
from verl.workers.core.micro_batching import global_batch_info, iter_mini_batches, restore_order, split_micro_batches
from verl.workers.core.model_forward import forward_values, multi_modal_kwargs
from verl.workers.core.optimizer_step import clip_grad_and_step
from verl.workers.critic.base import BasePPOCritic

__all__ = ["DataParallelPPOCritic"]

_MODEL_INPUT_KEYS = ("responses", "input_ids", "attention_mask", "position_ids")


def _select(data: DataProto, keys: list[str]) -> DataProto:
    missing = [k for k in keys if k not in data.batch.keys()]
    if missing:
        raise ValueError(f"the batch lacks {missing} (has {sorted(data.batch.keys())})")
    non_tensor = ["multi_modal_inputs"] if "multi_modal_inputs" in data.non_tensor_batch else []
    return data.select(batch_keys=keys, non_tensor_batch_keys=non_tensor)


class DataParallelPPOCritic(BasePPOCritic):
    """PPO critic over an (FSDP-wrapped) value model.

    Args:
        config: ``FSDPCriticConfig`` with per-rank batch sizes.
        critic_module: the value model (plain or FSDP1/FSDP2-wrapped).
        critic_optimizer: its optimizer.
        dp_group: data-parallel group for global token counts (default: the world).
        ulysses_group: Ulysses SP group (all its ranks hold the same data); None: no SP.
    """

    def __init__(
        self,
        config: Any,
        critic_module: nn.Module,
        critic_optimizer: torch.optim.Optimizer,
        dp_group: dist.ProcessGroup | None = None,
        ulysses_group: dist.ProcessGroup | None = None,
    ):
        super().__init__(config)
        self.critic_module = critic_module
        self.critic_optimizer = critic_optimizer
        self.use_remove_padding = config.model.use_remove_padding
        self.dp_group = dp_group
        self.ulysses_group = ulysses_group

    def _forward(self, micro_batch: DataProto) -> torch.Tensor:
        batch = micro_batch.batch
        response_length = batch["responses"].shape[-1]
        values = forward_values(
            self.critic_module,
            batch,
            response_length=response_length,
            use_remove_padding=self.use_remove_padding,
            multi_modal_inputs=multi_modal_kwargs(micro_batch.non_tensor_batch),
            ulysses_group=self.ulysses_group,
        )
        return values * batch["attention_mask"][:, -response_length:].to(values.dtype)

    def compute_values(self, data: DataProto) -> torch.Tensor:
        """Values ``(B, R)`` without gradients, 0 outside the response. ``data.meta_info``: ``micro_batch_size``,
        ``use_dynamic_bsz``, ``max_token_len``."""
        micro_batches, indices = split_micro_batches(
            _select(data, list(_MODEL_INPUT_KEYS)),
            micro_batch_size=data.meta_info.get("micro_batch_size"),
            use_dynamic_bsz=bool(data.meta_info.get("use_dynamic_bsz", False)),
            max_token_len=data.meta_info.get("max_token_len"),
            dp_group=self.dp_group,
            micro_batch_key="forward_micro_batch_size_per_gpu",
        )
        self.critic_module.eval()
        with torch.no_grad():
            values = [self._forward(micro_batch) for micro_batch in micro_batches]
        return restore_order(torch.cat(values), indices)

    def update_critic(self, data: DataProto) -> dict[str, list[float]]:
        """``ppo_epochs`` passes, one clipped optimizer step per mini-batch, clipped value loss
        (``cliprange_value``). ``data.batch``: model inputs, response_mask, values (v_old), returns."""
        data = _select(data, [*_MODEL_INPUT_KEYS, "response_mask", "values", "returns"])
        metrics: dict[str, list[float]] = {}
        self.critic_module.train()
        for _, mini_batch in iter_mini_batches(
            data, self.config.ppo_mini_batch_size, self.config.ppo_epochs, self.config.shuffle,
            self.config.data_loader_seed,
        ):  # fmt: skip
            append_to_dict(metrics, self._update_mini_batch(mini_batch))
        self.critic_optimizer.zero_grad(set_to_none=True)
        return metrics

    def _update_mini_batch(self, mini_batch: DataProto) -> dict[str, float]:
        info = global_batch_info(mini_batch.batch["response_mask"], self.dp_group)
        micro_batches, _ = split_micro_batches(
            mini_batch,
            micro_batch_size=self.config.ppo_micro_batch_size_per_gpu,
            use_dynamic_bsz=self.config.use_dynamic_bsz,
            max_token_len=self.config.ppo_max_token_len_per_gpu * self.config.ulysses_sp_size,
            dp_group=self.dp_group,
        )
        self.critic_optimizer.zero_grad(set_to_none=True)
        accumulator = MetricAccumulator()
        for micro_batch in micro_batches:
            loss, loss_metrics = critic_loss(self.config, self._forward(micro_batch), micro_batch.batch, info)
            loss.backward()
            accumulator.add(loss_metrics)
        step = clip_grad_and_step(
            self.critic_module, self.critic_optimizer, self.config.grad_clip, config_key="critic.grad_clip"
        )
        result = accumulator.result()
        result["critic/grad_norm"] = step.grad_norm
        result["critic/skipped_steps"] = 0.0 if step.stepped else 1.0
        return result
