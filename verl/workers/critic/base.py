"""``BasePPOCritic``: the interface of a PPO value function (upstream name and signatures)."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any

import torch

from verl.protocol import DataProto
from verl.workers.config.critic import CriticConfig

__all__ = ["BasePPOCritic"]


class BasePPOCritic(ABC):
    """A value model that predicts per-token values and regresses them on returns."""

    def __init__(self, config: CriticConfig):
        self.config = config

    @abstractmethod
    def compute_values(self, data: DataProto) -> torch.Tensor:
        """Values ``(B, R)`` of the response tokens."""

    @abstractmethod
    def update_critic(self, data: DataProto) -> dict[str, Any]:
        """One value-function update over ``data``; returns metrics (name -> list of values)."""
