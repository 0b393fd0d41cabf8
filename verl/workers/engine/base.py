"""``BaseEngine`` and ``EngineRegistry``: the training-backend interface of the engine worker path (upstream names).

An engine owns one model and its optimizer on one data-parallel rank: it builds them (``initialize``), moves them
between the CPU and the device (``to``, ``train_mode``/``eval_mode``), runs forward/backward over a batch with a
loss function (``forward_backward_batch``), steps the optimizer and lr schedule, saves/loads checkpoints and streams
its full weights to the rollout (``get_per_tensor_param``). The engine workers (``verl/workers/engine_workers.py``)
are written only against this class, so FSDP1/FSDP2 and VeOmni are interchangeable behind
``EngineRegistry.new(model_type, backend, ...)``.

Data contract of this distribution: ``forward_backward_batch`` takes a padded ``DataProto`` (the format both worker
paths share) with per-call switches in ``meta_info`` (``core.batch_plan``); upstream passes a jagged ``TensorDict``,
the packing happens inside the shared core instead. A loss function is ``loss_fn(model_output, micro_batch, info)
-> (loss, metrics)`` with ``info`` the mini-batch's global counts (``core.update_loop.LossFn``; upstream passes the
dp group instead), see ``verl.workers.engine.losses``.
"""

from __future__ import annotations

import contextlib
import importlib
import logging
from abc import ABC, abstractmethod
from collections.abc import Callable, Generator, Iterable, Iterator
from typing import Any

import torch

from verl.protocol import DataProto
from verl.workers.core.optimizer_step import StepResult
from verl.workers.core.update_loop import LossFn, optimizer_step

logger = logging.getLogger(__name__)

__all__ = ["BaseEngine", "BaseEngineCtx", "EngineRegistry", "LossFunction"]

LossFunction = LossFn
"""``(model_output, micro_batch, global_batch_info) -> (loss, metrics)`` (see the module docstring)."""


class BaseEngine(ABC):
    """One model + optimizer on one data-parallel rank (upstream ``verl.workers.engine.BaseEngine``)."""

    last_step_skipped: bool = False
    """Whether the last :meth:`optimizer_step` skipped a non-finite gradient (engines that can skip set it)."""

    # ----------------------------------------------------------------------------------------------- lifecycle
    @abstractmethod
    def initialize(self) -> None:
        """Build the model, wrap it for data parallelism, build the optimizer, lr schedule and checkpoint manager."""

    @property
    @abstractmethod
    def is_param_offload_enabled(self) -> bool:
        """Parameters live on the CPU between phases (``engine_config.param_offload``)."""

    @property
    @abstractmethod
    def is_optimizer_offload_enabled(self) -> bool:
        """Optimizer state lives on the CPU between updates (``engine_config.optimizer_offload``)."""

    def train_mode(self, **kwargs: Any) -> contextlib.AbstractContextManager:
        """Context of a training phase: the model (and optimizer) on the device in ``train()`` mode, offloaded
        again on exit when offload is enabled."""
        return BaseEngineCtx(self, "train", **kwargs)

    def eval_mode(self, **kwargs: Any) -> contextlib.AbstractContextManager:
        """Context of an inference phase: the model on the device in ``eval()`` mode, offloaded again on exit."""
        return BaseEngineCtx(self, "eval", **kwargs)

    @abstractmethod
    def enter_mode(self, mode: str) -> None:
        """Bring what phase ``mode`` (``"train"``/``"eval"``) needs to the device and set the module's mode."""

    @abstractmethod
    def exit_mode(self, mode: str) -> None:
        """Offload again what :meth:`enter_mode` loaded (when offload is enabled)."""

    @abstractmethod
    def to(self, device: str, model: bool = True, optimizer: bool = True, grad: bool = True) -> None:
        """Move the model parameters / optimizer state / gradients to ``device`` (``"cpu"`` or the device name)."""

    # ----------------------------------------------------------------------------------------------- compute
    @abstractmethod
    def forward_backward_batch(
        self, data: DataProto, loss_function: LossFunction | None = None, forward_only: bool = False
    ) -> dict[str, Any]:
        """Forward (and, unless ``forward_only``, backward) every micro-batch of ``data``.

        Returns ``{"model_output": {key: (B, R) tensor in the input row order}, "metrics": {name: value}}``;
        ``model_output`` is filled only for ``forward_only`` (training outputs are not kept).
        """

    @abstractmethod
    def optimizer_zero_grad(self) -> None:
        """Drop the accumulated gradients."""

    @abstractmethod
    def optimizer_step(self) -> float:
        """Clip the gradients (``optim.clip_grad``) and step; returns the pre-clip grad norm (non-finite: skipped)."""

    @abstractmethod
    def lr_scheduler_step(self) -> float:
        """Advance the lr schedule one step; returns the new learning rate."""

    def train_batch(self, data: DataProto, loss_function: LossFunction) -> dict[str, Any]:
        """One optimizer step over ``data`` (the core's ``optimizer_step``): zero_grad → forward/backward → step.

        ``metrics`` gain ``grad_norm`` and ``skipped_steps``; the caller steps the lr schedule.
        """
        output: dict[str, Any] = {}

        def accumulate() -> dict[str, float]:
            output.update(self.forward_backward_batch(data, loss_function, forward_only=False))
            return output["metrics"]

        step = lambda: StepResult(self.optimizer_step(), not self.last_step_skipped)  # noqa: E731
        output["metrics"] = optimizer_step(accumulate, self.optimizer_zero_grad, step)
        return output

    def infer_batch(self, data: DataProto, loss_function: LossFunction | None = None) -> dict[str, Any]:
        """Forward-only pass over ``data`` without gradients."""
        with torch.no_grad():
            return self.forward_backward_batch(data, loss_function, forward_only=True)

    # ----------------------------------------------------------------------------------------------- weights
    @abstractmethod
    def get_per_tensor_param(self, **kwargs: Any) -> tuple[Generator[tuple[str, torch.Tensor], None, None], Any]:
        """``(generator of (name, full tensor), peft_config | None)`` for the rollout weight sync. Collective: every
        rank must exhaust the generator."""

    @abstractmethod
    def save_checkpoint(
        self, local_path: str, hdfs_path: str | None = None, global_step: int = 0, max_ckpt_to_keep: int | None = None
    ) -> None:
        """Save model/optimizer/lr-schedule/RNG state under ``local_path`` (collective)."""

    @abstractmethod
    def load_checkpoint(self, local_path: str, hdfs_path: str | None = None, del_local_after_load: bool = True) -> None:
        """Load what :meth:`save_checkpoint` wrote (collective)."""

    # ----------------------------------------------------------------------------------------------- topology
    @abstractmethod
    def get_data_parallel_size(self) -> int: ...

    @abstractmethod
    def get_data_parallel_rank(self) -> int: ...

    @abstractmethod
    def get_data_parallel_group(self) -> Any: ...

    def is_mp_src_rank_with_outputs(self) -> bool:
        """Whether this rank's outputs are collected (True for pure data parallelism; with model parallelism only
        the first rank of each model-parallel group)."""
        return True

    def disable_adapter(self) -> contextlib.AbstractContextManager:
        """Context in which a LoRA adapter is off (the reference policy of a LoRA actor). No-op without LoRA."""
        return contextlib.nullcontext()


class BaseEngineCtx:
    """``train_mode``/``eval_mode`` context: load to the device on enter, offload on exit as configured.

    Args:
        engine: the engine.
        mode: ``"train"`` or ``"eval"``.
        disable_auto_offload: keep everything on the device on exit (e.g. between two calls of one step).
    """

    def __init__(self, engine: BaseEngine, mode: str, disable_auto_offload: bool = False):
        if mode not in ("train", "eval"):
            raise ValueError(f"engine mode must be 'train' or 'eval', got {mode!r}")
        self.engine = engine
        self.mode = mode
        self.disable_auto_offload = disable_auto_offload

    def __enter__(self) -> BaseEngine:
        self.engine.enter_mode(self.mode)
        return self.engine

    def __exit__(self, exc_type, exc, tb) -> None:
        if not self.disable_auto_offload:
            self.engine.exit_mode(self.mode)


# --------------------------------------------------------------------------------------------------------------
# registry
# --------------------------------------------------------------------------------------------------------------

# Modules that register the built-in engines; imported on the first lookup (importing this module has no side
# effects). An optional backend whose dependency is missing still registers: its error comes at initialize().
_BUILTIN_ENGINE_MODULES = ("verl.workers.engine.fsdp", "verl.workers.engine.veomni")


def _as_tuple(value: str | Iterable[str]) -> tuple[str, ...]:
    return (value,) if isinstance(value, str) else tuple(value)


class EngineRegistry:
    """``(model_type, backend, device) -> engine class`` (upstream name and methods).

    ``model_type`` is ``"language_model"`` (LM head, log-probs) or ``"value_model"`` (value head); ``backend`` is
    the strategy key (``fsdp``, ``fsdp2``, ``veomni``); ``device`` the platform name (``cpu``, ``cuda``, ``npu``).
    Unlike upstream, the FSDP engines are registered for ``cpu`` too, so the CPU runs the same classes.
    """

    _engines: dict[tuple[str, str, str], type] = {}
    _builtins_loaded = False

    @classmethod
    def register(
        cls,
        model_type: str,
        backend: str | Iterable[str],
        device: str | Iterable[str] = "cuda",
        vendor: str | None = None,
    ) -> Callable[[type], type]:
        """Class decorator registering an engine for every (backend, device) pair given. ``vendor`` is accepted
        for upstream compatibility; a device name already identifies the platform here."""

        def decorator(engine_cls: type) -> type:
            for name in _as_tuple(backend):
                for dev in _as_tuple(device):
                    cls._engines[(model_type, name, dev)] = engine_cls
            return engine_cls

        return decorator

    @classmethod
    def _load_builtins(cls) -> None:
        if cls._builtins_loaded:
            return
        cls._builtins_loaded = True
        for module in _BUILTIN_ENGINE_MODULES:
            importlib.import_module(module)

    @classmethod
    def get_engine_cls(cls, model_type: str, backend: str, device: str | None = None) -> type:
        """The engine class for ``model_type``/``backend`` on ``device`` (default: the current platform)."""
        from verl.utils.device import get_device_name

        cls._load_builtins()
        device = device or get_device_name()
        key = (model_type, backend, device)
        if key not in cls._engines:
            known = sorted(f"{m}/{b}/{d}" for m, b, d in cls._engines)
            raise ValueError(
                f"no training engine for model_type={model_type!r}, strategy={backend!r} on device {device!r}; "
                f"registered (model_type/strategy/device): {known}. Set actor_rollout_ref.actor.strategy "
                "(critic.strategy) to one of the registered strategies"
            )
        return cls._engines[key]

    @classmethod
    def new(cls, model_type: str, backend: str, *args: Any, **kwargs: Any) -> BaseEngine:
        """Instantiate the registered engine: ``get_engine_cls(model_type, backend)(*args, **kwargs)``."""
        return cls.get_engine_cls(model_type, backend)(*args, **kwargs)

    @classmethod
    def registered(cls) -> Iterator[tuple[str, str, str]]:
        """Every registered ``(model_type, backend, device)`` key."""
        cls._load_builtins()
        return iter(sorted(cls._engines))
