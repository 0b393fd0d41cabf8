"""Engine worker path (``trainer.use_legacy_worker_impl=disable``): workers written against ``BaseEngine``.

The trainer drives these workers exactly like the legacy ``fsdp_workers`` ones — same ``@register``-ed method
names, the same ``DataProto`` in and out, the same dispatch — so ``RayPPOTrainer`` needs no branch:

=======================  ============================================================================================
``ActorRolloutRefWorker``  ``init_model``, ``generate_sequences``, ``compute_log_prob``, ``compute_ref_log_prob``,
                           ``update_actor``, ``save_checkpoint``, ``load_checkpoint`` (role ``actor``, ``rollout``,
                           ``ref``, ``actor_rollout`` or ``actor_rollout_ref``)
``CriticWorker``           ``init_model``, ``compute_values``, ``update_critic``, ``save_checkpoint``,
                           ``load_checkpoint`` (engine-mode critic; upstream hands the trainer a ``TrainingWorker``)
``TrainingWorker``         upstream's generic engine worker: ``reset``, ``set_loss_fn``, ``train_mini_batch``,
                           ``train_batch``, ``infer_batch``, ``to``, checkpoints
=======================  ============================================================================================

Where the maths lives: the engines (``verl/workers/engine``) run the shared core (``verl/workers/core``); the
update loop here (PPO epochs × mini-batches, one optimizer step each) is the same as ``DataParallelPPOActor``'s.
``tests/workers/test_legacy_vs_engine.py`` checks that both paths give the same log-probs, losses, grad norms and
weights.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import torch

from verl.protocol import DataProto
from verl.single_controller.base import Worker
from verl.single_controller.base.decorator import Dispatch, register
from verl.utils.config import omega_conf_to_dataclass
from verl.utils.py_functional import append_to_dict
from verl.workers.core.micro_batching import iter_mini_batches
from verl.workers.engine import EngineRegistry
from verl.workers.engine.base import LossFunction
from verl.workers.engine.worker_utils import (
    BatchPlan,
    actor_update_plan,
    critic_update_plan,
    forward_plan,
    init_process_group,
    prefixed_engine_metrics,
)

logger = logging.getLogger(__name__)

__all__ = ["ActorRolloutRefWorker", "CriticWorker", "TrainingWorker", "TrainingWorkerConfig"]

_ROLES = ("actor", "rollout", "ref", "actor_rollout", "actor_rollout_ref")


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
    model_config: Any
    engine_config: Any
    optimizer_config: Any = None
    checkpoint_config: Any = None
    profiler_config: Any = None


class TrainingWorker(Worker):
    """One engine on every rank: forward/backward over ``DataProto`` batches with a loss function.

    Usable as a Ray worker (the ``@register``-ed methods) and in-process by the role workers below.
    """

    def __init__(self, config: TrainingWorkerConfig, processing_class: Any = None):
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

    def _require_loss_fn(self) -> LossFunction:
        if self.loss_fn is None:
            raise RuntimeError("TrainingWorker has no loss function: call set_loss_fn(loss_fn) before training")
        return self.loss_fn

    def run_mini_batches(self, data: DataProto, plan: BatchPlan) -> dict[str, list[float]]:
        """``plan.epochs`` passes over ``data``, one clipped optimizer step per mini-batch of ``plan`` rows.

        Returns the per-mini-batch metrics (loss terms, ``grad_norm``, ``skipped_steps``) as lists.
        """
        loss_fn = self._require_loss_fn()
        data.meta_info.update(plan.meta_info())
        metrics: dict[str, list[float]] = {}
        with self.engine.train_mode():
            for _, mini_batch in iter_mini_batches(data, plan.mini_batch_size, plan.epochs, plan.shuffle, plan.seed):
                output = self.engine.train_batch(mini_batch, loss_fn)
                output["metrics"]["skipped_steps"] = float(self.engine.last_step_skipped)
                append_to_dict(metrics, output["metrics"])
            self.engine.optimizer_zero_grad()
        return metrics

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def train_mini_batch(self, data: DataProto) -> DataProto:
        """Mini-batch training driven by ``data.meta_info`` (per-rank sizes): ``mini_batch_size``, ``epochs``,
        ``shuffle``, ``seed``, ``micro_batch_size`` or ``use_dynamic_bsz`` + ``max_token_len``, and the forward's
        switches (``temperature``, ``calculate_entropy``). Steps the lr schedule once; metrics in ``meta_info``."""
        plan = BatchPlan.from_meta_info(data.meta_info)
        metrics = self.run_mini_batches(data, plan)
        metrics["lr"] = [self.engine.lr_scheduler_step()]
        return DataProto(meta_info={"metrics": metrics})

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def train_batch(self, data: DataProto) -> DataProto:
        """One optimizer step over the whole (per-rank) batch; metrics in ``meta_info``."""
        with self.engine.train_mode():
            output = self.engine.train_batch(data, self._require_loss_fn())
        return DataProto(meta_info={"metrics": output["metrics"]})

    def infer(self, data: DataProto) -> dict[str, torch.Tensor]:
        """Forward-only outputs ``{name: (B, R)}`` in input row order (``data.meta_info`` as in ``train_mini_batch``)."""
        with self.engine.eval_mode():
            return self.engine.infer_batch(data)["model_output"]

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def infer_batch(self, data: DataProto) -> DataProto:
        return DataProto.from_dict(tensors=self.infer(data))

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def save_checkpoint(
        self, local_path: str, hdfs_path: str | None = None, global_step: int = 0, max_ckpt_to_keep: int | None = None
    ) -> None:
        self.engine.save_checkpoint(local_path, hdfs_path, global_step, max_ckpt_to_keep)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def load_checkpoint(
        self, local_path: str, hdfs_path: str | None = None, del_local_after_load: bool = False
    ) -> None:
        self.engine.load_checkpoint(local_path, hdfs_path, del_local_after_load)


class ActorRolloutRefWorker(Worker):
    """Actor, rollout and reference policy of the engine path (upstream name; legacy method names).

    Args:
        config: ``actor_rollout_ref`` (DictConfig or ``ActorRolloutRefConfig``).
        role: ``actor``, ``rollout``, ``ref``, ``actor_rollout`` or ``actor_rollout_ref``.
    """

    def __init__(self, config: Any, role: str):
        from verl.trainer.config.ppo_trainer import ActorRolloutRefConfig

        super().__init__()
        if role not in _ROLES:
            raise ValueError(f"ActorRolloutRefWorker role={role!r}: use one of {_ROLES}")
        self.config = omega_conf_to_dataclass(config, ActorRolloutRefConfig)
        self.role = role
        self._is_actor = role in ("actor", "actor_rollout", "actor_rollout_ref")
        self._is_rollout = role in ("rollout", "actor_rollout", "actor_rollout_ref")
        self._is_ref = role in ("ref", "actor_rollout_ref")
        init_process_group(self.rank, self.world_size, self._local_rank, timeout_s=self.config.nccl_timeout)
        self.actor: TrainingWorker | None = None
        self.ref: TrainingWorker | None = None
        self.rollout: Any = None

    @property
    def dp_size(self) -> int:
        # Ulysses SP is refused by the engines, so every rank is its own data-parallel rank
        return self.world_size

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def init_model(self) -> None:
        """Build the engines of this role (actor with the PPO loss, forward-only reference) and the rollout."""
        from functools import partial

        from verl.workers.engine.losses import ppo_loss

        cfg = self.config
        if self._is_actor:
            actor = cfg.actor
            worker_config = TrainingWorkerConfig(
                "language_model", cfg.model, actor.fsdp_config, actor.optim, actor.checkpoint
            )
            self.actor = TrainingWorker(worker_config, processing_class=_processing_class(cfg.model))
            self.actor.reset()
            self.actor.set_loss_fn(partial(ppo_loss, actor))
        if self._is_ref:
            self.ref = TrainingWorker(TrainingWorkerConfig("language_model", cfg.model, cfg.ref.fsdp_config))
            self.ref.reset()
        if self._is_rollout:
            self.rollout = self._build_rollout()

    def _build_rollout(self) -> Any:
        from verl.workers.engine.rollout_bridge import build_engine_rollout

        module = self.actor.engine.module if self.actor is not None else None
        return build_engine_rollout(self.config, module=module, dp_rank=self.rank)

    def _require(self, worker: TrainingWorker | None, what: str) -> TrainingWorker:
        if worker is None:
            raise RuntimeError(f"{what} is not available on a worker with role={self.role!r}; call init_model first")
        return worker

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def generate_sequences(self, prompts: DataProto) -> DataProto:
        """Responses for ``prompts`` with the rollout, after streaming the actor's current weights into it."""
        if self.rollout is None:
            raise RuntimeError(
                f"generate_sequences needs role rollout/actor_rollout(_ref), this worker is {self.role!r}"
            )
        engine = self.actor.engine if self.actor is not None else None
        return self.rollout.generate_sequences(prompts, engine)

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def compute_log_prob(self, data: DataProto) -> DataProto:
        """``old_log_probs`` (B, R) and ``entropys`` (B, R, for the ``actor/entropy`` metric) of the responses."""
        actor = self._require(self.actor, "the actor")
        rollout = self.config.rollout
        plan = forward_plan(
            "actor_rollout_ref.rollout.log_prob_micro_batch_size",
            rollout.log_prob_micro_batch_size,
            rollout.log_prob_micro_batch_size_per_gpu,
            rollout.log_prob_use_dynamic_bsz,
            rollout.log_prob_max_token_len_per_gpu * self.config.actor.ulysses_sequence_parallel_size,
            self.dp_size,
        )
        data.meta_info.update(plan.meta_info(), temperature=rollout.temperature, calculate_entropy=True)
        output = actor.infer(data)
        return DataProto.from_dict(
            tensors={"old_log_probs": output["log_probs"], "entropys": output["entropys"]},
            meta_info={"temperature": rollout.temperature},
        )

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def compute_ref_log_prob(self, data: DataProto) -> DataProto:
        """``ref_log_prob`` (B, R) under the frozen reference policy."""
        ref = self._require(self.ref, "the reference policy")
        cfg = self.config.ref
        plan = forward_plan(
            "actor_rollout_ref.ref.log_prob_micro_batch_size",
            cfg.log_prob_micro_batch_size,
            cfg.log_prob_micro_batch_size_per_gpu,
            cfg.log_prob_use_dynamic_bsz,
            cfg.log_prob_max_token_len_per_gpu * cfg.ulysses_sequence_parallel_size,
            self.dp_size,
        )
        data.meta_info.update(plan.meta_info(), temperature=self.config.rollout.temperature, calculate_entropy=False)
        return DataProto.from_dict(tensors={"ref_log_prob": ref.infer(data)["log_probs"]})

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def update_actor(self, data: DataProto) -> DataProto:
        """PPO update (``ppo_epochs`` × mini-batches); ``data.meta_info["temperature"]`` comes from the trainer.

        Metrics (lists, one value per mini-batch) use the legacy names: ``actor/pg_loss``, ``actor/grad_norm``,
        ``actor/lr`` (the rate this update used; the schedule then steps) ...
        """
        actor = self._require(self.actor, "the actor")
        cfg = self.config.actor
        if "temperature" not in data.meta_info:
            raise ValueError("update_actor: data.meta_info['temperature'] is missing (the trainer sets it)")
        lr = actor.engine.lr_scheduler.get_last_lr()[0]
        data.meta_info["calculate_entropy"] = cfg.uses_entropy
        metrics = actor.run_mini_batches(_actor_update_data(data, cfg), actor_update_plan(cfg, self.dp_size))
        actor.engine.lr_scheduler_step()
        metrics = prefixed_engine_metrics(metrics, "actor")
        metrics["actor/lr"] = [lr]
        return DataProto(meta_info={"metrics": metrics})

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def save_checkpoint(
        self, local_path: str, hdfs_path: str | None = None, global_step: int = 0, max_ckpt_to_keep: int | None = None
    ) -> None:
        self._require(self.actor, "the actor").save_checkpoint(local_path, hdfs_path, global_step, max_ckpt_to_keep)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def load_checkpoint(
        self, local_path: str, hdfs_path: str | None = None, del_local_after_load: bool = False
    ) -> None:
        self._require(self.actor, "the actor").load_checkpoint(local_path, hdfs_path, del_local_after_load)


_UPDATE_KEYS = (
    "responses",
    "input_ids",
    "attention_mask",
    "position_ids",
    "response_mask",
    "old_log_probs",
    "advantages",
)


def _actor_update_data(data: DataProto, actor_config: Any) -> DataProto:
    """The columns the PPO loss reads (as ``DataParallelPPOActor.update_policy`` selects them)."""
    keys = list(_UPDATE_KEYS)
    if actor_config.use_kl_loss:
        keys.append("ref_log_prob")
    if "rollout_is_weights" in data.batch.keys():
        keys.append("rollout_is_weights")
    missing = [k for k in keys if k not in data.batch.keys()]
    if missing:
        raise ValueError(f"update_actor: the batch lacks {missing} (has {sorted(data.batch.keys())})")
    non_tensor = ["multi_modal_inputs"] if "multi_modal_inputs" in data.non_tensor_batch else []
    return data.select(batch_keys=keys, non_tensor_batch_keys=non_tensor)


def _processing_class(model_config: Any) -> Any:
    """The tokenizer written next to HF checkpoints, or None when the model directory has none."""
    try:
        return model_config.tokenizer
    except (OSError, ValueError) as err:
        logger.info("no tokenizer at %s (%s): checkpoints will not include one", model_config.path, err)
        return None


class CriticWorker(Worker):
    """Value model of the engine path, with the legacy critic's method names.

    Args:
        config: ``critic`` (DictConfig or ``FSDPCriticConfig``).
    """

    def __init__(self, config: Any):
        from verl.workers.config import FSDPCriticConfig

        super().__init__()
        self.config = omega_conf_to_dataclass(config, FSDPCriticConfig)
        init_process_group(self.rank, self.world_size, self._local_rank)
        self.critic: TrainingWorker | None = None

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def init_model(self) -> None:
        from functools import partial

        from verl.workers.engine.losses import value_loss

        cfg = self.config
        worker_config = TrainingWorkerConfig("value_model", cfg.model, cfg.model.fsdp_config, cfg.optim, cfg.checkpoint)
        self.critic = TrainingWorker(worker_config)
        self.critic.reset()
        self.critic.set_loss_fn(partial(value_loss, cfg))

    def _require_critic(self) -> TrainingWorker:
        if self.critic is None:
            raise RuntimeError("the critic is not built: call init_model first")
        return self.critic

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def compute_values(self, data: DataProto) -> DataProto:
        """``values`` (B, R) of the responses."""
        cfg = self.config
        plan = forward_plan(
            "critic.forward_micro_batch_size",
            cfg.forward_micro_batch_size,
            cfg.forward_micro_batch_size_per_gpu,
            cfg.use_dynamic_bsz,
            cfg.forward_max_token_len_per_gpu * cfg.ulysses_sequence_parallel_size,
            self.world_size,
        )
        data.meta_info.update(plan.meta_info())
        return DataProto.from_dict(tensors={"values": self._require_critic().infer(data)["values"]})

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def update_critic(self, data: DataProto) -> DataProto:
        """Value-function update (``ppo_epochs`` × mini-batches); metrics ``critic/vf_loss``, ``critic/grad_norm``..."""
        critic = self._require_critic()
        keys = ["responses", "input_ids", "attention_mask", "position_ids", "response_mask", "values", "returns"]
        lr = critic.engine.lr_scheduler.get_last_lr()[0]
        metrics = critic.run_mini_batches(
            data.select(batch_keys=keys), critic_update_plan(self.config, self.world_size)
        )
        critic.engine.lr_scheduler_step()
        metrics = prefixed_engine_metrics(metrics, "critic")
        metrics["critic/lr"] = [lr]
        return DataProto(meta_info={"metrics": metrics})

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def save_checkpoint(
        self, local_path: str, hdfs_path: str | None = None, global_step: int = 0, max_ckpt_to_keep: int | None = None
    ) -> None:
        self._require_critic().save_checkpoint(local_path, hdfs_path, global_step, max_ckpt_to_keep)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def load_checkpoint(
        self, local_path: str, hdfs_path: str | None = None, del_local_after_load: bool = False
    ) -> None:
        self._require_critic().load_checkpoint(local_path, hdfs_path, del_local_after_load)
