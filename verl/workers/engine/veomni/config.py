"""The mapping of the VeOmni engine settings (``*.veomni``: :class:`verl.workers.config.VeOmniEngineConfig`,
``engine/veomni.yaml``) onto VeOmni's API.

VeOmni's entry points changed keyword names between releases (``ep_size`` vs ``extra_parallel_sizes``,
``mixed_precision=MixedPrecisionConfig(...)`` vs ``enable_mixed_precision``, ``enable_full_shard`` vs
``enable_reshard_after_forward``). The mapping below is written once, as pure functions of the config and of the
*parameter names* of the installed function, so it is unit-tested without VeOmni (whose Qwen3.5 forward cannot run
on a CPU, docs/veomni.md) and picks the spelling the installed release takes.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from verl.base_config import ConfigError
from verl.workers.config.engine import VEOMNI_TORCH_DTYPES, VeOmniEngineConfig, veomni_attention

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


@dataclass(frozen=True)
class ParallelSizes:
    """``world = dp_size * ulysses_size``; ``dp_size = dp_replicate_size * dp_shard_size``."""

    dp_size: int
    dp_replicate_size: int
    dp_shard_size: int
    ulysses_size: int
    ep_size: int


def parallel_sizes(config: VeOmniEngineConfig, world_size: int) -> ParallelSizes:
    """Mesh sizes from the config. Example: world 16, ulysses 2, fsdp_size 4 → dp 8 = 2 replicas × 4 shards; experts
    split within the 4 × 2 = 8 ranks of one parameter shard group (VeOmni's ``dp_shard_sp``)."""
    sp, ep = config.ulysses_parallel_size, config.expert_parallel_size
    if world_size % sp:
        raise ConfigError("ulysses_parallel_size", f"({sp}) must divide the number of ranks ({world_size}).")
    dp = world_size // sp
    shard = dp if config.fsdp_size == -1 else config.fsdp_size
    if dp % shard:
        raise ConfigError("fsdp_size", f"({shard}) must divide the data-parallel size {dp} (= ranks / ulysses).")
    # VeOmni shards parameters over dp_shard x ulysses (its `dp_shard_sp` mesh) and carves the expert groups out of it
    if (shard * sp) % ep:
        raise ConfigError(
            "expert_parallel_size",
            f"({ep}) must divide the parameter-shard size {shard * sp} (= fsdp shard {shard} x ulysses {sp}).",
        )
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
    """Fields of VeOmni's ``OpsImplementationConfig``; the attention gets VeOmni's SP variant when Ulysses > 1."""
    attn = veomni_attention(config.attn_implementation, config.ulysses_parallel_size)
    return {"attn_implementation": attn, **{name: getattr(config, name) for name in _OP_FIELDS}}


def foundation_model_kwargs(
    config: VeOmniEngineConfig,
    model_path: str,
    config_path: str,
    ops_implementation: Any,
    accepted: frozenset[str] | None = None,
) -> dict[str, Any]:
    """Arguments of ``veomni.models.auto.build_foundation_model``.

    ``accepted`` (the installed function's :func:`parameter_names`): ``force_use_huggingface`` is passed only where
    it exists. veomni 0.1.12 dropped it (its ``MODELING_BACKEND`` environment variable selects HF modeling), and
    passing it raised ``TypeError`` there; ``true`` with such a release is refused, naming the replacement.
    """
    kwargs = {
        "config_path": config_path,
        "weights_path": model_path,
        "torch_dtype": VEOMNI_TORCH_DTYPES[config.model_dtype],
        "init_device": config.init_device,
        "ops_implementation": ops_implementation,
    }
    if accepted is None or "force_use_huggingface" in accepted:
        kwargs["force_use_huggingface"] = config.force_use_huggingface
    elif config.force_use_huggingface:
        raise ConfigError(
            "force_use_huggingface",
            "(true) is not an argument of the installed veomni's build_foundation_model; set it to false and "
            "export MODELING_BACKEND=hf for the workers (ray_kwargs.ray_init.runtime_env.env_vars) instead.",
        )
    return kwargs


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
