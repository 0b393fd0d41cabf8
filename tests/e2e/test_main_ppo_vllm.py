"""End to end with the REAL vLLM engine as the rollout (its CPU build, `.venv-vllm`): `python -m verl.trainer.quickstart
actor_rollout_ref.rollout.name=vllm` — main_ppo on Ray, FSDP actor, vLLM engine in the actor worker, the weights
synced into it before every generation.

Invariants:
* GRPO learns with the vLLM rollout: mean reward of the last 5 steps >= the first 5 + 0.3 (the HF-rollout quickstart's
  criterion);
* every step logs upstream's training-inference mismatch metrics, and the engine's sampled-token log-probs stay
  within bf16 rounding of the fp32 actor's (mean |d log p| < 0.01 nats; a stale or wrong sync is off by 0.05+, the
  dummy start-up weights by 0.1+);
* the same run works on the FSDP1 actor and on the engine worker path (3 steps each).
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from verl.trainer import quickstart

pytestmark = [pytest.mark.e2e, pytest.mark.vllm]

REPO = Path(__file__).resolve().parents[2]
MISMATCH_METRICS = (
    "training/rollout_probs_diff_mean",
    "training/rollout_probs_diff_max",
    "training/rollout_probs_diff_std",
    "training/rollout_actor_probs_pearson_corr",
)


@pytest.fixture(scope="module")
def assets(tmp_path_factory):
    out = tmp_path_factory.mktemp("quickstart_vllm")
    quickstart.prepare(out, profile="vllm")
    return out


def _run(assets: Path, run_dir: Path, *overrides: str) -> dict[int, dict]:
    command = quickstart.main_ppo_command(
        assets,
        [
            quickstart.VLLM_ROLLOUT_OVERRIDE,
            f"trainer.default_local_dir={run_dir / 'ckpt'}",
            "trainer.test_freq=-1",
            "trainer.val_before_train=False",
            *overrides,
        ],
    )
    command = [
        arg if not arg.startswith("trainer.log_dir=") else f"trainer.log_dir={run_dir / 'logs'}" for arg in command
    ]
    env = dict(os.environ, OMP_NUM_THREADS="1", RAY_AUTH_MODE="disabled", HF_HUB_OFFLINE="1")
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    result = subprocess.run(command, env=env, cwd=REPO, capture_output=True, text=True, timeout=1500)
    if result.returncode != 0:
        raise AssertionError(
            f"main_ppo failed ({result.returncode}):\n{result.stdout[-4000:]}\n{result.stderr[-6000:]}"
        )
    by_step: dict[int, dict] = {}
    for line in (run_dir / "logs" / "metrics.jsonl").read_text().splitlines():
        record = json.loads(line)
        by_step.setdefault(record["step"], {}).update(record["data"])
    return by_step


def _check_mismatch_metrics(metrics: dict[int, dict]) -> float:
    for step, data in metrics.items():
        missing = [key for key in MISMATCH_METRICS if key not in data]
        assert not missing, f"step {step} lacks {missing}"
    worst = max(data["training/rollout_log_probs_diff_mean"] for data in metrics.values())
    assert worst < 0.01, f"engine vs actor log-probs differ by {worst} nats on average in some step"
    return worst


def test_grpo_quickstart_with_vllm_learns(assets, tmp_path, capsys):
    metrics = _run(assets, tmp_path, "trainer.total_training_steps=25")
    scores = [metrics[s]["critic/score/mean"] for s in sorted(metrics)]
    assert len(scores) == 25
    first, last = sum(scores[:5]) / 5, sum(scores[-5:]) / 5
    worst = _check_mismatch_metrics(metrics)
    with capsys.disabled():
        print(f"\n[vllm quickstart] first 5 steps {first:.3f}, last 5 steps {last:.3f}; worst mean |dlogp| {worst:.4f}")
    assert last >= first + 0.3, f"no visible learning: first 5 steps {first:.3f}, last 5 steps {last:.3f}: {scores}"


@pytest.mark.parametrize(
    "overrides",
    [("actor_rollout_ref.actor.strategy=fsdp",), ("trainer.use_legacy_worker_impl=disable",)],
    ids=["fsdp1", "engine_workers"],
)
def test_vllm_rollout_on_other_actor_paths(assets, tmp_path, overrides):
    metrics = _run(assets, tmp_path, "trainer.total_training_steps=3", *overrides)
    assert sorted(metrics) == [1, 2, 3]
    _check_mismatch_metrics(metrics)


def test_grpo_with_vllm_and_token_is_logs_rollout_correction(assets, tmp_path, capsys):
    """GRPO with the vLLM rollout and ``algorithm.rollout_correction.rollout_is=token`` (3 steps): every step logs
    upstream's ``rollout_corr/*`` metrics, and the IS weights are not all 1: the bf16 engine and the fp32 actor
    disagree on token probabilities (the mismatch the correction exists for)."""
    metrics = _run(assets, tmp_path, "trainer.total_training_steps=3", "algorithm.rollout_correction.rollout_is=token")
    assert sorted(metrics) == [1, 2, 3]
    for step, data in metrics.items():
        for key in (
            "rollout_corr/rollout_is_mean",
            "rollout_corr/rollout_is_std",
            "rollout_corr/kl",
            "rollout_corr/chi2_token",
            "rollout_corr/rollout_is_eff_sample_size",
        ):
            assert key in data, f"step {step} lacks {key}"
        assert data["rollout_corr/rollout_is_std"] > 0, f"step {step}: every IS weight is the same"
        assert data["rollout_corr/rollout_is_max"] > data["rollout_corr/rollout_is_min"], step
    with capsys.disabled():
        stats = {k: metrics[1][f"rollout_corr/{k}"] for k in ("rollout_is_min", "rollout_is_max", "rollout_is_std")}
        print(f"\n[vllm rollout_is=token] step 1 IS weights: {stats}, kl {metrics[1]['rollout_corr/kl']:.2e}")


@pytest.mark.slow
def test_grpo_with_vllm_and_r3_trains(assets, tmp_path):
    """GRPO with the vLLM rollout and router replay R3 (3 steps, legacy workers): the rollout records the routing
    vLLM's MoE routers used (prefix cache off), the old-log-prob pass and the update replay it; every step completes
    and logs the engine-vs-actor mismatch metrics within the usual bound."""
    metrics = _run(
        assets,
        tmp_path,
        "trainer.total_training_steps=3",
        "actor_rollout_ref.actor.router_replay.mode=R3",
        "actor_rollout_ref.rollout.enable_rollout_routing_replay=True",
        "actor_rollout_ref.rollout.enable_prefix_caching=False",
    )
    assert sorted(metrics) == [1, 2, 3]
    _check_mismatch_metrics(metrics)
