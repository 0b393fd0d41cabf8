"""``torch.npu.memory`` of the simulated Ascend: allocator settings are recorded, not applied (no caching allocator)."""

from __future__ import annotations

allocator_settings: list[str] = []


def _set_allocator_settings(settings: str) -> None:
    """Record the setting (tests check what the platform asked for, e.g. ``expandable_segments:True``)."""
    allocator_settings.append(settings)


def _record_memory_history(*args: object, **kwargs: object) -> None:
    return None


def _dump_snapshot(*args: object, **kwargs: object) -> None:
    return None
