"""The two FSDP checkpoint layouts ``python -m verl.model_merger`` reads, gathered into one full state dict.

* verl-ascend's: ``model_dcp/`` (torch.distributed.checkpoint shards, any world size), read by DCP.
* upstream verl's: one pickled state dict per rank, ``model_world_size_{W}_rank_{r}.pt``, each holding that
  rank's shard of every parameter -- a ``DTensor`` (FSDP2, or FSDP1 with DTensor state dicts) whose placement
  says how the shards fit together, or a plain tensor (older FSDP1 sharded state dicts: a flat split of dim 0).
  A 1-D mesh is what upstream's FSDP/FSDP2 workers write: ``Shard(d)`` pieces are concatenated along ``d`` in
  rank order, ``Replicate()`` ones are taken from rank 0.

Both need ``<local_dir>/huggingface/config.json`` (the model's config), which either trainer writes.
"""

from __future__ import annotations

import logging
import os
import re
from pathlib import Path

import torch

__all__ = ["UPSTREAM_SHARD_PATTERN", "find_upstream_shards", "load_upstream_state_dict"]

UPSTREAM_SHARD_PATTERN = re.compile(r"^model_world_size_(\d+)_rank_(\d+)\.pt$")


def find_upstream_shards(local_dir: str | os.PathLike) -> list[Path]:
    """The ``model_world_size_W_rank_r.pt`` files of ``local_dir`` in rank order ([] when there are none).

    Raises ``FileNotFoundError`` naming the missing ranks when the set is incomplete (a copy cut short), and
    ``ValueError`` when files of two world sizes are mixed.
    """
    found: dict[int, dict[int, Path]] = {}
    for path in Path(local_dir).iterdir():
        match = UPSTREAM_SHARD_PATTERN.match(path.name)
        if match:
            found.setdefault(int(match.group(1)), {})[int(match.group(2))] = path
    if not found:
        return []
    if len(found) > 1:
        raise ValueError(f"{local_dir}: model shards of several world sizes {sorted(found)}; keep one run's files")
    ((world_size, by_rank),) = found.items()
    missing = sorted(set(range(world_size)) - set(by_rank))
    if missing:
        raise FileNotFoundError(f"{local_dir}: model_world_size_{world_size}_rank_{{{missing}}}.pt missing")
    return [by_rank[rank] for rank in range(world_size)]


def _load_rank(path: Path) -> dict:
    # Upstream pickles DTensors (weights_only cannot rebuild them); these are the user's own training files.
    # Unpickling their DeviceMesh without a process group logs a torch.compile warning that does not apply here.
    mesh_log = logging.getLogger("torch.distributed.device_mesh")
    level = mesh_log.level
    mesh_log.setLevel(logging.ERROR)
    try:
        state = torch.load(path, map_location="cpu", weights_only=False)
    finally:
        mesh_log.setLevel(level)
    if not isinstance(state, dict):
        raise ValueError(f"{path}: expected a state dict (name -> tensor), got {type(state).__name__}")
    return state


def _merge_key(name: str, pieces: list, files: list[Path]) -> torch.Tensor:
    from torch.distributed.tensor import DTensor, Replicate, Shard

    first = pieces[0]
    if not isinstance(first, DTensor):
        return torch.cat([p for p in pieces], dim=0) if len(pieces) > 1 else first
    if len(first.placements) != 1:
        raise ValueError(
            f"{files[0]}: {name} is placed on a {len(first.placements)}-D mesh {first.placements}; only the 1-D "
            "FSDP mesh upstream's FSDP workers write is supported (merge HSDP checkpoints with upstream's merger)"
        )
    placement = first.placements[0]
    if isinstance(placement, Replicate):
        return first.to_local()
    if isinstance(placement, Shard):
        merged = torch.cat([p.to_local() for p in pieces], dim=placement.dim)
        if tuple(merged.shape) != tuple(first.shape):
            raise ValueError(f"{name}: shards add up to {tuple(merged.shape)}, the DTensor says {tuple(first.shape)}")
        return merged
    raise ValueError(f"{name}: placement {placement} cannot be merged")


def load_upstream_state_dict(files: list[Path]) -> dict[str, torch.Tensor]:
    """The full state dict from every rank's shard file (rank order), on the CPU."""
    states = [_load_rank(path) for path in files]
    keys = list(states[0])
    for path, state in zip(files[1:], states[1:], strict=True):
        if set(state) != set(keys):
            raise ValueError(f"{path}: holds other parameter names than {files[0]}")
    return {name: _merge_key(name, [state[name] for state in states], files) for name in keys}
