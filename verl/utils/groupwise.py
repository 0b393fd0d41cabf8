"""Group-wise statistics under upstream's names: ``as_torch_index`` and ``group_mean_std``.

User estimators written against upstream import these from ``verl.utils``; the built-in estimators use the same
maths through ``verl.trainer.ppo.group_stats``. One difference from upstream is deliberate: with ``device=None``
the result stays on the input's device (upstream picks CUDA when it is available, which moves CPU tensors of a
CPU run to a GPU it may not own).
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import Any

import numpy as np
import torch

__all__ = ["as_torch_index", "group_mean_std"]


def _labels(index: Any) -> list[Hashable]:
    if isinstance(index, torch.Tensor | np.ndarray):
        return index.reshape(-1).tolist()
    if isinstance(index, Sequence) and not isinstance(index, str):
        return list(index)
    raise TypeError(f"as_torch_index: expected a list, numpy array or tensor of group labels, got {type(index)}")


def _sort_key(label: Hashable) -> tuple[int, Any]:
    """Numbers sort numerically and before everything else, which sorts by its string form."""
    if isinstance(label, bool | int | float | np.integer | np.floating):
        return (0, float(label))
    return (1, str(label))


def as_torch_index(index: Any, device: torch.device | str | None = None) -> torch.Tensor:
    """Dense group ids ``0..G-1`` (``(N,)`` int64) for arbitrary labels, numbered in sorted label order.

    Equal labels get equal ids; the label values themselves are not kept (``[7, 3, 7]`` -> ``[1, 0, 1]``,
    ``["b", "a"]`` -> ``[1, 0]``). ``device=None`` keeps a tensor input's device, else the CPU.
    """
    labels = _labels(index)
    dense = {label: i for i, label in enumerate(sorted(set(labels), key=_sort_key))}
    if device is None and isinstance(index, torch.Tensor):
        device = index.device
    return torch.tensor([dense[label] for label in labels], dtype=torch.long, device=device)


@torch.no_grad()
def group_mean_std(
    scores: torch.Tensor, gidx: torch.Tensor, eps: float = 1e-6, device: torch.device | str | None = None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-group mean, std and count, each ``(G,)`` float32, for dense ids ``gidx`` from :func:`as_torch_index`.

    ``std = sqrt(max(Σ(x - mean)² / max(count - 1, 1), eps))`` (unbiased, floored at ``eps``). A group of one has
    no spread: it gets mean 0 and std 1, so its normalised score is the raw score.
    Example: scores ``[1, 3, 5]``, gidx ``[0, 0, 1]`` -> mean ``[2, 0]``, std ``[√2, 1]``, count ``[2, 1]``.
    """
    device = scores.device if device is None else torch.device(device)
    scores = scores.reshape(-1).to(device=device, dtype=torch.float32)
    gidx = gidx.reshape(-1).to(device=device, dtype=torch.long)
    if scores.numel() != gidx.numel():
        raise ValueError(f"group_mean_std: {scores.numel()} scores but {gidx.numel()} group ids")
    if gidx.numel() == 0:
        empty = torch.empty(0, device=device)
        return empty, empty, empty
    if int(gidx.min()) < 0:
        raise ValueError("group_mean_std: gidx must be dense ids 0..G-1; convert labels with as_torch_index first")
    num_groups = int(gidx.max()) + 1
    count = torch.zeros(num_groups, device=device).index_add_(0, gidx, torch.ones_like(scores))
    mean = torch.zeros(num_groups, device=device).index_add_(0, gidx, scores) / count.clamp(min=1.0)
    # Two passes (centre, then square) rather than E[x²] − E[x]², which cancels badly in fp32.
    sum_sq = torch.zeros(num_groups, device=device).index_add_(0, gidx, (scores - mean[gidx]).square())
    std = torch.sqrt((sum_sq / (count - 1.0).clamp(min=1.0)).clamp(min=eps))
    single = count <= 1.0
    return torch.where(single, 0.0, mean), torch.where(single, 1.0, std), count
