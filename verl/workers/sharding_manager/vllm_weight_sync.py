"""Move the trained actor's weights into a colocated vLLM engine (hybrid engine), one layer at a time.

```
 actor (HF model; plain, FSDP1 or FSDP2; params possibly offloaded to the CPU)
   │ iter_full_tensors     state_dict() -> per tensor: local shard -> compute device -> rollout dtype (matrices
   │                       only) -> all-gather
   │ group_by_layer        consecutive tensors of one decoder/vision block ("...layers.N.")
   │ weight_format         "per_expert" (default): fused 3-D experts -> experts.{e}.{gate,up,down}_proj.weight
   │                       "checkpoint": transformers' reverse weight conversion;  "hf": in-memory names as they are
   ▼
 engine, one block at a time       canonical staging -> vLLM's own model.load_weights (name mapping, stacking, TP
                                   slicing) -> the layers' post-load processing, as on a fresh engine
                                   (verl.utils.vllm.canonical_reload; field-report item 1 cannot recur there: the
                                   staged parameters carry the loaders recorded at engine build)
```

Peak extra memory is one layer's full tensors in the rollout dtype: no rank ever holds the whole model, and an
offloaded shard is moved to the device only for its own all-gather.

Dtypes. Matrices (2-D and up) are cast to the rollout dtype before the gather (half the traffic; casting first and
the engine's copy-cast round the same way, so the engine ends with the same bits). Vectors (norm weights, biases,
the GDN ``A_log`` / ``dt_bias``) travel in the actor's dtype: engines keep some of them in fp32 (vLLM's Qwen3.5 GDN
holds ``A_log`` in fp32), and rounding them to bf16 on the way would make the synced engine differ from one loaded
from the checkpoint.

Weight formats. transformers 5 keeps MoE experts fused (``mlp.experts.gate_up_proj [E, 2I, H]``, gate rows first,
``mlp.experts.down_proj [E, H, I]``); checkpoints and most vLLM loaders use per-expert names. vLLM >= 0.17's Qwen3.5
loader accepts both (docs/qwen3_5.md, "vLLM weight loading"), older loaders of other MoE families only the per-expert
ones. The default ``per_expert`` undoes transformers' standard expert merge (the ``qwen2_moe`` conversion shared by
Qwen2/3-MoE, Qwen3.5, DeepSeek-V2/V3, GLM-4-MoE ...) without depending on the transformers version. ``checkpoint``
runs transformers' own reverse conversion, which also undoes renames (e.g. Mixtral's); transformers 5.4 mangles the
``language_model`` prefix of multimodal models that were not loaded with ``from_pretrained``, so it is opt-in.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn as nn

from verl.utils.vllm.canonical_reload import ReloadReport, block_key, get_canonical_layout
from verl.utils.vllm.patch import WeightLoaderRepair, repair_moe_weight_loaders, unwrap_vllm_model
from verl.workers.sharding_manager.base import BaseShardingManager

__all__ = [
    "FSDPVLLMShardingManager",
    "WeightSyncReport",
    "align_names_to_engine",
    "align_vector_dtypes",
    "group_by_layer",
    "iter_full_tensors",
    "iter_vllm_weights",
    "load_weights_into_vllm",
    "split_fused_experts",
    "sync_actor_weights_to_vllm",
    "to_checkpoint_format",
]

logger = logging.getLogger(__name__)

# Wrapper prefixes that may survive in state-dict names (activation checkpointing, torch.compile, FSDP1).
_WRAPPER_PREFIXES = ("_checkpoint_wrapped_module.", "_orig_mod.", "_fsdp_wrapped_module.")
# "<anything>.layers.7." / ".blocks.3." / ".h.2." -> one decoder or vision block
_LAYER_RE = re.compile(r"^(.*?\.(?:layers|blocks|h)\.\d+)\.")


@dataclass
class WeightSyncReport:
    """What one sync moved: ``reload`` for an engine with a recorded canonical layout (the exact path), ``repair``
    for one without (see :func:`load_weights_into_vllm`)."""

    num_tensors: int
    num_bytes: int
    repair: WeightLoaderRepair | None = None
    reload: ReloadReport | None = None


# ----------------------------------------------------------------------------------------------------------------
# trainer side: full tensors, one at a time
# ----------------------------------------------------------------------------------------------------------------


def _clean_name(name: str) -> str:
    for prefix in _WRAPPER_PREFIXES:
        name = name.replace(prefix, "")
    return name


def _sharded_state_dict(module: nn.Module) -> dict[str, Any]:
    """The module's state dict WITHOUT gathering: DTensor shards for FSDP1 (sharded state-dict type) and FSDP2."""
    from torch.distributed.fsdp import FullyShardedDataParallel, ShardedStateDictConfig, StateDictType

    if isinstance(module, FullyShardedDataParallel):
        config = ShardedStateDictConfig(offload_to_cpu=False, _use_dtensor=True)
        with FullyShardedDataParallel.state_dict_type(module, StateDictType.SHARDED_STATE_DICT, config):
            return module.state_dict()
    return module.state_dict()


def _full_tensor(value: torch.Tensor, dtype: torch.dtype | None, device: torch.device | None) -> torch.Tensor:
    """Gather one (possibly DTensor-sharded, possibly CPU-offloaded) tensor; matrices are cast BEFORE the gather."""
    from torch.distributed.tensor import DTensor

    if isinstance(value, DTensor):
        local = _convert(value.to_local(), dtype, device)
        # An offloaded shard lives on the CPU while the mesh's collective backend needs the device: re-wrap the moved
        # shard with the same placements and global shape (uneven shards included) and gather that.
        moved = DTensor.from_local(
            local, value.device_mesh, value.placements, run_check=False, shape=value.shape, stride=value.stride()
        )
        return moved.full_tensor()
    return _convert(value.detach(), dtype, device)


def _convert(tensor: torch.Tensor, dtype: torch.dtype | None, device: torch.device | None) -> torch.Tensor:
    if dtype is not None and tensor.is_floating_point() and tensor.dim() >= 2:
        tensor = tensor.to(dtype)
    if device is not None:
        tensor = tensor.to(device)
    return tensor


def iter_full_tensors(
    module: nn.Module, *, dtype: torch.dtype | None = None, device: torch.device | str | None = None
) -> Iterator[tuple[str, torch.Tensor]]:
    """``(name, full tensor)`` for every state-dict entry of ``module``, in state-dict order.

    Works for a plain module, FSDP1 and FSDP2 (every rank must iterate: the gathers are collectives). Floating
    matrices (2-D and up) are cast to ``dtype``, vectors keep theirs (module docstring); all tensors end on
    ``device`` (default: where they are).
    """
    device = torch.device(device) if device is not None else None
    for name, value in _sharded_state_dict(module).items():
        yield _clean_name(name), _full_tensor(value, dtype, device)


def group_by_layer(named: Iterable[tuple[str, torch.Tensor]]) -> Iterator[dict[str, torch.Tensor]]:
    """Consecutive tensors of the same block (``...layers.N.``, ``...blocks.N.``) as one dict; any other tensor
    alone. Only one group is alive at a time."""
    group: dict[str, torch.Tensor] = {}
    group_key = None
    for name, tensor in named:
        match = _LAYER_RE.match(name)
        key = match.group(1) if match else name
        if group and key != group_key:
            yield group
            group = {}
        group_key = key
        group[name] = tensor
    if group:
        yield group


def _find_hf_model(module: nn.Module) -> nn.Module | None:
    from transformers import PreTrainedModel

    return next((m for m in module.modules() if isinstance(m, PreTrainedModel)), None)


def to_checkpoint_format(hf_model: nn.Module | None, group: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """One layer's tensors in the checkpoint's names and layout (transformers' reverse weight conversion, e.g.
    fused ``experts.gate_up_proj [E, 2I, H]`` -> ``experts.{e}.gate_proj.weight [I, H]`` + ``up_proj``)."""
    if hf_model is None:
        return group
    from transformers.core_model_loading import revert_weight_conversion

    return revert_weight_conversion(hf_model, group)


def split_fused_experts(group: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """One layer's tensors with transformers' fused experts split per expert (other tensors unchanged, in order).

    ``P.gate_up_proj [E, 2I, H]`` -> ``P.{e}.gate_proj.weight = [e, :I]``, ``P.{e}.up_proj.weight = [e, I:]``;
    ``P.down_proj [E, H, I]`` -> ``P.{e}.down_proj.weight = [e]``, for ``P`` ending in ``experts``. Raises ValueError
    when the pair's shapes are not that layout (another model family: use ``weight_format="checkpoint"``).
    """
    out: dict[str, torch.Tensor] = {}
    for name, tensor in group.items():
        prefix, _, leaf = name.rpartition(".")
        if not prefix.endswith("experts") or leaf not in ("gate_up_proj", "down_proj") or tensor.dim() != 3:
            out[name] = tensor
            continue
        _check_expert_layout(prefix, group)
        for e in range(tensor.shape[0]):
            if leaf == "gate_up_proj":
                gate, up = tensor[e].chunk(2, dim=0)
                out[f"{prefix}.{e}.gate_proj.weight"], out[f"{prefix}.{e}.up_proj.weight"] = gate, up
            else:
                out[f"{prefix}.{e}.down_proj.weight"] = tensor[e]
    return out


def _check_expert_layout(prefix: str, group: dict[str, torch.Tensor]) -> None:
    gate_up, down = group.get(f"{prefix}.gate_up_proj"), group.get(f"{prefix}.down_proj")
    if gate_up is None or down is None:
        return  # only one of the pair in this layer group: nothing to cross-check
    num_experts, rows, hidden = gate_up.shape
    if rows % 2 or tuple(down.shape) != (num_experts, hidden, rows // 2):
        raise ValueError(
            f"{prefix}: fused experts gate_up_proj {tuple(gate_up.shape)} / down_proj {tuple(down.shape)} are not "
            "transformers' standard [E, 2I, H] / [E, H, I] layout; sync with weight_format='checkpoint' (transformers' "
            "reverse conversion) or 'hf'"
        )


_WEIGHT_FORMATS = ("per_expert", "checkpoint", "hf")


def iter_vllm_weights(
    module: nn.Module,
    *,
    dtype: torch.dtype | None = None,
    device: torch.device | str | None = None,
    weight_format: str = "per_expert",
) -> Iterator[tuple[str, torch.Tensor]]:
    """The actor's weights as vLLM's ``load_weights`` wants them, streamed layer by layer (see module docstring)."""
    if weight_format not in _WEIGHT_FORMATS:
        raise ValueError(f"weight_format={weight_format!r}; valid: {_WEIGHT_FORMATS}")
    hf_model = _find_hf_model(module) if weight_format == "checkpoint" else None
    for group in group_by_layer(iter_full_tensors(module, dtype=dtype, device=device)):
        if weight_format == "per_expert":
            group = split_fused_experts(group)
        elif weight_format == "checkpoint":
            group = to_checkpoint_format(hf_model, group)
        yield from group.items()


# ----------------------------------------------------------------------------------------------------------------
# engine side
# ----------------------------------------------------------------------------------------------------------------


class _Counting:
    """Counts the tensors and bytes vLLM actually consumes from the weight iterator."""

    def __init__(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        self._weights = iter(weights)
        self.num_tensors = 0
        self.num_bytes = 0

    def __iter__(self) -> _Counting:
        return self

    def __next__(self) -> tuple[str, torch.Tensor]:
        name, tensor = next(self._weights)
        self.num_tensors += 1
        self.num_bytes += tensor.numel() * tensor.element_size()
        return name, tensor


def align_names_to_engine(
    weights: Iterable[tuple[str, torch.Tensor]], engine: nn.Module
) -> Iterator[tuple[str, torch.Tensor]]:
    """Map between the two HF layouts of a VLM's language model to the one the engine was built from.

    HF multimodal checkpoints name the text model ``model.language_model.*`` (vision ``model.visual.*``); the
    text-only class names it ``model.*``. Which one the trainer emits depends on the class it trains and on the
    transformers version (5.4's reverse conversion always adds ``language_model``, 5.24's only for a model loaded
    from such a checkpoint). A vLLM multimodal wrapper (it has a ``language_model`` child) takes the first, a
    text-only model the second, and has no place for vision weights.
    """
    multimodal = isinstance(getattr(engine, "language_model", None), nn.Module)
    text_vl, text = "model.language_model.", "model."
    for name, tensor in weights:
        if multimodal and name.startswith(text) and not name.startswith((text_vl, "model.visual.")):
            name = text_vl + name[len(text) :]
        elif not multimodal and name.startswith(text_vl):
            name = text + name[len(text_vl) :]
        elif not multimodal and name.startswith("model.visual."):
            continue
        yield name, tensor


def _vector_dtypes(engine: nn.Module) -> dict[str, torch.dtype]:
    """Leaf name -> dtype of the engine's vector parameters, for leaves whose parameters all share one dtype
    (``weight`` of the norms -> bf16, ``A_log`` of vLLM's GDN -> fp32)."""
    seen: dict[str, set[torch.dtype]] = {}
    for name, param in engine.named_parameters():
        if param.dim() <= 1 and param.is_floating_point():
            seen.setdefault(name.rpartition(".")[2], set()).add(param.dtype)
    return {leaf: next(iter(dtypes)) for leaf, dtypes in seen.items() if len(dtypes) == 1}


def align_vector_dtypes(
    weights: Iterable[tuple[str, torch.Tensor]], engine: nn.Module
) -> Iterator[tuple[str, torch.Tensor]]:
    """Vectors arrive in the actor's dtype (module docstring); cast each to the dtype the engine keeps it in, which
    rounds exactly as the engine's own copy would, minus vLLM's per-tensor narrowing warning on every sync."""
    dtypes = _vector_dtypes(engine)
    for name, tensor in weights:
        target = dtypes.get(name.rpartition(".")[2]) if tensor.dim() <= 1 and tensor.is_floating_point() else None
        yield name, (tensor.to(target) if target is not None and target != tensor.dtype else tensor)


def _block_groups(weights: Iterable[tuple[str, torch.Tensor]]) -> Iterator[tuple[str | None, dict[str, torch.Tensor]]]:
    """Consecutive tensors of one block (:func:`block_key`), and runs of consecutive non-block tensors, as groups."""
    group: dict[str, torch.Tensor] = {}
    key = None
    for name, tensor in weights:
        name_key = block_key(name)
        if group and name_key != key:
            yield key, group
            group = {}
        key = name_key
        group[name] = tensor
    if group:
        yield key, group


def load_weights_into_vllm(vllm_model: Any, weights: Iterable[tuple[str, torch.Tensor]]) -> WeightSyncReport:
    """Load ``weights`` (HF names, aligned to the engine's layout) into a running engine's model.

    An engine built by :class:`~verl.workers.rollout.vllm_rollout.vLLMRollout` recorded its canonical layout at load
    time; then each block is loaded into canonical parameters and post-processed like a fresh engine
    (:mod:`verl.utils.vllm.canonical_reload`), which is exact on every platform. An engine without that record
    (built elsewhere) gets the MoE weight-loader repair and vLLM's ``load_weights`` into its live parameters, which is
    exact only where post-processing kept the canonical layout; a warning says so once.
    """
    model = unwrap_vllm_model(vllm_model)
    layout = get_canonical_layout(model)
    counting = _Counting(align_vector_dtypes(align_names_to_engine(weights, model), model))
    if layout is None:
        _refuse_repacked(model)
        _warn_no_layout(model)
        repair = repair_moe_weight_loaders(model)
        model.load_weights(counting)
        return WeightSyncReport(num_tensors=counting.num_tensors, num_bytes=counting.num_bytes, repair=repair)
    reload = ReloadReport()
    for key, group in _block_groups(counting):
        reload.merge(layout.reload(model, key, lambda group=group: model.load_weights(iter(group.items()))))
    return WeightSyncReport(num_tensors=counting.num_tensors, num_bytes=counting.num_bytes, reload=reload)


_warned_no_layout: set[str] = set()


def _refuse_repacked(model: nn.Module) -> None:
    """Post-loading may replace a weight by an empty placeholder and keep a repacked copy the kernel reads (vLLM's
    CPU GEMM dispatch does on CPUs with oneDNN / AVX-512-BF16 / zentorch); loading into the live parameters then
    fails deep inside vLLM's weight loader with a bare shape assertion. Say what happened and what works instead."""
    emptied = [name for name, param in model.named_parameters() if param.numel() == 0]
    if emptied:
        raise RuntimeError(
            f"cannot sync weights into this {type(model).__name__}: its post-load processing replaced "
            f"{len(emptied)} parameters (e.g. {emptied[0]}) by empty placeholders and keeps repacked copies, so the "
            "live parameters cannot be written. Build the engine through verl's vLLMRollout (load format "
            "'verl_canonical', which records the canonical layout and re-runs the post-processing on every sync)."
        )


def _warn_no_layout(model: nn.Module) -> None:
    name = type(model).__name__
    if name not in _warned_no_layout:
        _warned_no_layout.add(name)
        logger.warning(
            "weight sync into a %s without a recorded canonical layout (the engine was not built by verl's "
            "vLLMRollout): weights are written into the live parameters, which is exact only where the platform's "
            "post-load processing kept vLLM's canonical layout",
            name,
        )


def sync_actor_weights_to_vllm(
    actor_module: nn.Module,
    vllm_model: Any,
    *,
    dtype: torch.dtype | None = None,
    device: torch.device | str | None = None,
    weight_format: str = "per_expert",
) -> WeightSyncReport:
    """Stream ``actor_module``'s weights (plain/FSDP1/FSDP2, offloaded or not) into ``vllm_model``."""
    weights = iter_vllm_weights(actor_module, dtype=dtype, device=device, weight_format=weight_format)
    report = load_weights_into_vllm(vllm_model, weights)
    logger.info("synced %d tensors (%.1f MiB) into vLLM", report.num_tensors, report.num_bytes / 2**20)
    return report


class FSDPVLLMShardingManager(BaseShardingManager):
    """Context around generation in the hybrid engine (upstream name).

    Enter: wake the engine's weights, stream the actor's weights in (``rollout.load_weights``: loader repair, vLLM's
    ``load_weights``, prefix-cache reset), free the gather buffers, wake the KV cache, switch to the generation RNG.
    Exit: restore the training RNG and put the engine back to sleep (KV cache, and weights where the sleep level
    discards them), so training gets the memory back.

    ``rollout`` is a :class:`verl.workers.rollout.vllm_rollout.vLLMRollout` (``wake_up(tags)``, ``sleep()``,
    ``load_weights(weights)``, ``config.dtype``). ``device`` (default: this rank's accelerator) is where each
    shard is gathered and where the full tensors are handed to vLLM; ``weight_format`` see :func:`iter_vllm_weights`. The generation RNG is seeded with ``seed + dp_rank``: the ranks of
    one tensor-parallel engine share a dp rank, so their samplers draw the same tokens.
    """

    def __init__(
        self,
        module: nn.Module,
        rollout: Any,
        *,
        dp_rank: int = 0,
        seed: int = 1000,
        device: torch.device | str | None = None,
        weight_format: str = "per_expert",
    ) -> None:
        from verl.utils.fsdp_utils import to_torch_dtype

        self.module = module
        self.rollout = rollout
        # offloaded shards must reach the collective backend's device before their gather
        self.device = torch.device(device) if device is not None else _compute_device()
        self.weight_format = weight_format
        self.dtype = to_torch_dtype(rollout.config.dtype)
        self._gen_rng_state = _seeded_rng_state(seed + dp_rank)
        self._train_rng_state: torch.Tensor | None = None
        self.last_report: WeightSyncReport | None = None

    def __enter__(self) -> FSDPVLLMShardingManager:
        from verl.utils.device import get_platform

        platform = get_platform()
        self.rollout.wake_up(tags=["weights"])
        self.last_report = self.rollout.load_weights(
            iter_vllm_weights(self.module, dtype=self.dtype, device=self.device, weight_format=self.weight_format)
        )
        platform.empty_cache()
        self.rollout.wake_up(tags=["kv_cache"])
        self._train_rng_state = platform.get_rng_state()
        platform.set_rng_state(self._gen_rng_state)
        return self

    def __exit__(self, *exc_info: Any) -> None:
        from verl.utils.device import get_platform

        platform = get_platform()
        self._gen_rng_state = platform.get_rng_state()
        platform.set_rng_state(self._train_rng_state)
        self.rollout.sleep()
        platform.empty_cache()


def _compute_device() -> torch.device:
    from verl.utils.device import get_platform

    return get_platform().device()  # the CPU platform's device is "cpu" (no index)


def _seeded_rng_state(seed: int) -> torch.Tensor:
    from verl.utils.device import get_platform

    platform = get_platform()
    saved = platform.get_rng_state()
    platform.manual_seed(seed)
    state = platform.get_rng_state()
    platform.set_rng_state(saved)
    return state
