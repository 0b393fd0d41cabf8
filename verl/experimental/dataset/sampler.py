"""Base classes of user samplers selected with ``data.sampler.class_path`` / ``data.sampler.class_name``.

``main_ppo`` builds the training sampler as ``cls(data_source=train_dataset, data_config=config.data)``. A
:class:`AbstractCurriculumSampler` is also told about every finished step: the trainer calls
``sampler.update(batch=batch)`` with the step's ``DataProto`` (prompts, responses, rewards, advantages) after the
actor update, before the next batch is drawn (custom samplers require ``data.dataloader_num_workers=0``, so the
next indices are drawn after the update).
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Sized
from typing import Any

from torch.utils.data import Sampler

__all__ = ["AbstractCurriculumSampler", "AbstractSampler"]


class AbstractSampler(Sampler[int]):
    """A sampler over the training set's row indices, built from the dataset and the ``data`` config."""

    @abstractmethod
    def __init__(self, data_source: Sized, data_config: Any):
        """``data_source``: the training dataset; ``data_config``: the ``data`` config node."""


class AbstractCurriculumSampler(AbstractSampler):
    """A sampler that adapts to training: ``update`` receives every finished step's batch."""

    @abstractmethod
    def update(self, batch: Any) -> None:
        """Called once per training step with the step's ``DataProto``."""
