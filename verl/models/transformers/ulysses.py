"""Ulysses sequence parallelism inside HF models: the per-forward context and the attention wrapper.

Under SP every rank runs the model on its slice ``(1, T_pad / sp)`` of the packed stream (``forward_packed``
slices it, see :func:`verl.utils.ulysses.shard_packed_batch`). Token-local layers need nothing. Each token mixer
receives the :class:`UlyssesContext` as the kwarg ``verl_ulysses`` (:data:`ULYSSES_KWARG`) and swaps the split
from sequence to heads around its sequence maths:

* full attention (this module): q/k/v ``(1, heads, T_pad/sp, d)`` --all-to-all--> ``(1, heads/sp, T_pad, d)``,
  the configured attention (sdpa / eager / flash / the NPU varlen kernel) on whole sequences with the
  ``cu_seqlens`` of the whole stream, then the output back to ``(1, T_pad/sp, heads, d)``. RoPE was already
  applied per token with the local position ids. With fewer KV heads than ranks (Qwen3.5: 2), the KV heads are
  replicated first so that every rank holds the KV head of its query heads.
* Qwen3.5 Gated DeltaNet: see ``verl.models.transformers.qwen3_5`` (same all-to-all on its conv channels and
  value heads).

Like HF's own ``cu_seqlens`` channel, the context is a *kwarg*: gradient checkpointing re-runs a layer with its
bound kwargs, so the recomputation in backward sees the same context as the forward.

The attention wrapper is installed on each attention *instance* (``self_attn`` modules of the decoder, never the
vision tower): the instance gets a copy of its class's ``forward`` whose global ``ALL_ATTENTION_FUNCTIONS`` wraps
every lookup (the mechanism of ``npu_patches``; an NPU attention replacement already on the instance is kept and
runs inside the SP wrapper). Without a context the wrapper calls the configured attention unchanged, so padded
forwards and generation are unaffected.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch
import torch.nn as nn
from torch.distributed import ProcessGroup

from verl.models.transformers.forward_globals import (
    FORWARD_GLOBALS_ATTR,
    WrappedAttentionFunctions,
    innermost,
    rebind_forward_globals,
)
from verl.models.transformers.instance_patch import original_class
from verl.models.transformers.varlen_attention import VARLEN_ATTENTION_ATTR
from verl.utils.packing import seq_idx_from_cu_seqlens
from verl.utils.ulysses import UlyssesShard, gather_heads_scatter_seq, gather_seq_scatter_heads

__all__ = [
    "ULYSSES_KWARG",
    "ULYSSES_MIXER_ATTR",
    "UlyssesContext",
    "apply_ulysses_attention",
    "prepare_model_for_ulysses",
    "ulysses_attention",
]

ULYSSES_KWARG = "verl_ulysses"
# Set on a token-mixer instance whose forward handles ULYSSES_KWARG; the value checks an SP size:
# ``check(module, sp_size) -> None`` raising ValueError when the mixer's heads cannot be split.
ULYSSES_MIXER_ATTR = "_verl_ulysses_mixer"
_ATTENTION_ATTR = "_verl_ulysses_attention"
_MASKED_IMPLEMENTATIONS = ("sdpa", "eager")
_SP_KEY = "ulysses_sequence_parallel_size"


class UlyssesContext:
    """What every token mixer needs during one SP forward.

    Attributes:
        group: the SP process group.
        world_size: ranks in ``group``.
        rank: this rank in ``group``.
        cu_seqlens: ``(N + 1,)`` int32 boundaries of the whole padded stream (the padding is its own sequence).
        max_seqlen: longest sequence of the padded stream.
        attention_calls / mixer_calls: SP attention / recurrent-mixer calls seen (checked after the forward).

    Deliberately not a dataclass: FSDP's forward-input handling (``torch.distributed.utils._apply_to_tensors``, used
    to cast or move the kwargs) rebuilds every dataclass it meets, so the layers would count their calls on a copy
    and the post-forward check would see none. Plain objects pass through FSDP unchanged.
    """

    def __init__(self, group: ProcessGroup, world_size: int, rank: int, cu_seqlens: torch.Tensor, max_seqlen: int):
        self.group = group
        self.world_size = world_size
        self.rank = rank
        self.cu_seqlens = cu_seqlens
        self.max_seqlen = max_seqlen
        self.attention_calls = 0
        self.mixer_calls = 0
        self._masks: dict = {}

    def __repr__(self) -> str:
        return f"UlyssesContext(world_size={self.world_size}, rank={self.rank}, tokens={self.padded_tokens})"

    @classmethod
    def from_shard(cls, shard: UlyssesShard, group: ProcessGroup) -> UlyssesContext:
        return cls(group, shard.sp_size, shard.sp_rank, shard.cu_seqlens, shard.max_seqlen)

    @property
    def padded_tokens(self) -> int:
        return int(self.cu_seqlens[-1])

    def attention_mask(self, implementation: str, dtype: torch.dtype, device: torch.device) -> torch.Tensor | None:
        """The mask HF would build for the whole padded stream: ``(1, 1, T, T)`` block-diagonal causal, bool for
        sdpa (True = attend), additive for eager (0 / dtype min); None for varlen kernels (they take cu_seqlens).
        Built once per forward and implementation."""
        if implementation not in _MASKED_IMPLEMENTATIONS:
            return None
        key = (implementation, dtype, device)
        if key not in self._masks:
            total = self.padded_tokens
            segment = seq_idx_from_cu_seqlens(self.cu_seqlens.to(device), total)
            causal = torch.ones(total, total, dtype=torch.bool, device=device).tril()
            allowed = (segment[:, None] == segment[None, :]) & causal
            if implementation == "eager":
                additive = torch.zeros(total, total, dtype=dtype, device=device)
                allowed = additive.masked_fill_(~allowed, torch.finfo(dtype).min)
            self._masks[key] = allowed[None, None]
        return self._masks[key]

    def check_calls(self, attention: int, mixers: int) -> None:
        """Every SP-capable layer must have run through its SP path exactly once in the forward."""
        if (self.attention_calls, self.mixer_calls) != (attention, mixers):
            raise RuntimeError(
                f"Ulysses SP forward: {self.attention_calls}/{attention} attention and {self.mixer_calls}/{mixers} "
                "recurrent layers ran sequence-parallel; the others computed on a sequence slice only (a later patch "
                "replaced the SP attention wrapper?). Apply model patches before the first SP forward."
            )


class _HeadsView:
    """The attention module as seen by the inner attention after the all-to-all: all attributes of the module,
    except ``num_key_value_groups``, which is that of the local head shard (differs when KV heads were replicated)."""

    def __init__(self, module: nn.Module, num_key_value_groups: int):
        self._module = module
        self.num_key_value_groups = num_key_value_groups

    def __getattr__(self, name: str) -> Any:
        return getattr(self._module, name)


def _replicate_kv_heads(x: torch.Tensor, world_size: int) -> torch.Tensor:
    """``(1, kv, T, d) -> (1, max(kv, world), T, d)``: each KV head repeated next to itself, so that after the
    scatter over heads rank r holds the KV head of its query heads (query head i uses KV head i // (H / kv))."""
    kv_heads = x.shape[1]
    return x if kv_heads % world_size == 0 else x.repeat_interleave(world_size // kv_heads, dim=1)


def ulysses_attention(
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    *,
    inner: Callable,
    implementation: str,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """Sequence-parallel attention around ``inner`` (an HF attention function).

    Shapes (HF convention): query ``(1, H, T_loc, d)``, key/value ``(1, KV, T_loc, d)`` -> output
    ``(1, T_loc, H, d)``. Without a :class:`UlyssesContext` in ``kwargs`` this is ``inner`` itself.
    """
    ctx: UlyssesContext | None = kwargs.pop(ULYSSES_KWARG, None)
    if ctx is None or ctx.world_size == 1:
        return inner(module, query, key, value, attention_mask, **kwargs)
    ctx.attention_calls += 1
    key, value = _replicate_kv_heads(key, ctx.world_size), _replicate_kv_heads(value, ctx.world_size)
    # (1, heads, T_loc, d) -> (1, heads / sp, T_pad, d)
    q, k, v = (gather_seq_scatter_heads(t, seq_dim=2, head_dim=1, group=ctx.group) for t in (query, key, value))
    # the local position ids describe a slice; the whole stream's boundaries are the context's cu_seqlens
    kwargs.pop("position_ids", None)
    kwargs.update(
        cu_seq_lens_q=ctx.cu_seqlens,
        cu_seq_lens_k=ctx.cu_seqlens,
        max_length_q=ctx.max_seqlen,
        max_length_k=ctx.max_seqlen,
    )
    # an attention that runs packed input from cu_seqlens (verl.models.transformers.varlen_attention) needs no mask
    varlen = getattr(module, VARLEN_ATTENTION_ATTR, False)
    mask = None if varlen else ctx.attention_mask(implementation, q.dtype, q.device)
    groups = q.shape[1] // k.shape[1]
    target = module if groups == getattr(module, "num_key_value_groups", groups) else _HeadsView(module, groups)
    out, _ = inner(target, q, k, v, mask, **kwargs)  # (1, T_pad, heads / sp, d)
    return gather_heads_scatter_seq(out, head_dim=2, seq_dim=1, group=ctx.group), None


def _ulysses_wrap(inner: Callable, implementation: str) -> Callable:
    """What ``ALL_ATTENTION_FUNCTIONS`` returns inside a wrapped attention forward: :func:`ulysses_attention` around
    what the wrapped registry (HF's, or an NPU / varlen replacement) returns."""
    return functools.partial(ulysses_attention, inner=inner, implementation=implementation)


def _unwrap_fsdp1(module: nn.Module) -> nn.Module:
    while isinstance(getattr(module, "_fsdp_wrapped_module", None), nn.Module):
        module = module._fsdp_wrapped_module
    return module


def _attention_modules(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """The decoder's attention modules (HF names them ``self_attn``; the vision tower's are ``attn``)."""
    found, seen = [], set()
    for name, module in model.named_modules():
        if name.rsplit(".", 1)[-1] != "self_attn":
            continue
        module = _unwrap_fsdp1(module)
        if id(module) not in seen:
            seen.add(id(module))
            found.append((name, module))
    return found


def _check_attention_heads(name: str, module: nn.Module, sp_size: int) -> None:
    config = module.config
    heads, kv_heads = config.num_attention_heads, config.num_key_value_heads
    if heads % sp_size or (kv_heads % sp_size and sp_size % kv_heads):
        raise ValueError(
            f"{_SP_KEY}={sp_size} cannot split the attention of {name}: it must divide the {heads} attention "
            f"heads, and divide or be a multiple of the {kv_heads} key/value heads"
        )
    if getattr(module, "sliding_window", None):
        raise ValueError(f"{_SP_KEY}={sp_size}: sliding-window attention ({name}) is not supported with Ulysses SP")


def apply_ulysses_attention(model: nn.Module) -> int:
    """Install the SP attention wrapper on every decoder attention instance of ``model`` (idempotent).

    Returns:
        The number of attention modules that carry the wrapper.

    Raises:
        ValueError: an attention module's forward does not look its kernel up in ``ALL_ATTENTION_FUNCTIONS``.
    """
    count = 0
    for name, module in _attention_modules(model):
        if not getattr(module, _ATTENTION_ATTR, False):
            forward = innermost(original_class(module).forward)
            if "ALL_ATTENTION_FUNCTIONS" not in forward.__code__.co_names:
                raise ValueError(
                    f"{type(module).__name__} ({name}) does not dispatch through ALL_ATTENTION_FUNCTIONS in this "
                    f"transformers version, so Ulysses SP cannot wrap it; set {_SP_KEY}=1"
                )
            current = getattr(module, FORWARD_GLOBALS_ATTR, {}).get("ALL_ATTENTION_FUNCTIONS")
            current = current if current is not None else forward.__globals__["ALL_ATTENTION_FUNCTIONS"]
            rebind_forward_globals(module, ALL_ATTENTION_FUNCTIONS=WrappedAttentionFunctions(current, _ulysses_wrap))
            object.__setattr__(module, _ATTENTION_ATTR, True)
        count += 1
    return count


def prepare_model_for_ulysses(model: nn.Module, sp_size: int) -> tuple[int, int]:
    """Check that ``model`` can run with ``sp_size`` SP ranks and install the attention wrapper.

    Returns:
        ``(attention modules, recurrent mixers)`` that run sequence-parallel in one forward.

    Raises:
        ValueError: heads not divisible (names ``ulysses_sequence_parallel_size``), or a recurrent mixer (e.g. a
            Qwen3.5 GatedDeltaNet) without SP support (its varlen patch was not applied).
    """
    attention = _attention_modules(model)
    for name, module in attention:
        _check_attention_heads(name, module, sp_size)
    mixers = 0
    for name, module in model.named_modules():
        check = getattr(module, ULYSSES_MIXER_ATTR, None)
        if check is not None:
            check(module, sp_size)
            mixers += 1
        elif type(module).__name__.endswith("GatedDeltaNet"):
            raise ValueError(
                f"{name} ({type(module).__name__}) has no sequence-parallel forward; apply the model patches "
                "(verl.models.transformers.patch_registry.apply_patches) before the first forward"
            )
    return apply_ulysses_attention(model), mixers
