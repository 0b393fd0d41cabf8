"""``VeOmniEngine``: the FSDP engine with the model built and sharded by VeOmni (``strategy=veomni``).

Only model construction differs from :class:`~verl.workers.engine.fsdp.FSDPEngine`: VeOmni initialises its parallel
state (FSDP2 × Ulysses × expert parallel mesh), builds its patched model class with the configured kernels and
shards it with FSDP2. With ``ulysses_parallel_size > 1`` VeOmni's own sequence parallelism runs inside its model;
the engine feeds each rank its slice of the packed stream through VeOmni's collator and gathers the hidden states
with VeOmni's ``gather_outputs`` (``sequence_parallel.py``). Everything after that — the packed forward, log-probs, losses, micro-batching, clipping,
checkpoints, weight sync — is the FSDP engine's, i.e. the shared core, so results do not depend on the backend.

``veomni`` is optional and imported only in :meth:`VeOmniEngine.initialize`; when it is missing (or broken, e.g.
built for another transformers release) the error says how to install it. Its Qwen3.5 forward cannot run on a CPU
(docs/veomni.md), so the CPU tests use a stand-in module (``verl.utils.testing.fake_veomni``).
"""

from __future__ import annotations

import contextlib
import importlib
import logging
import os
from types import ModuleType
from typing import Any

import torch.distributed as dist
import torch.nn as nn

from verl.models.transformers.packed_forward import VARLEN_PATCHED_ATTR
from verl.utils.device import get_device_name
from verl.utils.model import freeze_vision_tower
from verl.workers.core.fsdp_model import FSDPModel
from verl.workers.core.optimizer_step import build_lr_scheduler, build_optimizer
from verl.workers.engine.base import EngineRegistry
from verl.workers.engine.fsdp.transformer_impl import FSDPEngine, FSDPEngineWithLMHead
from verl.workers.engine.veomni.config import (
    foundation_model_kwargs,
    ops_implementation_kwargs,
    parallel_state_kwargs,
    parallelize_kwargs,
    parameter_names,
)
from verl.workers.engine.veomni.sequence_parallel import veomni_sequence_parallel

logger = logging.getLogger(__name__)

__all__ = ["VeOmniEngine", "VeOmniEngineWithLMHead", "import_veomni"]

INSTALL_HINT = "pip install verl[veomni]"
_DEVICES = ("cuda", "npu")  # VeOmni's Qwen3.5 Gated DeltaNet has Triton kernels only (docs/veomni.md)


def import_veomni(submodule: str) -> ModuleType:
    """``import veomni.<submodule>``, or an ImportError that says how to install VeOmni."""
    try:
        return importlib.import_module(f"veomni.{submodule}")
    except ImportError as err:
        raise ImportError(
            f"actor_rollout_ref.actor.strategy=veomni needs the optional VeOmni package, which failed to import "
            f"(veomni.{submodule}: {err}). Install it with `{INSTALL_HINT}` on a CUDA or Ascend machine, or use "
            "strategy=fsdp2"
        ) from err


def _mark_varlen_mixers(model: nn.Module) -> int:
    """VeOmni's Qwen3.5 Gated DeltaNet derives sequence boundaries from the packed position ids itself; mark its
    mixers so the packed forward does not refuse them as unpatched (``packed_forward._check_packed``)."""
    count = 0
    for module in model.modules():
        if type(module).__name__.endswith("GatedDeltaNet"):
            setattr(module, VARLEN_PATCHED_ATTR, True)
            count += 1
    return count


class VeOmniEngine(FSDPEngine):
    """FSDP engine whose model is built by ``veomni`` (config: :class:`~verl.workers.engine.veomni.config.VeOmniEngineConfig`)."""

    @staticmethod
    def _check_strategy(strategy: str) -> str:
        if strategy != "veomni":
            raise ValueError(f"the VeOmni engine needs strategy=veomni, got {strategy!r}")
        return strategy

    def initialize(self) -> None:
        """VeOmni's parallel state first: its mesh (``dp_replicate × dp_shard × ulysses``, ulysses innermost) gives
        the dp and Ulysses groups the core and the dispatch use; then the FSDP engine's lifecycle."""
        if not dist.is_initialized():
            raise RuntimeError("the VeOmni engine needs torch.distributed initialised (the engine worker does it)")
        parallel_state = import_veomni("distributed.parallel_state")
        init = parallel_state.init_parallel_state
        cfg = self.engine_config
        init(**parallel_state_kwargs(cfg, dist.get_world_size(), get_device_name(), parameter_names(init)))
        if cfg.ulysses_parallel_size > 1:
            self._adopt_sequence_parallel(parallel_state.get_parallel_state())
        super().initialize()

    def _adopt_sequence_parallel(self, state: Any) -> None:
        """Use VeOmni's own dp/ulysses groups and its SP collator and gather (``sequence_parallel.py``)."""
        layout = self.layout
        if (state.sp_size, state.sp_rank, state.dp_rank) != (layout.sp_size, layout.sp_rank, layout.dp_rank):
            raise RuntimeError(
                f"VeOmni's mesh puts rank {layout.rank} at (sp size, sp rank, dp rank) = "
                f"{(state.sp_size, state.sp_rank, state.dp_rank)}, the worker's dispatch at "
                f"{(layout.sp_size, layout.sp_rank, layout.dp_rank)}; install a veomni release whose ulysses mesh "
                f"dimension is innermost ({INSTALL_HINT})"
            )
        layout.dp_group, layout.ulysses_group = state.dp_group, state.sp_group  # build_groups() is then a no-op
        self._sp_group = state.sp_group
        self._sp_collator = import_veomni("data.data_collator").SequenceParallelCollator(seq_classification=True)
        self._sp_gather = import_veomni("distributed.sequence_parallel").gather_outputs

    def _core_ulysses_group(self) -> Any:
        """None: VeOmni's model runs the Ulysses all-to-all itself, the core must not split the stream again."""
        return None

    def _model_sequence_parallel(self) -> contextlib.AbstractContextManager:
        if self.engine_config.ulysses_parallel_size == 1:
            return contextlib.nullcontext()
        return veomni_sequence_parallel(
            self._require_module(), collator=self._sp_collator, gather_outputs=self._sp_gather, group=self._sp_group
        )

    def _build_model(self) -> FSDPModel:
        """VeOmni's sharded model with the core's optimizer and lr schedule (as every engine)."""
        module = self._build_sharded_module()
        built = FSDPModel(module=module, hf_config=getattr(module, "config", None))
        if not self.engine_config.forward_only:
            built.optimizer = build_optimizer(module.parameters(), self.optimizer_config)
            built.lr_scheduler = build_lr_scheduler(built.optimizer, self.optimizer_config)
        return built

    def _build_sharded_module(self) -> nn.Module:
        cfg, path = self.engine_config, os.path.expanduser(self.model_config.path)
        arguments = import_veomni("arguments")
        ops = arguments.OpsImplementationConfig(**ops_implementation_kwargs(cfg))
        build = import_veomni("models.auto").build_foundation_model
        model = build(
            **foundation_model_kwargs(cfg, path, path, ops_implementation=ops, accepted=parameter_names(build))
        )
        logger.info("VeOmni model %s: %d GDN mixers marked varlen", type(model).__name__, _mark_varlen_mixers(model))
        if self.freeze_vision_tower:  # before sharding, as in build_fsdp_model (VeOmni shards with FSDP2)
            freeze_vision_tower(model, f"{self.role}.freeze_vision_tower")
        parallelize = import_veomni("distributed.torch_parallelize").build_parallelize_model
        kwargs = parallelize_kwargs(
            cfg,
            weights_path=path,
            model_basic_modules=getattr(model, "_no_split_modules", None),
            enable_gradient_checkpointing=self.model_config.enable_gradient_checkpointing,
            accepted=parameter_names(parallelize),
            mixed_precision_cls=getattr(arguments, "MixedPrecisionConfig", None),
        )
        return parallelize(model, **kwargs)


@EngineRegistry.register(model_type="language_model", backend="veomni", device=list(_DEVICES))
class VeOmniEngineWithLMHead(VeOmniEngine, FSDPEngineWithLMHead):
    """VeOmni-built policy/reference model; log-probs through the shared core. (As in upstream v0.7.1 there is no
    VeOmni value-head engine: a critic uses ``critic.strategy=fsdp2``.)"""
