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
from verl.single_controller.base.decorator import Dispatch, make_nd_compute_dataproto_dispatch_fn, register
from verl.utils.checkpoint.fsdp_checkpoint_manager import FSDPCheckpointManager
from verl.utils.debug.performance import memory_metrics
from verl.utils.device import get_platform
from verl.utils.fsdp_utils import create_device_mesh
from verl.workers.actor.dp_actor import DataParallelPPOActor
from verl.workers.config.actor import ActorConfig
from verl.workers.config.critic import FSDPCriticConfig
from verl.workers.config.ref import RefConfig
from verl.workers.config.rollout import RolloutConfig
from verl.workers.core.batch_plan import actor_update_plan, critic_forward_plan, critic_update_plan, log_prob_plan
from verl.workers.core.fsdp_model import build_fsdp_model
from verl.workers.core.losses import bind_rollout_correction
from verl.workers.core.model_forward import LogProbOptions
from verl.workers.core.parallel_layout import DataSequenceLayout
from verl.workers.core.placement import Placement
from verl.workers.core.process_group import init_process_group
from verl.workers.core.roles import (
    CheckpointRPC,
    WorkerRoles,
    actor_rollout_ref_config,
    critic_config,
    generate_sequences,
)
from verl.workers.core.routing import router_replay_mode
from verl.workers.critic.dp_critic import DataParallelPPOCritic
from verl.workers.rollout.build import build_rollout

if TYPE_CHECKING:
    from omegaconf import DictConfig

    from verl.trainer.config.ppo_trainer import ActorRolloutRefConfig

logger = logging.getLogger(__name__)

__all__ = ["ActorRolloutRefWorker", "CriticWorker"]


# ----------------------------------------------------------------------------------------------------------------
# actor / rollout / reference policy
# ----------------------------------------------------------------------------------------------------------------


class ActorRolloutRefWorker(CheckpointRPC, Worker):
    """Policy worker: any combination of actor (training), rollout (generation) and reference policy.

    Args:
        config: ``actor_rollout_ref``: an ``ActorRolloutRefConfig`` or its DictConfig node (converted once).
        role: ``actor`` | ``rollout`` | ``ref`` | ``actor_rollout`` | ``actor_rollout_ref``.
    """

    def __init__(self, config: ActorRolloutRefConfig | DictConfig, role: str, **kwargs: Any):
        super().__init__()
        self.roles = WorkerRoles.parse(role)
        self.role = role
        self._is_actor, self._is_rollout, self._is_ref = self.roles.is_actor, self.roles.is_rollout, self.roles.is_ref
        self.config = actor_rollout_ref_config(config)
        init_process_group(self.rank, self.world_size, self._local_rank, timeout_s=self.config.nccl_timeout)
        self.model_config = self.config.model
        self.actor_config = self.config.actor
        self.rollout_config: RolloutConfig = self.config.rollout
        self.ref_config: RefConfig | None = self.config.ref if self._is_ref else None
        sp_key = "actor_rollout_ref.actor.ulysses_sequence_parallel_size"
        self.layout = DataSequenceLayout.from_world(self.actor_config.ulysses_sequence_parallel_size, sp_key)
        self.layout.build_groups()
        self.dp_size = self.layout.dp_size
        for mesh_name in ("actor", "rollout", "ref"):
            self._register_dispatch_collect_info(mesh_name, self.layout.dp_rank, self.layout.is_collect)
        self.update_plan = actor_update_plan(self.actor_config, self.dp_size) if self._is_actor else None
        self.actor = self.rollout = self.ref_policy = self.checkpoint_manager = None

    # ------------------------------------------------------------------------------------------------ building
    def _log_prob_options(self, config: ActorConfig | RefConfig) -> LogProbOptions:
        return LogProbOptions.from_config(
            config, self.model_config.use_remove_padding, self.model_config.use_fused_kernels
        )

    def _build_policy(self) -> None:
        fsdp_config = self.actor_config.fsdp_config
        built = build_fsdp_model(
            self.model_config,
            fsdp_config,
            strategy=self.actor_config.strategy,
            mesh=create_device_mesh(self.world_size, fsdp_config.fsdp_size),
            optim_config=self.actor_config.optim if self._is_actor else None,
            forward_only=not self._is_actor,
            role="actor_rollout_ref.actor",
            freeze_vision_tower=self._is_actor and self.actor_config.freeze_vision_tower,
        )
        self.actor_module_fsdp, self.actor_optimizer = built.module, built.optimizer
        self.actor_lr_scheduler = built.lr_scheduler
        placement = Placement.from_config(fsdp_config, forward_only=not self._is_actor)
        self._actor_placement = placement.bind(built.module, built.optimizer)
        self.actor = DataParallelPPOActor(
            self.actor_config,
            built.module,
            built.optimizer,
            self._log_prob_options(self.actor_config),
            update_plan=self.update_plan,
            **self.layout.groups(),
        )

    def _build_rollout(self) -> None:
        self.rollout, self.rollout_sharding_manager = build_rollout(
            self.actor_module_fsdp,
            self.rollout_config,
            self.model_config,
            param_offload=self._actor_placement.param_offload,
            world_size=self.world_size,
            rank=self.rank,
            seed=self.actor_config.fsdp_config.seed,
        )

    def _build_ref(self) -> None:
        ref_fsdp = self.ref_config.fsdp_config
        built = build_fsdp_model(
            self.model_config,
            ref_fsdp,
            strategy=self.ref_config.strategy,
            mesh=create_device_mesh(self.world_size, ref_fsdp.fsdp_size),
            forward_only=True,
            role="actor_rollout_ref.ref",
        )
        self.ref_module_fsdp = built.module
        self.ref_policy = DataParallelPPOActor(
            self.ref_config, built.module, None, self._log_prob_options(self.ref_config), **self.layout.groups()
        )

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def init_model(self) -> None:
        """Build the models of this worker's role (policy + optimizer, rollout, reference), then offload."""
        torch.manual_seed(self.actor_config.fsdp_config.seed)
        if self._is_actor or self._is_rollout:
            self._build_policy()
        if self._is_rollout:
            self._build_rollout()
        if self._is_ref:
            self._build_ref()
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
    @register(dispatch_mode=make_nd_compute_dataproto_dispatch_fn(mesh_name="rollout"))
    def generate_sequences(self, prompts: DataProto) -> DataProto:
        """Responses for this rank's prompts (HF rollout on the actor module; ``core.roles.generate_sequences``)."""
        self.roles.require(self._is_rollout, "generate_sequences", "rollout")
        return generate_sequences(
            self.rollout,
            self.rollout_sharding_manager,
            prompts,
            self.model_config.tokenizer,
            self.actor_config.fsdp_config.seed,
            self.layout.dp_rank,
        )

    def _log_prob_data(self, data: DataProto, config: RolloutConfig | RefConfig, key: str) -> DataProto:
        """``data`` on the device with the forward's per-rank plan and the rollout temperature in ``meta_info``."""
        plan = log_prob_plan(config, key, self.layout.sp_size, self.dp_size)
        data = data.to(get_platform().device())
        data.meta_info.update(plan.meta_info(), temperature=self.rollout_config.temperature)
        return data

    @register(dispatch_mode=make_nd_compute_dataproto_dispatch_fn(mesh_name="actor"))
    def compute_log_prob(self, data: DataProto) -> DataProto:
        """``old_log_probs`` and ``entropys`` (the trainer logs ``actor/entropy`` from them) under the current
        policy, with the rollout's log-prob micro-batching and temperature."""
        self.roles.require(self._is_actor, "compute_log_prob", "actor")
        data = self._log_prob_data(data, self.rollout_config, "actor_rollout_ref.rollout.log_prob_micro_batch_size")
        with self._actor_placement.on_device():
            out = self.actor.compute_log_prob(data, calculate_entropy=True)
        tensors = {"old_log_probs": out["log_probs"], "entropys": out["entropys"]}
        # router replay R2: the routing of this forward, replayed in the update (R3's is the rollout's, already in
        # the batch: the forward replayed it)
        if "routed_experts" in out and router_replay_mode(self.actor_config) == "R2":
            tensors["routed_experts"] = out["routed_experts"]
        meta_info = {"temperature": self.rollout_config.temperature}
        return DataProto.from_dict(tensors=tensors, meta_info=meta_info).to("cpu")

    @register(dispatch_mode=make_nd_compute_dataproto_dispatch_fn(mesh_name="ref"))
    def compute_ref_log_prob(self, data: DataProto) -> DataProto:
        """``ref_log_prob`` under the frozen reference policy (no entropy)."""
        self.roles.require(self._is_ref, "compute_ref_log_prob", "ref")
        data = self._log_prob_data(data, self.ref_config, "actor_rollout_ref.ref.log_prob_micro_batch_size")
        out = self.ref_policy.compute_log_prob(data, calculate_entropy=False)
        return DataProto.from_dict(tensors={"ref_log_prob": out["log_probs"]}).to("cpu")

    @register(dispatch_mode=make_nd_compute_dataproto_dispatch_fn(mesh_name="actor"))
    def update_actor(self, data: DataProto) -> DataProto:
        """One PPO update on this rank's shard; returns ``meta_info["metrics"]`` (incl. ``actor/lr``)."""
        self.roles.require(self._is_actor, "update_actor", "actor")
        bind_rollout_correction(self.actor_config, data.meta_info)
        data = data.to(get_platform().device())
        with self._actor_placement.on_device(optimizer=True):
            metrics = self.actor.update_policy(data)
            metrics["actor/lr"] = self.actor_lr_scheduler.get_last_lr()[0]
            self.actor_lr_scheduler.step()
        metrics.update(memory_metrics())  # after the update: the step's peak includes optimizer state and grads
        return DataProto(meta_info={"metrics": metrics})

    def _checkpointer(self, method: str) -> tuple[Any, Any]:
        self.roles.require(self._is_actor, method, "actor")
        return self.checkpoint_manager, self._actor_placement.on_device(optimizer=True)


# ----------------------------------------------------------------------------------------------------------------
# critic
# ----------------------------------------------------------------------------------------------------------------


class CriticWorker(CheckpointRPC, Worker):
    """Value-model worker. ``config``: ``critic`` (``FSDPCriticConfig`` or its DictConfig node, converted once)."""

    def __init__(self, config: FSDPCriticConfig | DictConfig, **kwargs: Any):
        super().__init__()
        self.config = critic_config(config)
        init_process_group(self.rank, self.world_size, self._local_rank)
        sp_key = "critic.ulysses_sequence_parallel_size"
        self.layout = DataSequenceLayout.from_world(self.config.ulysses_sequence_parallel_size, sp_key)
        self.layout.build_groups()
        self._register_dispatch_collect_info("critic", self.layout.dp_rank, self.layout.is_collect)
        self.update_plan = critic_update_plan(self.config, self.layout.dp_size)
        self.forward_plan = critic_forward_plan(self.config, self.layout.dp_size)

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

    @register(dispatch_mode=make_nd_compute_dataproto_dispatch_fn(mesh_name="critic"))
    def compute_values(self, data: DataProto) -> DataProto:
        """``values`` (B, R) of this rank's shard."""
        data = data.to(get_platform().device())
        data.meta_info.update(self.forward_plan.meta_info())
        with self._placement.on_device():
            values = self.critic.compute_values(data)
        return DataProto.from_dict(tensors={"values": values}).to("cpu")

    @register(dispatch_mode=make_nd_compute_dataproto_dispatch_fn(mesh_name="critic"))
    def update_critic(self, data: DataProto) -> DataProto:
        """One value-function update; returns ``meta_info["metrics"]`` (incl. ``critic/lr``)."""
        data = data.to(get_platform().device())
        with self._placement.on_device(optimizer=True):
            metrics = self.critic.update_critic(data)
            metrics["critic/lr"] = self.critic_lr_scheduler.get_last_lr()[0]
            self.critic_lr_scheduler.step()
        return DataProto(meta_info={"metrics": metrics})

    def _checkpointer(self, method: str) -> tuple[Any, Any]:
        return self.checkpoint_manager, self._placement.on_device(optimizer=True)
