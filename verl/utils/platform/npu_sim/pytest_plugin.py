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


# Devices the preloaded backend reports; tests may use any count up to this one.
_PRELOAD_DEVICE_COUNT = 8


def pytest_configure(config: pytest.Config) -> None:
    """Register the simulated device (inert) before any test runs a backward pass.

    torch's autograd engine sizes its per-device ready queues once, at the first backward of the process, from the
    devices registered at that moment; a device registered later makes every backward on it fail with an internal
    assert. Installing then uninstalling the simulation here registers the backend and the ``torch.npu`` module for
    the whole session while leaving them unreachable (``get_device_name() == "cpu"``) until a test asks for
    ``npu_sim``. Skipped where a real ``torch_npu`` exists (never mix the two) or no compiler can build the backend.
    """
    import importlib.util
    import warnings

    from verl.utils.platform import npu_sim

    if importlib.util.find_spec("torch_npu") is not None:
        return
    try:
        npu_sim.install(device_count=_PRELOAD_DEVICE_COUNT)
    except RuntimeError as exc:  # e.g. no C++ compiler: tests that need the simulator report it themselves
        warnings.warn(f"simulated Ascend not preloaded: {exc}")
        return
    npu_sim.uninstall()
