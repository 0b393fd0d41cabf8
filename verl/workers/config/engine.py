"""FSDP engine settings (`*.fsdp_config`) and the rule that links them to their role's keys.

The same knob exists twice upstream: once on the role (`actor_rollout_ref.actor.strategy`,
`...actor.ulysses_sequence_parallel_size`, `...actor.entropy_from_logits_with_chunking`) read by the legacy
worker, and once on the engine (`...actor.fsdp_config.<same name>`) read by the engine worker. Field report
item 9 is what happens when they disagree (FSDP2 configured on one, FSDP1 built by the other).
`link_role_and_engine` makes them one setting: whichever side the user set wins, setting both to different
values raises `ConfigError` naming both keys.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Optional

from verl.base_config import BaseConfig, ConfigError, field_default, require_choice, require_positive

__all__ = [
    "FSDP_STRATEGIES",
    "UNSUPPORTED_BACKENDS",
    "refuse_unsupported_backend",
    "VEOMNI_TORCH_DTYPES",
    "EngineConfig",
    "EngineRouterReplayConfig",
    "FSDPEngineConfig",
    "VeOmniEngineConfig",
    "link_role_and_engine",
]

FSDP_STRATEGIES = ("fsdp", "fsdp2")
"""`fsdp` = FSDP1 (`FullyShardedDataParallel` wrapper), `fsdp2` = `fully_shard` per decoder layer (CPU default)."""

_USE_INSTEAD = (
    "train with actor_rollout_ref.actor.strategy=fsdp or fsdp2 (Qwen3.5 on Ascend included) or with the Hydra "
    "override model_engine=veomni"
)

UNSUPPORTED_BACKENDS = {
    "megatron": f"the Megatron backend (megatron-core, MindSpeed on Ascend) is not part of verl-ascend; {_USE_INSTEAD}",
    "mindspeed_llm": f"MindSpeed (Megatron on Ascend) is not part of verl-ascend; {_USE_INSTEAD}",
    "mindspeed_mm": f"MindSpeed-MM (Megatron on Ascend) is not part of verl-ascend; {_USE_INSTEAD}",
    "torchtitan": f"the TorchTitan engine is not part of verl-ascend; {_USE_INSTEAD}",
    "automodel": f"the NeMo Automodel engine is not part of verl-ascend; {_USE_INSTEAD}",
    "fsdp_turbo": f"upstream HEAD's fsdp_turbo engine is not part of verl-ascend; {_USE_INSTEAD}",
}
"""strategy name -> why it is refused and what to use."""


def refuse_unsupported_backend(key: str, strategy: str) -> None:
    """Raise ConfigError naming ``key`` when ``strategy`` is an upstream backend this distribution lacks."""
    if strategy in UNSUPPORTED_BACKENDS:
        raise ConfigError(key, f"{strategy!r}: {UNSUPPORTED_BACKENDS[strategy]}.")


_DTYPES = ("fp32", "float32", "bf16", "bfloat16", "fp16", "float16")
_WRAP_POLICY_KEYS = ("min_num_params", "transformer_layer_cls_to_wrap", "disable")
_MIXED_PRECISION_KEYS = (
    "param_dtype",
    "reduce_dtype",
    "buffer_dtype",
    "keep_low_precision_grads",
    "cast_forward_inputs",
)


@dataclass
class EngineRouterReplayConfig(BaseConfig):
    """`<role>.<engine>.router_replay`: the engine-scoped form of `actor.router_replay` (upstream's VeOmni and
    Megatron recipes set `actor_rollout_ref.actor.veomni.router_replay.mode`). On the actor the two keys are one
    setting (the side changed from its default wins; both changed to different values raises); elsewhere (reference
    policy, critic) it has no effect."""

    mode: str = "disabled"
    """disabled | R2 | R3."""

    def __post_init__(self) -> None:
        require_choice("mode", self.mode, ("disabled", "R2", "R3"))


@dataclass
class EngineConfig(BaseConfig):
    """Settings every training engine shares."""

    strategy: Optional[str] = None
    """fsdp | fsdp2. null (the default) = follow the owning role's `strategy` key, which is the one key that
    selects FSDP1/FSDP2 (`actor_rollout_ref.actor.strategy`, `critic.strategy`). Setting it to a different
    value than the role's raises."""

    param_offload: bool = False
    """Move parameters to CPU between phases and back before use (manual offload)."""

    optimizer_offload: bool = False
    """Move optimizer state to CPU between updates (manual offload)."""

    forward_only: bool = False
    """The model only runs forward passes (reference policy): no optimizer, always offloaded."""

    use_torch_compile: bool = False
    """Upstream: torch.compile the entropy/log-prob kernels. Not applied here (reported as having no effect)."""

    seed: int = 42
    """Seed for model initialisation and dropout."""

    full_determinism: bool = False
    """Deterministic kernels (slower); for bitwise reproducibility checks."""

    router_replay: EngineRouterReplayConfig = field(default_factory=EngineRouterReplayConfig)
    """MoE router replay, engine-scoped (one setting with the actor's `router_replay`)."""


@dataclass
class FSDPEngineConfig(EngineConfig):
    """`fsdp_config` of the actor, reference policy and critic (`engine/fsdp.yaml`)."""

    wrap_policy: dict[str, Any] = field(default_factory=lambda: {"min_num_params": 0})
    """FSDP1 auto-wrap: `min_num_params` (size-based wrap when > 0), `transformer_layer_cls_to_wrap` (class names;
    defaults to the model's `_no_split_modules`), `disable`."""

    offload_policy: bool = False
    """FSDP2 only: `CPUOffloadPolicy` keeps parameters on CPU and streams them per layer. When true the manual
    `param_offload`/`optimizer_offload` flags are turned off (the policy owns placement)."""

    reshard_after_forward: bool = True
    """FSDP2: free the gathered parameters after forward (ZeRO-3); false keeps them until backward."""

    fsdp_size: int = -1
    """Ranks per FSDP shard group (hybrid sharding); -1 = all ranks."""

    forward_prefetch: bool = False
    """FSDP1: prefetch the next all-gather during forward."""

    model_dtype: str = "fp32"
    """dtype the weights are loaded in (fp32 | bf16 | fp16); master weights for the optimizer."""

    use_orig_params: bool = False
    """FSDP1 `use_orig_params` (needed for parameter-wise optimizer groups and LoRA)."""

    mixed_precision: Optional[dict[str, Any]] = None
    """FSDP mixed precision: {param_dtype, reduce_dtype, buffer_dtype}. null = params in `dtype`, gradient
    reduction and buffers in fp32."""

    ulysses_sequence_parallel_size: int = 1
    """Ulysses sequence-parallel group size (engine path). Linked to the role-level key of the same name."""

    entropy_from_logits_with_chunking: bool = False
    """Compute entropy in token chunks (engine path). Linked to the role-level key of the same name."""

    entropy_from_logits_chunk_size: int = 2048
    """Tokens per chunk for chunked log-prob/entropy. Linked to the role-level key of the same name."""

    entropy_checkpointing: bool = False
    """Recompute entropy in backward instead of storing the softmax. Linked to the role-level key."""

    dtype: str = "bfloat16"
    """Compute dtype of the FSDP mixed-precision policy (bfloat16 | float16 | float32)."""

    def __post_init__(self) -> None:
        if self.strategy is not None:
            require_choice("strategy", self.strategy, FSDP_STRATEGIES)
        require_choice("model_dtype", self.model_dtype, _DTYPES)
        require_choice("dtype", self.dtype, _DTYPES)
        require_positive("ulysses_sequence_parallel_size", self.ulysses_sequence_parallel_size)
        require_positive("entropy_from_logits_chunk_size", self.entropy_from_logits_chunk_size)
        if self.fsdp_size == 0 or self.fsdp_size < -1:
            raise ConfigError("fsdp_size", f"must be -1 (all ranks) or a positive group size, got {self.fsdp_size}.")
        _check_keys("wrap_policy", self.wrap_policy, _WRAP_POLICY_KEYS)
        if self.mixed_precision is not None:
            _check_keys("mixed_precision", self.mixed_precision, _MIXED_PRECISION_KEYS)
        if self.offload_policy and (self.param_offload or self.optimizer_offload):
            # Upstream semantics: CPUOffloadPolicy owns parameter placement, so manual offload is switched off.
            self._normalize("param_offload", False)
            self._normalize("optimizer_offload", False)


def _check_keys(name: str, mapping: dict[str, Any], allowed: tuple[str, ...]) -> None:
    unknown = sorted(set(mapping) - set(allowed))
    if unknown:
        raise ConfigError(f"{name}.{unknown[0]}", f"unknown key; {name} accepts: {', '.join(allowed)}.")


# Keys that exist on the role and on its fsdp_config and mean the same thing.
LINKED_ENGINE_KEYS = (
    "ulysses_sequence_parallel_size",
    "entropy_from_logits_with_chunking",
    "entropy_from_logits_chunk_size",
    "entropy_checkpointing",
    "use_torch_compile",
)


def link_role_and_engine(
    role: BaseConfig, engine_path: str = "fsdp_config", keys: tuple[str, ...] = LINKED_ENGINE_KEYS
) -> None:
    """Make `role.strategy` and each `role.<k>` (k in `keys`) one setting with `role.<engine_path>.<same key>`.

    `engine_path` is `fsdp_config` (actor, ref) or `model.fsdp_config` (critic).
    `strategy`: the engine's may only be null (then it takes the role's) or equal to it.
    Other keys: equal values are fine; if only one side differs from its declared default, that side wins
    and is copied to the other; if both were set to different values, raise. The engine config is replaced
    by an updated copy (never mutated), so an engine config shared between roles is never changed behind
    another role's back.
    """
    owner_path, _, engine_field = engine_path.rpartition(".")
    owner = getattr(role, owner_path) if owner_path else role
    engine = getattr(owner, engine_field)
    updates: dict[str, Any] = {}
    if engine.strategy is None:
        updates["strategy"] = role.strategy
    elif engine.strategy != role.strategy:
        raise ConfigError(
            f"{engine_path}.strategy",
            f"({engine.strategy}) contradicts {{node}}.strategy ({role.strategy}). {{node}}.strategy is the one key "
            f"that selects FSDP1/FSDP2 for this component: set only it and leave {engine_path}.strategy null.",
        )
    for key in keys:
        role_value, engine_value = getattr(role, key), getattr(engine, key)
        if role_value == engine_value:
            continue
        if engine_value == field_default(type(engine), key):
            updates[key] = role_value
        elif role_value == field_default(type(role), key):
            role._normalize(key, engine_value)
        else:
            raise ConfigError(
                f"{engine_path}.{key}",
                f"({engine_value!r}) contradicts {{node}}.{key} ({role_value!r}); they are one setting: set only "
                f"{{node}}.{key}.",
            )
    if not updates:
        return
    new_engine = dataclasses.replace(engine, **updates)
    if owner_path:
        role._normalize(owner_path, dataclasses.replace(owner, **{engine_field: new_engine}))
    else:
        role._normalize(engine_field, new_engine)


VEOMNI_SP_ATTENTION = {
    name: f"veomni_{name}_with_sp"
    for name in ("flash_attention_2", "flash_attention_3", "flash_attention_4", "flex_attention", "magi_attention")
}
"""`veomni.attn_implementation` values that have a Ulysses variant in VeOmni, and that variant's registered name
(veomni 0.1.12 registers these; its eager/sdpa attention has no all-to-all)."""


def veomni_attention(attn_implementation: str, ulysses_parallel_size: int) -> str:
    """The attention name VeOmni is given: its Ulysses variant under SP > 1. Eager/sdpa under SP would attend only
    within each rank's slice of the stream (silently wrong), so they are refused naming the key."""
    if ulysses_parallel_size == 1 or attn_implementation in VEOMNI_SP_ATTENTION.values():
        return attn_implementation
    if attn_implementation not in VEOMNI_SP_ATTENTION:
        raise ConfigError(
            "attn_implementation",
            f"({attn_implementation}) has no Ulysses sequence-parallel variant in VeOmni, but "
            f"{{node}}.ulysses_parallel_size is {ulysses_parallel_size}: use one of {sorted(VEOMNI_SP_ATTENTION)}, "
            "or ulysses_parallel_size=1.",
        )
    return VEOMNI_SP_ATTENTION[attn_implementation]


VEOMNI_TORCH_DTYPES = {"fp32": "float32", "float32": "float32", "bf16": "bfloat16", "bfloat16": "bfloat16"}
"""`veomni.model_dtype` spellings and the torch dtype name VeOmni takes for each."""


@dataclass
class VeOmniEngineConfig(BaseConfig):
    """Engine settings of ``strategy=veomni`` (FSDP2 + Ulysses + expert parallelism built by VeOmni)."""

    strategy: str = "veomni"
    """Always veomni (the role's strategy key selects this engine)."""

    router_replay: EngineRouterReplayConfig = field(default_factory=EngineRouterReplayConfig)
    """MoE router replay, engine-scoped (upstream's `actor.veomni.router_replay`; one setting with the actor's
    `router_replay`)."""

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
    """Attention kernel; with Ulysses > 1 it becomes VeOmni's ``veomni_<name>_with_sp`` (flash/flex/magi only)."""

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
        require_choice("model_dtype", self.model_dtype, tuple(VEOMNI_TORCH_DTYPES))
        veomni_attention(self.attn_implementation, self.ulysses_parallel_size)
        if self.fsdp_size == 0 or self.fsdp_size < -1:
            raise ConfigError("fsdp_size", f"must be -1 (all ranks) or a positive group size, got {self.fsdp_size}.")

    @property
    def ulysses_sequence_parallel_size(self) -> int:
        """The FSDP engine's name of ``ulysses_parallel_size``."""
        return self.ulysses_parallel_size
