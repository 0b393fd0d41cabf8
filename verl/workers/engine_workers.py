"""Engine worker path (``trainer.use_legacy_worker_impl=disable``): workers written against ``BaseEngine``.

The trainer drives these workers exactly like the legacy ``fsdp_workers`` ones — same ``@register``-ed method
names, the same ``DataProto`` in and out, the same n-d mesh dispatch — so ``RayPPOTrainer`` needs no branch:

==========================  =========================================================================================
``ActorRolloutRefWorker``   ``init_model``, ``generate_sequences``, ``compute_log_prob``, ``compute_ref_log_prob``,
                            ``update_actor``, ``save_checkpoint``, ``load_checkpoint`` (role ``actor``, ``rollout``,
                            ``ref``, ``actor_rollout`` or ``actor_rollout_ref``)
``CriticWorker``            ``init_model``, ``compute_values``, ``update_critic``, ``save_checkpoint``,
                            ``load_checkpoint`` (engine-mode critic; upstream hands the trainer a ``TrainingWorker``)
``TrainingWorker``          upstream's generic engine worker: ``reset``, ``set_loss_fn``, ``train_mini_batch``,
                            ``train_batch``, ``infer_batch``, ``to``, checkpoints
==========================  =========================================================================================

Where the work lives: the engines (``verl/workers/engine``) build their model with the core's ``build_fsdp_model``;
the loops (PPO epochs × mini-batches × micro-batches, one clipped optimizer step per mini-batch, and the forward-only
pass) are ``verl.workers.core.update_loop``'s, the per-rank sizes ``verl.workers.core.batch_plan``'s, offload
``verl.workers.core.placement``'s, role parsing and generation ``verl.workers.core.roles``' — the same functions the
legacy ``fsdp_workers`` call, so the classes here are RPC surfaces. ``tests/workers/test_legacy_vs_engine.py``
checks that both paths give the same log-probs, losses, grad norms and weights.
"""

from __future__ import annotations

import contextlib
import logging
from dataclasses import dataclass, replace
from functools import partial
from typing import TYPE_CHECKING, Any

import torch

from verl.protocol import DataProto
from verl.single_controller.base import Worker
from verl.single_controller.base.decorator import Dispatch, make_nd_compute_dataproto_dispatch_fn, register
from verl.utils.debug.performance import memory_metrics
from verl.utils.device import get_platform
from verl.workers.config.critic import FSDPCriticConfig, FSDPCriticModelCfg
from verl.workers.config.engine import FSDPEngineConfig, VeOmniEngineConfig
from verl.workers.config.model import HFModelConfig
from verl.workers.config.optimizer import OptimizerConfig
from verl.workers.config.ref import RefConfig
from verl.workers.config.rollout import RolloutConfig
from verl.workers.core.batch_plan import (
    BatchPlan,
    actor_update_plan,
    critic_forward_plan,
    critic_update_plan,
    log_prob_plan,
)
from verl.workers.core.losses import bind_rollout_correction
from verl.workers.core.micro_forward import MODEL_INPUT_KEYS, select_inputs
from verl.workers.core.parallel_layout import dp_sp_coordinates
from verl.workers.core.process_group import init_process_group
from verl.workers.core.roles import (
    CheckpointRPC,
    WorkerRoles,
    actor_rollout_ref_config,
    critic_config,
    generate_sequences,
)
from verl.workers.core.routing import (
    ROUTED_EXPERTS,
    ROUTER_REPLAY_META_KEY,
    engine_routing_mode,
    router_replay_mode,
    routing_keys,
)
from verl.workers.core.update_loop import prefixed_engine_metrics, run_mini_batches
from verl.workers.engine import EngineRegistry
from verl.workers.engine.base import LossFunction
from verl.workers.engine.losses import ppo_loss, value_loss

if TYPE_CHECKING:
    from omegaconf import DictConfig

    from verl.trainer.config.config import CheckpointConfig
    from verl.trainer.config.ppo_trainer import ActorRolloutRefConfig

logger = logging.getLogger(__name__)

__all__ = ["ActorRolloutRefWorker", "CriticWorker", "TrainingWorker", "TrainingWorkerConfig"]

_ACTOR_UPDATE_KEYS = (*MODEL_INPUT_KEYS, "response_mask", "old_log_probs", "advantages")
_CRITIC_UPDATE_KEYS = (*MODEL_INPUT_KEYS, "response_mask", "values", "returns")


@dataclass(frozen=True)
class TrainingWorkerConfig:
    """What a :class:`TrainingWorker` builds (upstream name and fields).

    Attributes:
        model_type: ``language_model`` or ``value_model``.
        model_config: ``HFModelConfig`` / the critic's model block.
        engine_config: ``FSDPEngineConfig`` (its ``strategy`` picks the engine) or ``VeOmniEngineConfig``.
        optimizer_config: None for a forward-only engine.
        checkpoint_config: ``CheckpointConfig``.
        profiler_config: accepted for compatibility (no profiler integration here).
    """

    model_type: str
    model_config: HFModelConfig | FSDPCriticModelCfg
    engine_config: FSDPEngineConfig | VeOmniEngineConfig
    optimizer_config: OptimizerConfig | None = None
    checkpoint_config: CheckpointConfig | None = None
    profiler_config: Any = None


class TrainingWorker(CheckpointRPC, Worker):
    """One engine on every rank: forward/backward over ``DataProto`` batches with a loss function.

    Usable as a Ray worker (mesh ``train``) and in-process by the role workers below.

    Args:
        config: see :class:`TrainingWorkerConfig`.
        processing_class: tokenizer written next to HF checkpoints.
        role: config-key prefix of the role, for error messages (e.g. ``critic``).
        freeze_vision_tower: do not train the model's vision encoder (the actor's ``freeze_vision_tower``).
    """

    def __init__(
        self,
        config: TrainingWorkerConfig,
        processing_class: Any = None,
        role: str = "train",
        freeze_vision_tower: bool = False,
    ):
        super().__init__()
        init_process_group(self.rank, self.world_size, self._local_rank)
        self.config = config
        self.engine = EngineRegistry.new(
            config.model_type,
            config.engine_config.strategy,
            config.model_config,
            config.engine_config,
            config.optimizer_config,
            config.checkpoint_config,
            processing_class=processing_class,
            role=role,
            # passed only when set: engines registered by user code need not know the keyword
            **({"freeze_vision_tower": True} if freeze_vision_tower else {}),
        )
        self._register_dispatch_collect_info(
            "train", self.engine.get_data_parallel_rank(), self.engine.is_mp_src_rank_with_outputs()
        )
        self.loss_fn: LossFunction | None = None

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def reset(self) -> None:
        """Build (or rebuild) model, optimizer and lr schedule (upstream: ``engine.initialize``)."""
        self.engine.initialize()

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def set_loss_fn(self, loss_fn: LossFunction) -> None:
        """``loss_fn(model_output, micro_batch, global_batch_info) -> (loss, metrics)``; see ``engine.losses``."""
        self.loss_fn = loss_fn

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def to(self, device: str, model: bool = True, optimizer: bool = True, grad: bool = True) -> None:
        self.engine.to(device, model=model, optimizer=optimizer, grad=grad)

    def run_mini_batches(self, data: DataProto, plan: BatchPlan) -> dict[str, list[float]]:
        """``plan.epochs`` passes over ``data``, one clipped optimizer step (``engine.train_batch``) per mini-batch of
        ``plan`` rows: the core's ``run_mini_batches``. Returns the per-mini-batch metrics (loss terms,
        ``grad_norm``, ``skipped_steps``) as lists."""
        loss_fn = self._require_loss_fn()
        data.meta_info.update(plan.meta_info())
        with self.engine.train_mode():
            train_step = lambda mini_batch: self.engine.train_batch(mini_batch, loss_fn)["metrics"]  # noqa: E731
            return run_mini_batches(data, plan, train_step, self.engine.optimizer_zero_grad)

    def _require_loss_fn(self) -> LossFunction:
        if self.loss_fn is None:
            raise RuntimeError("TrainingWorker has no loss function: call set_loss_fn(loss_fn) before training")
        return self.loss_fn

    def infer(self, data: DataProto) -> dict[str, torch.Tensor]:
        """Forward-only outputs ``{name: (B, R)}`` in input row order (sizes and switches in ``data.meta_info``)."""
        with self.engine.eval_mode():
            return self.engine.infer_batch(data)["model_output"]

    @register(dispatch_mode=make_nd_compute_dataproto_dispatch_fn(mesh_name="train"))
    def train_mini_batch(self, data: DataProto) -> DataProto:
        """Mini-batch training driven by ``data.meta_info`` (per-rank sizes): ``mini_batch_size``, ``epochs``,
        ``shuffle``, ``seed``, ``micro_batch_size`` or ``use_dynamic_bsz`` + ``max_token_len``, and the forward's
        switches (``temperature``, ``calculate_entropy``). Steps the lr schedule once; metrics in ``meta_info``."""
        plan = BatchPlan.from_meta_info(data.meta_info, training=True)
        metrics = self.run_mini_batches(data.to(get_platform().device()), plan)
        metrics["lr"] = [self.engine.lr_scheduler_step()]
        return DataProto(meta_info={"metrics": metrics})

    @register(dispatch_mode=make_nd_compute_dataproto_dispatch_fn(mesh_name="train"))
    def train_batch(self, data: DataProto) -> DataProto:
        """One optimizer step over the whole (per-rank) batch; metrics in ``meta_info``."""
        loss_fn = self._require_loss_fn()
        with self.engine.train_mode():
            output = self.engine.train_batch(data.to(get_platform().device()), loss_fn)
        return DataProto(meta_info={"metrics": output["metrics"]})

    @register(dispatch_mode=make_nd_compute_dataproto_dispatch_fn(mesh_name="train"))
    def infer_batch(self, data: DataProto) -> DataProto:
        return DataProto.from_dict(tensors=self.infer(data.to(get_platform().device()))).to("cpu")

    def _checkpointer(self, method: str) -> tuple[Any, Any]:
        return self.engine, contextlib.nullcontext()


class ActorRolloutRefWorker(CheckpointRPC, Worker):
    """Actor, rollout and reference policy of the engine path (upstream name; the legacy worker's methods).

    Args:
        config: ``actor_rollout_ref`` (DictConfig or ``ActorRolloutRefConfig``).
        role: ``actor``, ``rollout``, ``ref``, ``actor_rollout`` or ``actor_rollout_ref``.
    """

    def __init__(self, config: ActorRolloutRefConfig | DictConfig, role: str, **kwargs: Any):
        super().__init__()
        self.roles = WorkerRoles.parse(role)
        self.role = role
        self._is_actor, self._is_rollout, self._is_ref = self.roles.is_actor, self.roles.is_rollout, self.roles.is_ref
        self.config = actor_rollout_ref_config(config)
        init_process_group(self.rank, self.world_size, self._local_rank, timeout_s=self.config.nccl_timeout)
        sp_key = "actor_rollout_ref.actor.ulysses_sequence_parallel_size"
        sp = self.config.actor.ulysses_sp_size
        self.dp_size, dp_rank, sp_rank = dp_sp_coordinates(self.rank, self.world_size, sp, sp_key)
        self._dp_rank = dp_rank
        for mesh_name in ("actor", "rollout", "ref"):
            self._register_dispatch_collect_info(mesh_name, dp_rank, sp_rank == 0)
        self.actor: TrainingWorker | None = None
        self.ref: TrainingWorker | None = None
        self.rollout: Any = None
        self.rollout_sharding_manager: Any = None

    # ------------------------------------------------------------------------------------------------ building
    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def init_model(self) -> None:
        """Build this role's engines (policy: trainable with the PPO loss, or forward-only for a rollout-only
        worker; frozen reference) and the rollout on the policy's module."""
        cfg = self.config
        torch.manual_seed(cfg.actor.engine_config.seed)
        if self._is_actor or self._is_rollout:
            self.actor = self._build_policy()
        if self._is_rollout:
            self._build_rollout()
        if self._is_ref:
            # the reference policy is frozen whatever its engine's forward_only says (as in the legacy worker)
            ref_engine = replace(cfg.ref.engine_config, forward_only=True)
            ref_config = TrainingWorkerConfig("language_model", cfg.model, ref_engine)
            self.ref = TrainingWorker(ref_config, role="actor_rollout_ref.ref")
            self.ref.reset()

    def _build_policy(self) -> TrainingWorker:
        cfg, actor = self.config, self.config.actor
        engine_config = actor.engine_config if self._is_actor else replace(actor.engine_config, forward_only=True)
        optim = actor.optim if self._is_actor else None
        worker_config = TrainingWorkerConfig("language_model", cfg.model, engine_config, optim, actor.checkpoint)
        policy = TrainingWorker(
            worker_config,
            processing_class=cfg.model.tokenizer,
            role="actor_rollout_ref.actor",
            freeze_vision_tower=self._is_actor and actor.freeze_vision_tower,
        )
        policy.reset()
        if self._is_actor:
            policy.set_loss_fn(partial(ppo_loss, actor))
        return policy

    def _build_rollout(self) -> None:
        """The rollout on the policy engine's module (the same wiring as the legacy worker's)."""
        from verl.workers.rollout.build import build_rollout

        self.rollout, self.rollout_sharding_manager = build_rollout(
            self.actor.engine.module,
            self.config.rollout,
            self.config.model,
            param_offload=self.actor.engine.is_param_offload_enabled,
            world_size=self.world_size,
            rank=self.rank,
            seed=self.config.actor.engine_config.seed,
        )

    def _require(self, worker: Any, method: str, needed: str) -> Any:
        if worker is None:
            raise RuntimeError(f"{method} needs a worker with the {needed} role (after init_model); role={self.role!r}")
        return worker

    # ------------------------------------------------------------------------------------------------ phases
    @register(dispatch_mode=make_nd_compute_dataproto_dispatch_fn(mesh_name="rollout"))
    def generate_sequences(self, prompts: DataProto) -> DataProto:
        """Responses for this rank's prompts (``core.roles.generate_sequences``, as the legacy worker)."""
        self._require(self.rollout, "generate_sequences", "rollout")
        return generate_sequences(
            self.rollout,
            self.rollout_sharding_manager,
            prompts,
            self.config.model.tokenizer,
            self.config.actor.engine_config.seed,
            self._dp_rank,
        )

    def _log_prob_meta(
        self,
        data: DataProto,
        config: RolloutConfig | RefConfig,
        key: str,
        calculate_entropy: bool,
        routing: bool = False,
    ) -> DataProto:
        plan = log_prob_plan(config, key, self.config.actor.ulysses_sp_size, self.dp_size)
        keys = [*MODEL_INPUT_KEYS]
        keys += routing_keys(self.config.actor, recording=True) if routing else []
        data = select_inputs(data.to(get_platform().device()), keys, key)
        data.meta_info.update(
            plan.meta_info(), temperature=self.config.rollout.temperature, calculate_entropy=calculate_entropy
        )
        if routing:
            data.meta_info[ROUTER_REPLAY_META_KEY] = engine_routing_mode(self.config.actor, recording=True)
        return data

    @register(dispatch_mode=make_nd_compute_dataproto_dispatch_fn(mesh_name="actor"))
    def compute_log_prob(self, data: DataProto) -> DataProto:
        """``old_log_probs`` and ``entropys`` (the trainer logs ``actor/entropy`` from them) under the current
        policy, with the rollout's log-prob micro-batching and temperature."""
        actor = self._require(self.actor if self._is_actor else None, "compute_log_prob", "actor")
        key = "actor_rollout_ref.rollout.log_prob_micro_batch_size"
        output = actor.infer(self._log_prob_meta(data, self.config.rollout, key, calculate_entropy=True, routing=True))
        tensors = {"old_log_probs": output["log_probs"], "entropys": output["entropys"]}
        # router replay R2: the routing of this forward, replayed in the update (R3's is the rollout's, already in
        # the batch: the forward replayed it)
        if ROUTED_EXPERTS in output and router_replay_mode(self.config.actor) == "R2":
            tensors[ROUTED_EXPERTS] = output[ROUTED_EXPERTS]
        meta_info = {"temperature": self.config.rollout.temperature}
        return DataProto.from_dict(tensors=tensors, meta_info=meta_info).to("cpu")

    @register(dispatch_mode=make_nd_compute_dataproto_dispatch_fn(mesh_name="ref"))
    def compute_ref_log_prob(self, data: DataProto) -> DataProto:
        """``ref_log_prob`` under the frozen reference policy (no entropy)."""
        ref = self._require(self.ref, "compute_ref_log_prob", "ref")
        key = "actor_rollout_ref.ref.log_prob_micro_batch_size"
        output = ref.infer(self._log_prob_meta(data, self.config.ref, key, calculate_entropy=False))
        return DataProto.from_dict(tensors={"ref_log_prob": output["log_probs"]}).to("cpu")

    @register(dispatch_mode=make_nd_compute_dataproto_dispatch_fn(mesh_name="actor"))
    def update_actor(self, data: DataProto) -> DataProto:
        """PPO update (``ppo_epochs`` × mini-batches); ``data.meta_info["temperature"]`` comes from the trainer.

        Metrics (one value per mini-batch) use the legacy names: ``actor/pg_loss``, ``actor/grad_norm``,
        ``actor/skipped_steps``, ``actor/lr`` (the rate this update used; the schedule then steps) ...
        """
        actor = self._require(self.actor if self._is_actor else None, "update_actor", "actor")
        cfg = self.config.actor
        bind_rollout_correction(cfg, data.meta_info)
        if "temperature" not in data.meta_info:
            raise ValueError("update_actor: data.meta_info['temperature'] is missing (the trainer sets it)")
        keys = [*_ACTOR_UPDATE_KEYS, *(["ref_log_prob"] if cfg.use_kl_loss else [])]
        keys += ["rollout_is_weights"] if "rollout_is_weights" in data.batch.keys() else []
        keys += routing_keys(cfg)
        batch = select_inputs(data.to(get_platform().device()), keys, "update_actor")
        batch.meta_info["calculate_entropy"] = cfg.uses_entropy
        batch.meta_info[ROUTER_REPLAY_META_KEY] = engine_routing_mode(cfg)
        lr = actor.engine.lr_scheduler.get_last_lr()[0]
        metrics = prefixed_engine_metrics(actor.run_mini_batches(batch, actor_update_plan(cfg, self.dp_size)), "actor")
        actor.engine.lr_scheduler_step()
        metrics["actor/lr"] = lr
        metrics.update(memory_metrics())  # after the update: the step's peak includes optimizer state and grads
        return DataProto(meta_info={"metrics": metrics})

    def _checkpointer(self, method: str) -> tuple[Any, Any]:
        return self._require(self.actor if self._is_actor else None, method, "actor"), contextlib.nullcontext()


class CriticWorker(CheckpointRPC, Worker):
    """Value model of the engine path, with the legacy critic's method names. ``config``: the ``critic`` node."""

    def __init__(self, config: FSDPCriticConfig | DictConfig, **kwargs: Any):
        super().__init__()
        self.config = critic_config(config)
        init_process_group(self.rank, self.world_size, self._local_rank)
        sp_key = "critic.ulysses_sequence_parallel_size"
        sp = self.config.ulysses_sequence_parallel_size
        self.dp_size, dp_rank, sp_rank = dp_sp_coordinates(self.rank, self.world_size, sp, sp_key)
        self._register_dispatch_collect_info("critic", dp_rank, sp_rank == 0)
        self.critic: TrainingWorker | None = None

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def init_model(self) -> None:
        cfg = self.config
        torch.manual_seed(cfg.model.fsdp_config.seed)
        worker_config = TrainingWorkerConfig("value_model", cfg.model, cfg.model.fsdp_config, cfg.optim, cfg.checkpoint)
        self.critic = TrainingWorker(worker_config, role="critic")
        self.critic.reset()
        self.critic.set_loss_fn(partial(value_loss, cfg))

    def _require_critic(self) -> TrainingWorker:
        if self.critic is None:
            raise RuntimeError("the critic is not built: call init_model first")
        return self.critic

    @register(dispatch_mode=make_nd_compute_dataproto_dispatch_fn(mesh_name="critic"))
    def compute_values(self, data: DataProto) -> DataProto:
        """``values`` (B, R) of this rank's shard."""
        plan = critic_forward_plan(self.config, self.dp_size)
        data = select_inputs(data.to(get_platform().device()), MODEL_INPUT_KEYS, "compute_values")
        data.meta_info.update(plan.meta_info())
        return DataProto.from_dict(tensors={"values": self._require_critic().infer(data)["values"]}).to("cpu")

    @register(dispatch_mode=make_nd_compute_dataproto_dispatch_fn(mesh_name="critic"))
    def update_critic(self, data: DataProto) -> DataProto:
        """Value-function update (``ppo_epochs`` × mini-batches); ``critic/vf_loss``, ``critic/grad_norm``,
        ``critic/lr`` ... (one value per mini-batch)."""
        critic = self._require_critic()
        batch = select_inputs(data.to(get_platform().device()), _CRITIC_UPDATE_KEYS, "update_critic")
        lr = critic.engine.lr_scheduler.get_last_lr()[0]
        plan = critic_update_plan(self.config, self.dp_size)
        metrics = prefixed_engine_metrics(critic.run_mini_batches(batch, plan), "critic")
        critic.engine.lr_scheduler_step()
        metrics["critic/lr"] = lr
        return DataProto(meta_info={"metrics": metrics})

    def _checkpointer(self, method: str) -> tuple[Any, Any]:
        return self._require_critic(), contextlib.nullcontext()
