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

The role workers' RPC methods and model build are ``verl.workers.core.roles``' (the legacy ``fsdp_workers`` inherit
the same), so the classes here only say how a phase runs on a :class:`TrainingWorker`; the engines
(``verl/workers/engine``) run it with the core's loops. ``tests/workers/test_legacy_vs_engine.py`` checks that both
paths give the same log-probs, losses, grad norms and weights.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Any

import torch

from verl.protocol import DataProto
from verl.single_controller.base import Worker
from verl.single_controller.base.decorator import Dispatch, make_nd_compute_dataproto_dispatch_fn, register
from verl.utils.device import get_platform
from verl.workers.config.critic import FSDPCriticConfig, FSDPCriticModelCfg
from verl.workers.config.engine import FSDPEngineConfig, VeOmniEngineConfig
from verl.workers.config.model import HFModelConfig
from verl.workers.config.optimizer import OptimizerConfig
from verl.workers.core.batch_plan import BatchPlan, actor_update_plan
from verl.workers.core.micro_forward import MODEL_INPUT_KEYS, select_inputs
from verl.workers.core.process_group import init_process_group
from verl.workers.core.roles import ActorRolloutRefRPC, CheckpointRPC, CriticRPC
from verl.workers.core.routing import ROUTER_REPLAY_META_KEY, engine_routing_mode, routing_keys
from verl.workers.core.update_loop import prefixed_engine_metrics, run_mini_batches, scheduled_update
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

    def _checkpointer(self, method: str) -> Any:
        return self.engine


class ActorRolloutRefWorker(ActorRolloutRefRPC, Worker):
    """Actor, rollout and reference policy of the engine path (upstream name; the legacy worker's methods, from
    ``core.roles.ActorRolloutRefRPC``), each phase run on a :class:`TrainingWorker`.

    Args:
        config: ``actor_rollout_ref`` (DictConfig or ``ActorRolloutRefConfig``).
        role: ``actor``, ``rollout``, ``ref``, ``actor_rollout`` or ``actor_rollout_ref``.
    """

    def __init__(self, config: ActorRolloutRefConfig | DictConfig, role: str, **kwargs: Any):
        super().__init__()
        self._start(config, role)
        self.actor: TrainingWorker | None = None
        self.ref: TrainingWorker | None = None

    def _use_policy(self, policy: TrainingWorker) -> None:
        self.actor = policy
        if self._is_actor:
            policy.set_loss_fn(partial(ppo_loss, self.config.actor))

    def _use_ref(self, ref: TrainingWorker) -> None:
        self.ref = ref

    # ------------------------------------------------------------------------------------------------ phases
    def _log_probs(self, data: DataProto, which: str) -> dict[str, torch.Tensor]:
        """The policy's pass records the routing (router replay) and gives the entropy; the reference's neither."""
        policy = which == "actor"
        keys = [*MODEL_INPUT_KEYS, *(routing_keys(self.config.actor, recording=True) if policy else [])]
        data = select_inputs(data, keys, "compute_log_prob" if policy else "compute_ref_log_prob")
        data.meta_info["calculate_entropy"] = policy
        if policy:
            data.meta_info[ROUTER_REPLAY_META_KEY] = engine_routing_mode(self.config.actor, recording=True)
        return (self.actor if policy else self.ref).infer(data)

    def _train(self, data: DataProto) -> dict[str, Any]:
        cfg = self.config.actor
        if "temperature" not in data.meta_info:
            raise ValueError("update_actor: data.meta_info['temperature'] is missing (the trainer sets it)")
        keys = [*_ACTOR_UPDATE_KEYS, *(["ref_log_prob"] if cfg.use_kl_loss else [])]
        keys += ["rollout_is_weights"] if "rollout_is_weights" in data.batch.keys() else []
        keys += routing_keys(cfg)
        batch = select_inputs(data, keys, "update_actor")
        batch.meta_info["calculate_entropy"] = cfg.uses_entropy
        batch.meta_info[ROUTER_REPLAY_META_KEY] = engine_routing_mode(cfg)
        plan = actor_update_plan(cfg, self.dp_size)
        update = lambda: prefixed_engine_metrics(self.actor.run_mini_batches(batch, plan), "actor")  # noqa: E731
        return scheduled_update(update, self.actor.engine.lr_scheduler, "actor")


class CriticWorker(CriticRPC, Worker):
    """Value model of the engine path, with the legacy critic's methods (``core.roles.CriticRPC``), run on a
    :class:`TrainingWorker`. ``config``: the ``critic`` node."""

    def __init__(self, config: FSDPCriticConfig | DictConfig, **kwargs: Any):
        super().__init__()
        self._start(config)
        self.critic: TrainingWorker | None = None

    def _use_critic(self, critic: TrainingWorker) -> None:
        self.critic = critic
        critic.set_loss_fn(partial(value_loss, self.config))

    def _require_critic(self) -> TrainingWorker:
        if self.critic is None:
            raise RuntimeError("the critic is not built: call init_model first")
        return self.critic

    def _values(self, data: DataProto) -> torch.Tensor:
        return self._require_critic().infer(select_inputs(data, MODEL_INPUT_KEYS, "compute_values"))["values"]

    def _train(self, data: DataProto) -> dict[str, Any]:
        critic = self._require_critic()
        batch = select_inputs(data, _CRITIC_UPDATE_KEYS, "update_critic")
        update = lambda: prefixed_engine_metrics(critic.run_mini_batches(batch, self.update_plan), "critic")  # noqa: E731
        return scheduled_update(update, critic.engine.lr_scheduler, "critic")
