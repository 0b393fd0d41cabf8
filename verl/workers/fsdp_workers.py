"""Legacy FSDP workers (upstream ``verl.workers.fsdp_workers``): ``ActorRolloutRefWorker`` and ``CriticWorker``.

Each worker is one process of a worker group; the driver reaches it only through ``@register``-ed methods
(typed facades in ``verl.trainer.ppo.worker_groups``). One training step touches them in this order::

    generate_sequences   (rollout: hf generates with the actor module;  mesh "rollout"
                          vllm gets the weights streamed in first)
    compute_log_prob     (actor, old log-probs + entropy for the metric) mesh "actor"
    compute_ref_log_prob (reference policy)                              mesh "ref"
    compute_values / update_critic                                       CriticWorker, mesh "critic"
    update_actor                                                         mesh "actor"
    save_checkpoint / load_checkpoint                                    every rank

Every data-parallel rank gets its own shard of the batch (n-d mesh dispatch); with Ulysses SP
(``ulysses_sequence_parallel_size`` = sp) the sp ranks of one group share a shard and split its token stream. The
maths and the orchestration are in ``verl.workers.core`` (shared with the engine path): the loops
(``update_loop``), per-rank sizes (``batch_plan``: the config keeps its global values), offload (``placement``:
parameters and optimizer state on the host between phases, so every tensor a phase touches is on ONE device), role
parsing and generation (``roles``). This module wires models and RPC.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

import torch

from verl.protocol import DataProto
from verl.single_controller.base import Worker
from verl.single_controller.base.decorator import Dispatch, register
from verl.utils.checkpoint.fsdp_checkpoint_manager import FSDPCheckpointManager
from verl.utils.fsdp_utils import create_device_mesh
from verl.workers.actor.dp_actor import DataParallelPPOActor
from verl.workers.config.actor import ActorConfig
from verl.workers.config.critic import FSDPCriticConfig
from verl.workers.config.ref import RefConfig
from verl.workers.config.rollout import RolloutConfig
from verl.workers.core.batch_plan import actor_update_plan
from verl.workers.core.fsdp_model import FSDPModel, build_fsdp_model
from verl.workers.core.model_forward import LogProbOptions
from verl.workers.core.placement import Placement
from verl.workers.core.roles import ActorRolloutRefRPC, CriticRPC
from verl.workers.critic.dp_critic import DataParallelPPOCritic

if TYPE_CHECKING:
    from omegaconf import DictConfig

    from verl.trainer.config.ppo_trainer import ActorRolloutRefConfig

logger = logging.getLogger(__name__)

__all__ = ["ActorRolloutRefWorker", "CriticWorker"]


# ----------------------------------------------------------------------------------------------------------------
# actor / rollout / reference policy
# ----------------------------------------------------------------------------------------------------------------


class ActorRolloutRefWorker(ActorRolloutRefRPC, Worker):
    """Policy worker: any combination of actor (training), rollout (generation) and reference policy.

    The RPC methods are ``core.roles.ActorRolloutRefRPC``'s; this class builds the models and runs each phase on
    ``DataParallelPPOActor`` under the policy's offload placement.

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
        self.layout.build_groups()
        self.update_plan = actor_update_plan(self.actor_config, self.dp_size) if self._is_actor else None
        self.actor = self.ref_policy = self.checkpoint_manager = None

    # ------------------------------------------------------------------------------------------------ building
    def _build_model(
        self, config: ActorConfig | RefConfig, role: str, training: bool = False
    ) -> tuple[FSDPModel, DataParallelPPOActor]:
        """The role's FSDP model (``core.fsdp_model``) and the ``DataParallelPPOActor`` over it."""
        fsdp_config = config.fsdp_config
        built = build_fsdp_model(
            self.model_config,
            fsdp_config,
            strategy=config.strategy,
            mesh=create_device_mesh(self.world_size, fsdp_config.fsdp_size),
            optim_config=config.optim if training else None,
            forward_only=not training,
            role=f"actor_rollout_ref.{role}",
            freeze_vision_tower=training and config.freeze_vision_tower,
        )
        options = LogProbOptions.from_config(
            config, self.model_config.use_remove_padding, self.model_config.use_fused_kernels
        )
        plan = self.update_plan if training else None
        groups = self.layout.groups()
        return built, DataParallelPPOActor(config, built.module, built.optimizer, options, update_plan=plan, **groups)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def init_model(self) -> None:
        """Build the models of this worker's role (policy + optimizer, rollout, reference), then offload."""
        torch.manual_seed(self.actor_config.fsdp_config.seed)
        if self._is_actor or self._is_rollout:
            built, self.actor = self._build_model(self.actor_config, "actor", training=self._is_actor)
            self.actor_module_fsdp, self.actor_optimizer, self.actor_lr_scheduler = (
                built.module,
                built.optimizer,
                built.lr_scheduler,
            )
            placement = Placement.from_config(self.actor_config.fsdp_config, forward_only=not self._is_actor)
            self._actor_placement = placement.bind(built.module, built.optimizer)
        if self._is_rollout:
            self._build_rollout(self.actor_module_fsdp, self._actor_placement.param_offload)
        if self._is_ref:
            built_ref, self.ref_policy = self._build_model(self.ref_config, "ref")
            self.ref_module_fsdp = built_ref.module
        if self._is_actor:
            self.checkpoint_manager = FSDPCheckpointManager(
                self.actor_module_fsdp,
                self.actor_optimizer,
                self.actor_lr_scheduler,
                processing_class=self.model_config.tokenizer,
                checkpoint_config=self.actor_config.checkpoint,
            )
        if self._is_actor or self._is_rollout:
            self._actor_placement.offload()

    # ------------------------------------------------------------------------------------------------ phases
    def _log_probs(self, data: DataProto, which: str) -> dict[str, torch.Tensor]:
        if which == "ref":
            return self.ref_policy.compute_log_prob(data, calculate_entropy=False)
        with self._actor_placement.on_device():
            return self.actor.compute_log_prob(data, calculate_entropy=True)

    def _train(self, data: DataProto) -> dict[str, Any]:
        with self._actor_placement.on_device(optimizer=True):
            metrics = self.actor.update_policy(data)
            metrics["actor/lr"] = self.actor_lr_scheduler.get_last_lr()[0]
            self.actor_lr_scheduler.step()
        return metrics

    def _checkpointer(self, method: str) -> tuple[Any, Any]:
        self.roles.require(self._is_actor, method, "actor")
        return self.checkpoint_manager, self._actor_placement.on_device(optimizer=True)


# ----------------------------------------------------------------------------------------------------------------
# critic
# ----------------------------------------------------------------------------------------------------------------


class CriticWorker(CriticRPC, Worker):
    """Value-model worker. ``config``: ``critic`` (``FSDPCriticConfig`` or its DictConfig node, converted once).
    The RPC methods are ``core.roles.CriticRPC``'s, run on ``DataParallelPPOCritic`` under its placement."""

    def __init__(self, config: FSDPCriticConfig | DictConfig, **kwargs: Any):
        super().__init__()
        self._start(config)
        self.layout.build_groups()

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def init_model(self) -> None:
        model_cfg = self.config.model
        fsdp_config = model_cfg.fsdp_config
        torch.manual_seed(fsdp_config.seed)
        built = build_fsdp_model(
            model_cfg,
            fsdp_config,
            strategy=self.config.strategy,
            mesh=create_device_mesh(self.world_size, fsdp_config.fsdp_size),
            optim_config=self.config.optim,
            value_head=True,
            role="critic",
        )
        self.critic_module, self.critic_optimizer = built.module, built.optimizer
        self.critic_lr_scheduler = built.lr_scheduler
        self._placement = Placement.from_config(fsdp_config, forward_only=False).bind(built.module, built.optimizer)
        self.critic = DataParallelPPOCritic(
            self.config, built.module, built.optimizer, update_plan=self.update_plan, **self.layout.groups()
        )
        self.checkpoint_manager = FSDPCheckpointManager(
            built.module, built.optimizer, built.lr_scheduler, checkpoint_config=self.config.checkpoint
        )
        self._placement.offload()

    def _values(self, data: DataProto) -> torch.Tensor:
        with self._placement.on_device():
            return self.critic.compute_values(data)

    def _train(self, data: DataProto) -> dict[str, Any]:
        with self._placement.on_device(optimizer=True):
            metrics = self.critic.update_critic(data)
            metrics["critic/lr"] = self.critic_lr_scheduler.get_last_lr()[0]
            self.critic_lr_scheduler.step()
        return metrics

    def _checkpointer(self, method: str) -> tuple[Any, Any]:
        return self.checkpoint_manager, self._placement.on_device(optimizer=True)
