"""Data parallel x Ulysses layout (verl.workers.core.parallel_layout.py)."""

import pytest

from verl.workers.core.parallel_layout import DataSequenceLayout, dp_sp_coordinates


def test_coordinates_by_hand():
    """Invariant: W = 4, sp = 2 → dp size 2; ranks 0..3 are dp ranks 0, 0, 1, 1 and SP ranks 0, 1, 0, 1 (the legacy
    workers' convention, so both paths dispatch the same rows to the same ranks)."""
    assert [dp_sp_coordinates(r, 4, 2, "sp") for r in range(4)] == [(2, 0, 0), (2, 0, 1), (2, 1, 0), (2, 1, 1)]
    assert dp_sp_coordinates(3, 4, 1, "sp") == (4, 3, 0)


def test_sp_must_divide_the_world():
    """Invariant: an SP size that does not divide the ranks raises naming the key."""
    with pytest.raises(ValueError, match="actor.ulysses_sequence_parallel_size=3"):
        dp_sp_coordinates(0, 4, 3, "actor.ulysses_sequence_parallel_size")


def test_single_process_layout_has_no_groups():
    """Invariant: without a process group the layout is one rank that collects; SP 1 builds no groups (the dp group
    is then the world: None)."""
    layout = DataSequenceLayout.from_world(1, "sp")
    layout.build_groups()
    assert (layout.dp_size, layout.dp_rank, layout.is_collect) == (1, 0, True)
    assert layout.dp_group is None and layout.ulysses_group is None
