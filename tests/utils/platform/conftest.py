"""The simulated-Ascend fixture (``npu_sim``) for the platform tests."""

from verl.utils.platform.npu_sim.pytest_plugin import npu_sim  # noqa: F401
