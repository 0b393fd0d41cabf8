"""PF-PPO (``algorithm.use_pf_ppo``): resample the batch with replacement, weighted by response score, so the
policy update sees reliable (high-|score| or extreme) samples more often."""

from __future__ import annotations

import copy
from typing import Any

import numpy as np
import torch

_REWEIGHT_METHODS = ("pow", "max_min", "max_random")


def pf_ppo_weights(scores: torch.Tensor, reweight_method: str, weight_pow: float) -> torch.Tensor:
    """Unnormalised sampling weights ``(bs,)`` from per-response scores ``(bs,)``.

    ``pow``: |s|^p; ``max_min``: 1 for the batch's best and worst scores, else 0; ``max_random``: 0.4 for the
    best score, else 0.1.
    """
    if reweight_method == "pow":
        return scores.abs().pow(weight_pow)
    if reweight_method == "max_min":
        extreme = (scores == scores.max()) | (scores == scores.min())
        return extreme.to(scores.dtype)
    if reweight_method == "max_random":
        return torch.where(scores == scores.max(), 0.4, 0.1).to(scores.dtype)
    raise ValueError(
        f"Unsupported algorithm.pf_ppo.reweight_method {reweight_method!r}; choose one of {list(_REWEIGHT_METHODS)}."
    )


def _take(values: Any, rows: np.ndarray) -> Any:
    return values[rows] if isinstance(values, np.ndarray) else [values[i] for i in rows]


def compute_pf_ppo_reweight_data(data: Any, reweight_method: str = "pow", weight_pow: float = 2.0) -> Any:
    """Return a resampled copy of ``data`` (a ``DataProto``) of the same size; ``data`` is not modified.

    Rows are drawn with replacement with probability ∝ ``pf_ppo_weights(Σ_t token_level_scores)`` (+1e-8 so an
    all-zero batch still samples). Every tensor, every non-tensor column, and every ``meta_info`` list with one
    entry per row are reindexed alike.
    """
    with torch.no_grad():
        scores = data.batch["token_level_scores"].sum(dim=-1)
        weights = torch.clamp(pf_ppo_weights(scores, reweight_method, weight_pow) + 1e-8, min=1e-8)
        batch_size = scores.shape[0]
        rows = torch.multinomial(weights, batch_size, replacement=True)
    rows_np = rows.cpu().numpy()
    resampled = copy.copy(data)
    resampled.batch = data.batch[rows]
    resampled.non_tensor_batch = {key: _take(values, rows_np) for key, values in data.non_tensor_batch.items()}
    resampled.meta_info = {
        key: _take(value, rows_np) if isinstance(value, list) and len(value) == batch_size else value
        for key, value in data.meta_info.items()
    }
    return resampled
