"""Checkpoint manager base: what to save, atomic directory commits, retention, RNG state (upstream names).

A checkpoint directory is written as ``<local_path>.tmp`` by every rank and renamed to ``<local_path>`` by rank 0
only after every rank finished (:func:`atomic_commit`): each rank fsyncs what is there, rank 0 writes the manifest
(every file and its size) last, renames, and fsyncs the parent directory (``durable`` says why). A run killed
mid-save therefore leaves at most a stale ``.tmp`` directory next to the previous, intact checkpoint; the next
save removes the stale directory.
"""

from __future__ import annotations

import os
import random
import re
import shutil
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from verl.upstream_gaps import missing_name_getattr
from verl.utils.checkpoint.durable import fsync_path, fsync_tree, write_manifest
from verl.utils.device import get_device_name, get_platform
from verl.utils.driver_watch import check_driver_alive

__all__ = [
    "BaseCheckpointManager",
    "atomic_commit",
    "find_latest_ckpt_path",
    "get_checkpoint_tracker_filename",
    "prepare_tmp_dir",
]

_VALID_CONTENTS = ("model", "optimizer", "extra", "hf_model")


def _contents(value: Sequence[str] | None, key: str) -> tuple[str, ...]:
    contents = tuple(value) if value is not None else ("model", "optimizer", "extra")
    unknown = sorted(set(contents) - set(_VALID_CONTENTS))
    if unknown:
        raise ValueError(f"checkpoint.{key} has unknown entries {unknown}; valid: {list(_VALID_CONTENTS)}")
    return contents


class BaseCheckpointManager:
    """Holds the model/optimizer/scheduler and the ``checkpoint`` config (``save_contents``/``load_contents``).

    Subclasses implement :meth:`save_checkpoint` and :meth:`load_checkpoint`.
    """

    def __init__(
        self,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer | None = None,
        lr_scheduler: Any = None,
        processing_class: Any = None,
        checkpoint_config: Any = None,
    ):
        save = None if checkpoint_config is None else checkpoint_config.save_contents
        load = None if checkpoint_config is None else checkpoint_config.load_contents
        self.checkpoint_save_contents = _contents(save, "save_contents")
        self.checkpoint_load_contents = _contents(load if load is not None else save, "load_contents")
        self.checkpoint_config = checkpoint_config
        self.model = model
        self.optimizer = optimizer
        self.lr_scheduler = lr_scheduler
        self.processing_class = processing_class
        self.previous_global_step: int | None = None
        self.previous_saved_paths: list[str] = []
        self.rank = dist.get_rank() if dist.is_initialized() else 0
        self.world_size = dist.get_world_size() if dist.is_initialized() else 1

    @property
    def should_save_model(self) -> bool:
        return "model" in self.checkpoint_save_contents

    @property
    def should_save_optimizer(self) -> bool:
        return "optimizer" in self.checkpoint_save_contents

    @property
    def should_save_extra(self) -> bool:
        return "extra" in self.checkpoint_save_contents

    @property
    def should_save_hf_model(self) -> bool:
        return "hf_model" in self.checkpoint_save_contents

    @property
    def should_load_model(self) -> bool:
        return "model" in self.checkpoint_load_contents

    @property
    def should_load_optimizer(self) -> bool:
        return "optimizer" in self.checkpoint_load_contents

    @property
    def should_load_extra(self) -> bool:
        return "extra" in self.checkpoint_load_contents

    def save_checkpoint(
        self, local_path: str, hdfs_path: str | None = None, global_step: int = 0, max_ckpt_to_keep: int | None = None
    ) -> None:
        raise NotImplementedError

    def load_checkpoint(self, local_path: str | None, hdfs_path: str | None = None, del_local_after_load: bool = False):
        raise NotImplementedError

    def remove_previous_save_local_path(self, path: str | list[str]) -> None:
        for p in [path] if isinstance(path, str) else path:
            if os.path.isdir(p):
                shutil.rmtree(p, ignore_errors=True)

    def _record_saved_path(self, local_path: str, max_ckpt_to_keep: int | None) -> None:
        """Remember ``local_path`` and delete the oldest saves beyond ``max_ckpt_to_keep`` (rank 0 deletes)."""
        if local_path in self.previous_saved_paths:
            self.previous_saved_paths.remove(local_path)
        self.previous_saved_paths.append(local_path)
        if max_ckpt_to_keep is None or max_ckpt_to_keep <= 0:
            return
        excess = len(self.previous_saved_paths) - max_ckpt_to_keep
        if excess > 0:
            stale, self.previous_saved_paths = self.previous_saved_paths[:excess], self.previous_saved_paths[excess:]
            if self.rank == 0:
                self.remove_previous_save_local_path(stale)

    @staticmethod
    def local_mkdir(path: str) -> str:
        os.makedirs(path, exist_ok=True)
        return path

    @staticmethod
    def get_rng_state() -> dict[str, Any]:
        """Python, NumPy, torch CPU and (off the CPU) accelerator RNG states."""
        state = {"cpu": torch.get_rng_state(), "numpy": np.random.get_state(), "random": random.getstate()}
        if get_device_name() != "cpu":
            state["device"] = get_platform().get_rng_state()
        return state

    @staticmethod
    def load_rng_state(rng_state: dict[str, Any]) -> None:
        torch.set_rng_state(rng_state["cpu"])
        np.random.set_state(rng_state["numpy"])
        random.setstate(rng_state["random"])
        if "device" in rng_state and get_device_name() != "cpu":
            get_platform().set_rng_state(rng_state["device"])


def _barrier() -> None:
    if dist.is_initialized():
        dist.barrier()


def prepare_tmp_dir(local_path: str, rank: int) -> str:
    """Create an empty ``<local_path>.tmp`` (rank 0; a stale one from a killed save is removed). Collective."""
    tmp = os.path.abspath(local_path).rstrip("/") + ".tmp"
    if rank == 0:
        if os.path.exists(tmp):
            shutil.rmtree(tmp)
        os.makedirs(tmp)
    _barrier()
    return tmp


def atomic_commit(tmp: str, local_path: str, rank: int) -> None:
    """Rename the finished ``tmp`` directory to ``local_path`` (rank 0, after every rank's files). Collective.

    An existing ``local_path`` (a re-save of the same step) is first renamed aside, so at every instant either
    the old or the new complete checkpoint exists under its name or its ``.old`` name.
    """
    fsync_tree(tmp)  # every rank: its own files reach the disk before rank 0 commits
    _barrier()
    if rank == 0:
        write_manifest(tmp)
        final = os.path.abspath(local_path).rstrip("/")
        check_driver_alive(f"committing {final}")
        old = final + ".old"
        if os.path.exists(old):
            shutil.rmtree(old)
        if os.path.exists(final):
            os.replace(final, old)
        os.replace(tmp, final)
        fsync_path(os.path.dirname(final))
        shutil.rmtree(old, ignore_errors=True)
    _barrier()


def get_checkpoint_tracker_filename(root_path: str) -> str:
    """``<root>/latest_checkpointed_iteration.txt`` (upstream name)."""
    return os.path.join(root_path, "latest_checkpointed_iteration.txt")


def find_latest_ckpt_path(path: str | None, directory_format: str = "global_step_{}") -> str | None:
    """The ``global_step_N`` directory named by the tracker file under ``path``, or None (upstream name)."""
    if path is None:
        return None
    tracker = get_checkpoint_tracker_filename(path)
    if not os.path.exists(tracker):
        return None
    with open(tracker) as f:
        text = f.read().strip()
    if not re.fullmatch(r"\d+", text):
        raise ValueError(f"{tracker} should hold a step number, found {text!r}; delete it to start from scratch")
    ckpt = os.path.join(path, directory_format.format(int(text)))
    return ckpt if os.path.exists(ckpt) else None


__getattr__ = missing_name_getattr(__name__)  # upstream names missing here raise with the reason (verl.upstream_gaps)
