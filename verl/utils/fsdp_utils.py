"""FSDP1 / FSDP2 adapter: every difference between the two lives here, one function per difference.

docs/design.md "Two worker paths, one core": callers pick the implementation with the single config key
``actor.strategy`` (``critic.strategy``) through :func:`get_fsdp_adapter` and never branch on the
strategy themselves (field-report item 9). The differences are:

=====================  ==========================================  =========================================
difference             FSDP1 (``"fsdp"``)                          FSDP2 (``"fsdp2"``)
=====================  ==========================================  =========================================
wrap                   ``FullyShardedDataParallel`` + auto-wrap    ``fully_shard`` per layer, then the root
mixed precision        ``MixedPrecision``                          ``MixedPrecisionPolicy``
grad-sync control      ``module.no_sync()``                        ``set_requires_gradient_sync(False)``
grad clipping          ``module.clip_grad_norm_``                  ``clip_grad_norm_`` over DTensors
full state dict        ``FULL_STATE_DICT`` context (rank 0)        ``get_model_state_dict(full_state_dict)``
param offload          move every flat parameter's storage         ``module.to(device)``
=====================  ==========================================  =========================================

CPU specifics (docs/cpu_notes.md "FSDP on the CPU"): FSDP1 needs ``device_id=torch.device("cpu")``,
``sync_module_states=False`` and ``FullStateDictConfig(offload_to_cpu=False)``; FSDP2's
``CPUOffloadPolicy`` must not pin memory. Both are decided here from the device name, nowhere else.

The wrap policy (field-report item 6; which modules become units, the same for both strategies) lives in
``verl.utils.fsdp_wrap_policy`` and is re-exported here under its upstream names. :meth:`FSDPAdapter.describe`
reads back what a wrapper actually does (mesh, dtypes, offload, resharding, prefetch) for logs and tests. The
helpers that call torch's private FSDP runtime (root unshard, FSDP1 flat-parameter moves) are in
``verl.utils.fsdp_internals``.
"""

from __future__ import annotations

import contextlib
from abc import ABC, abstractmethod
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import CPUOffloadPolicy, FSDPModule, MixedPrecisionPolicy, fully_shard  # noqa: F401

from verl.upstream_gaps import missing_name_getattr
from verl.utils.device import get_device_name
from verl.utils.fsdp_internals import (
    fsdp1_root_unsharded,
    fsdp2_grad_sync,
    fsdp2_root_unsharded,
    move_fsdp1_flat_params,
)
from verl.utils.fsdp_wrap_policy import (  # noqa: F401  (upstream import path of the wrap-policy helpers)
    _get_optional,
    get_fsdp_wrap_policy,
    get_module_class_from_name,
    layer_class_names,
    resolve_wrap_classes,
    select_fsdp2_wrap_targets,
)

SUPPORTED_STRATEGIES = ("fsdp", "fsdp2")

_DTYPES = {
    "fp32": torch.float32,
    "float32": torch.float32,
    "bf16": torch.bfloat16,
    "bfloat16": torch.bfloat16,
    "fp16": torch.float16,
    "float16": torch.float16,
}


# --------------------------------------------------------------------------------------------------------------
# strategy and small helpers
# --------------------------------------------------------------------------------------------------------------


def check_strategy(strategy: str, config_key: str = "actor_rollout_ref.actor.strategy") -> str:
    """Return ``strategy`` if it is an FSDP strategy, else raise a ValueError naming ``config_key``."""
    if strategy not in SUPPORTED_STRATEGIES:
        raise ValueError(
            f"{config_key}={strategy!r} is not an FSDP strategy; use one of {SUPPORTED_STRATEGIES} "
            "(fsdp = FSDP1 FullyShardedDataParallel, fsdp2 = fully_shard, the CPU default)"
        )
    return strategy


def to_torch_dtype(dtype: str | torch.dtype) -> torch.dtype:
    """``"bf16" | "bfloat16" | torch.bfloat16 | ...`` -> ``torch.dtype``."""
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype not in _DTYPES:
        raise ValueError(f"unknown dtype {dtype!r}; valid: {sorted(_DTYPES)}")
    return _DTYPES[dtype]


def fsdp_version(model: nn.Module) -> int:
    """1 for an FSDP1 ``FullyShardedDataParallel``, 2 for an FSDP2 ``FSDPModule``, 0 otherwise (upstream name)."""
    from torch.distributed.fsdp import FullyShardedDataParallel

    if isinstance(model, FullyShardedDataParallel):
        return 1
    if isinstance(model, FSDPModule):
        return 2
    return 0


def create_device_mesh(world_size: int, fsdp_size: int) -> DeviceMesh:
    """1-D ``("fsdp",)`` mesh, or 2-D ``("ddp", "fsdp")`` (HSDP) when ``0 < fsdp_size < world_size``."""
    device = get_device_name()
    if fsdp_size <= 0 or fsdp_size >= world_size:
        return init_device_mesh(device, mesh_shape=(world_size,), mesh_dim_names=("fsdp",))
    if world_size % fsdp_size:
        raise ValueError(f"fsdp_config.fsdp_size={fsdp_size} must divide the world size {world_size}")
    return init_device_mesh(device, mesh_shape=(world_size // fsdp_size, fsdp_size), mesh_dim_names=("ddp", "fsdp"))


# --------------------------------------------------------------------------------------------------------------
# mixed precision
# --------------------------------------------------------------------------------------------------------------


def mixed_precision_dtypes(
    mixed_precision: Mapping | None, default_param_dtype: str = "bf16"
) -> dict[str, torch.dtype]:
    """``{"param_dtype", "reduce_dtype", "buffer_dtype"}``; upstream defaults are bf16 params, fp32 reduce/buffers."""
    # `fsdp_config.mixed_precision` is a free-form dict upstream (any subset of the three keys)
    mp = mixed_precision or {}
    defaults = {"param_dtype": default_param_dtype, "reduce_dtype": "fp32", "buffer_dtype": "fp32"}
    dtypes = {}
    for key, default in defaults.items():
        value = _get_optional(mp, key, default)
        try:
            dtypes[key] = to_torch_dtype(value)
        except ValueError:
            source = f"fsdp_config.mixed_precision.{key}" if key in mp else "fsdp_config.dtype"
            raise ValueError(f"{source}={value!r} is not a dtype; use one of {sorted(_DTYPES)}") from None
    return dtypes


# --------------------------------------------------------------------------------------------------------------
# what a wrapped module actually does (read back from the wrapper, for logs and tests)
# --------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class FSDPLayout:
    """How a wrapped model is sharded, read back from the FSDP wrapper (not from the config that asked for it).

    ``replicas`` x ``shard_size`` = ranks: a parameter is split over ``shard_size`` ranks and that group is
    replicated ``replicas`` times (HSDP; ``shard_size=1`` is pure replication). ``storage_dtype``: dtype of the
    sharded (master) parameters, i.e. ``fsdp_config.model_dtype``; ``param_dtype`` / ``reduce_dtype``: compute
    and gradient-reduction dtypes of the mixed-precision policy. ``num_units``: FSDP units (layers + root).
    """

    strategy: str
    replicas: int
    shard_size: int
    num_units: int
    storage_dtype: torch.dtype
    param_dtype: torch.dtype
    reduce_dtype: torch.dtype
    cpu_offload: bool
    reshard_after_forward: bool
    forward_prefetch: bool


# --------------------------------------------------------------------------------------------------------------
# the adapter
# --------------------------------------------------------------------------------------------------------------


class FSDPAdapter(ABC):
    """One method per FSDP1/FSDP2 difference. Get one with :func:`get_fsdp_adapter`."""

    strategy: str

    @abstractmethod
    def mixed_precision(self, dtypes: dict[str, torch.dtype]) -> Any:
        """The strategy's mixed-precision object from :func:`mixed_precision_dtypes`."""

    @abstractmethod
    def wrap(
        self,
        module: nn.Module,
        *,
        mesh: DeviceMesh,
        dtypes: dict[str, torch.dtype],
        wrap_policy: Mapping | None,
        offload_params: bool = False,
        reshard_after_forward: bool = True,
        forward_prefetch: bool = False,
        use_orig_params: bool = False,
    ) -> nn.Module:
        """Shard ``module`` over ``mesh``; ``offload_params`` keeps parameters on the CPU between uses."""

    @abstractmethod
    def describe(self, module: nn.Module) -> FSDPLayout:
        """What the wrapper of ``module`` does (mesh, dtypes, offload, resharding, prefetch)."""

    @abstractmethod
    def check_options(self, fsdp_config: Any, key_prefix: str) -> None:
        """Raise a ValueError naming the key when ``fsdp_config`` asks for what this strategy cannot do."""

    @abstractmethod
    def grad_sync(self, module: nn.Module, enabled: bool) -> contextlib.AbstractContextManager:
        """Context in which backward does (``enabled``) or does not reduce gradients across ranks."""

    @abstractmethod
    def clip_grad_norm(self, module: nn.Module, max_norm: float) -> torch.Tensor:
        """Clip gradients in place to total L2 norm ``max_norm``; return the pre-clip total norm (a plain
        0-dim tensor, identical on every rank)."""

    @abstractmethod
    def full_state_dict(self, module: nn.Module) -> dict[str, torch.Tensor]:
        """Unsharded state dict with plain CPU tensors on rank 0 (``{}`` on the other ranks). Collective."""

    @abstractmethod
    def load_full_state_dict(self, module: nn.Module, state_dict: Mapping[str, torch.Tensor]) -> None:
        """Load an unsharded state dict that every rank holds into the sharded ``module``. Collective."""

    @abstractmethod
    def inference_params(self, module: nn.Module) -> contextlib.AbstractContextManager:
        """Context in which the wrapped HF model's own methods (``generate``) can run without the wrapper's
        forward: both gather the root unit's parameters (nested units gather theirs in their own forward)."""

    @abstractmethod
    def offload_params(self, module: nn.Module) -> None:
        """Move the sharded parameters (and their gradients) to the CPU."""

    @abstractmethod
    def load_params(self, module: nn.Module, device: torch.device | str) -> None:
        """Move the sharded parameters (and their gradients) back to ``device``."""

    @abstractmethod
    def reshard(self, module: nn.Module) -> None:
        """Free the gathered parameters a forward without backward left behind (the root unit, and every unit with
        ``reshard_after_forward=False``), so the module holds its shards again and ``module.parameters()`` are the
        sharded parameters (what an optimizer must be built on)."""


def _fsdp1_sharding(mesh: DeviceMesh, reshard_after_forward: bool) -> tuple[Any, DeviceMesh]:
    """FSDP1 sharding strategy (and the mesh to pass) for a 1-D ``("fsdp",)`` or HSDP ``("ddp", "fsdp")`` mesh.

    HSDP with shard groups of one rank (``fsdp_size=1``) is pure replication. FSDP1's ``HYBRID_SHARD`` would
    silently fall back to ``NO_SHARD`` *within the one-rank shard group* and never reduce gradients across the
    replicas (every rank trains its own copy); ``NO_SHARD`` over the replica dimension all-reduces them.
    """
    from torch.distributed.fsdp import ShardingStrategy

    if mesh.ndim == 2 and mesh.shape[1] == 1:
        return ShardingStrategy.NO_SHARD, mesh[mesh.mesh_dim_names[0]]
    hybrid = mesh.ndim == 2
    if reshard_after_forward:
        return (ShardingStrategy.HYBRID_SHARD if hybrid else ShardingStrategy.FULL_SHARD), mesh
    return (ShardingStrategy._HYBRID_SHARD_ZERO2 if hybrid else ShardingStrategy.SHARD_GRAD_OP), mesh


class FSDP1Adapter(FSDPAdapter):
    strategy = "fsdp"

    def mixed_precision(self, dtypes):
        from torch.distributed.fsdp import MixedPrecision

        return MixedPrecision(**dtypes)

    def wrap(
        self,
        module,
        *,
        mesh,
        dtypes,
        wrap_policy,
        offload_params=False,
        reshard_after_forward=True,
        forward_prefetch=False,
        use_orig_params=False,
    ):
        from torch.distributed.fsdp import CPUOffload, FullyShardedDataParallel

        on_cpu = get_device_name() == "cpu"
        if offload_params and on_cpu:
            # FSDP1 CPUOffload pins memory, which needs an accelerator (docs/cpu_notes.md "FSDP on the CPU"); on
            # the CPU the parameters already live in host memory, so the request is satisfied without it.
            offload_params = False
        sharding, mesh = _fsdp1_sharding(mesh, reshard_after_forward)
        return FullyShardedDataParallel(
            module,
            auto_wrap_policy=get_fsdp_wrap_policy(module, wrap_policy),
            device_id=torch.device("cpu") if on_cpu else _current_device(),
            sharding_strategy=sharding,
            mixed_precision=self.mixed_precision(dtypes),
            # every rank loaded the same weights; broadcasting them needs an accelerator
            # (docs/cpu_notes.md "FSDP on the CPU")
            sync_module_states=False,
            device_mesh=mesh,
            use_orig_params=use_orig_params,
            forward_prefetch=forward_prefetch,
            cpu_offload=CPUOffload(offload_params=True) if offload_params else None,
        )

    def describe(self, module):
        from torch.distributed.fsdp import FullyShardedDataParallel, ShardingStrategy

        units = FullyShardedDataParallel.fsdp_modules(module)
        mesh = getattr(module, "_device_mesh", None)
        shape = tuple(mesh.shape) if mesh is not None else (dist.get_world_size(),)
        if module.sharding_strategy == ShardingStrategy.NO_SHARD:
            replicas, shard_size = shape[0], 1
        else:
            replicas, shard_size = shape if len(shape) == 2 else (1, shape[0])
        mp = module.mixed_precision
        flat = next(p for p in module.parameters())
        return FSDPLayout(
            strategy=self.strategy,
            replicas=replicas,
            shard_size=shard_size,
            num_units=len(units),
            storage_dtype=flat.dtype,
            param_dtype=mp.param_dtype or flat.dtype,
            reduce_dtype=mp.reduce_dtype or mp.param_dtype or flat.dtype,
            cpu_offload=bool(module.cpu_offload.offload_params),
            reshard_after_forward=module.sharding_strategy
            in (ShardingStrategy.FULL_SHARD, ShardingStrategy.HYBRID_SHARD),
            forward_prefetch=all(unit.forward_prefetch for unit in units),
        )

    def check_options(self, fsdp_config, key_prefix):
        if fsdp_config.offload_policy:
            raise ValueError(
                f"{key_prefix}.offload_policy=True is FSDP2-only (CPUOffloadPolicy); with strategy=fsdp use "
                f"{key_prefix}.param_offload / optimizer_offload, or set the role's strategy to fsdp2"
            )

    def grad_sync(self, module, enabled):
        return contextlib.nullcontext() if enabled else module.no_sync()

    def clip_grad_norm(self, module, max_norm):
        return module.clip_grad_norm_(max_norm=max_norm).detach().float()

    def full_state_dict(self, module):
        from torch.distributed.fsdp import FullStateDictConfig, FullyShardedDataParallel, StateDictType

        # offload_to_cpu=True segfaults on the CPU backend (docs/cpu_notes.md "FSDP on the CPU"); the tensors are on the
        # CPU there anyway.
        cfg = FullStateDictConfig(offload_to_cpu=get_device_name() != "cpu", rank0_only=True)
        with FullyShardedDataParallel.state_dict_type(module, StateDictType.FULL_STATE_DICT, cfg):
            state = module.state_dict()
        if _rank() != 0:
            return {}
        return {k: v.detach().cpu() for k, v in state.items()}

    def load_full_state_dict(self, module, state_dict):
        from torch.distributed.fsdp import FullStateDictConfig, FullyShardedDataParallel, StateDictType

        cfg = FullStateDictConfig(offload_to_cpu=False, rank0_only=False)
        with FullyShardedDataParallel.state_dict_type(module, StateDictType.FULL_STATE_DICT, cfg):
            module.load_state_dict(state_dict)

    def inference_params(self, module):
        return fsdp1_root_unsharded(module)

    def offload_params(self, module):
        move_fsdp1_flat_params(module, torch.device("cpu"))

    def load_params(self, module, device):
        move_fsdp1_flat_params(module, torch.device(device))

    def reshard(self, module):
        # FSDP1's ``parameters()`` are the flat parameters whether gathered or not, and its next forward frees what
        # a previous one left gathered: nothing to do.
        return None


class FSDP2Adapter(FSDPAdapter):
    strategy = "fsdp2"

    def mixed_precision(self, dtypes):

        return MixedPrecisionPolicy(
            param_dtype=dtypes["param_dtype"], reduce_dtype=dtypes["reduce_dtype"], cast_forward_inputs=True
        )

    def wrap(
        self,
        module,
        *,
        mesh,
        dtypes,
        wrap_policy,
        offload_params=False,
        reshard_after_forward=True,
        forward_prefetch=False,
        use_orig_params=False,
    ):
        from torch.distributed.fsdp import OffloadPolicy

        # pinning needs an accelerator (docs/cpu_notes.md "FSDP on the CPU")
        offload = CPUOffloadPolicy(pin_memory=get_device_name() != "cpu") if offload_params else OffloadPolicy()
        kwargs = {"mesh": mesh, "mp_policy": self.mixed_precision(dtypes), "offload_policy": offload}
        names, source = layer_class_names(module, wrap_policy)
        targets = select_fsdp2_wrap_targets(module, resolve_wrap_classes(module, names, source))
        for target in targets:
            fully_shard(target, reshard_after_forward=reshard_after_forward, **kwargs)
        fully_shard(module, reshard_after_forward=reshard_after_forward, **kwargs)
        if forward_prefetch:
            layers = [t for t in targets if t is not module]
            for current, nxt in zip(layers, layers[1:]):
                current.set_modules_to_forward_prefetch([nxt])
        return module

    def describe(self, module):

        states = [m._get_fsdp_state() for m in module.modules() if isinstance(m, FSDPModule)]
        groups = [s._fsdp_param_group for s in states if s._fsdp_param_group is not None]
        layer_groups = [s._fsdp_param_group for s in states[1:] if s._fsdp_param_group is not None]
        param = next(p for p in module.parameters())
        mp = groups[0].mp_policy
        shape = tuple(param.device_mesh.shape)
        replicas, shard_size = shape if len(shape) == 2 else (1, shape[0])
        return FSDPLayout(
            strategy=self.strategy,
            replicas=replicas,
            shard_size=shard_size,
            num_units=len(states),
            storage_dtype=param.dtype,
            param_dtype=mp.param_dtype or param.dtype,
            reduce_dtype=mp.reduce_dtype or mp.param_dtype or param.dtype,
            cpu_offload=all(isinstance(g.offload_policy, CPUOffloadPolicy) for g in groups),
            # FSDP2 never reshards the root after forward (its parameters are needed first in backward); the
            # layers (modules() lists the root first) carry the setting
            reshard_after_forward=all(g.post_forward_mesh_info is not None for g in layer_groups or groups),
            forward_prefetch=any(s._states_to_forward_prefetch for s in states),
        )

    def check_options(self, fsdp_config, key_prefix):
        return None  # every fsdp_config key has an FSDP2 meaning

    def grad_sync(self, module, enabled):
        return fsdp2_grad_sync(module, enabled)

    def clip_grad_norm(self, module, max_norm):
        from torch.distributed.tensor import DTensor

        params = [p for p in module.parameters() if p.grad is not None]
        norm = torch.nn.utils.clip_grad_norm_(params, max_norm=max_norm, foreach=False)
        if isinstance(norm, DTensor):
            norm = norm.full_tensor()
        return norm.detach().float()

    def full_state_dict(self, module):
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        options = StateDictOptions(full_state_dict=True, cpu_offload=True)
        state = get_model_state_dict(module, options=options)
        return state if _rank() == 0 else {}

    def load_full_state_dict(self, module, state_dict):
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

        set_model_state_dict(module, dict(state_dict), options=StateDictOptions(full_state_dict=True))

    def inference_params(self, module):
        # The root group's parameters (embeddings, the vision tower when it is no unit of its own) are gathered by
        # the root forward's hook; ``generate`` also calls the model outside its forward (transformers >= 5.x
        # encodes the images before the first decoding step), so gather them for the whole call.
        return fsdp2_root_unsharded(module)

    def offload_params(self, module):
        module.to("cpu")

    def load_params(self, module, device):
        module.to(device)

    def reshard(self, module):
        # FSDP2 registers the gathered tensors as the module's parameters while a unit is unsharded
        for unit in module.modules():
            if isinstance(unit, FSDPModule):
                unit.reshard()


_ADAPTERS: dict[str, FSDPAdapter] = {"fsdp": FSDP1Adapter(), "fsdp2": FSDP2Adapter()}


def get_fsdp_adapter(strategy: str, config_key: str = "actor_rollout_ref.actor.strategy") -> FSDPAdapter:
    """The adapter for ``strategy`` (``"fsdp"`` = FSDP1, ``"fsdp2"`` = FSDP2)."""
    return _ADAPTERS[check_strategy(strategy, config_key)]


def adapter_for(module: nn.Module) -> FSDPAdapter | None:
    """The adapter matching an already-wrapped module (None for an unwrapped one)."""
    version = fsdp_version(module)
    return None if version == 0 else _ADAPTERS["fsdp" if version == 1 else "fsdp2"]


# --------------------------------------------------------------------------------------------------------------
# offload (upstream function names); every tensor of a phase is on ONE device (field-report item 10)
# --------------------------------------------------------------------------------------------------------------


def offload_fsdp_model_to_cpu(model: nn.Module) -> None:
    """Move a wrapped model's sharded parameters to the CPU (upstream name)."""
    adapter = adapter_for(model)
    if adapter is None:
        model.to("cpu")
    else:
        adapter.offload_params(model)


def load_fsdp_model_to_gpu(model: nn.Module, device: torch.device | str | None = None) -> None:
    """Move a wrapped model's sharded parameters back to the accelerator (upstream name; any device)."""
    device = device if device is not None else _current_device()
    adapter = adapter_for(model)
    if adapter is None:
        model.to(device)
    else:
        adapter.load_params(model, device)


def offload_fsdp_optimizer(optimizer: torch.optim.Optimizer) -> None:
    """Move every optimizer state tensor to the CPU (same for FSDP1 and FSDP2)."""
    _move_optimizer_state(optimizer, torch.device("cpu"))


def load_fsdp_optimizer(optimizer: torch.optim.Optimizer, device_id: torch.device | str | int | None = None) -> None:
    """Move every optimizer state tensor to ``device_id`` (default: the current accelerator)."""
    if device_id is None or isinstance(device_id, int):
        device_id = _current_device()
    _move_optimizer_state(optimizer, torch.device(device_id))


def _move_optimizer_state(optimizer: torch.optim.Optimizer, device: torch.device) -> None:
    if not optimizer.state:
        return
    for group in optimizer.param_groups:
        for param in group["params"]:
            state = optimizer.state[param]
            for key, value in state.items():
                if isinstance(value, torch.Tensor):
                    state[key] = value.to(device, non_blocking=False)


def fsdp2_clip_grad_norm_(parameters: Iterable[torch.Tensor], max_norm: float, norm_type: float = 2.0) -> torch.Tensor:
    """Clip DTensor gradients and return the full (replicated) total norm (upstream name)."""
    from torch.distributed.tensor import DTensor

    norm = torch.nn.utils.clip_grad_norm_(list(parameters), max_norm=max_norm, norm_type=norm_type, foreach=False)
    return norm.full_tensor() if isinstance(norm, DTensor) else norm


def _current_device() -> torch.device:
    from verl.utils.device import get_device_id

    name = get_device_name()
    return torch.device("cpu") if name == "cpu" else torch.device(name, get_device_id())


def _rank() -> int:
    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


__getattr__ = missing_name_getattr(__name__)  # upstream names missing here raise with the reason (verl.upstream_gaps)
