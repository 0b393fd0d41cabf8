"""Ulysses sequence parallelism (SP): the process group, the collectives, and slicing the packed stream.

Ulysses splits the *sequence* of the one packed row ``(1, T)`` over the ``sp`` ranks of a group: every token-local
layer (embeddings, norms, MLP/MoE, projections, LM head) runs on ``T / sp`` tokens per rank. Token mixers need the
whole sequence, so around each one an all-to-all swaps the split from sequence to heads::

    (1, T/sp, heads, d) --gather_seq_scatter_heads--> (1, T, heads/sp, d)    mixer on whole sequences
    (1, T, heads/sp, d) --gather_heads_scatter_seq--> (1, T/sp, heads, d)

``T`` is first right-padded to a multiple of ``sp``; the padding forms a sequence of its own (its own
``cu_seqlens`` segment, positions restarting at 0), so it never mixes with real tokens.

Names and signatures follow upstream ``verl/utils/ulysses.py``. Every tensor handed to a collective is made
contiguous first (field-report item 4: strided inputs are mis-read or rejected by collectives on NPU).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
from torch.distributed import ProcessGroup

from verl.upstream_gaps import missing_name_getattr
from verl.utils.packing import PackedBatch, validate_cu_seqlens

if TYPE_CHECKING:
    from verl.protocol import DataProto

__all__ = [
    "FSDPUlyssesShardingManager",
    "Gather",
    "SeqAllToAll",
    "UlyssesShard",
    "all_gather_tensor",
    "all_to_all_tensor",
    "gather_heads_scatter_seq",
    "gather_outputs_and_unpad",
    "gather_outpus_and_unpad",
    "gather_seq_scatter_heads",
    "get_ulysses_sequence_parallel_group",
    "get_ulysses_sequence_parallel_rank",
    "get_ulysses_sequence_parallel_world_size",
    "set_ulysses_sequence_parallel_group",
    "shard_packed_batch",
    "slice_input_tensor",
    "ulysses_pad",
    "ulysses_pad_and_slice_inputs",
    "validate_ulysses_config",
]

# The SP group of this process (None: SP disabled). Set by the worker once its device mesh exists.
_ULYSSES_SEQUENCE_PARALLEL_GROUP: ProcessGroup | None = None


def set_ulysses_sequence_parallel_group(group: ProcessGroup | None) -> None:
    """Install ``group`` as this process's SP group (None disables SP)."""
    global _ULYSSES_SEQUENCE_PARALLEL_GROUP
    _ULYSSES_SEQUENCE_PARALLEL_GROUP = group


def get_ulysses_sequence_parallel_group() -> ProcessGroup | None:
    """The SP group set by :func:`set_ulysses_sequence_parallel_group`, or None."""
    return _ULYSSES_SEQUENCE_PARALLEL_GROUP


def _resolve(group: ProcessGroup | None) -> ProcessGroup | None:
    return group if group is not None else _ULYSSES_SEQUENCE_PARALLEL_GROUP


def get_ulysses_sequence_parallel_world_size(group: ProcessGroup | None = None) -> int:
    """Size of ``group`` (default: the installed SP group); 1 without a group or without torch.distributed."""
    group = _resolve(group)
    if group is None or not dist.is_initialized():
        return 1
    return dist.get_world_size(group)


def get_ulysses_sequence_parallel_rank(group: ProcessGroup | None = None) -> int:
    """Rank of this process in ``group`` (default: the installed SP group); 0 without a group."""
    group = _resolve(group)
    if group is None or not dist.is_initialized():
        return 0
    return dist.get_rank(group)


def validate_ulysses_config(num_heads: int, ulysses_sequence_size: int) -> None:
    """Raise if ``num_heads`` attention heads cannot be split over ``ulysses_sequence_size`` ranks."""
    if ulysses_sequence_size < 1 or num_heads % ulysses_sequence_size != 0:
        raise ValueError(
            f"ulysses_sequence_parallel_size={ulysses_sequence_size} must divide the number of attention heads "
            f"({num_heads}); choose a divisor of {num_heads}"
        )


# ---- raw collectives --------------------------------------------------------------------------------------------


def all_to_all_tensor(
    local_input: torch.Tensor,
    scatter_dim: int,
    gather_dim: int,
    group: ProcessGroup | None = None,
    async_op: bool = False,
) -> torch.Tensor | Callable[[], torch.Tensor]:
    """All-to-all: split ``scatter_dim`` into ``world`` equal pieces, send piece ``i`` to rank ``i``, and
    concatenate the pieces received along ``gather_dim`` in rank order.

    Shape: ``scatter_dim`` shrinks by ``world``, ``gather_dim`` grows by ``world``. With ``async_op`` a callable
    that waits and returns the result is returned instead.
    """
    group = _resolve(group)
    world = get_ulysses_sequence_parallel_world_size(group)
    scatter_dim, gather_dim = scatter_dim % local_input.dim(), gather_dim % local_input.dim()
    if world == 1:
        return (lambda: local_input) if async_op else local_input
    if local_input.shape[scatter_dim] % world:
        raise ValueError(
            f"all_to_all_tensor: dim {scatter_dim} of shape {tuple(local_input.shape)} is not divisible by the "
            f"SP world size {world}; pad it first (ulysses_pad / slice_input_tensor)"
        )
    # one contiguous (world, ...) staging buffer: piece i = rows [i*s/world, (i+1)*s/world) of scatter_dim
    send = local_input.unflatten(scatter_dim, (world, -1)).movedim(scatter_dim, 0).contiguous()
    recv = torch.empty_like(send)
    work = dist.all_to_all_single(recv, send, group=group, async_op=async_op)

    def finish() -> torch.Tensor:
        if work is not None:
            work.wait()
        # recv[i] came from rank i: put the rank axis right before gather_dim and merge the two
        return recv.movedim(0, gather_dim).flatten(gather_dim, gather_dim + 1).contiguous()

    return finish if async_op else finish()


def all_gather_tensor(
    local_tensor: torch.Tensor, group: ProcessGroup | None = None, async_op: bool = False
) -> torch.Tensor | Callable[[], torch.Tensor]:
    """All-gather along dim 0: ``(n, ...)`` on each rank -> ``(world * n, ...)`` in rank order."""
    group = _resolve(group)
    world = get_ulysses_sequence_parallel_world_size(group)
    if world == 1:
        return (lambda: local_tensor) if async_op else local_tensor
    local_tensor = local_tensor.contiguous()
    output = local_tensor.new_empty((world * local_tensor.shape[0], *local_tensor.shape[1:]))
    # all_gather_single is the newer name of all_gather_into_tensor (deprecated in torch 2.13)
    gather_single = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    work = gather_single(output, local_tensor, group=group, async_op=async_op)
    if async_op:
        return lambda: (work.wait(), output)[1]
    return output


class SeqAllToAll(torch.autograd.Function):
    """Differentiable :func:`all_to_all_tensor`; the backward is the reverse all-to-all."""

    @staticmethod
    def forward(ctx, group, local_input, scatter_dim, gather_dim, async_op=False):
        ctx.group, ctx.scatter_dim, ctx.gather_dim = group, scatter_dim, gather_dim
        return all_to_all_tensor(local_input, scatter_dim, gather_dim, group, async_op=False)

    @staticmethod
    def backward(ctx, grad_output):
        grad = all_to_all_tensor(grad_output, ctx.gather_dim, ctx.scatter_dim, ctx.group)
        return None, grad, None, None, None


class Gather(torch.autograd.Function):
    """Differentiable all-gather along ``gather_dim``.

    Backward keeps this rank's slice of the gradient, times the world size when ``grad_scaler``: every SP rank
    then computes the same loss on the gathered tensor, and averaging the parameter gradients over the SP group
    (what FSDP's reduction over all ranks does) recovers the gradient of that loss.
    """

    @staticmethod
    def forward(ctx, group, local_tensor, gather_dim, grad_scaler=True, async_op=False):
        world = get_ulysses_sequence_parallel_world_size(group)
        ctx.group, ctx.gather_dim, ctx.grad_scaler, ctx.world = group, gather_dim, grad_scaler, world
        ctx.rank, ctx.local_size = get_ulysses_sequence_parallel_rank(group), local_tensor.shape[gather_dim]
        moved = local_tensor.movedim(gather_dim, 0)
        gathered = all_gather_tensor(moved, group)
        return gathered.movedim(0, gather_dim).contiguous()

    @staticmethod
    def backward(ctx, grad_output):
        grad = grad_output.narrow(ctx.gather_dim, ctx.rank * ctx.local_size, ctx.local_size)
        if ctx.grad_scaler:
            grad = grad * ctx.world
        return None, grad.contiguous(), None, None, None


# ---- padding and slicing --------------------------------------------------------------------------------------


def _pad_dim(x: torch.Tensor, dim: int, pad: int, value: float = 0) -> torch.Tensor:
    if pad == 0:
        return x
    shape = list(x.shape)
    shape[dim] = pad
    return torch.cat([x, x.new_full(shape, value)], dim=dim)


def _unpad_dim(x: torch.Tensor, dim: int, pad: int) -> torch.Tensor:
    return x if pad == 0 else x.narrow(dim, 0, x.shape[dim] - pad)


def gather_seq_scatter_heads(
    x: torch.Tensor,
    seq_dim: int,
    head_dim: int,
    unpadded_dim_size: int = 0,
    group: ProcessGroup | None = None,
) -> torch.Tensor:
    """``[.., s/n, .., h, ..] -> [.., s, .., h/n, ..]`` (differentiable); with ``unpadded_dim_size`` the
    gathered sequence is cut back to that length (its right padding dropped)."""
    group = _resolve(group)
    if get_ulysses_sequence_parallel_world_size(group) == 1:
        return x
    x = SeqAllToAll.apply(group, x, head_dim, seq_dim)
    if unpadded_dim_size and unpadded_dim_size < x.shape[seq_dim]:
        x = _unpad_dim(x, seq_dim, x.shape[seq_dim] - unpadded_dim_size)
    return x


def gather_heads_scatter_seq(
    x: torch.Tensor, head_dim: int, seq_dim: int, group: ProcessGroup | None = None
) -> torch.Tensor:
    """``[.., s, .., h/n, ..] -> [.., s/n, .., h, ..]`` (differentiable); the sequence is right-padded with
    zeros to a multiple of the world size first."""
    group = _resolve(group)
    world = get_ulysses_sequence_parallel_world_size(group)
    if world == 1:
        return x
    x = _pad_dim(x, seq_dim, -x.shape[seq_dim] % world)
    return SeqAllToAll.apply(group, x, seq_dim, head_dim)


def slice_input_tensor(
    x: torch.Tensor, dim: int, padding: bool = True, group: ProcessGroup | None = None
) -> torch.Tensor:
    """This rank's contiguous slice of ``x`` along ``dim`` (right-padded with zeros to a multiple of the world
    size first when ``padding``)."""
    group = _resolve(group)
    world = get_ulysses_sequence_parallel_world_size(group)
    if world == 1:
        return x
    if padding:
        x = _pad_dim(x, dim, -x.shape[dim] % world)
    elif x.shape[dim] % world:
        raise ValueError(f"slice_input_tensor: dim {dim} of {tuple(x.shape)} is not divisible by {world}")
    size = x.shape[dim] // world
    return x.narrow(dim, get_ulysses_sequence_parallel_rank(group) * size, size).contiguous()


def ulysses_pad(
    input_ids_rmpad: torch.Tensor,
    position_ids_rmpad: torch.Tensor | None = None,
    sp_size: int = 1,
    pad_value: int = 0,
) -> tuple[torch.Tensor, torch.Tensor | None, int]:
    """Right-pad a packed row to a multiple of ``sp_size``.

    Args:
        input_ids_rmpad: ``(1, T)``.
        position_ids_rmpad: ``(1, T)`` or ``(C, 1, T)``; the padding gets positions ``0..pad-1`` (every row), so
            it reads as a sequence of its own.
        sp_size: the SP world size.
        pad_value: token id of the padding.

    Returns:
        ``(input_ids (1, T + pad), position_ids (.., T + pad) | None, pad)``.
    """
    pad = -input_ids_rmpad.shape[-1] % sp_size
    if pad == 0:
        return input_ids_rmpad, position_ids_rmpad, 0
    input_ids_rmpad = _pad_dim(input_ids_rmpad, -1, pad, pad_value)
    if position_ids_rmpad is not None:
        tail = torch.arange(pad, device=position_ids_rmpad.device, dtype=position_ids_rmpad.dtype)
        tail = tail.expand(*position_ids_rmpad.shape[:-1], pad)
        position_ids_rmpad = torch.cat([position_ids_rmpad, tail], dim=-1).contiguous()
    return input_ids_rmpad, position_ids_rmpad, pad


def ulysses_pad_and_slice_inputs(
    input_ids_rmpad: torch.Tensor,
    position_ids_rmpad: torch.Tensor | None = None,
    sp_size: int = 1,
    skip_position_ids_rmpad: bool = False,
    pad_value: int = 0,
    *,
    group: ProcessGroup | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None, int]:
    """:func:`ulysses_pad`, then this rank's slice of the ids (and of the position ids unless
    ``skip_position_ids_rmpad``) along the last dim. Returns ``(ids (1, T_pad/sp), pos, pad)``."""
    input_ids_rmpad, position_ids_rmpad, pad = ulysses_pad(input_ids_rmpad, position_ids_rmpad, sp_size, pad_value)
    if sp_size == 1:
        return input_ids_rmpad, position_ids_rmpad, pad
    group = _resolve(group)
    if get_ulysses_sequence_parallel_world_size(group) != sp_size:
        raise ValueError(
            f"ulysses_pad_and_slice_inputs: sp_size={sp_size} but the SP group has "
            f"{get_ulysses_sequence_parallel_world_size(group)} ranks; set_ulysses_sequence_parallel_group first"
        )
    input_ids_rmpad = slice_input_tensor(input_ids_rmpad, -1, padding=False, group=group)
    if position_ids_rmpad is not None and not skip_position_ids_rmpad:
        position_ids_rmpad = slice_input_tensor(position_ids_rmpad, -1, padding=False, group=group)
    return input_ids_rmpad, position_ids_rmpad, pad


def gather_outputs_and_unpad(
    x: torch.Tensor,
    gather_dim: int,
    unpad_dim: int | None = None,
    padding_size: int = 0,
    grad_scaler: bool = True,
    group: ProcessGroup | None = None,
) -> torch.Tensor:
    """All-gather SP-sliced outputs along ``gather_dim`` (differentiable, see :class:`Gather`) and drop the last
    ``padding_size`` entries of ``unpad_dim``."""
    group = _resolve(group)
    if get_ulysses_sequence_parallel_world_size(group) == 1:
        return x
    x = Gather.apply(group, x, gather_dim, grad_scaler)
    if unpad_dim is not None:
        x = _unpad_dim(x, unpad_dim, padding_size)
    return x


def gather_outpus_and_unpad(*args, **kwargs):
    """Removed misspelt alias (upstream raises too)."""
    raise RuntimeError("gather_outpus_and_unpad was renamed: call verl.utils.ulysses.gather_outputs_and_unpad")


# ---- the packed format ------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class UlyssesShard:
    """This rank's part of a packed batch under SP.

    Attributes:
        input_ids: ``(1, T_pad / sp)`` this rank's slice of the padded packed ids.
        position_ids: ``(1, T_pad / sp)`` or ``(C, 1, T_pad / sp)``.
        cu_seqlens: ``(B + 1,)`` or ``(B + 2,)`` int32 boundaries of the *whole padded* stream (the padding is the
            last sequence); the token mixers see the whole stream after their all-to-all.
        max_seqlen: longest sequence of the padded stream.
        pad_size: padding tokens at the end of the stream (``T_pad - T``).
        total_tokens: ``T``, the real tokens.
        sp_size: ranks in the SP group.
        sp_rank: this rank; its slice starts at token ``sp_rank * T_pad / sp``.
    """

    input_ids: torch.Tensor
    position_ids: torch.Tensor
    cu_seqlens: torch.Tensor
    max_seqlen: int
    pad_size: int
    total_tokens: int
    sp_size: int
    sp_rank: int

    @property
    def padded_tokens(self) -> int:
        return self.total_tokens + self.pad_size


def shard_packed_batch(packed: PackedBatch, group: ProcessGroup | None = None, pad_value: int = 0) -> UlyssesShard:
    """Pad ``packed`` to a multiple of the SP size and keep this rank's slice (see :class:`UlyssesShard`)."""
    group = _resolve(group)
    sp_size = get_ulysses_sequence_parallel_world_size(group)
    total = packed.total_tokens
    validate_cu_seqlens(packed.cu_seqlens, total)
    ids, pos, pad = ulysses_pad_and_slice_inputs(
        packed.input_ids, packed.position_ids, sp_size, pad_value=pad_value, group=group
    )
    cu_seqlens = packed.cu_seqlens.to(device=packed.input_ids.device, dtype=torch.int32)
    if pad:
        cu_seqlens = torch.cat([cu_seqlens, cu_seqlens.new_tensor([total + pad])])
    return UlyssesShard(
        input_ids=ids.contiguous(),
        position_ids=pos.contiguous(),
        cu_seqlens=cu_seqlens.contiguous(),
        max_seqlen=max(packed.max_seqlen, pad),
        pad_size=pad,
        total_tokens=total,
        sp_size=sp_size,
        sp_rank=get_ulysses_sequence_parallel_rank(group),
    )


# ---- the worker-side context (upstream HEAD keeps it in this module) --------------------------------------------


class FSDPUlyssesShardingManager:
    """Installs the ``"sp"`` group of a ``("dp", "sp")`` device mesh as the SP group inside ``with`` (the previous
    group is restored on exit); the ``BaseShardingManager`` interface of upstream.

    ``preprocess_data`` all-gathers a DataProto over the SP group, for dispatch that gave each SP rank a different
    shard; ``postprocess_data`` keeps this rank's part again. With dispatch by the mesh's ``dp`` rank (every SP
    rank already holds its data-parallel group's shard) neither is needed.
    """

    def __init__(self, device_mesh: Any):
        self.device_mesh = device_mesh
        self._previous: list[ProcessGroup | None] = []

    def _group(self) -> ProcessGroup | None:
        return None if self.device_mesh is None else self.device_mesh["sp"].get_group()

    def __enter__(self) -> FSDPUlyssesShardingManager:
        self._previous.append(get_ulysses_sequence_parallel_group())
        if self.device_mesh is not None:
            set_ulysses_sequence_parallel_group(self._group())
        return self

    def __exit__(self, exc_type, exc_value, traceback) -> None:
        set_ulysses_sequence_parallel_group(self._previous.pop())

    def preprocess_data(self, data: DataProto) -> DataProto:
        """Every SP rank holds the rows of all SP ranks afterwards, in rank order (in place, returned)."""
        group = self._group()
        if get_ulysses_sequence_parallel_world_size(group) > 1:
            from verl.protocol import all_gather_data_proto

            all_gather_data_proto(data, process_group=group)
        return data

    def postprocess_data(self, data: DataProto) -> DataProto:
        """This SP rank's chunk of ``data`` (the inverse of :meth:`preprocess_data`)."""
        group = self._group()
        sp_size = get_ulysses_sequence_parallel_world_size(group)
        if sp_size == 1:
            return data
        return data.chunk(chunks=sp_size)[get_ulysses_sequence_parallel_rank(group)]


__getattr__ = missing_name_getattr(__name__)  # upstream names missing here raise with the reason (verl.upstream_gaps)
