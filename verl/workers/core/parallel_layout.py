"""Data parallel × Ulysses sequence parallel layout of a worker (both worker paths use it).

Rank ``r`` of a world of ``W`` ranks with Ulysses size ``sp`` is data-parallel rank ``r // sp`` and SP rank
``r % sp``: the ``sp`` consecutive ranks of one SP group receive the same rows (dispatch by dp rank) and split their
packed token stream; only SP rank 0 returns outputs. Example: W = 4, sp = 2 → dp ranks 0, 0, 1, 1; collectors 0, 2.
The coordinates are arithmetic (known before any process group exists, so workers can declare their dispatch
info at construction); the groups are built by :meth:`DataSequenceLayout.build_groups`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch.distributed as dist

__all__ = ["DataSequenceLayout", "dp_sp_coordinates"]


def dp_sp_coordinates(rank: int, world_size: int, sp_size: int, sp_key: str) -> tuple[int, int, int]:
    """``(dp_size, dp_rank, sp_rank)`` of ``rank``; raises ValueError naming ``sp_key`` if sp does not divide W."""
    if sp_size < 1 or world_size % sp_size:
        raise ValueError(f"{sp_key}={sp_size} must be >= 1 and divide the number of ranks ({world_size})")
    return world_size // sp_size, rank // sp_size, rank % sp_size


@dataclass
class DataSequenceLayout:
    """Coordinates of this rank and (after :meth:`build_groups`) its dp and Ulysses process groups.

    ``dp_group``/``ulysses_group`` stay None when ``sp_size`` is 1: the dp group is then the world (the core's
    default) and there is no sequence split.
    """

    world_size: int
    rank: int
    sp_size: int
    dp_size: int
    dp_rank: int
    sp_rank: int
    dp_group: Any = None
    ulysses_group: Any = None

    @classmethod
    def from_world(cls, sp_size: int, sp_key: str) -> DataSequenceLayout:
        """The layout of this process in the default process group (1 rank when none is initialised)."""
        rank, world = (dist.get_rank(), dist.get_world_size()) if dist.is_initialized() else (0, 1)
        dp_size, dp_rank, sp_rank = dp_sp_coordinates(rank, world, sp_size, sp_key)
        return cls(world, rank, sp_size, dp_size, dp_rank, sp_rank)

    @property
    def is_collect(self) -> bool:
        return self.sp_rank == 0

    def build_groups(self) -> None:
        """Create the (dp, sp) device mesh's groups (collective: every rank calls it). No-op for sp 1."""
        if self.sp_size == 1 or self.ulysses_group is not None:
            return
        from torch.distributed.device_mesh import init_device_mesh

        from verl.utils.device import get_device_name

        mesh = init_device_mesh(get_device_name(), (self.dp_size, self.sp_size), mesh_dim_names=("dp", "sp"))
        self.dp_group, self.ulysses_group = mesh["dp"].get_group(), mesh["sp"].get_group()

    def groups(self) -> dict[str, Any]:
        """Keyword arguments for the core's forward/loss functions (``dp_group``, ``ulysses_group``)."""
        return {"dp_group": self.dp_group, "ulysses_group": self.ulysses_group}
