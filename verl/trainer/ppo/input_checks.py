"""Input checks shared by the advantage estimators and the losses.

Every estimator and loss takes several ``(batch_size, response_length)`` tensors that must line up token for
token. A mismatch (a response mask cut to a different length, log-probs of another micro-batch) would otherwise
broadcast silently or fail deep inside torch with an unhelpful message, so the public functions check shapes up
front and raise a ``ValueError`` that names the tensors.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

SizedBatch = Sequence[Any] | np.ndarray | torch.Tensor


def check_same_shape(where: str, **tensors: torch.Tensor | None) -> None:
    """Raise ``ValueError`` unless all given (non-None) tensors have the same shape.

    Args:
        where: the function being called, for the message (e.g. ``"compute_policy_loss_vanilla"``).
        **tensors: name -> tensor; ``None`` entries (optional inputs not given) are skipped.
    """
    present = {name: t for name, t in tensors.items() if t is not None}
    shapes = {name: tuple(t.shape) for name, t in present.items()}
    if len(set(shapes.values())) > 1:
        listed = ", ".join(f"{name} {shape}" for name, shape in shapes.items())
        raise ValueError(
            f"{where}: inputs must all have the same shape (batch_size, response_length), got {listed}. "
            "Check that every tensor comes from the same (micro-)batch and is cut to the response part."
        )


def check_2d(where: str, name: str, tensor: torch.Tensor) -> None:
    """Raise ``ValueError`` unless ``tensor`` is ``(batch_size, response_length)``."""
    if tensor.dim() != 2:
        raise ValueError(f"{where}: {name} must be 2-D (batch_size, response_length), got shape {tuple(tensor.shape)}.")


def check_batch_length(where: str, name: str, values: SizedBatch, batch_size: int) -> None:
    """Raise ``ValueError`` unless ``len(values) == batch_size`` (one entry per response)."""
    if len(values) != batch_size:
        raise ValueError(
            f"{where}: {name} has {len(values)} entries but the batch has {batch_size} responses; "
            "it needs one entry per response (e.g. the 'uid' of each response's prompt)."
        )
