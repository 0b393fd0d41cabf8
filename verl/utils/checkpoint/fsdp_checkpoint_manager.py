"""FSDP (FSDP1 and FSDP2) checkpoints: sharded model + optimizer + extra state per rank, and an HF export.

Layout of one checkpoint directory (upstream names)::

    <local_path>/
        model_world_size_{W}_rank_{r}.pt        # sharded model state (DCP state-dict API, both strategies)
        optim_world_size_{W}_rank_{r}.pt        # sharded optimizer state
        extra_state_world_size_{W}_rank_{r}.pt  # lr scheduler + RNG states
        fsdp_config.json                        # {"FSDP_version": 1|2, "world_size": W}
        huggingface/                            # config, generation config, tokenizer; with save_contents
                                                # containing "hf_model" also the full weights
                                                # (loadable with AutoModelForCausalLM.from_pretrained)

The whole directory is written as ``<local_path>.tmp`` and renamed when complete (``atomic_commit``).
Every tensor handed to ``state_dict`` must be on one device: callers that offload parameters or optimizer
state load them back first (field-report item 10; the workers do it around every phase).
"""

from __future__ import annotations

import json
import os
import warnings
from typing import Any

import torch
import torch.nn as nn

from verl.utils.checkpoint.checkpoint_manager import BaseCheckpointManager, atomic_commit, prepare_tmp_dir
from verl.utils.device import get_device_name
from verl.utils.fsdp_utils import adapter_for, fsdp_version

__all__ = ["FSDPCheckpointManager", "unwrap_hf_model", "save_hf_model"]


def _state_dict_options(full: bool):
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    # cpu_offload copies shards to host memory; on the CPU they already are, and FSDP1's offload path segfaults
    # there (cpu_environment.md §3b)
    return StateDictOptions(full_state_dict=full, cpu_offload=get_device_name() != "cpu")


def unwrap_hf_model(model: nn.Module) -> nn.Module:
    """The HF model inside an FSDP1 wrapper (FSDP2 and plain models are returned as they are)."""
    while isinstance(getattr(model, "_fsdp_wrapped_module", None), nn.Module):
        model = model._fsdp_wrapped_module
    return model


def _hf_class(model: nn.Module) -> type:
    """The HF class of ``model`` (FSDP2 swaps the class for a dynamic ``FSDP<Name>`` subclass)."""
    from torch.distributed.fsdp import FSDPModule
    from transformers import PreTrainedModel

    for cls in type(model).__mro__:
        if issubclass(cls, PreTrainedModel) and not issubclass(cls, FSDPModule):
            return cls
    raise TypeError(f"{type(model).__name__} is not a transformers PreTrainedModel; cannot export it to HF format")


def save_hf_model(model: nn.Module, full_state_dict: dict[str, torch.Tensor], hf_dir: str) -> None:
    """Write ``full_state_dict`` as an HF model directory for the (unwrapped) model's class and config.

    A meta-device twin of the class does the writing, so tied weights, shard names and ``architectures``
    are exactly what ``from_pretrained`` expects.
    """
    inner = unwrap_hf_model(model)
    cls = _hf_class(inner)
    with torch.device("meta"):
        twin = cls._from_config(inner.config)
    twin.save_pretrained(hf_dir, state_dict=full_state_dict, safe_serialization=True)


class FSDPCheckpointManager(BaseCheckpointManager):
    """Save/load an FSDP1 or FSDP2 model with its optimizer, lr scheduler and RNG states (upstream name).

    Args:
        model: the wrapped model (``fsdp_version(model)`` 1 or 2; a plain module works for world size 1).
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

    # ---------------------------------------------------------------------------------------------------------
    # file names
    # ---------------------------------------------------------------------------------------------------------

    def _file(self, root: str, kind: str) -> str:
        return os.path.join(root, f"{kind}_world_size_{self.world_size}_rank_{self.rank}.pt")

    # ---------------------------------------------------------------------------------------------------------
    # save
    # ---------------------------------------------------------------------------------------------------------

    def save_checkpoint(
        self, local_path: str, hdfs_path: str | None = None, global_step: int = 0, max_ckpt_to_keep: int | None = None
    ) -> None:
        """Write the checkpoint to ``local_path`` atomically. Collective: every rank calls it."""
        if local_path is None:
            return
        if hdfs_path is not None:
            raise ValueError("checkpoint upload to HDFS is not supported; set trainer.default_hdfs_dir=null")
        tmp = prepare_tmp_dir(local_path, self.rank)
        self._save_states(tmp)
        if self.rank == 0:
            self._save_hf_config(tmp)
        if self.should_save_hf_model:
            self._save_hf_weights(tmp)
        atomic_commit(tmp, local_path, self.rank)
        self.previous_global_step = global_step
        self._record_saved_path(os.path.abspath(local_path).rstrip("/"), max_ckpt_to_keep)

    def _save_states(self, root: str) -> None:
        from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_optimizer_state_dict

        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)
            if self.should_save_model:
                torch.save(
                    get_model_state_dict(self.model, options=_state_dict_options(False)), self._file(root, "model")
                )
            if self.should_save_optimizer and self.optimizer is not None:
                optim = get_optimizer_state_dict(self.model, self.optimizer, options=_state_dict_options(False))
                torch.save(optim, self._file(root, "optim"))
        if self.should_save_extra:
            extra = {
                "lr_scheduler": None if self.lr_scheduler is None else self.lr_scheduler.state_dict(),
                "rng": self.get_rng_state(),
            }
            torch.save(extra, self._file(root, "extra_state"))

    def _save_hf_config(self, root: str) -> None:
        hf_dir = self.local_mkdir(os.path.join(root, "huggingface"))
        inner = unwrap_hf_model(self.model)
        with open(os.path.join(root, "fsdp_config.json"), "w") as f:
            json.dump({"FSDP_version": fsdp_version(self.model), "world_size": self.world_size}, f)
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
        """Load what ``checkpoint.load_contents`` lists from ``local_path`` (None: nothing). Collective."""
        if local_path is None:
            return
        if not os.path.isdir(local_path):
            raise FileNotFoundError(f"checkpoint directory {local_path} does not exist")
        self._check_layout(local_path)
        if self.should_load_model:
            self._load_model(local_path)
        if self.should_load_optimizer and self.optimizer is not None:
            self._load_optimizer(local_path)
        if self.should_load_extra:
            extra = torch.load(self._file(local_path, "extra_state"), weights_only=False)
            if self.lr_scheduler is not None and extra["lr_scheduler"] is not None:
                self.lr_scheduler.load_state_dict(extra["lr_scheduler"])
            self.load_rng_state(extra["rng"])

    def _check_layout(self, local_path: str) -> None:
        meta_file = os.path.join(local_path, "fsdp_config.json")
        if not os.path.exists(meta_file):
            raise FileNotFoundError(f"{meta_file} is missing: {local_path} is not a complete FSDP checkpoint")
        with open(meta_file) as f:
            saved_world = json.load(f)["world_size"]
        if saved_world != self.world_size:
            raise RuntimeError(
                f"{local_path} was saved with world size {saved_world} but this run has {self.world_size} ranks; "
                "resume with the same trainer.nnodes x trainer.n_gpus_per_node, or load the HF export in "
                "huggingface/ as actor_rollout_ref.model.path"
            )

    def _load_model(self, local_path: str) -> None:
        from torch.distributed.checkpoint.state_dict import set_model_state_dict

        state = torch.load(self._file(local_path, "model"), weights_only=False)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)
            set_model_state_dict(self.model, state, options=_state_dict_options(False))

    def _load_optimizer(self, local_path: str) -> None:
        from torch.distributed.checkpoint.state_dict import set_optimizer_state_dict

        path = self._file(local_path, "optim")
        if not os.path.exists(path):
            raise FileNotFoundError(
                f"{path} is missing; the checkpoint was saved without 'optimizer' in checkpoint.save_contents. "
                "Remove 'optimizer' from checkpoint.load_contents to resume the model only"
            )
        state = torch.load(path, weights_only=False)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)
            set_optimizer_state_dict(self.model, self.optimizer, state, options=_state_dict_options(False))
