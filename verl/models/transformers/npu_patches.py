"""Ascend fused-kernel patches (field-report item 7), one registry entry per kernel, applied to model instances.

Every patch here is optional (a speed-up): it changes the ``forward`` of the matching module *instances* of the
model being built (:func:`verl.models.transformers.instance_patch.set_forward`) — never a class for everyone,
never at import time — and raises :class:`PatchSkipped` when its target
class is missing from the installed transformers, the model has no such module, or ``torch_npu`` lacks the op.
The registry (``patch_registry.apply_patches(model, platform="npu")``) applies each in isolation and prints one
line per patch.

==========================  ===========================  ==============================================================
patch                       torch_npu op                 replaces
==========================  ===========================  ==============================================================
``npu-rms-norm``            ``npu_rms_norm``             ``x·rstd·w`` norms (Llama, Qwen2/3, Qwen3-MoE); Qwen3.5's
                            (``npu_gemma_rms_norm``)     zero-centred ``x·rstd·(1+w)`` norm and its SiLU-gated norm
``npu-rotary-mul``          ``npu_rotary_mul``           ``apply_rotary_pos_emb`` seen by each attention module
                                                         (Qwen3.5: partial rotary, pass-through dims kept)
``npu-swiglu``              ``npu_swiglu``               ``down(silu(gate(x)) · up(x))`` dense MLPs (also MoE shared
                                                         experts)
``npu-fusion-attention``    ``npu_fusion_attention``     attention for packed input (``cu_seq_lens_q`` given): TND
                                                         layout, causal per sequence; padded input keeps the
                                                         configured implementation
``npu-grouped-matmul-moe``  ``npu_grouped_matmul``       the expert loop of Qwen3-MoE / Qwen3.5-MoE: tokens sorted by
                                                         expert, two grouped GEMMs (custom autograd function)
==========================  ===========================  ==============================================================

The attention-level patches (rotary, attention) must change a *module-global* function the installed
transformers' attention ``forward`` looks up. Instead of patching that global, each attention instance gets a
copy of its class's ``forward`` whose globals map the name to the NPU version (:func:`rebind_forward_globals`):
the exact installed forward code runs, only for that instance.

The replacement forwards look ``torch_npu`` up when they run (it is loaded once per process) instead of holding
it, so a patched model can be deep-copied and pickled. Each reports to the start-up probe
(:mod:`verl.models.transformers.patch_probe`) under its patch name.
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn as nn
import torch.nn.functional as F

from verl.models.transformers.forward_globals import WrappedAttentionFunctions, innermost, rebind_forward_globals
from verl.models.transformers.instance_patch import original_class, set_forward
from verl.models.transformers.patch_probe import record_call
from verl.models.transformers.patch_registry import ModelPatch, PatchSkipped, register_patch
from verl.models.transformers.varlen_attention import VARLEN_ATTENTION_ATTR
from verl.utils.platform.npu import import_torch_npu

__all__ = ["FAMILIES", "NPU_PATCHES", "NPUGroupedMatmul"]

SUPPORTED_TRANSFORMERS = ">=5.4.0,<6"
_PATCHED_ATTR = "_verl_npu_patches"
_CAUSAL_MASK_SIZE = 2048  # npu_fusion_attention's compressed causal mask is 2048 x 2048 (sparse_mode 2/3)


@dataclass(frozen=True)
class Family:
    """Where a model family's classes live (``transformers.models.<module>.modeling_<module>``) and their names."""

    module: str
    rms_norm: tuple[str, ...] = ()
    zero_centred_norm: tuple[str, ...] = ()
    gated_norm: tuple[str, ...] = ()
    mlp: tuple[str, ...] = ()
    attention: tuple[str, ...] = ()
    experts: tuple[str, ...] = ()


FAMILIES: dict[str, Family] = {
    "llama": Family("llama", rms_norm=("LlamaRMSNorm",), mlp=("LlamaMLP",), attention=("LlamaAttention",)),
    "qwen2": Family("qwen2", rms_norm=("Qwen2RMSNorm",), mlp=("Qwen2MLP",), attention=("Qwen2Attention",)),
    "qwen3": Family("qwen3", rms_norm=("Qwen3RMSNorm",), mlp=("Qwen3MLP",), attention=("Qwen3Attention",)),
    "qwen3_moe": Family(
        "qwen3_moe",
        rms_norm=("Qwen3MoeRMSNorm",),
        mlp=("Qwen3MoeMLP",),
        attention=("Qwen3MoeAttention",),
        experts=("Qwen3MoeExperts",),
    ),
    "qwen3_5": Family(
        "qwen3_5",
        zero_centred_norm=("Qwen3_5RMSNorm",),
        gated_norm=("Qwen3_5RMSNormGated",),
        mlp=("Qwen3_5MLP",),
        attention=("Qwen3_5Attention",),
    ),
    "qwen3_5_moe": Family(
        "qwen3_5_moe",
        zero_centred_norm=("Qwen3_5MoeRMSNorm",),
        gated_norm=("Qwen3_5MoeRMSNormGated",),
        mlp=("Qwen3_5MoeMLP",),
        attention=("Qwen3_5MoeAttention",),
        experts=("Qwen3_5MoeExperts",),
    ),
}


# ---- shared helpers ------------------------------------------------------------------------------------------------


def _npu() -> Any:
    """The loaded torch_npu, for a patched forward (the patch checked at apply time that it imports)."""
    module, error = import_torch_npu()
    if module is None:
        raise RuntimeError(f"an NPU-patched module runs but torch_npu no longer imports ({error})")
    return module


def _torch_npu(*ops: str) -> Any:
    module, error = import_torch_npu()
    if module is None:
        raise PatchSkipped(f"torch_npu is not importable ({type(error).__name__}: {error})")
    missing = [op for op in ops if not hasattr(module, op)]
    if missing:
        raise PatchSkipped(f"torch_npu {getattr(module, '__version__', '?')} has no {', '.join(missing)}")
    return module


def _family(model: nn.Module) -> Family:
    model_type = getattr(getattr(model, "config", None), "model_type", None) or ""
    for suffix in ("_text", "_vision"):
        model_type = model_type.removesuffix(suffix)
    if model_type not in FAMILIES:
        raise PatchSkipped(f"no NPU kernel mapping for model_type {model_type!r}")
    return FAMILIES[model_type]


def _classes(family: Family, names: Iterable[str]) -> tuple[type, ...]:
    """The named classes from the installed transformers; PatchSkipped naming the first one that is missing."""
    module_name = f"transformers.models.{family.module}.modeling_{family.module}"
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        raise PatchSkipped(f"{module_name} is not in the installed transformers ({e})") from None
    classes = []
    for name in names:
        cls = getattr(module, name, None)
        if cls is None:
            import transformers

            raise PatchSkipped(f"transformers {transformers.__version__} has no {module_name}.{name}")
        classes.append(cls)
    if not classes:
        raise PatchSkipped(f"model family {family.module!r} has no such module type")
    return tuple(classes)


def _instances(model: nn.Module, classes: tuple[type, ...], patch: str) -> list[nn.Module]:
    """Modules of exactly these classes (before any patch gave them a forward of their own) not yet patched by
    ``patch``; PatchSkipped when the model has none."""
    found = [m for m in model.modules() if original_class(m) in classes]
    if not found:
        raise PatchSkipped(f"the model has no {'/'.join(c.__name__ for c in classes)} module")
    return [m for m in found if patch not in getattr(m, _PATCHED_ATTR, ())]


def _mark(module: nn.Module, patch: str) -> None:
    object.__setattr__(module, _PATCHED_ATTR, (*getattr(module, _PATCHED_ATTR, ()), patch))


# ---- RMSNorm ------------------------------------------------------------------------------------------------------


def _rms_norm_forward(self: nn.Module, hidden_states: torch.Tensor) -> torch.Tensor:
    """y = x·rstd·w (x's dtype), as Llama/Qwen RMSNorm when weight and input share a dtype."""
    record_call("npu-rms-norm")
    return _npu().npu_rms_norm(hidden_states.contiguous(), self.weight, epsilon=self.variance_epsilon)[0]


def _zero_centred_norm_forward(self: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """Qwen3.5: y = (x·rstd·(1 + w)) computed in fp32, cast to x's dtype (docs/qwen3_5.md, "Norms")."""
    record_call("npu-rms-norm")
    torch_npu = _npu()
    x = x.contiguous()
    if hasattr(torch_npu, "npu_gemma_rms_norm"):
        return torch_npu.npu_gemma_rms_norm(x, self.weight, epsilon=self.eps)[0]
    # Older torch_npu: the same map through npu_rms_norm with gamma = 1 + w (rounded to x's dtype).
    return torch_npu.npu_rms_norm(x, (1.0 + self.weight.float()).to(x.dtype), epsilon=self.eps)[0]


def _gated_norm_forward(self: nn.Module, hidden_states: torch.Tensor, gate: torch.Tensor):
    """Qwen3.5 GDN output norm: (w·norm(x)) · silu(gate) in fp32, cast to x's dtype."""
    record_call("npu-rms-norm")
    normed = _npu().npu_rms_norm(hidden_states.contiguous(), self.weight, epsilon=self.variance_epsilon)[0]
    return (normed.float() * F.silu(gate.float())).to(hidden_states.dtype)


_NORM_ROLES = (
    ("rms_norm", _rms_norm_forward, "variance_epsilon"),
    ("zero_centred_norm", _zero_centred_norm_forward, "eps"),
    ("gated_norm", _gated_norm_forward, "variance_epsilon"),
)


def apply_npu_rms_norm(model: nn.Module) -> None:
    """Each norm role of the family is patched on its own: a role whose class is missing is left unpatched."""
    _torch_npu("npu_rms_norm")
    family = _family(model)
    reasons, patched = [], 0
    for role, forward, eps_attr in _NORM_ROLES:
        names = getattr(family, role)
        if not names:
            continue
        try:
            modules = _instances(model, _classes(family, names), "npu-rms-norm")
        except PatchSkipped as e:
            reasons.append(str(e))
            continue
        for module in modules:
            if not hasattr(module, eps_attr):
                raise PatchSkipped(
                    f"{type(module).__name__} has no {eps_attr!r}; its forward changed in this transformers"
                )
            set_forward(module, forward)
            _mark(module, "npu-rms-norm")
            patched += 1
    if patched == 0 and reasons:
        raise PatchSkipped("; ".join(reasons))


# ---- rotary embedding ---------------------------------------------------------------------------------------------


def _npu_apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=1):
    """HF ``apply_rotary_pos_emb`` through ``npu_rotary_mul`` (rotate-half); the dims past cos's last dim (partial
    rotary, Qwen3.5) pass through unchanged. q/k (B, N, S, D), cos/sin (B, S, D_rot)."""
    record_call("npu-rotary-mul")
    torch_npu = _npu()
    cos = cos.unsqueeze(unsqueeze_dim).contiguous()
    sin = sin.unsqueeze(unsqueeze_dim).contiguous()
    rotary_dim = cos.shape[-1]

    def rotate(x: torch.Tensor) -> torch.Tensor:
        if rotary_dim == x.shape[-1]:
            return torch_npu.npu_rotary_mul(x.contiguous(), cos, sin)
        rotated = torch_npu.npu_rotary_mul(x[..., :rotary_dim].contiguous(), cos, sin)
        return torch.cat([rotated, x[..., rotary_dim:]], dim=-1)

    return rotate(q), rotate(k)


def apply_npu_rotary_mul(model: nn.Module) -> None:
    _torch_npu("npu_rotary_mul")
    family = _family(model)
    for module in _instances(model, _classes(family, family.attention), "npu-rotary-mul"):
        rebind_forward_globals(module, apply_rotary_pos_emb=_npu_apply_rotary_pos_emb)
        _mark(module, "npu-rotary-mul")


# ---- SwiGLU --------------------------------------------------------------------------------------------------------


def _swiglu_forward(self: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """down(silu(gate(x)) · up(x)) with the product fused: npu_swiglu(cat(gate(x), up(x)))."""
    record_call("npu-swiglu")
    fused = torch.cat((self.gate_proj(x), self.up_proj(x)), dim=-1)
    return self.down_proj(_npu().npu_swiglu(fused, dim=-1))


def _is_silu(act: Any) -> bool:
    return isinstance(act, nn.SiLU) or act is F.silu or type(act).__name__ in ("SiLU", "SiLUActivation")


def apply_npu_swiglu(model: nn.Module) -> None:
    _torch_npu("npu_swiglu")
    family = _family(model)
    modules = _instances(model, _classes(family, family.mlp), "npu-swiglu")
    if any(not _is_silu(getattr(m, "act_fn", None)) for m in modules):
        raise PatchSkipped("hidden_act is not silu; npu_swiglu would change the activation")
    for module in modules:
        set_forward(module, _swiglu_forward)
        _mark(module, "npu-swiglu")


# ---- flash attention, TND varlen layout -----------------------------------------------------------------------------


def _npu_varlen_attention(
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    *,
    fallback: Callable,
    dropout: float = 0.0,
    scaling: float | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """Packed attention with ``npu_fusion_attention`` (TND): q (1, N, T, D), k/v (1, N_kv, T, D) → (1, T, N, D).

    Sequences are the ``cu_seq_lens_q/k`` segments (cumulative lengths handed to the kernel as host lists); each
    is causal (sparse_mode 3 with the 2048² compressed mask). Without ``cu_seq_lens_q`` (padded batches), with a
    sliding window or a non-causal module, the configured attention function runs instead.
    """
    cu_q = kwargs.get("cu_seq_lens_q")
    unsupported = getattr(module, "sliding_window", None) or not getattr(module, "is_causal", True)
    if cu_q is None or query.shape[0] != 1 or unsupported:
        return fallback(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs)
    cu_k = kwargs.get("cu_seq_lens_k", cu_q)
    record_call("npu-fusion-attention")
    q, k, v = (t[0].transpose(0, 1).contiguous() for t in (query, key, value))  # (T, N, D)
    out = _npu().npu_fusion_attention(
        q,
        k,
        v,
        q.shape[1],
        "TND",
        atten_mask=_causal_mask(q.device),
        scale=scaling if scaling is not None else q.shape[-1] ** -0.5,
        keep_prob=1.0 - dropout,
        sparse_mode=3,
        actual_seq_qlen=cu_q[1:].tolist(),
        actual_seq_kvlen=cu_k[1:].tolist(),
    )[0]
    return out.unsqueeze(0), None


_CAUSAL_MASKS: dict[torch.device, torch.Tensor] = {}  # the compressed causal mask, built once per device


def _causal_mask(device: torch.device) -> torch.Tensor:
    if device not in _CAUSAL_MASKS:
        ones = torch.ones(_CAUSAL_MASK_SIZE, _CAUSAL_MASK_SIZE, dtype=torch.bool, device=device)
        _CAUSAL_MASKS[device] = torch.triu(ones, diagonal=1)  # True = masked out (NPU convention)
    return _CAUSAL_MASKS[device]


def _npu_attention_wrap(fn: Callable, _name: str = "") -> Callable:
    return functools.partial(_npu_varlen_attention, fallback=fn)


def apply_npu_fusion_attention(model: nn.Module) -> None:
    _torch_npu("npu_fusion_attention")
    family = _family(model)
    for module in _instances(model, _classes(family, family.attention), "npu-fusion-attention"):
        forward = innermost(original_class(module).forward)
        registry = forward.__globals__.get("ALL_ATTENTION_FUNCTIONS")
        if registry is None:
            raise PatchSkipped(f"{type(module).__name__}.forward does not use ALL_ATTENTION_FUNCTIONS")
        replacements = {"ALL_ATTENTION_FUNCTIONS": WrappedAttentionFunctions(registry, _npu_attention_wrap)}
        eager = forward.__globals__.get("eager_attention_forward")
        if eager is not None and "eager_attention_forward" in forward.__code__.co_names:
            replacements["eager_attention_forward"] = _npu_attention_wrap(eager)
        rebind_forward_globals(module, **replacements)
        _mark(module, "npu-fusion-attention")
        if not getattr(module, "sliding_window", None) and getattr(module, "is_causal", True):
            object.__setattr__(module, VARLEN_ATTENTION_ATTR, True)  # packed input needs no T x T mask


# ---- grouped-matmul MoE ----------------------------------------------------------------------------------------------


class NPUGroupedMatmul(torch.autograd.Function):
    """``y[rows_g] = x[rows_g] @ w[g]`` over contiguous row groups with ``npu_grouped_matmul`` (it has no autograd).

    Shapes: x (M, K) rows sorted by group, weight (G, K, N), group_sizes (G,) int64 counts → y (M, N).
    Backward: dx = grouped(dy, wᵀ) (groups along M); dw_g = x[rows_g]ᵀ @ dy[rows_g] (groups along K = the
    contraction axis, ``group_type=2``).
    """

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, weight: torch.Tensor, group_sizes: torch.Tensor, torch_npu: Any):
        ctx.save_for_backward(x, weight, group_sizes)
        ctx.torch_npu = torch_npu
        return torch_npu.npu_grouped_matmul(
            [x], [weight], group_list=group_sizes, split_item=3, group_type=0, group_list_type=1
        )[0]

    @staticmethod
    def backward(ctx: Any, grad_out: torch.Tensor):
        x, weight, group_sizes = ctx.saved_tensors
        gmm = ctx.torch_npu.npu_grouped_matmul
        grad_out = grad_out.contiguous()
        grad_x = gmm(
            [grad_out], [weight.transpose(1, 2)], group_list=group_sizes, split_item=3, group_type=0, group_list_type=1
        )[0]
        grad_w = gmm(
            [x.t().contiguous()], [grad_out], group_list=group_sizes, split_item=3, group_type=2, group_list_type=1
        )[0]
        return grad_x, grad_w, None, None


def _grouped_experts_forward(
    self: nn.Module,
    hidden_states: torch.Tensor,
    top_k_index: torch.Tensor,
    top_k_weights: torch.Tensor,
) -> torch.Tensor:
    """HF experts (gate_up_proj (E, 2I, H), down_proj (E, H, I)) with two grouped GEMMs.

    hidden_states (T, H), top_k_index/top_k_weights (T, k) → (T, H): each (token, slot) pair is routed to its
    expert, rows are sorted by expert (stable), ``swiglu`` joins the two halves of gate_up, and the weighted expert
    outputs are summed back per token.
    """
    record_call("npu-grouped-matmul-moe")
    torch_npu = _npu()
    num_slots = top_k_index.shape[1]
    flat_expert = top_k_index.reshape(-1)
    order = torch.argsort(flat_expert, stable=True)
    token_of_row = order // num_slots
    group_sizes = torch.bincount(flat_expert, minlength=self.num_experts).to(torch.int64)
    rows = hidden_states[token_of_row].contiguous()  # (T*k, H), grouped by expert
    gate_up = NPUGroupedMatmul.apply(rows, self.gate_up_proj.transpose(1, 2), group_sizes, torch_npu)
    activated = torch_npu.npu_swiglu(gate_up, dim=-1)  # silu(gate) * up, the [gate; up] halves of gate_up_proj
    expert_out = NPUGroupedMatmul.apply(activated, self.down_proj.transpose(1, 2), group_sizes, torch_npu)
    weighted = expert_out * top_k_weights.reshape(-1)[order].unsqueeze(-1)
    output = torch.zeros_like(hidden_states)
    return output.index_add_(0, token_of_row, weighted.to(output.dtype))


def _check_expert_layout(module: nn.Module) -> None:
    gate_up, down = getattr(module, "gate_up_proj", None), getattr(module, "down_proj", None)
    if not isinstance(gate_up, torch.Tensor) or not isinstance(down, torch.Tensor) or gate_up.dim() != 3:
        raise PatchSkipped(f"{type(module).__name__} does not store fused 3-D expert weights")
    experts, two_inter, hidden = gate_up.shape
    if getattr(module, "has_bias", False) or tuple(down.shape) != (experts, hidden, two_inter // 2):
        raise PatchSkipped(f"{type(module).__name__} expert weights are not laid out as (E, 2I, H) / (E, H, I)")
    if not _is_silu(getattr(module, "act_fn", None)):
        raise PatchSkipped("expert activation is not silu")


def apply_npu_grouped_matmul_moe(model: nn.Module) -> None:
    _torch_npu("npu_grouped_matmul", "npu_swiglu")
    family = _family(model)
    if not family.experts:
        raise PatchSkipped(f"model family {family.module!r} has no routed experts")
    modules = _instances(model, _classes(family, family.experts), "npu-grouped-matmul-moe")
    for module in modules:
        _check_expert_layout(module)
    for module in modules:
        set_forward(module, _grouped_experts_forward)
        _mark(module, "npu-grouped-matmul-moe")


# ---- registration ------------------------------------------------------------------------------------------------


def _patch(name: str, apply: Callable[[nn.Module], None], families: tuple[str, ...], description: str) -> ModelPatch:
    return register_patch(
        ModelPatch(
            name=name,
            model_types=families,
            platforms=("npu",),
            apply=apply,
            required=False,
            transformers=SUPPORTED_TRANSFORMERS,
            description=description,
            probe_key=name,
        )
    )


_ALL = tuple(FAMILIES)
NPU_PATCHES: tuple[ModelPatch, ...] = (
    _patch("npu-rms-norm", apply_npu_rms_norm, _ALL, "RMSNorm (plain, zero-centred, gated) -> torch_npu.npu_rms_norm"),
    _patch("npu-rotary-mul", apply_npu_rotary_mul, _ALL, "rotary embedding -> torch_npu.npu_rotary_mul"),
    _patch("npu-swiglu", apply_npu_swiglu, _ALL, "SiLU-gated MLP -> torch_npu.npu_swiglu"),
    _patch(
        "npu-fusion-attention",
        apply_npu_fusion_attention,
        _ALL,
        "packed attention -> torch_npu.npu_fusion_attention (TND, cu_seqlens)",
    ),
    _patch(
        "npu-grouped-matmul-moe",
        apply_npu_grouped_matmul_moe,
        ("qwen3_moe", "qwen3_5_moe"),
        "routed experts -> torch_npu.npu_grouped_matmul",
    ),
)
