"""``python -m verl.utils.platform.npu_sim.launch``: a program runs as on an Ascend node (driver, Ray, workers)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from verl.utils.platform.npu_sim.launch import SETUP_HOOK, fake_acl, ray_runtime_env_hook

REPO = Path(__file__).resolve().parents[3]

PROBE = """
import json, os, sys
import torch
from ray._private.accelerators.npu import NPUAcceleratorManager
from verl.utils.device import get_device_name
print(json.dumps({
    "name": __name__, "argv": sys.argv[1:], "device": get_device_name(), "count": torch.npu.device_count(),
    "ray_npus": NPUAcceleratorManager.get_current_node_num_accelerators(),
    "ray_type": NPUAcceleratorManager.get_current_node_accelerator_type(),
    "hook": os.environ.get("RAY_RUNTIME_ENV_HOOK"),
}))
"""


def test_runtime_env_hook_adds_the_worker_setup_hook_and_keeps_the_rest():
    """Ray's runtime-env hook adds the simulator's worker_process_setup_hook and leaves other fields alone."""
    assert ray_runtime_env_hook(None) == {"worker_process_setup_hook": SETUP_HOOK}
    env = {"env_vars": {"A": "1"}, "worker_process_setup_hook": SETUP_HOOK}
    assert ray_runtime_env_hook(env) == env


def test_runtime_env_hook_refuses_to_replace_another_setup_hook():
    """Ray runs one setup hook: a program's own hook is not silently dropped (nor is the simulator's)."""
    with pytest.raises(RuntimeError, match="my.module.hook"):
        ray_runtime_env_hook({"worker_process_setup_hook": "my.module.hook"})


def test_ray_sizes_the_node_from_the_simulated_acl(monkeypatch):
    """Ray asks AscendCL for the node's NPU count and SoC: the stand-in answers 3 devices of an Ascend910B."""
    from ray._private.accelerators.npu import NPUAcceleratorManager

    monkeypatch.setitem(sys.modules, "acl", fake_acl(3))
    monkeypatch.delenv("ASCEND_RT_VISIBLE_DEVICES", raising=False)
    assert NPUAcceleratorManager.get_current_node_num_accelerators() == 3
    assert NPUAcceleratorManager.get_current_node_accelerator_type() == "Ascend910B"


def test_launch_runs_the_module_as_main_on_a_simulated_node(tmp_path):
    """The module runs as __main__ with its arguments unchanged, on the npu platform with --devices simulated
    NPUs, Ray would count those NPUs, and RAY_RUNTIME_ENV_HOOK is set for the workers Ray starts."""
    (tmp_path / "probe_main.py").write_text(PROBE)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path), str(REPO)]), OMP_NUM_THREADS="1")
    env.pop("VERL_PLATFORM", None)
    env.pop("ASCEND_RT_VISIBLE_DEVICES", None)
    command = [sys.executable, "-m", "verl.utils.platform.npu_sim.launch", "--devices", "2", "probe_main"]
    result = subprocess.run([*command, "a=1", "--flag"], env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    seen = json.loads(result.stdout.strip().splitlines()[-1])
    assert seen == {
        "name": "__main__",
        "argv": ["a=1", "--flag"],
        "device": "npu",
        "count": 2,
        "ray_npus": 2,
        "ray_type": "Ascend910B",
        "hook": "verl.utils.platform.npu_sim.launch.ray_runtime_env_hook",
    }
