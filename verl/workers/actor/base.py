"""``BasePPOActor``: the interface of a PPO actor (upstream name and signatures)."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any

import torch

from verl.protocol import DataProto
from verl.workers.config.actor import ActorConfig
from verl.workers.config.ref import RefConfig

__all__ = ["BasePPOActor"]


class BasePPOActor(ABC):
    """A policy that computes log-probs of given responses and updates itself on a batch of rollouts."""

    def __init__(self, config: ActorConfig | RefConfig):
        self.config = config

    @abstractmethod
    def compute_log_prob(self, data: DataProto, calculate_entropy: bool = False) -> dict[str, torch.Tensor]:
        """Log-probs ``(B, R)`` of ``data.batch["responses"]`` (and ``entropys`` when asked)."""

    @abstractmethod
    def update_policy(self, data: DataProto) -> dict[str, Any]:
        """One PPO update over ``data``; returns metrics (name -> list of values)."""
