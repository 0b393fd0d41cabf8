"""Mini-batches, micro-batches and the global counts that make gradient accumulation exact.

Loss normalisation: every micro-batch loss is ``sum(loss over its tokens) / N_global * dp_size`` where ``N_global``
is the number of valid tokens (or sequences, for ``seq-mean-*`` modes) of the whole mini-batch on all
data-parallel ranks (``core_algos.agg_loss`` with ``batch_num_tokens`` / ``global_batch_size``). Summing the
micro-batch gradients and FSDP's mean over ranks then gives exactly the gradient of the mini-batch loss, for any
number or composition of micro-batches (fixed count or ``use_dynamic_bsz``) and any data-parallel size.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import torch
import torch.distributed as dist

from verl.protocol import DataProto
from verl.utils.seqlen_balancing import prepare_dynamic_batch, restore_dynamic_batch

__all__ = ["GlobalBatchInfo", "global_batch_info", "iter_mini_batches", "restore_order", "split_micro_batches"]


@dataclass(frozen=True)
class GlobalBatchInfo:
    """Counts over the whole mini-batch on every data-parallel rank (``agg_loss`` keyword arguments)."""

    dp_size: int
    batch_num_tokens: int
    global_batch_size: int

    def as_kwargs(self) -> dict[str, int]:
        return {
            "dp_size": self.dp_size,
            "batch_num_tokens": self.batch_num_tokens,
            "global_batch_size": self.global_batch_size,
        }


def global_batch_info(response_mask: torch.Tensor, dp_group: dist.ProcessGroup | None = None) -> GlobalBatchInfo:
    """Valid tokens and valid sequences of ``response_mask`` (B, R), summed over ``dp_group`` (collective)."""
    counts = torch.stack([response_mask.sum(), (response_mask.sum(-1) > 0).sum()]).to("cpu", torch.int64)
    dp_size = 1
    if dist.is_initialized():
        dp_size = dist.get_world_size(dp_group)
        if dp_size > 1:
            counts = _all_reduce_sum(counts, dp_group)
    return GlobalBatchInfo(dp_size, int(counts[0]), int(counts[1]))


def _all_reduce_sum(counts: torch.Tensor, dp_group: dist.ProcessGroup | None) -> torch.Tensor:
    if dist.get_backend(dp_group) != "gloo":
        from verl.utils.device import get_platform

        on_device = counts.to(get_platform().device())
        dist.all_reduce(on_device, group=dp_group)
        return on_device.cpu()
    dist.all_reduce(counts, group=dp_group)
    return counts


def iter_mini_batches(
    data: DataProto, mini_batch_size: int, epochs: int, shuffle: bool = False, seed: int = 42
) -> Iterator[tuple[int, DataProto]]:
    """Yield ``(epoch, mini_batch)`` for ``epochs`` passes over ``data`` in mini-batches of ``mini_batch_size`` rows.

    ``shuffle`` permutes the rows before each pass with a generator seeded by ``seed + epoch``.
    """
    if mini_batch_size <= 0 or len(data) % mini_batch_size:
        raise ValueError(
            f"the batch of {len(data)} responses on this rank is not a multiple of the mini-batch size "
            f"{mini_batch_size}; check ppo_mini_batch_size * rollout.n against data.train_batch_size and the number "
            "of GPUs"
        )
    for epoch in range(epochs):
        epoch_data = data
        if shuffle:
            order = torch.randperm(len(data), generator=torch.Generator().manual_seed(seed + epoch))
            epoch_data = data.select_idxs(order)
        for mini_batch in epoch_data.split(mini_batch_size):
            yield epoch, mini_batch


def split_micro_batches(
    data: DataProto,
    *,
    micro_batch_size: int | None,
    use_dynamic_bsz: bool,
    max_token_len: int | None,
    dp_group: dist.ProcessGroup | None = None,
    micro_batch_key: str = "ppo_micro_batch_size_per_gpu",
) -> tuple[list[DataProto], list[list[int]] | None]:
    """Micro-batches by count, or by token budget when ``use_dynamic_bsz`` (balanced, order restorable).

    Returns:
        ``(micro_batches, indices)``; ``indices`` is None for the fixed-count split (order unchanged), else the
        row indices of each micro-batch for :func:`restore_order`.
    """
    if use_dynamic_bsz:
        if not max_token_len or max_token_len <= 0:
            raise ValueError("use_dynamic_bsz needs a positive token budget (ppo_max_token_len_per_gpu)")
        return prepare_dynamic_batch(data, max_token_len=max_token_len, dp_group=dp_group)
    if micro_batch_size is None or micro_batch_size <= 0:
        raise ValueError(f"{micro_batch_key} is not set: set it or turn on use_dynamic_bsz")
    return data.split(micro_batch_size), None


def restore_order(tensor: torch.Tensor, indices: list[list[int]] | None) -> torch.Tensor:
    """Undo the reordering of a dynamic split on the concatenated outputs (no-op for fixed-count splits)."""
    return tensor if indices is None else restore_dynamic_batch(tensor, indices)
