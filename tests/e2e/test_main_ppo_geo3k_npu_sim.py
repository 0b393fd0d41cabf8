"""Multimodal GRPO (geo3k format, tiny Qwen3.5 VL model) with ``trainer.device=npu`` on the simulated Ascend equals the
``trainer.device=cpu`` run for 3 steps: critic/score/mean, actor/pg_loss and actor/grad_norm per step (1e-5
relative, the tolerance of ``test_main_ppo_npu_sim.py``). The simulated NPU runs the vision tower's patch
embedding and the image merge on the ``npu`` device, so a random or CPU-stranded tensor anywhere in that path
(field-report items 4-5) would change the metrics or raise the simulator's device-mixing error.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from verl.trainer import quickstart, quickstart_geo3k

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
LAUNCH = [sys.executable, "-m", "verl.utils.platform.npu_sim.launch", "--devices", "1"]
COMPARED = ("critic/score/mean", "actor/pg_loss", "actor/grad_norm")


def _env() -> dict:
    env = dict(os.environ, OMP_NUM_THREADS="1", RAY_AUTH_MODE="disabled", HF_HUB_OFFLINE="1")
    env.update(TOKENIZERS_PARALLELISM="false", PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    for key in ("VERL_PLATFORM", "ASCEND_RT_VISIBLE_DEVICES", "RAY_RUNTIME_ENV_HOOK"):
        env.pop(key, None)
    return env


def _command(assets: Path, run_dir: Path, device: str) -> list[str]:
    overrides = [
        f"trainer.default_local_dir={run_dir / 'ckpt'}",
        f"trainer.log_dir={run_dir / 'logs'}",
        f"trainer.device={device}",
        "trainer.total_training_steps=3",
        "trainer.val_before_train=False",
        "trainer.test_freq=-1",
        "data.train_batch_size=4",
        "actor_rollout_ref.actor.ppo_mini_batch_size=4",
        "actor_rollout_ref.rollout.n=4",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=16",
    ]
    return quickstart.main_ppo_command(assets, overrides, task="geo3k")


def _run(command: list[str]) -> str:
    done = subprocess.run(command, env=_env(), cwd=REPO, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-6000:]
    return done.stdout + done.stderr


def _metrics(run_dir: Path) -> dict[int, dict]:
    by_step: dict[int, dict] = {}
    for line in (run_dir / "logs" / "metrics.jsonl").read_text().splitlines():
        record = json.loads(line)
        by_step.setdefault(record["step"], {}).update(record["data"])
    return by_step


def test_geo3k_on_simulated_npu_equals_cpu(tmp_path):
    assets = tmp_path / "assets"
    quickstart_geo3k.prepare(assets, warmup_steps=30)
    cpu_out = _run(_command(assets, tmp_path / "cpu", "cpu"))
    npu_out = _run([*LAUNCH, *_command(assets, tmp_path / "npu", "npu")[2:]])
    platforms = lambda out: set(re.findall(r"\[verl patch\] model_type=\S+ platform=(\w+)", out))  # noqa: E731
    assert platforms(cpu_out) == {"cpu"} and platforms(npu_out) == {"npu"}
    cpu, npu = _metrics(tmp_path / "cpu"), _metrics(tmp_path / "npu")
    assert sorted(cpu) == sorted(npu) == [1, 2, 3]
    for step in (1, 2, 3):
        for name in COMPARED:
            assert npu[step][name] == pytest.approx(cpu[step][name], rel=1e-5, abs=1e-9), (step, name)
