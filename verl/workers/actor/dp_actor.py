"""``DataParallelPPOActor``: the legacy FSDP actor (upstream name), a thin driver over ``verl.workers.core``.

``compute_log_prob`` (old-log-prob and reference passes) and ``update_policy`` (PPO epochs over mini-batches,
gradient accumulation over micro-batches, one clipped optimizer step per mini-batch) only decide *which* rows go
through the shared core; the maths — packed forward, fused/chunked log-probs, losses, clipping — is the core's.

Batch sizes are per data-parallel rank, in responses (the worker normalises the global config values):
``ppo_mini_batch_size`` rows per optimizer step, ``ppo_micro_batch_size_per_gpu`` rows per forward/backward, or
``ppo_max_token_len_per_gpu`` tokens per forward/backward with ``use_dynamic_bsz``.
"""

from __future__ import annotations

import logging
from typing import Any

import torch
import torch.distributed as dist
import torch.nn as nn

from verl.protocol import DataProto
from verl.utils.py_functional import append_to_dict
from verl.workers.actor.base import BasePPOActor
from verl.workers.core.losses import MetricAccumulator, actor_loss
from verl.workers.core.micro_batching import global_batch_info, iter_mini_batches, restore_order, split_micro_batches
from verl.workers.core.model_forward import LogProbOptions, RoutingStep, forward_log_probs, multi_modal_kwargs
from verl.workers.core.optimizer_step import clip_grad_and_step
from verl.workers.core.routing import replay_router, routing_keys

logger = logging.getLogger(__name__)

__all__ = ["DataParallelPPOActor"]

_MODEL_INPUT_KEYS = ("responses", "input_ids", "attention_mask", "position_ids")


def _meta(data: DataProto, key: str, caller: str) -> Any:
    if key not in data.meta_info:
        raise ValueError(
            f"{caller}: data.meta_info[{key!r}] is missing; the trainer/worker sets it (temperature comes from "
            "actor_rollout_ref.rollout.temperature)"
        )
    return data.meta_info[key]


def _select(data: DataProto, keys: list[str]) -> DataProto:
    missing = [k for k in keys if k not in data.batch.keys()]
    if missing:
        raise ValueError(f"the batch lacks {missing} (has {sorted(data.batch.keys())})")
    non_tensor = ["multi_modal_inputs"] if "multi_modal_inputs" in data.non_tensor_batch else []
    return data.select(batch_keys=keys, non_tensor_batch_keys=non_tensor)


def active_dropout(module: nn.Module) -> list[str]:
    """Names of dropout that is active in training mode: ``nn.Dropout`` modules with p > 0 and ``*dropout*``
    floats > 0 of the HF config (attention dropout is applied functionally, from the config)."""
    found = [name for name, m in module.named_modules() if isinstance(m, nn.modules.dropout._DropoutNd) and m.p > 0]
    config = getattr(getattr(module, "module", module), "config", None)
    if config is not None:
        for sub in [config, *(getattr(config, k) for k in ("text_config",) if hasattr(config, k))]:
            found += [f"config.{k}" for k, v in vars(sub).items() if "dropout" in k and isinstance(v, float) and v > 0]
    return found


class DataParallelPPOActor(BasePPOActor):
    """PPO actor over an (FSDP-wrapped) HF causal LM.

    Args:
        config: ``FSDPActorConfig`` for the actor, ``FSDPRefConfig`` for the reference policy (per-rank sizes).
        actor_module: the model (plain or FSDP1/FSDP2-wrapped).
        actor_optimizer: None for a reference policy (``update_policy`` then raises).
        log_prob_options: how the forward runs; by default from the actor config's keys.
        dp_group: data-parallel process group for global token counts (default: the world).
        ulysses_group: Ulysses SP group (all its ranks hold the same data); None: no SP.
    """

    def __init__(
        self,
        config: Any,
        actor_module: nn.Module,
        actor_optimizer: torch.optim.Optimizer | None = None,
        log_prob_options: LogProbOptions | None = None,
        dp_group: dist.ProcessGroup | None = None,
        ulysses_group: dist.ProcessGroup | None = None,
    ):
        super().__init__(config)
        self.actor_module = actor_module
        self.actor_optimizer = actor_optimizer
        if log_prob_options is None:
            log_prob_options = LogProbOptions.from_config(config, config.use_remove_padding, config.use_fused_kernels)
        self.log_prob_options = log_prob_options
        self.use_remove_padding = log_prob_options.use_remove_padding
        self.dp_group = dp_group
        self.ulysses_group = ulysses_group
        self.router = replay_router(config, actor_module)

    def _routing(self, micro_batch: DataProto, recording: bool) -> RoutingStep | None:
        """R2: record in the old-log-prob forward, replay in the update; R3: replay the rollout's routing in both."""
        if self.router is None:
            return None
        if recording and self.config.router_replay.mode == "R2":
            return RoutingStep(self.router, "record")
        return RoutingStep(self.router, "replay", micro_batch.batch.get("routed_experts"))

    def _forward(
        self, micro_batch: DataProto, temperature: float, calculate_entropy: bool, recording: bool = False
    ) -> dict[str, torch.Tensor]:
        batch = micro_batch.batch
        return forward_log_probs(
            self.actor_module,
            batch,
            response_length=batch["responses"].shape[-1],
            temperature=temperature,
            calculate_entropy=calculate_entropy,
            options=self.log_prob_options,
            multi_modal_inputs=multi_modal_kwargs(micro_batch.non_tensor_batch),
            ulysses_group=self.ulysses_group,
            routing=self._routing(micro_batch, recording),
        )

    def compute_log_prob(self, data: DataProto, calculate_entropy: bool = False) -> dict[str, torch.Tensor]:
        """Log-probs ``(B, R)`` of the responses under the current weights, without gradients.

        ``data.meta_info``: ``temperature`` (required), ``micro_batch_size``, ``use_dynamic_bsz``,
        ``max_token_len``. Returns ``{"log_probs"}`` plus ``{"entropys"}`` when ``calculate_entropy``.
        """
        temperature = _meta(data, "temperature", "compute_log_prob")
        use_dynamic_bsz = bool(data.meta_info.get("use_dynamic_bsz", False))
        micro_batches, indices = split_micro_batches(
            _select(data, [*_MODEL_INPUT_KEYS, *routing_keys(self.config, recording=True)]),
            micro_batch_size=data.meta_info.get("micro_batch_size"),
            use_dynamic_bsz=use_dynamic_bsz,
            max_token_len=data.meta_info.get("max_token_len"),
            dp_group=self.dp_group,
            micro_batch_key="log_prob_micro_batch_size_per_gpu",
        )
        self.actor_module.eval()
        outputs: dict[str, list[torch.Tensor]] = {}
        with torch.no_grad():
            try:
                for micro_batch in micro_batches:
                    forward = self._forward(micro_batch, temperature, calculate_entropy, recording=True)
                    for key, value in forward.items():
                        outputs.setdefault(key, []).append(value)
            finally:
                self._stop_routing()
        return {key: restore_order(torch.cat(values), indices) for key, values in outputs.items()}

    def _update_keys(self, on_policy: bool) -> list[str]:
        keys = [*_MODEL_INPUT_KEYS, "response_mask", "advantages", *routing_keys(self.config)]
        if not on_policy:
            keys.append("old_log_probs")
        if self.config.use_kl_loss:
            keys.append("ref_log_prob")
        return keys

    def update_policy(self, data: DataProto) -> dict[str, list[float]]:
        """PPO update: ``ppo_epochs`` passes, one clipped optimizer step per mini-batch.

        ``data.batch``: responses, input_ids, attention_mask, position_ids, response_mask, old_log_probs,
        advantages (+ ref_log_prob with ``use_kl_loss``, optional rollout_is_weights);
        ``data.meta_info["temperature"]``. Returns metrics (one value per mini-batch).
        """
        if self.actor_optimizer is None:
            raise RuntimeError("update_policy needs an optimizer; this actor was built as a reference policy")
        temperature = _meta(data, "temperature", "update_policy")
        on_policy = "old_log_probs" not in data.batch.keys()
        if on_policy:
            self._check_on_policy(data)
        keys = self._update_keys(on_policy)
        if "rollout_is_weights" in data.batch.keys():
            keys.append("rollout_is_weights")
        data = _select(data, keys)
        # Without the old-log-prob pass the update's forward also gives the actor/entropy metric that pass logged.
        calculate_entropy = self.config.calculate_entropy or self.config.entropy_coeff != 0 or on_policy
        metrics: dict[str, list[float]] = {}
        self.actor_module.train()
        try:
            for _, mini_batch in iter_mini_batches(
                data, self.config.ppo_mini_batch_size, self.config.ppo_epochs, self.config.shuffle,
                self.config.data_loader_seed,
            ):  # fmt: skip
                append_to_dict(metrics, self._update_mini_batch(mini_batch, temperature, calculate_entropy, on_policy))
        finally:
            self._stop_routing()
        self.actor_optimizer.zero_grad(set_to_none=True)
        return metrics

    def _stop_routing(self) -> None:
        """Replay stays on through each backward (checkpoint recomputes); off afterwards, so the next forward of
        this module (the rollout's generation in the hybrid engine) routes natively."""
        if self.router is not None:
            self.router.stop()

    def _check_on_policy(self, data: DataProto) -> None:
        """A batch without ``old_log_probs`` (the trainer skipped step 3, ``verl.trainer.ppo.on_policy``) is only
        exact when the whole update is one optimizer step and the train-mode forward equals the eval-mode one."""
        if self.config.ppo_epochs != 1 or len(data) > self.config.ppo_mini_batch_size:
            raise ValueError(
                f"update_policy got no old_log_probs but runs {self.config.ppo_epochs} epoch(s) over "
                f"{len(data)} responses in mini-batches of {self.config.ppo_mini_batch_size}: only one optimizer step "
                "per batch can take old_log_probs from its own forward; run compute_log_prob first "
                "(actor_rollout_ref.actor.skip_old_log_prob_on_policy=False)"
            )
        dropout = active_dropout(self.actor_module)
        if dropout:
            raise ValueError(
                f"the actor model has active dropout ({', '.join(dropout[:3])}): its training forward differs from "
                "the old-log-prob pass, so old_log_probs cannot come from the update; set "
                "actor_rollout_ref.actor.skip_old_log_prob_on_policy=False"
            )

    def _update_mini_batch(
        self, mini_batch: DataProto, temperature: float, calculate_entropy: bool, on_policy: bool = False
    ) -> dict:
        info = global_batch_info(mini_batch.batch["response_mask"], self.dp_group)
        micro_batches, _ = split_micro_batches(
            mini_batch,
            micro_batch_size=self.config.ppo_micro_batch_size_per_gpu,
            use_dynamic_bsz=self.config.use_dynamic_bsz,
            max_token_len=self.config.ppo_max_token_len_per_gpu * self.config.ulysses_sp_size,
            dp_group=self.dp_group,
        )
        self.actor_optimizer.zero_grad(set_to_none=True)
        accumulator = MetricAccumulator()
        for micro_batch in micro_batches:
            outputs = self._forward(micro_batch, temperature, calculate_entropy)
            if on_policy:  # before this mini-batch's (only) optimizer step: these weights are pi_old
                micro_batch.batch["old_log_probs"] = outputs["log_probs"].detach()
            loss, loss_metrics = actor_loss(self.config, outputs, micro_batch.batch, info)
            loss.backward()
            accumulator.add(loss_metrics)
        step = clip_grad_and_step(self.actor_module, self.actor_optimizer, self.config.grad_clip)
        result = accumulator.result()
        result["actor/grad_norm"] = step.grad_norm
        result["actor/skipped_steps"] = 0.0 if step.stepped else 1.0
        return result
