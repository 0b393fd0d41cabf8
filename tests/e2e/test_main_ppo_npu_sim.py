"""``python -m verl.trainer.main_ppo trainer.device=npu`` end to end, through Ray, on the simulated Ascend.

Invariants:
* The quickstart GRPO run with ``trainer.device=npu`` and parameter + optimizer offload completes on a simulated
  Ascend node (driver and every Ray worker run the simulator; Ray counts its NPUs as on hardware) and its per-step
  metrics equal the same run with ``trainer.device=cpu``.
* ``trainer.device=npu`` on a machine without torch_npu fails in seconds, before Ray starts or any model is built,
  with one message naming torch_npu and CANN.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from verl.trainer import quickstart

pytestmark = [pytest.mark.e2e]

REPO = Path(__file__).resolve().parents[2]
LAUNCH = [sys.executable, "-m", "verl.utils.platform.npu_sim.launch", "--devices", "1"]
COMPARED = ("critic/score/mean", "actor/pg_loss", "actor/grad_norm")
OFFLOAD = (
    "actor_rollout_ref.actor.fsdp_config.param_offload=True",
    "actor_rollout_ref.actor.fsdp_config.optimizer_offload=True",
)


@pytest.fixture(scope="module")
def assets(tmp_path_factory):
    out = tmp_path_factory.mktemp("quickstart")
    quickstart.prepare(out)
    return out


def _env() -> dict:
    env = dict(os.environ)
    env.update(OMP_NUM_THREADS="1", RAY_AUTH_MODE="disabled", HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    for key in ("VERL_PLATFORM", "ASCEND_RT_VISIBLE_DEVICES", "RAY_RUNTIME_ENV_HOOK"):
        env.pop(key, None)
    return env


def _command(assets: Path, run_dir: Path, *overrides: str) -> list[str]:
    overrides = (f"trainer.default_local_dir={run_dir / 'ckpt'}", *overrides)
    command = quickstart.main_ppo_command(assets, list(overrides))
    return [arg if not arg.startswith("trainer.log_dir=") else f"trainer.log_dir={run_dir / 'logs'}" for arg in command]


def _train(command: list[str]) -> str:
    """Run main_ppo to completion; returns its output (driver and Ray workers)."""
    result = subprocess.run(command, env=_env(), cwd=REPO, capture_output=True, text=True, timeout=600)
    if result.returncode != 0:
        raise AssertionError(
            f"main_ppo failed ({result.returncode}):\n{result.stdout[-4000:]}\n{result.stderr[-6000:]}"
        )
    return result.stdout + result.stderr


def _worker_platforms(output: str) -> set[str]:
    """Platforms the Ray workers built their models for (their one-line patch report)."""
    return set(re.findall(r"\(WorkerDict pid=\d+\).*\[verl patch\] model_type=\S+ platform=(\w+)", output))


def _metrics(run_dir: Path) -> dict[int, dict]:
    by_step: dict[int, dict] = {}
    for line in (run_dir / "logs" / "metrics.jsonl").read_text().splitlines():
        record = json.loads(line)
        by_step.setdefault(record["step"], {}).update(record["data"])
    return by_step


def test_grpo_on_simulated_npu_with_offload_equals_cpu(assets, tmp_path):
    """Two GRPO steps with param+optimizer offload: trainer.device=npu on the simulated Ascend completes (its Ray
    workers build the model for the npu platform, with the NPU kernel patches) and logs, per step, the
    critic/score/mean, actor/pg_loss and actor/grad_norm of the trainer.device=cpu run (1e-5 relative: the same
    tokens are sampled and the simulated kernels are the CPU ones; only the NPU fused-op patches reorder a few fp32
    reductions, measured 2e-7 on the grad norm). perf/max_memory_*_gb are the simulated NPU's peaks (> 0), 0 on the
    CPU."""
    common = ("trainer.total_training_steps=2", "trainer.val_before_train=False", "trainer.test_freq=-1", *OFFLOAD)
    cpu_output = _train(_command(assets, tmp_path / "cpu", "trainer.device=cpu", *common))
    npu_output = _train([*LAUNCH, *_command(assets, tmp_path / "npu", "trainer.device=npu", *common)[2:]])
    assert _worker_platforms(cpu_output) == {"cpu"} and _worker_platforms(npu_output) == {"npu"}
    cpu, npu = _metrics(tmp_path / "cpu"), _metrics(tmp_path / "npu")
    assert sorted(npu) == sorted(cpu) == [1, 2]
    for step in (1, 2):
        for name in COMPARED:
            assert npu[step][name] == pytest.approx(cpu[step][name], rel=1e-5, abs=1e-9), (step, name)
        # device memory is read through the Platform: the simulated NPU counts its live bytes, the CPU has no allocator
        assert npu[step]["perf/max_memory_allocated_gb"] > 0 and cpu[step]["perf/max_memory_allocated_gb"] == 0
        assert npu[step]["perf/max_memory_reserved_gb"] >= npu[step]["perf/max_memory_allocated_gb"]


def test_npu_without_torch_npu_fails_before_ray(assets, tmp_path):
    """No simulator, no torch_npu: main_ppo exits non-zero within a minute with the platform's one message (naming
    trainer.device=npu, torch_npu and CANN's set_env.sh), before Ray starts and before any model is built."""
    start = time.time()
    command = _command(assets, tmp_path, "trainer.device=npu")
    result = subprocess.run(command, env=_env(), cwd=REPO, capture_output=True, text=True, timeout=300)
    output = result.stdout + result.stderr
    assert result.returncode != 0
    assert time.time() - start < 60
    assert output.count("trainer.device=npu cannot be used on this machine") == 1
    assert "torch_npu cannot be imported" in output and "CANN" in output and "set_env.sh" in output
    assert "Started a local Ray instance" not in output and "[verl patch]" not in output
