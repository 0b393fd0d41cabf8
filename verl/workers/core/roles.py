"""What the role workers of both paths do alike: parse the role, take the typed config, start, generate, and the
RPC methods themselves (:class:`ActorRolloutRefRPC`, :class:`CriticRPC`, :class:`CheckpointRPC`).

The legacy (``fsdp_workers``) and engine (``engine_workers``) ``ActorRolloutRefWorker``/``CriticWorker`` inherit
their ``@register``-ed methods from here and supply only how a phase runs (``_log_probs``/``_train``/``_values``:
``DataParallelPPOActor`` under its placement, or a ``TrainingWorker``), so a role means the same on both paths.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import torch

from verl.protocol import DataProto
from verl.single_controller.base.decorator import Dispatch, make_nd_compute_dataproto_dispatch_fn, register
from verl.utils.config import omega_conf_to_dataclass
from verl.utils.debug.performance import memory_metrics, timed
from verl.utils.device import get_platform
from verl.workers.config.critic import FSDPCriticConfig
from verl.workers.core.batch_plan import critic_forward_plan, critic_update_plan, log_prob_plan
from verl.workers.core.losses import bind_rollout_correction
from verl.workers.core.parallel_layout import DataSequenceLayout
from verl.workers.core.process_group import init_process_group
from verl.workers.core.routing import ROUTED_EXPERTS, router_replay_mode
from verl.workers.rollout.base import generation_seed

if TYPE_CHECKING:
    from verl.trainer.config.ppo_trainer import ActorRolloutRefConfig

__all__ = [
    "ActorRolloutRefRPC",
    "CheckpointRPC",
    "CriticRPC",
    "WorkerRoles",
    "actor_rollout_ref_config",
    "critic_config",
    "generate_sequences",
]

ROLES = ("actor", "rollout", "ref", "actor_rollout", "actor_rollout_ref")


@dataclass(frozen=True)
class WorkerRoles:
    """Which of actor (training), rollout (generation) and reference policy one ``ActorRolloutRefWorker`` plays."""

    name: str
    is_actor: bool
    is_rollout: bool
    is_ref: bool

    @classmethod
    def parse(cls, role: str) -> WorkerRoles:
        if role not in ROLES:
            raise ValueError(f"ActorRolloutRefWorker role={role!r} is not one of {ROLES}")
        parts = role.split("_")
        return cls(role, "actor" in parts, "rollout" in parts, "ref" in parts)

    def require(self, condition: bool, method: str, needed: str) -> None:
        if not condition:
            raise RuntimeError(f"{method} needs a worker with the {needed} role; this worker's role is {self.name!r}")


class CheckpointRPC:
    """``save_checkpoint`` / ``load_checkpoint`` of a worker (both paths): :meth:`_checkpointer` names the engine
    that saves (``BaseEngine.save_checkpoint``, with the state on the device around it as its placement says)."""

    def _checkpointer(self, method: str) -> Any:
        raise NotImplementedError

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def save_checkpoint(
        self, local_path: str, hdfs_path: str | None = None, global_step: int = 0, max_ckpt_to_keep: int | None = None
    ) -> None:
        """Model/optimizer/lr-schedule/RNG (+ HF export with ``hf_model``) of the trained model, atomically."""
        self._checkpointer("save_checkpoint").save_checkpoint(local_path, hdfs_path, global_step, max_ckpt_to_keep)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def load_checkpoint(self, local_path: str, hdfs_path: str | None = None, del_local_after_load: bool = False):
        self._checkpointer("load_checkpoint").load_checkpoint(local_path, hdfs_path, del_local_after_load)


def actor_rollout_ref_config(config: Any) -> ActorRolloutRefConfig:
    """The typed ``actor_rollout_ref`` config: a dataclass passes through, a DictConfig node is converted once."""
    from verl.trainer.config.ppo_trainer import ActorRolloutRefConfig

    return omega_conf_to_dataclass(config, ActorRolloutRefConfig)


def critic_config(config: Any) -> FSDPCriticConfig:
    """The typed ``critic`` config (converted once from a DictConfig node), refusing an HF export it cannot do."""
    config = omega_conf_to_dataclass(config, FSDPCriticConfig)
    if "hf_model" in config.checkpoint.save_contents:
        raise ValueError(
            "critic.checkpoint.save_contents contains 'hf_model', but the value model (a causal LM with a one-unit "
            "head) has no HF export; remove 'hf_model' (the sharded checkpoint resumes the critic)"
        )
    return config


def generate_sequences(
    rollout: Any, sharding_manager: Any, prompts: DataProto, tokenizer: Any, base_seed: int, dp_rank: int
) -> DataProto:
    """Responses for one rank's prompts (on the device), sampled from the device generator seeded with
    :func:`generation_seed` for this step and dp rank (restored afterwards); entering the sharding manager syncs
    the trained weights into the rollout (``timing_s/update_weights``). Returns the output on the CPU."""
    prompts = prompts.to(get_platform().device())
    prompts.meta_info.setdefault("eos_token_id", tokenizer.eos_token_id)
    prompts.meta_info.setdefault("pad_token_id", tokenizer.pad_token_id)
    seed = generation_seed(base_seed, prompts.meta_info, dp_rank)
    seconds: dict[str, float] = {}
    with contextlib.ExitStack() as stack:
        with timed(seconds, "update_weights"):
            stack.enter_context(sharding_manager)
        stack.enter_context(get_platform().fork_rng(seed))
        prompts = sharding_manager.preprocess_data(prompts)
        output = sharding_manager.postprocess_data(rollout.generate_sequences(prompts))
    output.meta_info["metrics"] = {"timing_s/update_weights": seconds["update_weights"]}
    return output.to("cpu")


def _on_device(data: DataProto) -> DataProto:
    return data.to(get_platform().device())


class ActorRolloutRefRPC(CheckpointRPC):
    """The RPC methods of both paths' ``ActorRolloutRefWorker`` (a ``Worker``). One training step calls them as::

        generate_sequences    rollout: HF generates with the policy module, vLLM gets the weights streamed first
        compute_log_prob      old log-probs + entropy (the metric)                               mesh "actor"
        compute_ref_log_prob  reference policy                                                   mesh "ref"
        update_actor          PPO update (after the critic's compute_values / update_critic)     mesh "actor"
        save/load_checkpoint  every rank

    Both paths build their models alike (:meth:`init_model`: the engine path's ``TrainingWorker``); a path supplies
    what it runs the phases on (:meth:`_use_policy`, :meth:`_use_ref`) and how (:meth:`_log_probs`, :meth:`_train`).
    """

    def _start(self, config: Any, role: str) -> None:
        """Role, typed config, process group and the dispatch info of the three meshes (dp rank; SP rank 0
        collects); ``self.layout``'s groups are not built yet."""
        self.roles = WorkerRoles.parse(role)
        self.role = role
        self._is_actor, self._is_rollout, self._is_ref = self.roles.is_actor, self.roles.is_rollout, self.roles.is_ref
        self.config = actor_rollout_ref_config(config)
        init_process_group(self.rank, self.world_size, self._local_rank, timeout_s=self.config.nccl_timeout)
        sp_key = "actor_rollout_ref.actor.ulysses_sequence_parallel_size"
        self.layout = DataSequenceLayout.from_world(self.config.actor.ulysses_sp_size, sp_key)
        self.dp_size = self.layout.dp_size
        for mesh_name in ("actor", "rollout", "ref"):
            self._register_dispatch_collect_info(mesh_name, self.layout.dp_rank, self.layout.is_collect)
        self.rollout = self.rollout_sharding_manager = self._policy_engine = None

    def _log_probs(self, data: DataProto, which: str) -> dict[str, torch.Tensor]:
        """The forward-only pass of ``which`` (``"actor"``: with ``entropys`` and the routing; ``"ref"``) over
        ``data``, on the device with its per-rank plan and temperature in ``meta_info``."""
        raise NotImplementedError

    def _train(self, data: DataProto) -> dict[str, Any]:
        """One PPO update over ``data`` (on the device); metrics incl. ``actor/lr``, the schedule then stepped."""
        raise NotImplementedError

    def _use_policy(self, policy: Any) -> None:
        """Take the built policy (a ``TrainingWorker``: its engine holds the sharded model) for the phases."""
        raise NotImplementedError

    def _use_ref(self, ref: Any) -> None:
        """Take the built, frozen reference policy (a ``TrainingWorker``)."""
        raise NotImplementedError

    def _engine_worker(self, config: Any, role: str, training: bool) -> Any:
        """The ``TrainingWorker`` of ``actor_rollout_ref.<role>`` (its engine: model, optimizer, lr schedule, offload,
        checkpoints), built; forward-only (no optimizer) unless ``training``, whatever the engine's
        ``forward_only`` says."""
        from verl.workers.engine_workers import TrainingWorker, TrainingWorkerConfig

        engine_config = config.engine_config if training else replace(config.engine_config, forward_only=True)
        optim, checkpoint = (config.optim, config.checkpoint) if training else (None, None)
        worker_config = TrainingWorkerConfig("language_model", self.config.model, engine_config, optim, checkpoint)
        worker = TrainingWorker(
            worker_config,
            processing_class=self.config.model.tokenizer,
            role=f"actor_rollout_ref.{role}",
            freeze_vision_tower=training and config.freeze_vision_tower,
        )
        worker.reset()
        return worker

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def init_model(self) -> None:
        """Build this role's models: the policy (trainable for the actor, forward-only for a rollout-only worker),
        the rollout on the policy's module, the frozen reference policy; each offloaded as configured."""
        from verl.workers.rollout.build import build_rollout

        torch.manual_seed(self.config.actor.engine_config.seed)
        if self._is_actor or self._is_rollout:
            policy = self._engine_worker(self.config.actor, "actor", training=self._is_actor)
            self._policy_engine = policy.engine
            self._use_policy(policy)
        if self._is_rollout:
            self.rollout, self.rollout_sharding_manager = build_rollout(
                policy.engine.module,
                self.config.rollout,
                self.config.model,
                param_offload=policy.engine.is_param_offload_enabled,
                world_size=self.world_size,
                rank=self.rank,
                seed=self.config.actor.engine_config.seed,
            )
        if self._is_ref:
            self._use_ref(self._engine_worker(self.config.ref, "ref", training=False))

    def _checkpointer(self, method: str) -> Any:
        self.roles.require(self._is_actor, method, "actor")
        return self._policy_engine

    @register(dispatch_mode=make_nd_compute_dataproto_dispatch_fn(mesh_name="rollout"))
    def generate_sequences(self, prompts: DataProto) -> DataProto:
        """Responses for this rank's prompts (:func:`generate_sequences`)."""
        self.roles.require(self._is_rollout, "generate_sequences", "rollout")
        seed = self.config.actor.engine_config.seed
        tokenizer = self.config.model.tokenizer
        return generate_sequences(
            self.rollout, self.rollout_sharding_manager, prompts, tokenizer, seed, self.layout.dp_rank
        )

    def _log_prob_pass(self, data: DataProto, which: str, config: Any) -> dict[str, torch.Tensor]:
        key = f"actor_rollout_ref.{'rollout' if which == 'actor' else 'ref'}.log_prob_micro_batch_size"
        plan = log_prob_plan(config, key, self.layout.sp_size, self.dp_size)
        data = _on_device(data)
        data.meta_info.update(plan.meta_info(), temperature=self.config.rollout.temperature)
        return self._log_probs(data, which)

    @register(dispatch_mode=make_nd_compute_dataproto_dispatch_fn(mesh_name="actor"))
    def compute_log_prob(self, data: DataProto) -> DataProto:
        """``old_log_probs`` and ``entropys`` (the trainer logs ``actor/entropy`` from them) under the current
        policy, with the rollout's log-prob micro-batching and temperature."""
        self.roles.require(self._is_actor, "compute_log_prob", "actor")
        out = self._log_prob_pass(data, "actor", self.config.rollout)
        tensors = {"old_log_probs": out["log_probs"], "entropys": out["entropys"]}
        # router replay R2: the routing of this forward, replayed in the update (R3's is the rollout's, already in
        # the batch: the forward replayed it)
        if ROUTED_EXPERTS in out and router_replay_mode(self.config.actor) == "R2":
            tensors[ROUTED_EXPERTS] = out[ROUTED_EXPERTS]
        meta_info = {"temperature": self.config.rollout.temperature}
        return DataProto.from_dict(tensors=tensors, meta_info=meta_info).to("cpu")

    @register(dispatch_mode=make_nd_compute_dataproto_dispatch_fn(mesh_name="ref"))
    def compute_ref_log_prob(self, data: DataProto) -> DataProto:
        """``ref_log_prob`` under the frozen reference policy (no entropy)."""
        self.roles.require(self._is_ref, "compute_ref_log_prob", "ref")
        out = self._log_prob_pass(data, "ref", self.config.ref)
        return DataProto.from_dict(tensors={"ref_log_prob": out["log_probs"]}).to("cpu")

    @register(dispatch_mode=make_nd_compute_dataproto_dispatch_fn(mesh_name="actor"))
    def update_actor(self, data: DataProto) -> DataProto:
        """PPO update (``ppo_epochs`` × mini-batches) on this rank's shard; ``data.meta_info["temperature"]`` comes
        from the trainer. Metrics (one value per mini-batch): ``actor/pg_loss``, ``actor/grad_norm``,
        ``actor/skipped_steps``, ``actor/lr`` (the rate this update used; the schedule then steps) ..."""
        self.roles.require(self._is_actor, "update_actor", "actor")
        bind_rollout_correction(self.config.actor, data.meta_info)
        metrics = self._train(_on_device(data))
        metrics.update(memory_metrics())  # after the update: the step's peak includes optimizer state and grads
        return DataProto(meta_info={"metrics": metrics})


class CriticRPC(CheckpointRPC):
    """The RPC methods of both paths' ``CriticWorker``: start-up, ``init_model``, ``compute_values`` and
    ``update_critic``; a path supplies what it runs the phases on (:meth:`_use_critic`) and how (:meth:`_values`,
    :meth:`_train`)."""

    def _start(self, config: Any) -> None:
        """Typed config (:func:`critic_config`), process group, dispatch info and the per-rank plans."""
        self.config = critic_config(config)
        init_process_group(self.rank, self.world_size, self._local_rank)
        sp_key = "critic.ulysses_sequence_parallel_size"
        self.layout = DataSequenceLayout.from_world(self.config.ulysses_sequence_parallel_size, sp_key)
        self.dp_size = self.layout.dp_size
        self._register_dispatch_collect_info("critic", self.layout.dp_rank, self.layout.is_collect)
        self.update_plan = critic_update_plan(self.config, self.dp_size)
        self.forward_plan = critic_forward_plan(self.config, self.dp_size)
        self._critic_engine = None

    def _use_critic(self, critic: Any) -> None:
        """Take the built value model (a ``TrainingWorker``: its engine holds the sharded model) for the phases."""
        raise NotImplementedError

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def init_model(self) -> None:
        """Build the value model (the engine path's ``TrainingWorker`` with a value head), offloaded as configured."""
        from verl.workers.engine_workers import TrainingWorker, TrainingWorkerConfig

        cfg = self.config
        torch.manual_seed(cfg.model.fsdp_config.seed)
        worker_config = TrainingWorkerConfig("value_model", cfg.model, cfg.model.fsdp_config, cfg.optim, cfg.checkpoint)
        critic = TrainingWorker(worker_config, role="critic")
        critic.reset()
        self._critic_engine = critic.engine
        self._use_critic(critic)

    def _checkpointer(self, method: str) -> Any:
        if self._critic_engine is None:
            raise RuntimeError(f"{method}: the critic is not built: call init_model first")
        return self._critic_engine

    def _values(self, data: DataProto) -> torch.Tensor:
        """Values ``(B, R)`` of ``data`` (on the device, ``self.forward_plan`` in ``meta_info``)."""
        raise NotImplementedError

    def _train(self, data: DataProto) -> dict[str, Any]:
        """One value-function update over ``data`` (on the device); metrics incl. ``critic/lr``."""
        raise NotImplementedError

    @register(dispatch_mode=make_nd_compute_dataproto_dispatch_fn(mesh_name="critic"))
    def compute_values(self, data: DataProto) -> DataProto:
        """``values`` (B, R) of this rank's shard."""
        data = _on_device(data)
        data.meta_info.update(self.forward_plan.meta_info())
        return DataProto.from_dict(tensors={"values": self._values(data)}).to("cpu")

    @register(dispatch_mode=make_nd_compute_dataproto_dispatch_fn(mesh_name="critic"))
    def update_critic(self, data: DataProto) -> DataProto:
        """Value-function update (``ppo_epochs`` × mini-batches); ``critic/vf_loss``, ``critic/grad_norm``,
        ``critic/lr`` ... (one value per mini-batch)."""
        return DataProto(meta_info={"metrics": self._train(_on_device(data))})
