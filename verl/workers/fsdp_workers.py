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
(``ulysses_sequence_parallel_size`` = sp) the sp ranks of one group share a shard and split its token stream. The maths is
in ``verl.workers.core`` (shared with the engine path); this module wires configs, models, offload and RPC.

Offload (``fsdp_config.param_offload`` / ``optimizer_offload``): parameters and optimizer state live on the host
between phases and are moved to the device around each phase, so every tensor a phase touches — including
``state_dict`` in checkpointing — is on ONE device (field-report item 10).
"""

from __future__ import annotations

import contextlib
import datetime
import logging
import os
from collections.abc import Iterator
from typing import Any

import torch
import torch.distributed as dist

from verl.protocol import DataProto
from verl.single_controller.base import Worker
from verl.single_controller.base.decorator import Dispatch, make_nd_compute_dataproto_dispatch_fn, register
from verl.utils.checkpoint.fsdp_checkpoint_manager import FSDPCheckpointManager
from verl.utils.config import omega_conf_to_dataclass
from verl.utils.debug.performance import memory_metrics, timed
from verl.utils.device import (
    get_device_id,
    get_device_name,
    get_local_device_index,
    get_nccl_backend,
    get_platform,
    get_torch_device,
)
from verl.utils.fsdp_utils import (
    create_device_mesh,
    load_fsdp_model_to_gpu,
    load_fsdp_optimizer,
    offload_fsdp_model_to_cpu,
    offload_fsdp_optimizer,
)
from verl.workers.actor.dp_actor import DataParallelPPOActor
from verl.workers.config.actor import FSDPActorConfig
from verl.workers.config.batch import per_gpu_micro_batch
from verl.workers.config.critic import FSDPCriticConfig
from verl.workers.config.model import HFModelConfig
from verl.workers.config.ref import FSDPRefConfig
from verl.workers.config.rollout import RolloutConfig
from verl.workers.core.fsdp_model import build_fsdp_model
from verl.workers.core.losses import bind_rollout_correction
from verl.workers.core.model_forward import LogProbOptions
from verl.workers.core.parallel_layout import DataSequenceLayout
from verl.workers.core.routing import router_replay_mode
from verl.workers.critic.dp_critic import DataParallelPPOCritic
from verl.workers.rollout.base import generation_seed
from verl.workers.rollout.build import build_rollout

logger = logging.getLogger(__name__)

__all__ = ["ActorRolloutRefWorker", "CriticWorker"]

ROLES = ("actor", "rollout", "ref", "actor_rollout", "actor_rollout_ref")


# ----------------------------------------------------------------------------------------------------------------
# process setup and config normalisation
# ----------------------------------------------------------------------------------------------------------------


def init_distributed(timeout_s: int = 600) -> None:
    """Join the worker group's process group (``get_nccl_backend()``: gloo | nccl | hccl) once per process."""
    if dist.is_initialized():
        return
    if get_device_name() != "cpu":
        get_torch_device().set_device(get_local_device_index(int(os.environ.get("LOCAL_RANK", "0"))))
    dist.init_process_group(
        backend=get_nccl_backend(),
        rank=int(os.environ.get("RANK", "0")),
        world_size=int(os.environ.get("WORLD_SIZE", "1")),
        timeout=datetime.timedelta(seconds=timeout_s),
    )


def _device() -> torch.device:
    name = get_device_name()
    return torch.device("cpu") if name == "cpu" else torch.device(name, get_device_id())


def _set_per_rank_ppo_sizes(config: Any, dp_size: int, key_prefix: str) -> None:
    """Global prompt counts -> responses per rank (``ppo_mini_batch_size``), global micro size -> per GPU."""
    config.ppo_mini_batch_size = config.mini_batch_responses_per_rank(dp_size)
    micro = per_gpu_micro_batch(
        f"{key_prefix}.ppo_micro_batch_size", config.ppo_micro_batch_size, config.ppo_micro_batch_size_per_gpu, dp_size
    )
    config.ppo_micro_batch_size, config.ppo_micro_batch_size_per_gpu = None, micro
    if not config.use_dynamic_bsz and (micro is None or config.ppo_mini_batch_size % micro):
        raise ValueError(
            f"{key_prefix}.ppo_micro_batch_size_per_gpu={micro} must be set and divide the {config.ppo_mini_batch_size} "
            f"responses per GPU per mini-batch ({key_prefix}.ppo_mini_batch_size x rollout.n / {dp_size} ranks)"
        )


def _set_per_rank_log_prob_size(config: Any, dp_size: int, key_prefix: str) -> None:
    config.log_prob_micro_batch_size_per_gpu = per_gpu_micro_batch(
        f"{key_prefix}.log_prob_micro_batch_size",
        config.log_prob_micro_batch_size,
        config.log_prob_micro_batch_size_per_gpu,
        dp_size,
    )
    config.log_prob_micro_batch_size = None


class _Placement:
    """Moves one model's parameters / optimizer state to the device around a phase when they are offloaded."""

    def __init__(self, module: torch.nn.Module, optimizer: Any, param_offload: bool, optimizer_offload: bool):
        self.module, self.optimizer = module, optimizer
        self.param_offload, self.optimizer_offload = param_offload, optimizer_offload

    def offload(self) -> None:
        if self.param_offload:
            offload_fsdp_model_to_cpu(self.module)
        if self.optimizer_offload and self.optimizer is not None:
            offload_fsdp_optimizer(self.optimizer)

    @contextlib.contextmanager
    def on_device(self, optimizer: bool = False) -> Iterator[None]:
        if self.param_offload:
            load_fsdp_model_to_gpu(self.module, _device())
        if optimizer and self.optimizer_offload and self.optimizer is not None:
            load_fsdp_optimizer(self.optimizer, _device())
        try:
            yield
        finally:
            self.offload()


def _as(config: Any, cls: type) -> Any:
    return omega_conf_to_dataclass(config, cls)


# ----------------------------------------------------------------------------------------------------------------
# actor / rollout / reference policy
# ----------------------------------------------------------------------------------------------------------------


class ActorRolloutRefWorker(Worker):
    """Policy worker: any combination of actor (training), rollout (generation) and reference policy.

    Args:
        config: the ``actor_rollout_ref`` config node (DictConfig or dataclass-like with ``model``, ``actor``,
            ``rollout``, ``ref``).
        role: ``actor`` | ``rollout`` | ``ref`` | ``actor_rollout`` | ``actor_rollout_ref``.
    """

    def __init__(self, config: Any, role: str, **kwargs: Any):
        super().__init__()
        if role not in ROLES:
            raise ValueError(f"ActorRolloutRefWorker role={role!r} is not one of {ROLES}")
        self.role = role
        self._is_actor = role in ("actor", "actor_rollout", "actor_rollout_ref")
        self._is_rollout = role in ("rollout", "actor_rollout", "actor_rollout_ref")
        self._is_ref = role in ("ref", "actor_rollout_ref")
        init_distributed(int(config.nccl_timeout) if "nccl_timeout" in config else 600)
        self.config = config
        self.model_config: HFModelConfig = _as(config.model, HFModelConfig)
        self.actor_config: FSDPActorConfig = _as(config.actor, FSDPActorConfig)
        self.rollout_config: RolloutConfig = _as(config.rollout, RolloutConfig)
        self.ref_config: FSDPRefConfig | None = _as(config.ref, FSDPRefConfig) if self._is_ref else None
        sp_key = "actor_rollout_ref.actor.ulysses_sequence_parallel_size"
        self.layout = DataSequenceLayout.from_world(self.actor_config.ulysses_sequence_parallel_size, sp_key)
        self.layout.build_groups()
        self.dp_size = self.layout.dp_size
        for mesh_name in ("actor", "rollout", "ref"):
            self._register_dispatch_collect_info(mesh_name, self.layout.dp_rank, self.layout.is_collect)
        if self._is_actor:
            _set_per_rank_ppo_sizes(self.actor_config, self.dp_size, "actor_rollout_ref.actor")
        _set_per_rank_log_prob_size(self.rollout_config, self.dp_size, "actor_rollout_ref.rollout")
        if self._is_ref:
            _set_per_rank_log_prob_size(self.ref_config, self.dp_size, "actor_rollout_ref.ref")
        self.actor = self.rollout = self.ref_policy = self.checkpoint_manager = None

    # ------------------------------------------------------------------------------------------------ building
    def _log_prob_options(self, config: Any) -> LogProbOptions:
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
        self.actor_module_fsdp, self.actor_optimizer, self.actor_lr_scheduler = (
            built.module, built.optimizer, built.lr_scheduler,
        )  # fmt: skip
        self._actor_placement = _Placement(
            built.module, built.optimizer, fsdp_config.param_offload, fsdp_config.optimizer_offload
        )
        self.actor = DataParallelPPOActor(
            self.actor_config, built.module, built.optimizer, self._log_prob_options(self.actor_config),
            **self.layout.groups(),
        )  # fmt: skip

    def _build_rollout(self) -> None:
        self.rollout, self.rollout_sharding_manager = build_rollout(
            self.actor_module_fsdp,
            self.rollout_config,
            self.model_config,
            param_offload=self.actor_config.fsdp_config.param_offload,
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
        """Responses for this rank's prompts (HF rollout on the actor module), sampled from the device generator
        seeded with :func:`generation_seed` for this step and dp rank (restored afterwards)."""
        self._require(self._is_rollout, "generate_sequences", "rollout")
        prompts = prompts.to(_device())
        tokenizer = self.model_config.tokenizer
        prompts.meta_info.setdefault("eos_token_id", tokenizer.eos_token_id)
        prompts.meta_info.setdefault("pad_token_id", tokenizer.pad_token_id)
        seed = generation_seed(self.actor_config.fsdp_config.seed, prompts.meta_info, self.layout.dp_rank)
        seconds: dict[str, float] = {}
        with contextlib.ExitStack() as stack:
            with timed(seconds, "update_weights"):  # entering syncs the trained weights into the rollout
                stack.enter_context(self.rollout_sharding_manager)
            stack.enter_context(get_platform().fork_rng(seed))
            prompts = self.rollout_sharding_manager.preprocess_data(prompts)
            output = self.rollout.generate_sequences(prompts)
            output = self.rollout_sharding_manager.postprocess_data(output)
        output.meta_info["metrics"] = {"timing_s/update_weights": seconds["update_weights"]}
        return output.to("cpu")

    def _log_prob_meta(self, data: DataProto, config: Any) -> None:
        data.meta_info["micro_batch_size"] = config.log_prob_micro_batch_size_per_gpu
        data.meta_info["max_token_len"] = config.log_prob_max_token_len_per_gpu * self.layout.sp_size
        data.meta_info["use_dynamic_bsz"] = config.log_prob_use_dynamic_bsz
        data.meta_info["temperature"] = self.rollout_config.temperature

    @register(dispatch_mode=make_nd_compute_dataproto_dispatch_fn(mesh_name="actor"))
    def compute_log_prob(self, data: DataProto) -> DataProto:
        """``old_log_probs`` and ``entropys`` (the trainer logs ``actor/entropy`` from them) under the current
        policy, with the rollout's log-prob micro-batching and temperature."""
        self._require(self._is_actor, "compute_log_prob", "actor")
        data = data.to(_device())
        self._log_prob_meta(data, self.rollout_config)
        with self._actor_placement.on_device():
            out = self.actor.compute_log_prob(data, calculate_entropy=True)
        tensors = {"old_log_probs": out["log_probs"], "entropys": out["entropys"]}
        # router replay R2: the routing of this forward, replayed in the update (R3's is the rollout's, already in
        # the batch: the forward replayed it)
        if "routed_experts" in out and router_replay_mode(self.actor_config) == "R2":
            tensors["routed_experts"] = out["routed_experts"]
        return DataProto.from_dict(tensors=tensors, meta_info={"temperature": self.rollout_config.temperature}).to(
            "cpu"
        )

    @register(dispatch_mode=make_nd_compute_dataproto_dispatch_fn(mesh_name="ref"))
    def compute_ref_log_prob(self, data: DataProto) -> DataProto:
        """``ref_log_prob`` under the frozen reference policy (no entropy)."""
        self._require(self._is_ref, "compute_ref_log_prob", "ref")
        data = data.to(_device())
        self._log_prob_meta(data, self.ref_config)
        out = self.ref_policy.compute_log_prob(data, calculate_entropy=False)
        return DataProto.from_dict(tensors={"ref_log_prob": out["log_probs"]}).to("cpu")

    @register(dispatch_mode=make_nd_compute_dataproto_dispatch_fn(mesh_name="actor"))
    def update_actor(self, data: DataProto) -> DataProto:
        """One PPO update on this rank's shard; returns ``meta_info["metrics"]`` (incl. ``actor/lr``)."""
        self._require(self._is_actor, "update_actor", "actor")
        bind_rollout_correction(self.actor_config, data.meta_info)
        data = data.to(_device())
        with self._actor_placement.on_device(optimizer=True):
            metrics = self.actor.update_policy(data)
            metrics["actor/lr"] = self.actor_lr_scheduler.get_last_lr()[0]
            self.actor_lr_scheduler.step()
        metrics.update(memory_metrics())  # after the update: the step's peak includes optimizer state and grads
        return DataProto(meta_info={"metrics": metrics})

    # ------------------------------------------------------------------------------------------------ checkpoints
    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def save_checkpoint(
        self, local_path: str, hdfs_path: str | None = None, global_step: int = 0, max_ckpt_to_keep: int | None = None
    ) -> None:
        """Save the actor's model/optimizer/scheduler/RNG (and HF export with ``hf_model``) atomically."""
        self._require(self._is_actor, "save_checkpoint", "actor")
        with self._actor_placement.on_device(optimizer=True):
            self.checkpoint_manager.save_checkpoint(local_path, hdfs_path, global_step, max_ckpt_to_keep)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def load_checkpoint(self, local_path: str, hdfs_path: str | None = None, del_local_after_load: bool = False):
        self._require(self._is_actor, "load_checkpoint", "actor")
        with self._actor_placement.on_device(optimizer=True):
            self.checkpoint_manager.load_checkpoint(local_path, hdfs_path, del_local_after_load)

    def _require(self, condition: bool, method: str, needed: str) -> None:
        if not condition:
            raise RuntimeError(f"{method} needs a worker with the {needed} role; this worker's role is {self.role!r}")


# ----------------------------------------------------------------------------------------------------------------
# critic
# ----------------------------------------------------------------------------------------------------------------


class CriticWorker(Worker):
    """Value-model worker. ``config``: the ``critic`` config node (``FSDPCriticConfig``)."""

    def __init__(self, config: Any, **kwargs: Any):
        super().__init__()
        init_distributed()
        self.config: FSDPCriticConfig = _as(config, FSDPCriticConfig)
        sp_key = "critic.ulysses_sequence_parallel_size"
        self.layout = DataSequenceLayout.from_world(self.config.ulysses_sequence_parallel_size, sp_key)
        self.layout.build_groups()
        self._register_dispatch_collect_info("critic", self.layout.dp_rank, self.layout.is_collect)
        if "hf_model" in self.config.checkpoint.save_contents:
            raise ValueError(
                "critic.checkpoint.save_contents contains 'hf_model', but the value model (a causal LM with a one-unit "
                "head) has no HF export; remove 'hf_model' (the sharded checkpoint resumes the critic)"
            )
        _set_per_rank_ppo_sizes(self.config, self.layout.dp_size, "critic")
        self.config.forward_micro_batch_size_per_gpu = per_gpu_micro_batch(
            "critic.forward_micro_batch_size",
            self.config.forward_micro_batch_size,
            self.config.forward_micro_batch_size_per_gpu,
            self.layout.dp_size,
        )
        self.config.forward_micro_batch_size = None

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
        self.critic_module, self.critic_optimizer, self.critic_lr_scheduler = (
            built.module, built.optimizer, built.lr_scheduler,
        )  # fmt: skip
        self._placement = _Placement(
            built.module, built.optimizer, fsdp_config.param_offload, fsdp_config.optimizer_offload
        )
        self.critic = DataParallelPPOCritic(self.config, built.module, built.optimizer, **self.layout.groups())
        self.checkpoint_manager = FSDPCheckpointManager(
            built.module, built.optimizer, built.lr_scheduler, checkpoint_config=self.config.checkpoint
        )
        self._placement.offload()

    @register(dispatch_mode=make_nd_compute_dataproto_dispatch_fn(mesh_name="critic"))
    def compute_values(self, data: DataProto) -> DataProto:
        """``values`` (B, R) of this rank's shard."""
        data = data.to(_device())
        data.meta_info["micro_batch_size"] = self.config.forward_micro_batch_size_per_gpu
        data.meta_info["max_token_len"] = self.config.forward_max_token_len_per_gpu * self.layout.sp_size
        data.meta_info["use_dynamic_bsz"] = self.config.use_dynamic_bsz
        with self._placement.on_device():
            values = self.critic.compute_values(data)
        return DataProto.from_dict(tensors={"values": values}).to("cpu")

    @register(dispatch_mode=make_nd_compute_dataproto_dispatch_fn(mesh_name="critic"))
    def update_critic(self, data: DataProto) -> DataProto:
        """One value-function update; returns ``meta_info["metrics"]`` (incl. ``critic/lr``)."""
        data = data.to(_device())
        with self._placement.on_device(optimizer=True):
            metrics = self.critic.update_critic(data)
            metrics["critic/lr"] = self.critic_lr_scheduler.get_last_lr()[0]
            self.critic_lr_scheduler.step()
        return DataProto(meta_info={"metrics": metrics})

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def save_checkpoint(
        self, local_path: str, hdfs_path: str | None = None, global_step: int = 0, max_ckpt_to_keep: int | None = None
    ) -> None:
        with self._placement.on_device(optimizer=True):
            self.checkpoint_manager.save_checkpoint(local_path, hdfs_path, global_step, max_ckpt_to_keep)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def load_checkpoint(self, local_path: str, hdfs_path: str | None = None, del_local_after_load: bool = False):
        with self._placement.on_device(optimizer=True):
            self.checkpoint_manager.load_checkpoint(local_path, hdfs_path, del_local_after_load)
