"""Grouping of responses by prompt, for the group-relative estimators (GRPO, RLOO, OPO, ...).

The trainer tags every response with its prompt's ``uid`` (``non_tensor_batch["uid"]``); responses sharing a uid
form a group. Two forms are offered: ``group_rows`` (label -> row indices, for readable per-group loops) and
``group_ids`` + ``group_mean_std`` (dense ids and scatter reductions, for the vectorized estimators).
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import Any

import numpy as np
import torch

IndexLike = Sequence[Hashable] | np.ndarray | torch.Tensor


def _labels(index: IndexLike) -> list[Any]:
    return index.tolist() if isinstance(index, torch.Tensor | np.ndarray) else list(index)


def group_rows(index: IndexLike) -> dict[Any, list[int]]:
    """Map each group label to the row indices that carry it, groups in order of first appearance.

    Args:
        index: ``(bs,)`` labels; any hashable values (uid strings, ints) in a list, numpy array or tensor.
    """
    rows: dict[Any, list[int]] = {}
    for row, label in enumerate(_labels(index)):
        rows.setdefault(label, []).append(row)
    return rows


def group_ids(index: IndexLike, device: torch.device | str | None = None) -> torch.Tensor:
    """Dense group ids ``0..G-1`` (order of first appearance) as a ``(bs,)`` int64 tensor."""
    dense: dict[Any, int] = {}
    ids = [dense.setdefault(label, len(dense)) for label in _labels(index)]
    return torch.tensor(ids, dtype=torch.long, device=device)


def group_sum(values: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """Per-group sums ``(G,)`` of ``values`` ``(bs,)`` grouped by ``ids`` ``(bs,)``."""
    num_groups = int(ids.max().item()) + 1 if ids.numel() else 0
    return torch.zeros(num_groups, dtype=values.dtype, device=values.device).index_add_(0, ids, values)


def group_mean_std(scores: torch.Tensor, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-group mean, unbiased std and size, each ``(G,)``.

    A group of one has no spread to measure: it gets mean 0 and std 1, so its normalised score is the raw score
    (the same convention as the per-group GRPO loop).

    Args:
        scores: ``(bs,)``.
        ids: ``(bs,)`` dense group ids from :func:`group_ids`.
    """
    counts = group_sum(torch.ones_like(scores), ids)
    mean = group_sum(scores, ids) / counts
    # Two passes (centre, then square) rather than E[x²] − E[x]², which cancels badly in fp32.
    sum_sq = group_sum((scores - mean[ids]).square(), ids)
    std = torch.sqrt(sum_sq / (counts - 1).clamp(min=1))
    singleton = counts == 1
    mean = torch.where(singleton, torch.zeros_like(mean), mean)
    std = torch.where(singleton, torch.ones_like(std), std)
    return mean, std, counts
