"""VeOmni engine settings (``*.veomni``, upstream ``engine/veomni.yaml``) and their mapping onto VeOmni's API.

VeOmni's entry points changed keyword names between releases (``ep_size`` vs ``extra_parallel_sizes``,
``mixed_precision=MixedPrecisionConfig(...)`` vs ``enable_mixed_precision``, ``enable_full_shard`` vs
``enable_reshard_after_forward``). The mapping below is written once, as pure functions of the config and of the
*parameter names* of the installed function, so it is unit-tested without VeOmni (which cannot be installed next
to the CPU stack: ``shared/reference/cpu_environment.md`` §6) and picks the spelling the installed release takes.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from verl.base_config import BaseConfig, ConfigError, require_choice, require_positive

__all__ = [
    "ParallelSizes",
    "VeOmniEngineConfig",
    "foundation_model_kwargs",
    "ops_implementation_kwargs",
    "parallel_sizes",
    "parallel_state_kwargs",
    "parallelize_kwargs",
    "parameter_names",
]

_OP_FIELDS = (
    "moe_implementation",
    "cross_entropy_loss_implementation",
    "rms_norm_implementation",
    "swiglu_mlp_implementation",
    "rotary_pos_emb_implementation",
    "rms_norm_gated_implementation",
    "causal_conv1d_implementation",
    "chunk_gated_delta_rule_implementation",
    "load_balancing_loss_implementation",
)
_TORCH_DTYPE_NAMES = {"fp32": "float32", "float32": "float32", "bf16": "bfloat16", "bfloat16": "bfloat16"}


@dataclass
class VeOmniEngineConfig(BaseConfig):
    """Engine settings of ``strategy=veomni`` (FSDP2 + Ulysses + expert parallelism built by VeOmni)."""

    strategy: str = "veomni"
    """Always veomni (the role's strategy key selects this engine)."""

    param_offload: bool = False
    """Move parameters to the CPU between phases."""

    optimizer_offload: bool = False
    """Move optimizer state to the CPU between updates."""

    offload_policy: bool = False
    """Kept for the engine interface; VeOmni's own CPU offload is ``enable_fsdp_offload``."""

    forward_only: bool = False
    """Reference policy: no optimizer."""

    seed: int = 42
    """Seed for initialisation."""

    fsdp_size: int = -1
    """Ranks per FSDP shard group (hybrid sharding); -1 = all data-parallel ranks."""

    ulysses_parallel_size: int = 1
    """Ulysses sequence-parallel size."""

    expert_parallel_size: int = 1
    """Expert-parallel size of MoE layers."""

    mixed_precision: bool = True
    """fp32 master weights with bf16 compute."""

    model_dtype: str = "bf16"
    """dtype the weights are loaded in (bf16 | fp32); mixed precision upcasts the masters to fp32."""

    init_device: str = "meta"
    """Where the model is created before sharding: meta (no memory until sharded) | cpu | cuda | npu."""

    enable_full_shard: bool = True
    """ZeRO-3 (reshard after forward); false keeps gathered parameters until backward."""

    enable_fsdp_offload: bool = False
    """VeOmni's FSDP2 CPU offload of parameters."""

    enable_reentrant: bool = False
    """Re-entrant activation checkpointing."""

    forward_prefetch: bool = True
    """Prefetch the next layer's all-gather."""

    use_torch_compile: bool = False
    """torch.compile the entropy kernels (unused by the shared core)."""

    ckpt_manager: str = "dcp"
    """Upstream's checkpoint format; this engine writes DCP-style sharded state dicts through FSDPCheckpointManager."""

    entropy_from_logits_with_chunking: bool = False
    """Chunked log-prob/entropy instead of the fused LM head."""

    entropy_from_logits_chunk_size: int = 2048
    """Tokens per chunk."""

    entropy_checkpointing: bool = False
    """Recompute entropy in backward."""

    attn_implementation: str = "flash_attention_2"
    """Attention kernel; with Ulysses > 1 a flash-attention name becomes ``veomni_<name>_with_sp``."""

    moe_implementation: str = "fused"
    """MoE experts kernel (fused GroupGEMM; VeOmni maps it to fused_npu on Ascend)."""

    cross_entropy_loss_implementation: str = "eager"
    """VeOmni cross-entropy kernel (the shared core computes log-probs itself)."""

    rms_norm_implementation: str = "eager"
    """RMSNorm kernel."""

    swiglu_mlp_implementation: str = "eager"
    """SwiGLU MLP kernel (must be eager on NPU)."""

    rotary_pos_emb_implementation: str = "eager"
    """RoPE kernel."""

    rms_norm_gated_implementation: str = "eager"
    """Qwen3.5 gated RMSNorm kernel (npu on Ascend)."""

    causal_conv1d_implementation: str = "eager"
    """Qwen3.5 GDN causal conv1d kernel (npu on Ascend)."""

    chunk_gated_delta_rule_implementation: str = "eager"
    """Qwen3.5 GDN chunk kernel (npu | npu_ascendc on Ascend)."""

    load_balancing_loss_implementation: str = "eager"
    """MoE load-balancing loss kernel."""

    force_use_huggingface: bool = False
    """Build the plain HF model class instead of VeOmni's patched one."""

    activation_gpu_limit: float = 0.0
    """GiB of activations kept on the device before VeOmni's activation offload starts (0 = off)."""

    basic_modules: list[str] = field(default_factory=list)
    """Extra module class names sharded as FSDP units, added to the model's ``_no_split_modules``."""

    def __post_init__(self) -> None:
        require_choice("strategy", self.strategy, ("veomni",))
        require_positive("ulysses_parallel_size", self.ulysses_parallel_size)
        require_positive("expert_parallel_size", self.expert_parallel_size)
        require_positive("entropy_from_logits_chunk_size", self.entropy_from_logits_chunk_size)
        require_choice("init_device", self.init_device, ("meta", "cpu", "cuda", "npu"))
        require_choice("model_dtype", self.model_dtype, tuple(_TORCH_DTYPE_NAMES))
        if self.fsdp_size == 0 or self.fsdp_size < -1:
            raise ConfigError("fsdp_size", f"must be -1 (all ranks) or a positive group size, got {self.fsdp_size}.")

    @property
    def ulysses_sequence_parallel_size(self) -> int:
        """The FSDP engine's name of ``ulysses_parallel_size``."""
        return self.ulysses_parallel_size


@dataclass(frozen=True)
class ParallelSizes:
    """``world = dp_size * ulysses_size``; ``dp_size = dp_replicate_size * dp_shard_size``."""

    dp_size: int
    dp_replicate_size: int
    dp_shard_size: int
    ulysses_size: int
    ep_size: int


def parallel_sizes(config: VeOmniEngineConfig, world_size: int) -> ParallelSizes:
    """Mesh sizes from the config. Example: world 16, ulysses 2, fsdp_size 4 → dp 8 = 2 replicas × 4 shards."""
    sp, ep = config.ulysses_parallel_size, config.expert_parallel_size
    if world_size % sp:
        raise ConfigError("ulysses_parallel_size", f"({sp}) must divide the number of ranks ({world_size}).")
    dp = world_size // sp
    shard = dp if config.fsdp_size == -1 else config.fsdp_size
    if dp % shard:
        raise ConfigError("fsdp_size", f"({shard}) must divide the data-parallel size {dp} (= ranks / ulysses).")
    if dp % ep:
        raise ConfigError("expert_parallel_size", f"({ep}) must divide the data-parallel size {dp}.")
    return ParallelSizes(dp, dp // shard, shard, sp, ep)


def parameter_names(fn: Callable) -> frozenset[str]:
    """Keyword names ``fn`` accepts explicitly (its ``**kwargs`` swallow anything, so they do not count)."""
    params = inspect.signature(fn).parameters.values()
    return frozenset(p.name for p in params if p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL))


def _pick(accepted: frozenset[str], options: dict[str, Any], what: str) -> dict[str, Any]:
    """The first spelling of ``options`` (name → value, in preference order) the installed function accepts."""
    for name, value in options.items():
        if name in accepted:
            return {name: value}
    raise RuntimeError(
        f"the installed veomni does not accept any of {list(options)} for {what}; install a supported release "
        "(pip install verl[veomni])"
    )


def parallel_state_kwargs(
    config: VeOmniEngineConfig, world_size: int, device_type: str, accepted: frozenset[str]
) -> dict[str, Any]:
    """Arguments of ``veomni.distributed.parallel_state.init_parallel_state``."""
    sizes = parallel_sizes(config, world_size)
    kwargs = {
        "dp_size": sizes.dp_size,
        "dp_replicate_size": sizes.dp_replicate_size,
        "dp_shard_size": sizes.dp_shard_size,
        "ulysses_size": sizes.ulysses_size,
        "dp_mode": "fsdp2",
        "device_type": device_type,
    }
    if "extra_parallel_sizes" in accepted:
        kwargs.update(extra_parallel_sizes=(sizes.ep_size,), extra_parallel_names=("ep",))
    else:
        kwargs.update(_pick(accepted, {"ep_size": sizes.ep_size}, "expert_parallel_size"))
    return kwargs


def ops_implementation_kwargs(config: VeOmniEngineConfig) -> dict[str, str]:
    """Fields of VeOmni's ``OpsImplementationConfig``; flash attention gets VeOmni's SP variant when Ulysses > 1."""
    attn = config.attn_implementation
    if config.ulysses_parallel_size > 1 and attn.startswith("flash_attention"):
        attn = f"veomni_{attn}_with_sp"
    return {"attn_implementation": attn, **{name: getattr(config, name) for name in _OP_FIELDS}}


def foundation_model_kwargs(
    config: VeOmniEngineConfig, model_path: str, config_path: str, ops_implementation: Any
) -> dict[str, Any]:
    """Arguments of ``veomni.models.auto.build_foundation_model``."""
    return {
        "config_path": config_path,
        "weights_path": model_path,
        "torch_dtype": _TORCH_DTYPE_NAMES[config.model_dtype],
        "init_device": config.init_device,
        "ops_implementation": ops_implementation,
        "force_use_huggingface": config.force_use_huggingface,
    }


def _basic_modules(model_modules: Iterable[str] | None, extra: Iterable[str]) -> list[str]:
    # `_no_split_modules` is a set in transformers 5 (field-report item 6): sort so every rank agrees
    return sorted(set(model_modules or ()) | set(extra))


def parallelize_kwargs(
    config: VeOmniEngineConfig,
    *,
    weights_path: str,
    model_basic_modules: Iterable[str] | None,
    enable_gradient_checkpointing: bool,
    accepted: frozenset[str],
    mixed_precision_cls: Callable[..., Any] | None,
) -> dict[str, Any]:
    """Arguments of ``veomni.distributed.torch_parallelize.build_parallelize_model`` (after the model)."""
    kwargs: dict[str, Any] = {
        "weights_path": weights_path,
        "enable_gradient_checkpointing": enable_gradient_checkpointing,
        "basic_modules": _basic_modules(model_basic_modules, config.basic_modules),
        "init_device": config.init_device,
        "enable_fsdp_offload": config.enable_fsdp_offload,
        "enable_reentrant": config.enable_reentrant,
        "enable_forward_prefetch": config.forward_prefetch,
    }
    precision = {"enable_mixed_precision": config.mixed_precision}
    if mixed_precision_cls is not None:
        precision = {"mixed_precision": mixed_precision_cls(enable=config.mixed_precision), **precision}
    kwargs.update(_pick(accepted, precision, "mixed_precision"))
    reshard = {"enable_full_shard": config.enable_full_shard, "enable_reshard_after_forward": config.enable_full_shard}
    kwargs.update(_pick(accepted, reshard, "enable_full_shard"))
    return kwargs
