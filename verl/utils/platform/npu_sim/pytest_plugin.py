"""pytest fixtures for the simulated Ascend.

Use in a test module with ``from verl.utils.platform.npu_sim.pytest_plugin import npu_sim  # noqa: F401`` (pytest
finds fixtures in module globals), or load it for a whole suite with ``pytest_plugins`` in the root conftest.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from verl.utils.platform.npu_sim import simulated_ascend


@pytest.fixture
def npu_sim(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The simulated Ascend for one test: ``get_device_name() == "npu"``; everything is undone afterwards."""
    monkeypatch.delenv("VERL_PLATFORM", raising=False)
    with simulated_ascend():
        yield
