"""Legacy FSDP workers (upstream ``verl.workers.fsdp_workers``): ``ActorRolloutRefWorker`` and ``CriticWorker``.

Their RPC methods, and the order one training step calls them in, are ``verl.workers.core.roles``', and so is the
build (the engine path's ``TrainingWorker``: model, optimizer, lr schedule, ``Placement``, checkpoint manager). What
is legacy here is who runs a phase: upstream's ``DataParallelPPOActor``/``DataParallelPPOCritic`` over the built
module, under its placement. Every data-parallel rank gets its own shard of the batch (n-d mesh dispatch); with
Ulysses SP the sp ranks of one group share a shard and split its token stream.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

import torch

from verl.protocol import DataProto
from verl.single_controller.base import Worker
from verl.workers.actor.dp_actor import DataParallelPPOActor
from verl.workers.config.actor import ActorConfig
from verl.workers.config.critic import FSDPCriticConfig
from verl.workers.config.ref import RefConfig
from verl.workers.config.rollout import RolloutConfig
from verl.workers.core.batch_plan import actor_update_plan
from verl.workers.core.roles import ActorRolloutRefRPC, CriticRPC
from verl.workers.core.update_loop import scheduled_update
from verl.workers.critic.dp_critic import DataParallelPPOCritic
from verl.workers.engine.fsdp.transformer_impl import FSDPEngineWithLMHead
from verl.workers.engine_workers import TrainingWorker

if TYPE_CHECKING:
    from omegaconf import DictConfig

    from verl.trainer.config.ppo_trainer import ActorRolloutRefConfig

logger = logging.getLogger(__name__)

__all__ = ["ActorRolloutRefWorker", "CriticWorker"]


class ActorRolloutRefWorker(ActorRolloutRefRPC, Worker):
    """Policy worker: any combination of actor (training), rollout (generation) and reference policy.

    The RPC methods are ``core.roles.ActorRolloutRefRPC``'s; this class runs each phase on ``DataParallelPPOActor``
    with the policy's parameters (and, to update, optimizer state) on the device (``FSDPEngine.placement``).

    Args:
        config: ``actor_rollout_ref``: an ``ActorRolloutRefConfig`` or its DictConfig node (converted once).
        role: ``actor`` | ``rollout`` | ``ref`` | ``actor_rollout`` | ``actor_rollout_ref``.
    """

    def __init__(self, config: ActorRolloutRefConfig | DictConfig, role: str, **kwargs: Any):
        super().__init__()
        self._start(config, role)
        self.model_config = self.config.model
        self.actor_config = self.config.actor
        self.rollout_config: RolloutConfig = self.config.rollout
        self.ref_config: RefConfig | None = self.config.ref if self._is_ref else None
        self.update_plan = actor_update_plan(self.actor_config, self.dp_size) if self._is_actor else None
        self.actor = self.ref_policy = self.checkpoint_manager = None

    def _actor_over(self, engine: FSDPEngineWithLMHead, config: ActorConfig | RefConfig, training: bool):
        """A ``DataParallelPPOActor`` over the engine's module, with its forward options (the role's ``entropy_*``
        keys are linked to its ``fsdp_config``'s, so they are the same settings)."""
        options, groups = engine.log_prob_options, engine.layout.groups()
        plan = self.update_plan if training else None
        return DataParallelPPOActor(config, engine.module, engine.optimizer, options, update_plan=plan, **groups)

    def _use_policy(self, policy: TrainingWorker) -> None:
        engine = policy.engine
        self.actor = self._actor_over(engine, self.actor_config, training=self._is_actor)
        self.actor_module_fsdp, self.actor_optimizer = engine.module, engine.optimizer
        self.actor_lr_scheduler, self._actor_placement = engine.lr_scheduler, engine.placement
        self.checkpoint_manager = engine.checkpoint_manager if self._is_actor else None

    def _use_ref(self, ref: TrainingWorker) -> None:
        self.ref_policy = self._actor_over(ref.engine, self.ref_config, training=False)
        self.ref_module_fsdp = ref.engine.module

    def _log_probs(self, data: DataProto, which: str) -> dict[str, torch.Tensor]:
        if which == "ref":
            return self.ref_policy.compute_log_prob(data, calculate_entropy=False)
        with self._actor_placement.on_device():
            return self.actor.compute_log_prob(data, calculate_entropy=True)

    def _train(self, data: DataProto) -> dict[str, Any]:
        with self._actor_placement.on_device(optimizer=True):
            return scheduled_update(lambda: self.actor.update_policy(data), self.actor_lr_scheduler, "actor")


class CriticWorker(CriticRPC, Worker):
    """Value-model worker. ``config``: ``critic`` (``FSDPCriticConfig`` or its DictConfig node, converted once).
    The RPC methods are ``core.roles.CriticRPC``'s, run on ``DataParallelPPOCritic`` (built as the actor's)."""

    def __init__(self, config: FSDPCriticConfig | DictConfig, **kwargs: Any):
        super().__init__()
        self._start(config)

    def _use_critic(self, critic: TrainingWorker) -> None:
        engine = critic.engine
        self.critic_module, self.critic_optimizer = engine.module, engine.optimizer
        self.critic_lr_scheduler, self._placement = engine.lr_scheduler, engine.placement
        self.checkpoint_manager = engine.checkpoint_manager
        groups = engine.layout.groups()
        self.critic = DataParallelPPOCritic(
            self.config, engine.module, engine.optimizer, update_plan=self.update_plan, **groups
        )

    def _values(self, data: DataProto) -> torch.Tensor:
        with self._placement.on_device():
            return self.critic.compute_values(data)

    def _train(self, data: DataProto) -> dict[str, Any]:
        with self._placement.on_device(optimizer=True):
            return scheduled_update(lambda: self.critic.update_critic(data), self.critic_lr_scheduler, "critic")
