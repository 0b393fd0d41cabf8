"""HF-format export of an FSDP model: at save time from the live model, or offline from a sharded checkpoint.

``export_hf_from_checkpoint(ckpt_dir, target_dir)`` turns the DCP model shards of a checkpoint written by
``FSDPCheckpointManager`` (any world size, FSDP1 or FSDP2) into a directory that
``AutoModelForCausalLM.from_pretrained`` loads: the model is built on the meta device from
``<ckpt_dir>/huggingface/config.json``, materialised empty on the CPU, filled by DCP (which gathers the shards
of every rank) and written with ``save_pretrained``. It runs in one process without a process group.
"""

from __future__ import annotations

import os
import shutil
import warnings

import torch
import torch.nn as nn

__all__ = ["DCP_MODEL_DIR", "DCP_OPTIM_DIR", "export_hf_from_checkpoint", "save_hf_model", "unwrap_hf_model"]

# DCP sub-directories of a checkpoint (each holds .metadata plus one __<rank>_0.distcp file per rank)
DCP_MODEL_DIR = "model_dcp"
DCP_OPTIM_DIR = "optim_dcp"


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


def _model_class(config) -> type:
    import transformers

    for name in getattr(config, "architectures", None) or []:
        cls = getattr(transformers, name, None)
        if cls is not None:
            return cls
    raise ValueError(
        f"config.architectures={getattr(config, 'architectures', None)} names no transformers model class; the "
        "checkpoint's huggingface/config.json must list the model class (e.g. Qwen3_5MoeForCausalLM)"
    )


def _saved_dtype(dcp_dir: str) -> torch.dtype:
    """The dtype the first floating-point tensor was saved in (= fsdp_config.model_dtype of the run)."""
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    for meta in FileSystemReader(dcp_dir).read_metadata().state_dict_metadata.values():
        if isinstance(meta, TensorStorageMetadata) and meta.properties.dtype.is_floating_point:
            return meta.properties.dtype
    return torch.float32


def export_hf_from_checkpoint(ckpt_dir: str, target_dir: str, dtype: torch.dtype | None = None) -> str:
    """Write the full model of the sharded checkpoint ``ckpt_dir`` as an HF model directory ``target_dir``.

    Args:
        ckpt_dir: a directory written by ``FSDPCheckpointManager.save_checkpoint`` (``model_dcp/`` and
            ``huggingface/config.json``), at any world size.
        target_dir: output; the generation config and tokenizer files of ``huggingface/`` are copied along.
        dtype: weight dtype of the export; default: the dtype the checkpoint holds.

    Returns ``target_dir``.
    """
    import torch.distributed.checkpoint as dcp

    from verl.utils.rope_utils import load_hf_config

    dcp_dir, hf_dir = os.path.join(ckpt_dir, DCP_MODEL_DIR), os.path.join(ckpt_dir, "huggingface")
    for required in (os.path.join(dcp_dir, ".metadata"), os.path.join(hf_dir, "config.json")):
        if not os.path.exists(required):
            raise FileNotFoundError(
                f"{required} is missing: {ckpt_dir} is not a sharded (DCP) checkpoint with 'model' in "
                "checkpoint.save_contents"
            )
    config = load_hf_config(hf_dir)
    with torch.device("meta"):
        model = _model_class(config)._from_config(config, dtype=dtype or _saved_dtype(dcp_dir))
    model.to_empty(device="cpu")
    state = model.state_dict()
    # fills the tensors in place from every rank's file; no_dist: plain file reads, no collective, so it also runs on
    # one rank of a live group
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled", category=UserWarning)
        dcp.load(state, checkpoint_id=dcp_dir, no_dist=True)
    model.save_pretrained(target_dir, state_dict=state, safe_serialization=True)
    # the run's own generation config and tokenizer files; config.json and weights are the export's
    for name in os.listdir(hf_dir):
        if name != "config.json" and not name.startswith("model") and os.path.isfile(os.path.join(hf_dir, name)):
            shutil.copy2(os.path.join(hf_dir, name), os.path.join(target_dir, name))
    return target_dir
