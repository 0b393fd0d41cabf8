"""FSDP (FSDP1 and FSDP2) checkpoints: sharded model + optimizer (DCP) + extra state per rank, and an HF export.

Layout of one checkpoint directory::

    <local_path>/
        model_dcp/                              # sharded model state: torch.distributed.checkpoint (DCP)
        optim_dcp/                              # sharded optimizer state (DCP), with "optimizer" in save_contents
        extra_state_world_size_{W}_rank_{r}.pt  # lr scheduler + RNG states (upstream name)
        fsdp_config.json                        # {"FSDP_version": 1|2, "world_size": W, "format": "dcp"}
        huggingface/                            # config, generation config, tokenizer; with save_contents
                                                # containing "hf_model" also the full weights
                                                # (loadable with AutoModelForCausalLM.from_pretrained)

DCP stores every shard with its global offsets, so a checkpoint resumes at any world size and under either
strategy (save at 2 ranks, resume at 1: DCP reshards), and ``hf_export.export_hf_from_checkpoint`` turns it into an
HF model offline. Directories in upstream's per-rank layout (``model_world_size_{W}_rank_{r}.pt``,
``optim_world_size_{W}_rank_{r}.pt``) still load, at their own world size only.

The whole directory is written as ``<local_path>.tmp`` and renamed when complete, after an fsync of its files and
a ``checkpoint_manifest.json`` listing them with their sizes (``atomic_commit``); loading checks the manifest.
Every tensor handed to ``state_dict`` must be on one device: callers that offload parameters or optimizer
state load them back first (field-report item 10; the workers do it around every phase).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import warnings
from collections.abc import Iterator
from typing import Any

import torch
import torch.distributed as dist
import torch.nn as nn

from verl.utils.checkpoint.checkpoint_manager import BaseCheckpointManager, atomic_commit, prepare_tmp_dir
from verl.utils.checkpoint.durable import NO_MANIFEST, CheckpointError, check_manifest
from verl.utils.checkpoint.hf_export import DCP_MODEL_DIR, DCP_OPTIM_DIR, save_hf_model, unwrap_hf_model
from verl.utils.checkpoint.save_errors import save_error
from verl.utils.device import get_device_name
from verl.utils.fsdp_utils import adapter_for, fsdp_version

logger = logging.getLogger(__name__)

__all__ = ["FSDPCheckpointManager", "unwrap_hf_model", "save_hf_model"]


def _state_dict_options(full: bool):
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    # cpu_offload copies shards to host memory; on the CPU they already are, and FSDP1's offload path segfaults
    # there (docs/cpu_notes.md "FSDP on the CPU")
    return StateDictOptions(full_state_dict=full, cpu_offload=get_device_name() != "cpu")


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    # the DCP state-dict API warns (FutureWarning) about FSDP1 internals on every call, and DCP about running
    # without a process group, which is what one process (or the offline export) means
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        warnings.filterwarnings("ignore", message="torch.distributed is disabled", category=UserWarning)
        yield


class FSDPCheckpointManager(BaseCheckpointManager):
    """Save/load an FSDP1 or FSDP2 model with its optimizer, lr scheduler and RNG states (upstream name).

    Args:
        model: the wrapped model (``fsdp_version(model)`` 1 or 2), or a plain module (one process).
        optimizer, lr_scheduler: optional; saved/loaded when given and listed in the contents.
        processing_class: tokenizer/processor written to ``huggingface/``.
        checkpoint_config: has ``save_contents``/``load_contents`` (``model``, ``optimizer``, ``extra``,
            ``hf_model``).
    """

    def __init__(
        self,
        model: nn.Module,
        optimizer: torch.optim.Optimizer | None = None,
        lr_scheduler: Any = None,
        processing_class: Any = None,
        checkpoint_config: Any = None,
        **kwargs: Any,
    ):
        super().__init__(model, optimizer, lr_scheduler, processing_class, checkpoint_config)

    def _file(self, root: str, kind: str, world_size: int | None = None, rank: int | None = None) -> str:
        world_size = self.world_size if world_size is None else world_size
        rank = self.rank if rank is None else rank
        return os.path.join(root, f"{kind}_world_size_{world_size}_rank_{rank}.pt")

    # ---------------------------------------------------------------------------------------------------------
    # save
    # ---------------------------------------------------------------------------------------------------------

    def save_checkpoint(
        self, local_path: str, hdfs_path: str | None = None, global_step: int = 0, max_ckpt_to_keep: int | None = None
    ) -> None:
        """Write the checkpoint to ``local_path`` atomically. Collective: every rank calls it.

        Raises:
            CheckpointSaveError: any failure (a full disk named as such), with the path and the free space.
        """
        if local_path is None:
            return
        if hdfs_path is not None:
            raise ValueError("checkpoint upload to HDFS is not supported; set trainer.default_hdfs_dir=null")
        try:
            tmp = prepare_tmp_dir(local_path, self.rank)
            self._save_states(tmp)
            if self.rank == 0:
                self._save_hf_config(tmp)
            if self.should_save_hf_model:
                self._save_hf_weights(tmp)
            atomic_commit(tmp, local_path, self.rank)
        except BaseException as exc:  # DCP's CheckpointException is a BaseException; save_error passes Ctrl-C on
            intact = f"{local_path} was not replaced: only {local_path}.tmp was written."
            raise save_error(exc, local_path, intact) from exc
        self.previous_global_step = global_step
        self._record_saved_path(os.path.abspath(local_path).rstrip("/"), max_ckpt_to_keep)

    def _save_states(self, root: str) -> None:
        from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_optimizer_state_dict

        with _quiet():
            if self.should_save_model:
                state = get_model_state_dict(self.model, options=_state_dict_options(False))
                _dcp_save(state, os.path.join(root, DCP_MODEL_DIR))
            if self.should_save_optimizer and self.optimizer is not None:
                state = get_optimizer_state_dict(self.model, self.optimizer, options=_state_dict_options(False))
                _dcp_save(state, os.path.join(root, DCP_OPTIM_DIR))
        if self.should_save_extra:
            extra = {
                "lr_scheduler": None if self.lr_scheduler is None else self.lr_scheduler.state_dict(),
                "rng": self.get_rng_state(),
            }
            torch.save(extra, self._file(root, "extra_state"))

    def _save_hf_config(self, root: str) -> None:
        hf_dir = self.local_mkdir(os.path.join(root, "huggingface"))
        inner = unwrap_hf_model(self.model)
        meta = {"FSDP_version": fsdp_version(self.model), "world_size": self.world_size, "format": "dcp"}
        with open(os.path.join(root, "fsdp_config.json"), "w") as f:
            json.dump(meta, f)
        config = getattr(inner, "config", None)
        if config is not None:
            config.save_pretrained(hf_dir)
        generation_config = getattr(inner, "generation_config", None)
        if generation_config is not None and getattr(inner, "can_generate", lambda: False)():
            generation_config.save_pretrained(hf_dir)
        if self.processing_class is not None:
            self.processing_class.save_pretrained(hf_dir)

    def _save_hf_weights(self, root: str) -> None:
        adapter = adapter_for(self.model)
        full = adapter.full_state_dict(self.model) if adapter is not None else self.model.state_dict()
        if self.rank == 0:
            save_hf_model(self.model, full, os.path.join(root, "huggingface"))

    # ---------------------------------------------------------------------------------------------------------
    # load
    # ---------------------------------------------------------------------------------------------------------

    def load_checkpoint(self, local_path: str | None, hdfs_path: str | None = None, del_local_after_load: bool = False):
        """Load what ``checkpoint.load_contents`` lists from ``local_path`` (None: nothing). Collective.

        A DCP checkpoint loads at any world size; one in the per-rank layout only at its own world size. A file
        missing or shorter than the checkpoint's manifest says is a :class:`CheckpointError` naming it.
        """
        if local_path is None:
            return
        if not os.path.isdir(local_path):
            raise FileNotFoundError(f"checkpoint directory {local_path} does not exist")
        problem = check_manifest(local_path)
        if problem not in (None, NO_MANIFEST):  # no manifest: written by upstream or an older version
            raise CheckpointError(f"checkpoint {local_path} {problem}; it cannot be loaded safely")
        saved_world = self._saved_world_size(local_path)
        if self.should_load_model:
            self._load_model(local_path, saved_world)
        if self.should_load_optimizer and self.optimizer is not None:
            self._load_optimizer(local_path, saved_world)
        if self.should_load_extra:
            self._load_extra(local_path, saved_world)

    @staticmethod
    def _saved_world_size(local_path: str) -> int:
        meta_file = os.path.join(local_path, "fsdp_config.json")
        if not os.path.exists(meta_file):
            raise FileNotFoundError(f"{meta_file} is missing: {local_path} is not a complete FSDP checkpoint")
        with open(meta_file) as f:
            return int(json.load(f)["world_size"])

    def _require_same_world(self, local_path: str, saved_world: int) -> None:
        if saved_world != self.world_size:
            raise RuntimeError(
                f"{local_path} holds per-rank shard files (model_world_size_{saved_world}_rank_*.pt) of a "
                f"{saved_world}-rank run; such files cannot be resharded to this run's {self.world_size} ranks. "
                "Resume with the same trainer.nnodes x trainer.n_gpus_per_node, or save once more at that size "
                "(this version writes DCP checkpoints, which load at any world size)"
            )

    def _load_model(self, local_path: str, saved_world: int) -> None:
        from torch.distributed.checkpoint.state_dict import get_model_state_dict, set_model_state_dict

        with _quiet():
            if os.path.isdir(os.path.join(local_path, DCP_MODEL_DIR)):
                state = get_model_state_dict(self.model, options=_state_dict_options(False))
                _dcp_load(state, os.path.join(local_path, DCP_MODEL_DIR))
            else:
                self._require_same_world(local_path, saved_world)
                state = torch.load(self._file(local_path, "model"), weights_only=False)
            set_model_state_dict(self.model, state, options=_state_dict_options(False))

    def _load_optimizer(self, local_path: str, saved_world: int) -> None:
        from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict, set_optimizer_state_dict

        dcp_dir, legacy = os.path.join(local_path, DCP_OPTIM_DIR), self._file(local_path, "optim", saved_world)
        if not os.path.isdir(dcp_dir) and not os.path.exists(legacy):
            raise FileNotFoundError(
                f"{local_path} has no optimizer state; the checkpoint was saved without 'optimizer' in "
                "checkpoint.save_contents. Remove 'optimizer' from checkpoint.load_contents to resume the model only"
            )
        with _quiet():
            if os.path.isdir(dcp_dir):
                # a fresh optimizer has no state yet: this creates it (zero-filled) with the shapes DCP loads into
                state = get_optimizer_state_dict(self.model, self.optimizer, options=_state_dict_options(False))
                _dcp_load(state, dcp_dir)
            else:
                self._require_same_world(local_path, saved_world)
                state = torch.load(legacy, weights_only=False)
            set_optimizer_state_dict(self.model, self.optimizer, state, options=_state_dict_options(False))

    def _load_extra(self, local_path: str, saved_world: int) -> None:
        """lr schedule (the same on every rank) and RNG states. At another world size, rank r takes saved rank r's
        RNG state where it exists; ranks beyond the saved ones keep their own seed (warned)."""
        own = self._file(local_path, "extra_state", saved_world)
        path = own if os.path.exists(own) else self._file(local_path, "extra_state", saved_world, rank=0)
        extra = torch.load(path, weights_only=False)
        if self.lr_scheduler is not None and extra["lr_scheduler"] is not None:
            self.lr_scheduler.load_state_dict(extra["lr_scheduler"])
        if path == own:
            self.load_rng_state(extra["rng"])
        else:
            logger.warning(
                "%s was saved by %d ranks: rank %d has no saved RNG state and keeps its own",
                local_path,
                saved_world,
                self.rank,
            )


def _dcp_save(state: dict, checkpoint_dir: str) -> None:
    """Every rank writes its shards; rank 0 writes the global metadata. Collective when a group exists."""
    import torch.distributed.checkpoint as dcp

    dcp.save(state, checkpoint_id=checkpoint_dir, no_dist=not dist.is_initialized())


def _dcp_load(state: dict, checkpoint_dir: str) -> None:
    """Fill ``state`` in place from a DCP directory; DCP reads each rank's slice from whichever files hold it."""
    import torch.distributed.checkpoint as dcp

    dcp.load(state, checkpoint_id=checkpoint_dir, no_dist=not dist.is_initialized())
