"""Test-wide settings: one torch thread per process (2-core machines), offline HF, no Ray auth token."""

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("RAY_AUTH_MODE", "disabled")

import torch  # noqa: E402

pytest_plugins = ["verl.utils.platform.npu_sim.pytest_plugin"]

torch.set_num_threads(1)
