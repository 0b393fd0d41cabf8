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

__all__ = [
    "DCP_MODEL_DIR",
    "DCP_OPTIM_DIR",
    "compare_with_hf_dir",
    "export_hf_from_checkpoint",
    "load_checkpoint_model",
    "save_hf_model",
    "unwrap_hf_model",
]

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


def _model_class(config, trust_remote_code: bool = False) -> type:
    import transformers

    for name in getattr(config, "architectures", None) or []:
        cls = getattr(transformers, name, None)
        if cls is not None:
            return cls
    reference = (getattr(config, "auto_map", None) or {}).get("AutoModelForCausalLM")
    if trust_remote_code and reference:
        from transformers.dynamic_module_utils import get_class_from_dynamic_module

        return get_class_from_dynamic_module(reference, config._name_or_path)
    raise ValueError(
        f"config.architectures={getattr(config, 'architectures', None)} names no transformers model class; the "
        "checkpoint's huggingface/config.json must list the model class (e.g. Qwen3_5MoeForCausalLM), or, for a "
        "model whose code ships with the checkpoint (auto_map), pass --trust-remote-code"
    )


def _saved_dtype(dcp_dir: str) -> torch.dtype:
    """The dtype the first floating-point tensor was saved in (= fsdp_config.model_dtype of the run)."""
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    for meta in FileSystemReader(dcp_dir).read_metadata().state_dict_metadata.values():
        if isinstance(meta, TensorStorageMetadata) and meta.properties.dtype.is_floating_point:
            return meta.properties.dtype
    return torch.float32


def load_checkpoint_model(
    ckpt_dir: str, dtype: torch.dtype | None = None, trust_remote_code: bool = False
) -> tuple[nn.Module, dict[str, torch.Tensor]]:
    """The HF model (on the CPU) and its full state dict from a checkpoint directory, in either layout:
    verl-ascend's ``model_dcp/`` (any world size) or upstream's ``model_world_size_W_rank_r.pt`` files."""
    import torch.distributed.checkpoint as dcp

    from verl.model_merger.fsdp_layout import find_upstream_shards, load_upstream_state_dict
    from verl.utils.rope_utils import load_hf_config

    dcp_dir, hf_dir = os.path.join(ckpt_dir, DCP_MODEL_DIR), os.path.join(ckpt_dir, "huggingface")
    if not os.path.isfile(os.path.join(hf_dir, "config.json")):
        raise FileNotFoundError(f"{hf_dir}/config.json is missing: {ckpt_dir} is not an actor/critic checkpoint dir")
    upstream_files = [] if os.path.isdir(dcp_dir) else find_upstream_shards(ckpt_dir)
    if not upstream_files and not os.path.exists(os.path.join(dcp_dir, ".metadata")):
        raise FileNotFoundError(
            f"{dcp_dir}/.metadata is missing and there are no model_world_size_*_rank_*.pt files: {ckpt_dir} holds "
            "no model weights (was 'model' in checkpoint.save_contents?)"
        )
    config = load_hf_config(hf_dir, trust_remote_code=trust_remote_code)
    if upstream_files:
        full = load_upstream_state_dict(upstream_files)
        first_float = next((t.dtype for t in full.values() if t.is_floating_point()), torch.float32)
        saved_dtype = first_float
    else:
        full, saved_dtype = None, _saved_dtype(dcp_dir)
    with torch.device("meta"):
        model = _model_class(config, trust_remote_code)._from_config(config, dtype=dtype or saved_dtype)
    model.to_empty(device="cpu")
    state = model.state_dict()
    if full is None:
        # fills the tensors in place from every rank's file; no_dist: plain file reads, no collective, so it also
        # runs on one rank of a live group
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="torch.distributed is disabled", category=UserWarning)
            dcp.load(state, checkpoint_id=dcp_dir, no_dist=True)
    else:
        _fill(state, full, ckpt_dir)
    return model, state


def _fill(state: dict[str, torch.Tensor], full: dict[str, torch.Tensor], ckpt_dir: str) -> None:
    """Copy ``full`` into the model's ``state`` (cast to its dtype); the names must be the model's."""
    missing = sorted(set(state) - set(full))
    unexpected = sorted(set(full) - set(state))
    # a tied lm_head is absent from upstream's shards when it shares the embedding
    shared = {state[other].data_ptr() for other in full if other in state}
    missing = [name for name in missing if state[name].data_ptr() not in shared]
    if missing or unexpected:
        raise ValueError(
            f"{ckpt_dir}: the shards do not match huggingface/config.json's model: missing {missing[:5]}, "
            f"unexpected {unexpected[:5]}"
        )
    for name, tensor in full.items():
        if tuple(tensor.shape) != tuple(state[name].shape):
            raise ValueError(
                f"{ckpt_dir}: {name} has shape {tuple(tensor.shape)}, the model {tuple(state[name].shape)}"
            )
        state[name].copy_(tensor)


def export_hf_from_checkpoint(
    ckpt_dir: str, target_dir: str, dtype: torch.dtype | None = None, trust_remote_code: bool = False
) -> str:
    """Write the full model of the sharded checkpoint ``ckpt_dir`` as an HF model directory ``target_dir``.

    Args:
        ckpt_dir: a directory written by ``FSDPCheckpointManager.save_checkpoint`` (``model_dcp/`` and
            ``huggingface/config.json``), at any world size, or by upstream verl's FSDP checkpoint manager
            (``model_world_size_W_rank_r.pt``).
        target_dir: output; the generation config and tokenizer files of ``huggingface/`` are copied along.
        dtype: weight dtype of the export; default: the dtype the checkpoint holds.
        trust_remote_code: allow a model class that ships as code with the checkpoint (``auto_map``).

    Returns ``target_dir``.
    """
    model, state = load_checkpoint_model(ckpt_dir, dtype=dtype, trust_remote_code=trust_remote_code)
    hf_dir = os.path.join(ckpt_dir, "huggingface")
    model.save_pretrained(target_dir, state_dict=state, safe_serialization=True)
    # the run's own generation config and tokenizer files; config.json and weights are the export's
    for name in os.listdir(hf_dir):
        if name != "config.json" and not name.startswith("model") and os.path.isfile(os.path.join(hf_dir, name)):
            shutil.copy2(os.path.join(hf_dir, name), os.path.join(target_dir, name))
    return target_dir


def compare_with_hf_dir(
    ckpt_dir: str, test_hf_dir: str, trust_remote_code: bool = False, atol: float = 0.0
) -> list[str]:
    """Differences between the checkpoint's merged weights and the HF model in ``test_hf_dir`` (compared in the
    checkpoint's dtype): one line per missing/extra name or tensor off by more than ``atol``; [] when equal."""
    from transformers import AutoModelForCausalLM

    _, merged = load_checkpoint_model(ckpt_dir, trust_remote_code=trust_remote_code)
    reference = AutoModelForCausalLM.from_pretrained(test_hf_dir, trust_remote_code=trust_remote_code).state_dict()
    problems = [f"missing in {test_hf_dir}: {n}" for n in sorted(set(merged) - set(reference))]
    problems += [f"not in the checkpoint: {n}" for n in sorted(set(reference) - set(merged))]
    for name in sorted(set(merged) & set(reference)):
        ours, theirs = merged[name], reference[name].to(merged[name].dtype)
        if ours.shape != theirs.shape:
            problems.append(f"{name}: shape {tuple(ours.shape)} vs {tuple(theirs.shape)}")
            continue
        diff = (ours.float() - theirs.float()).abs().max().item() if ours.numel() else 0.0
        if diff > atol:
            problems.append(f"{name}: max |difference| {diff:.3g} > {atol:g}")
    return problems
