"""Test-wide settings: one torch thread per process (2-core machines), offline HF, no Ray auth token."""

import importlib.util
import os

import pytest

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("RAY_AUTH_MODE", "disabled")

import torch  # noqa: E402

pytest_plugins = ["verl.utils.platform.npu_sim.pytest_plugin"]

torch.set_num_threads(1)


def pytest_collection_modifyitems(config, items):
    """Tests marked ``vllm`` need the real engine, which lives in its own environment (``make test-vllm``)."""
    if importlib.util.find_spec("vllm") is not None:
        return
    skip = pytest.mark.skip(reason="needs the real vLLM engine: run in .venv-vllm (make test-vllm)")
    for item in items:
        if item.get_closest_marker("vllm") is not None:
            item.add_marker(skip)


def _load_upstream_config_defaults():
    """tests/upstream_config_defaults.py (upstream's recorded config defaults), loaded by path: with
    --import-mode=importlib the tests directory is not on sys.path."""
    import importlib.util
    import sys
    from pathlib import Path

    name = "upstream_config_defaults"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, Path(__file__).parent / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


@pytest.fixture(scope="session")
def upstream_defaults():
    return _load_upstream_config_defaults()
