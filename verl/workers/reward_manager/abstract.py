"""The reward-manager interface (upstream ``AbstractRewardManager``): a callable that turns a batch of rollouts
into token-level rewards."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import Any

import torch

RawRewardFn = Callable[..., Any]


class AbstractRewardManager(ABC):
    """``__call__(data, return_dict=False)`` -> ``(B, R)`` float32 rewards, or with ``return_dict`` a dict with
    ``reward_tensor``, ``reward_extra_info`` (per-sample lists) and ``reward_metrics`` (scalars to log)."""

    @abstractmethod
    def __init__(
        self,
        tokenizer: Any,
        num_examine: int,
        compute_score: RawRewardFn | None,
        reward_fn_key: str = "data_source",
        **kwargs: Any,
    ):
        pass

    @abstractmethod
    def __call__(self, data: Any, return_dict: bool = False) -> torch.Tensor | dict[str, Any]:
        pass
