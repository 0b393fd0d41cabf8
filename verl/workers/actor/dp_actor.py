"""``DataParallelPPOActor``: the legacy FSDP actor (upstream name), a thin driver over ``verl.workers.core``.

``compute_log_prob`` (old-log-prob and reference passes) and ``update_policy`` only decide *which* rows go through
the core's loops (``update_loop``, shared with the engine path) and maths. Per-rank sizes come from a ``BatchPlan``:
the worker's ``actor_update_plan`` for ``update_policy`` (the config keeps its global, prompt-counted values) and
``meta_info`` for ``compute_log_prob``.
"""

from __future__ import annotations

import logging
from functools import partial

import torch
import torch.distributed as dist
import torch.nn as nn

from verl.protocol import DataProto
from verl.workers.actor.base import BasePPOActor
from verl.workers.config.actor import ActorConfig
from verl.workers.config.ref import RefConfig
from verl.workers.core.batch_plan import BatchPlan, ForwardSwitches, per_rank_update_plan
from verl.workers.core.losses import actor_loss
from verl.workers.core.micro_forward import MODEL_INPUT_KEYS, policy_forward, select_inputs
from verl.workers.core.model_forward import LogProbOptions
from verl.workers.core.routing import engine_routing_mode, replay_router, routing_keys
from verl.workers.core.update_loop import clipped_updates, forward_only, prefixed_engine_metrics

logger = logging.getLogger(__name__)

__all__ = ["DataParallelPPOActor"]


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
        config: ``FSDPActorConfig`` for the actor, ``FSDPRefConfig`` for the reference policy.
        actor_module: the model (plain or FSDP1/FSDP2-wrapped).
        actor_optimizer: None for a reference policy (``update_policy`` then raises).
        log_prob_options: how the forward runs; by default from the actor config's keys.
        dp_group: data-parallel process group for global token counts (default: the world).
        ulysses_group: Ulysses SP group (all its ranks hold the same data); None: no SP.
        update_plan: per-rank sizes of ``update_policy`` (the worker's ``actor_update_plan``); None reads them
            from ``config`` as per-rank values (upstream's contract for this class).
    """

    def __init__(
        self,
        config: ActorConfig | RefConfig,
        actor_module: nn.Module,
        actor_optimizer: torch.optim.Optimizer | None = None,
        log_prob_options: LogProbOptions | None = None,
        dp_group: dist.ProcessGroup | None = None,
        ulysses_group: dist.ProcessGroup | None = None,
        update_plan: BatchPlan | None = None,
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
        self._update_plan = update_plan

    @property
    def update_plan(self) -> BatchPlan:
        if self._update_plan is None:
            self._update_plan = per_rank_update_plan(self.config)
        return self._update_plan

    def _forward(self, micro_batch: DataProto, temperature: float, calculate_entropy: bool, recording: bool = False):
        return policy_forward(
            self.actor_module,
            micro_batch,
            temperature=temperature,
            calculate_entropy=calculate_entropy,
            options=self.log_prob_options,
            ulysses_group=self.ulysses_group,
            router=self.router,
            routing_mode=engine_routing_mode(self.config, recording),
        )

    def compute_log_prob(self, data: DataProto, calculate_entropy: bool = False) -> dict[str, torch.Tensor]:
        """Log-probs ``(B, R)`` of the responses under the current weights, without gradients.

        ``data.meta_info``: ``temperature`` (required), ``micro_batch_size``, ``use_dynamic_bsz``,
        ``max_token_len``. Returns ``{"log_probs"}`` plus ``{"entropys"}`` when ``calculate_entropy``.
        """
        temperature = ForwardSwitches.from_meta_info(data.meta_info).require_temperature("compute_log_prob")
        inputs = [*MODEL_INPUT_KEYS, *routing_keys(self.config, recording=True)]
        data = select_inputs(data, inputs, "compute_log_prob")
        self.actor_module.eval()
        try:
            return forward_only(
                data,
                BatchPlan.from_meta_info(data.meta_info),
                lambda micro_batch: self._forward(micro_batch, temperature, calculate_entropy, recording=True),
                dp_group=self.dp_group,
                micro_batch_key="log_prob_micro_batch_size_per_gpu",
            )
        finally:
            self._stop_routing()

    def _update_keys(self, data: DataProto, on_policy: bool) -> list[str]:
        keys = [*MODEL_INPUT_KEYS, "response_mask", "advantages", *routing_keys(self.config)]
        if not on_policy:
            keys.append("old_log_probs")
        if self.config.use_kl_loss:
            keys.append("ref_log_prob")
        if "rollout_is_weights" in data.batch.keys():
            keys.append("rollout_is_weights")
        return keys

    def update_policy(self, data: DataProto) -> dict[str, list[float]]:
        """PPO update: ``ppo_epochs`` passes, one clipped optimizer step per mini-batch.

        ``data.batch``: responses, input_ids, attention_mask, position_ids, response_mask, old_log_probs,
        advantages (+ ref_log_prob with ``use_kl_loss``, optional rollout_is_weights);
        ``data.meta_info["temperature"]``. Returns metrics (one value per mini-batch).
        """
        if self.actor_optimizer is None:
            raise RuntimeError("update_policy needs an optimizer; this actor was built as a reference policy")
        temperature = ForwardSwitches.from_meta_info(data.meta_info).require_temperature("update_policy")
        on_policy = "old_log_probs" not in data.batch.keys()
        if on_policy:
            self._check_on_policy(data)
        data = select_inputs(data, self._update_keys(data, on_policy), "update_policy")
        # Without the old-log-prob pass the update's forward also gives the actor/entropy metric that pass logged.
        calculate_entropy = self.config.uses_entropy or on_policy

        def forward(micro_batch: DataProto) -> dict[str, torch.Tensor]:
            outputs = self._forward(micro_batch, temperature, calculate_entropy)
            if on_policy:  # before this mini-batch's (only) optimizer step: these weights are pi_old
                micro_batch.batch["old_log_probs"] = outputs["log_probs"].detach()
            return outputs

        self.actor_module.train()
        try:
            metrics = clipped_updates(
                data,
                self.update_plan,
                forward,
                partial(actor_loss, self.config),
                self.actor_module,
                self.actor_optimizer,
                self.config.grad_clip,
                dp_group=self.dp_group,
            )
        finally:
            self._stop_routing()
        return prefixed_engine_metrics(metrics, "actor")

    def _stop_routing(self) -> None:
        """Replay stays on through each backward (checkpoint recomputes); off afterwards, so the next forward of
        this module (the rollout's generation in the hybrid engine) routes natively."""
        if self.router is not None:
            self.router.stop()

    def _check_on_policy(self, data: DataProto) -> None:
        """A batch without ``old_log_probs`` (the trainer skipped step 3, ``verl.trainer.ppo.on_policy``) is only
        exact when the whole update is one optimizer step and the train-mode forward equals the eval-mode one."""
        plan = self.update_plan
        if plan.epochs != 1 or len(data) > plan.mini_batch_size:
            raise ValueError(
                f"update_policy got no old_log_probs but runs {plan.epochs} epoch(s) over "
                f"{len(data)} responses in mini-batches of {plan.mini_batch_size}: only one optimizer step "
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
