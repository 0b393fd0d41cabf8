"""``FSDPEngine`` (FSDP1 / FSDP2) over the shared worker core, with an LM head or a value head (upstream names).

The engine adds no maths and no loop of its own (those are ``verl.workers.core``'s, see its package docstring); it
owns the lifecycle both worker paths build through: the sharded model, optimizer and lr schedule, the offload rule
(``Placement``: ``train_mode``/``eval_mode`` and checkpoints load what it offloads and offload it again),
checkpoints and the full-weight stream for the rollout.
"""

from __future__ import annotations

import contextlib
import functools
import logging
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
import torch.nn as nn

from verl.models.transformers.router_replay import install_router_replay
from verl.protocol import DataProto
from verl.utils.checkpoint.fsdp_checkpoint_manager import FSDPCheckpointManager
from verl.utils.device import get_device_name, get_platform
from verl.utils.fsdp_utils import (
    check_strategy,
    create_device_mesh,
)
from verl.workers.config.critic import FSDPCriticModelCfg
from verl.workers.config.engine import FSDPEngineConfig, VeOmniEngineConfig
from verl.workers.config.model import HFModelConfig
from verl.workers.config.optimizer import OptimizerConfig
from verl.workers.core.batch_plan import BatchPlan, ForwardSwitches
from verl.workers.core.fsdp_model import FSDPModel, build_fsdp_model
from verl.workers.core.micro_forward import policy_forward, value_forward
from verl.workers.core.model_forward import LogProbOptions
from verl.workers.core.optimizer_step import clip_grad_and_step
from verl.workers.core.parallel_layout import DataSequenceLayout
from verl.workers.core.placement import Placement
from verl.workers.core.update_loop import forward_backward
from verl.workers.engine.base import BaseEngine, EngineRegistry, LossFunction

if TYPE_CHECKING:
    from verl.trainer.config.config import CheckpointConfig

logger = logging.getLogger(__name__)

__all__ = ["FSDPEngine", "FSDPEngineWithLMHead", "FSDPEngineWithValueHead"]

_DEVICES = ("cpu", "cuda", "npu")


class FSDPEngine(BaseEngine):
    """A HF model sharded with FSDP1 (``strategy=fsdp``) or FSDP2 (``fsdp2``), trained through the shared core.

    Args:
        model_config: ``HFModelConfig`` (actor/ref) or the critic's ``model`` block.
        engine_config: ``FSDPEngineConfig`` (``*.fsdp_config``); its ``strategy`` is already linked to the role's
            ``strategy`` key by the config (one key selects FSDP1/FSDP2, field-report item 9).
        optimizer_config: ``FSDPOptimizerConfig``; None for a forward-only engine (reference policy).
        checkpoint_config: ``CheckpointConfig`` (``save_contents``/``load_contents``).
        processing_class: tokenizer/processor written next to HF checkpoints.
        role: config-key prefix of the role, for error messages.
        freeze_vision_tower: the role's ``freeze_vision_tower`` (see ``build_fsdp_model``); ignored when forward-only.
    """

    model_type = ""  # "language_model" | "value_model", set by the concrete classes

    def __init__(
        self,
        model_config: HFModelConfig | FSDPCriticModelCfg,
        engine_config: FSDPEngineConfig | VeOmniEngineConfig,
        optimizer_config: OptimizerConfig | None = None,
        checkpoint_config: CheckpointConfig | None = None,
        *,
        processing_class: Any = None,
        role: str = "actor_rollout_ref.actor",
        freeze_vision_tower: bool = False,
    ):
        self.strategy = self._check_strategy(engine_config.strategy)
        if model_config.lora_rank > 0:
            raise ValueError(f"{role}: model.lora_rank > 0 (LoRA) is not supported by the FSDP engine; set lora_rank=0")
        if not engine_config.forward_only and optimizer_config is None:
            raise ValueError(f"{role}: a trainable engine needs the role's `optim` config")
        self.model_config = model_config
        self.engine_config = engine_config
        self.optimizer_config = optimizer_config
        self.checkpoint_config = checkpoint_config
        self.processing_class = processing_class
        self.role = role
        self.freeze_vision_tower = freeze_vision_tower and not engine_config.forward_only
        self.layout = DataSequenceLayout.from_world(
            engine_config.ulysses_sequence_parallel_size, f"{role}.ulysses_sequence_parallel_size"
        )
        self.module: nn.Module | None = None
        self.hf_config: Any = None
        self.optimizer: torch.optim.Optimizer | None = None
        self.lr_scheduler: Any = None
        self.checkpoint_manager: FSDPCheckpointManager | None = None
        self.last_step_skipped = False
        self.placement = Placement.from_config(engine_config, forward_only=engine_config.forward_only)

    # ------------------------------------------------------------------------------------------------ lifecycle
    def initialize(self) -> None:
        """Build the sharded model with its optimizer and lr schedule (the core's ``build_fsdp_model``, as the legacy
        worker does), the Ulysses groups and the checkpoint manager; then offload as configured."""
        self.layout.build_groups()
        built = self._build_model()
        self.module, self.hf_config = built.module, built.hf_config
        self.optimizer, self.lr_scheduler = built.optimizer, built.lr_scheduler
        self.checkpoint_manager = FSDPCheckpointManager(
            model=self.module,
            optimizer=self.optimizer,
            lr_scheduler=self.lr_scheduler,
            processing_class=self.processing_class,
            checkpoint_config=self.checkpoint_config,
        )
        self.placement.bind(self.module, self.optimizer).offload()

    @staticmethod
    def _check_strategy(strategy: str) -> str:
        return check_strategy(strategy, "fsdp_config.strategy")

    def _build_model(self) -> FSDPModel:
        forward_only = self.engine_config.forward_only
        return build_fsdp_model(
            self.model_config,
            self.engine_config,
            strategy=self.strategy,
            mesh=create_device_mesh(dist.get_world_size(), self.engine_config.fsdp_size),
            optim_config=None if forward_only else self.optimizer_config,
            forward_only=forward_only,
            value_head=self.model_type == "value_model",
            role=self.role,
            freeze_vision_tower=self.freeze_vision_tower,
        )

    @property
    def is_param_offload_enabled(self) -> bool:
        return self.placement.param_offload

    @property
    def is_optimizer_offload_enabled(self) -> bool:
        return self.placement.optimizer_offload

    def _require_module(self) -> nn.Module:
        if self.module is None:
            raise RuntimeError("the engine is not initialised: call initialize() (the worker's init_model) first")
        return self.module

    def enter_mode(self, mode: str) -> None:
        """Bring what the phase needs to the device and set train/eval mode (see ``BaseEngineCtx``)."""
        module = self._require_module()
        self.placement.load(optimizer=mode == "train")
        module.train(mode == "train")

    def exit_mode(self, mode: str) -> None:
        """Offload again what :meth:`enter_mode` loaded."""
        self.placement.offload(optimizer=mode == "train")

    def to(self, device: str, model: bool = True, optimizer: bool = True, grad: bool = True) -> None:
        """Move parameters (with their gradients: ``grad`` is implied by ``model``) and/or optimizer state."""
        if device not in _DEVICES:
            raise ValueError(f"engine.to(device={device!r}): use 'cpu' or the device name ({get_device_name()!r})")
        self._require_module()
        self.placement.to(device, model=model, optimizer=optimizer)

    # ------------------------------------------------------------------------------------------------ compute
    def forward_step(self, micro_batch: DataProto, switches: ForwardSwitches) -> dict[str, torch.Tensor]:
        """The core's forward of one micro-batch: ``{name: (b, R) tensor}``."""
        raise NotImplementedError

    def forward_backward_batch(
        self, data: DataProto, loss_function: LossFunction | None = None, forward_only: bool = False
    ) -> dict[str, Any]:
        """Forward (and backward) every micro-batch of ``data``: the core's ``forward_backward``.

        ``data.meta_info``: ``micro_batch_size`` or ``use_dynamic_bsz`` + ``max_token_len`` (per rank), plus what
        :meth:`forward_step` reads (``temperature``, ``calculate_entropy``, ``router_replay``). Loss terms are
        normalised by the global counts of the whole ``data`` (one mini-batch), so the summed gradient is exact for
        any split.
        """
        self._require_module()
        switches = ForwardSwitches.from_meta_info(data.meta_info)
        model_output, metrics = forward_backward(
            data,
            BatchPlan.from_meta_info(data.meta_info),
            lambda micro_batch: self.forward_step(micro_batch, switches),
            loss_function,
            backward=not forward_only,
            dp_group=self.get_data_parallel_group(),
        )
        return {"model_output": model_output, "metrics": metrics}

    def optimizer_zero_grad(self) -> None:
        self._require_optimizer().zero_grad(set_to_none=True)

    def optimizer_step(self) -> float:
        """Clip to ``optim.clip_grad`` and step (skipped, with a warning, when the norm is not finite)."""
        step = clip_grad_and_step(
            self._require_module(),
            self._require_optimizer(),
            self.optimizer_config.clip_grad,
            config_key="optim.clip_grad",
        )
        self.last_step_skipped = not step.stepped
        return step.grad_norm

    def lr_scheduler_step(self) -> float:
        self._require_optimizer()
        self.lr_scheduler.step()
        return self.lr_scheduler.get_last_lr()[0]

    def _require_optimizer(self) -> torch.optim.Optimizer:
        if self.optimizer is None:
            raise RuntimeError("this engine is forward-only (no optimizer): it cannot be trained")
        return self.optimizer

    # ------------------------------------------------------------------------------------------------ weights
    def get_per_tensor_param(self, **kwargs: Any) -> tuple[Iterator[tuple[str, torch.Tensor]], Any]:
        """Full (unsharded) weights one tensor at a time, on the device, for the rollout weight sync.

        The stream is ``verl.workers.sharding_manager.vllm_weight_sync.iter_full_tensors``, the one the legacy
        worker's sharding manager uses: each shard (offloaded or not) is gathered on its own, so at most one full
        tensor is alive beyond the shards. Collective: every rank exhausts the generator. ``kwargs``: ``dtype``
        (cast floating tensors before the gather, e.g. the rollout dtype). Returns ``(stream, None)``: no LoRA
        config.
        """
        from verl.workers.sharding_manager.vllm_weight_sync import iter_full_tensors

        stream = iter_full_tensors(self._require_module(), dtype=kwargs.get("dtype"), device=get_platform().device())
        return stream, None

    def save_checkpoint(
        self, local_path: str, hdfs_path: str | None = None, global_step: int = 0, max_ckpt_to_keep: int | None = None
    ) -> None:
        self._require_module()
        with self.placement.on_device(optimizer=True):
            self.checkpoint_manager.save_checkpoint(local_path, hdfs_path, global_step, max_ckpt_to_keep)

    def load_checkpoint(self, local_path: str, hdfs_path: str | None = None, del_local_after_load: bool = True) -> None:
        self._require_module()
        with self.placement.on_device(optimizer=True):
            self.checkpoint_manager.load_checkpoint(local_path, hdfs_path, del_local_after_load)

    # ------------------------------------------------------------------------------------------------ topology
    def get_data_parallel_size(self) -> int:
        return self.layout.dp_size

    def get_data_parallel_rank(self) -> int:
        return self.layout.dp_rank

    def get_data_parallel_group(self) -> Any:
        """The dp group of the core's global counts and dynamic batching (None = the world, when SP is 1)."""
        return self.layout.dp_group

    def _core_ulysses_group(self) -> Any:
        """The Ulysses group the core's packed forward splits the stream over (this engine's own SP)."""
        return self.layout.ulysses_group

    def _model_sequence_parallel(self) -> contextlib.AbstractContextManager:
        """Scope of one core forward; a backend whose model runs sequence parallelism itself (VeOmni) wraps the
        core's whole-stream call here and returns None from :meth:`_core_ulysses_group`."""
        return contextlib.nullcontext()

    def is_mp_src_rank_with_outputs(self) -> bool:
        """Only SP rank 0 of each Ulysses group returns outputs (its peers hold the same rows)."""
        return self.layout.is_collect


@EngineRegistry.register(model_type="language_model", backend=["fsdp", "fsdp2"], device=list(_DEVICES))
class FSDPEngineWithLMHead(FSDPEngine):
    """Policy/reference engine: response log-probs (and entropy on request) through the core's LM-head path."""

    model_type = "language_model"

    _router: Any = None
    """The model's ``RouterReplay``, installed by the first forward that records or replays the routing."""

    @functools.cached_property
    def log_prob_options(self) -> LogProbOptions:
        """How the forward runs: the model block's padding/fused flags and the engine's ``entropy_*`` keys."""
        model = self.model_config
        return LogProbOptions.from_config(self.engine_config, model.use_remove_padding, model.use_fused_kernels)

    def forward_step(self, micro_batch: DataProto, switches: ForwardSwitches) -> dict[str, torch.Tensor]:
        """``{"log_probs": (b, R)}`` (+ ``"entropys"`` with ``calculate_entropy``); needs the ``temperature``."""
        mode = switches.router_replay
        with self._model_sequence_parallel():
            return policy_forward(
                self.module,
                micro_batch,
                temperature=switches.require_temperature("forward_step"),
                calculate_entropy=bool(switches.calculate_entropy),
                options=self.log_prob_options,
                ulysses_group=self._core_ulysses_group(),
                router=None if mode is None else self._replay_router(),
                routing_mode=mode,
                routing_sp_group=self.layout.ulysses_group,
            )

    def forward_backward_batch(
        self, data: DataProto, loss_function: LossFunction | None = None, forward_only: bool = False
    ) -> dict[str, Any]:
        """The base pass; router replay (kept on through each backward) is switched off afterwards, so the next
        forward of this module (the rollout's generation in the hybrid engine) routes natively."""
        try:
            return super().forward_backward_batch(data, loss_function, forward_only)
        finally:
            if self._router is not None:
                self._router.stop()

    def _replay_router(self) -> Any:
        if self._router is None:
            self._router = install_router_replay(self._require_module())
        return self._router


@EngineRegistry.register(model_type="value_model", backend=["fsdp", "fsdp2"], device=list(_DEVICES))
class FSDPEngineWithValueHead(FSDPEngine):
    """Critic engine: per-response-token values ``(b, R)`` through the core's value forward."""

    model_type = "value_model"

    def forward_step(self, micro_batch: DataProto, switches: ForwardSwitches) -> dict[str, torch.Tensor]:
        values = value_forward(
            self.module,
            micro_batch,
            use_remove_padding=self.model_config.use_remove_padding,
            ulysses_group=self.layout.ulysses_group,
        )
        return {"values": values}
