"""Reward scoring in worker processes, configured the way a user's run is (``load_reward_manager`` with a reward
function file and ``reward.num_workers`` / ``reward.compute_score_timeout`` / ``reward.batch_timeout``).

Invariants:
* parallel scores equal serial in-process scores exactly (same tensor, same extra info);
* with ``num_workers=4`` four calls run at the same time (measured from the calls' own start/end stamps, not from
  wall time; the speed-up itself is measured by ``benchmarks/reward_scoring.py``);
* a hanging function with a 2 s limit: the first timeout is reported while the batch is still running, naming
  sample and data source; the batch limit ends the batch; the trainer step counts the samples as timed out; the
  hung workers and what they started are gone; no thread is added; the next batch scores normally.
"""

import logging
import os
import re
import textwrap
import threading
import time
from types import SimpleNamespace

import psutil
import pytest
import torch
from omegaconf import OmegaConf

from verl.trainer.ppo.ray_trainer import RayPPOTrainer
from verl.trainer.ppo.reward import load_reward_manager
from verl.workers.reward_manager import NaiveRewardManager

REWARD_FILE = textwrap.dedent(
    """
    import os
    import subprocess
    import sys
    import time

    CALLS_IN_THIS_PROCESS = []  # module state: one list per worker process

    def compute_score(data_source, solution_str, ground_truth, extra_info=None, pid_dir=None, nap_s=0.0):
        start = time.time()
        CALLS_IN_THIS_PROCESS.append(solution_str)
        if "hang" in solution_str:
            child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3600)"])  # like a sandbox run
            with open(os.path.join(pid_dir, f"{os.getpid()}-{child.pid}"), "w"):
                pass
            time.sleep(3600)
        time.sleep(nap_s)
        hit = solution_str.strip().endswith(str(ground_truth))
        return {"score": float(hit) - 0.25 * len(solution_str) / 10, "hit": hit, "pid": os.getpid(),
                "t0": start, "t1": time.time(), "n_calls": len(CALLS_IN_THIS_PROCESS)}
    """
)


def _config(path, **reward):
    reward_kwargs = reward.pop("reward_kwargs", {})
    custom = {"path": str(path), "name": "compute_score", "reward_kwargs": reward_kwargs}
    return OmegaConf.create(
        {"data": {"reward_fn_key": "data_source"}, "reward": {"custom_reward_function": custom, **reward}}
    )


@pytest.fixture
def reward_file(tmp_path):
    path = tmp_path / "user_reward.py"
    path.write_text(REWARD_FILE)
    return path


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _wait_gone(pids, timeout_s=10.0):
    deadline = time.monotonic() + timeout_s
    while any(_alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    return [p for p in pids if _alive(p)]


def test_parallel_scores_equal_serial_scores(tokenizer, make_batch, reward_file):
    """12 samples, 3 data sources: the reward tensor and every extra column except the per-call stamps are equal
    between serial in-process scoring and 4 worker processes, sample by sample."""
    responses = [f"A: {i % 5}" for i in range(12)]
    batch = make_batch(
        [f"Q: {i}" for i in range(12)],
        responses,
        [str(i % 3) for i in range(12)],
        data_sources=["openai/gsm8k", "a", "b"] * 4,
    )
    parallel_manager = load_reward_manager(_config(reward_file, num_workers=4), tokenizer)
    serial_manager = NaiveRewardManager(tokenizer, 0, compute_score=parallel_manager.compute_score)
    assert serial_manager.scorer.pool is None and parallel_manager.scorer.pool.num_workers == 4
    serial, parallel = (m(batch, return_dict=True) for m in (serial_manager, parallel_manager))
    parallel_manager.close()
    assert torch.equal(serial["reward_tensor"], parallel["reward_tensor"])
    assert serial["reward_tensor"].abs().sum() > 0  # scores are not all zero, so equality is informative
    for key in ("score", "hit", "reward_failed", "reward_timed_out"):
        assert serial["reward_extra_info"][key] == parallel["reward_extra_info"][key], key
    assert len(set(parallel["reward_extra_info"]["pid"])) > 1 and set(serial["reward_extra_info"]["pid"]) == {
        os.getpid()
    }


def test_four_workers_run_four_calls_at_once(tokenizer, make_batch, reward_file):
    """reward.num_workers=4, a 1 s reward, 8 samples on a started pool: at some instant exactly four calls were
    running (from each call's own start/end stamps), in four processes; never more than four."""
    manager = load_reward_manager(_config(reward_file, num_workers=4, reward_kwargs={"nap_s": 1.0}), tokenizer)
    warm = make_batch(["Q"] * 4, ["A: 0"] * 4, ["0"] * 4)
    manager(warm)  # starts the four workers, so the measured batch does not include start-up
    out = manager(make_batch(["Q"] * 8, ["A: 1"] * 8, ["1"] * 8), return_dict=True)
    manager.close()
    info = out["reward_extra_info"]
    intervals = list(zip(info["t0"], info["t1"], strict=True))
    most_at_once = max(sum(t0 <= t < t1 for t0, t1 in intervals) for t, _ in intervals)
    assert most_at_once == 4
    assert len(set(info["pid"])) == 4


HANGING = ["A: hang"] * 7 + ["A: 1"]


@pytest.mark.timeout(180)  # without the kill the hang is an hour: fail instead of waiting for it
def test_hanging_reward_with_a_2s_limit(tokenizer, make_batch, reward_file, tmp_path, caplog):
    """7 of 8 samples hang (each also starts a subprocess), reward.compute_score_timeout=2,
    reward.batch_timeout=60, 4 workers.

    * the first timeout is logged while the batch runs, within the 2 s limit + a few seconds of the start (serial
      scoring would report nothing before 7 x 2 = 14 s), naming sample index and data source;
    * the batch finishes within its 60 s deadline: every hanging sample ended by its own 2 s limit (the deadline
      warning never appears) and the one good sample is scored (two waves of 2 s plus worker restarts; the 60 s
      leave room for a loaded machine, where a restart takes a few seconds);
    * the trainer's reward step (``RayPPOTrainer._compute_reward``, what ``fit`` calls) counts 7 timed out;
    * every hung worker and its subprocess are gone, no thread was added, and the next batch scores normally.
    """
    pid_dir = tmp_path / "pids"
    pid_dir.mkdir()
    config = _config(
        reward_file,
        num_workers=4,
        compute_score_timeout=2.0,
        batch_timeout=60.0,
        reward_kwargs={"pid_dir": str(pid_dir)},
    )
    manager = load_reward_manager(config, tokenizer)
    batch = make_batch([f"Q: {i}" for i in range(8)], HANGING, ["1"] * 8, data_sources=[f"src{i}" for i in range(8)])
    threads_before = threading.active_count()
    metrics: dict = {}
    start = time.time()
    with caplog.at_level(logging.WARNING):
        RayPPOTrainer._compute_reward(SimpleNamespace(reward_fn=manager), batch, metrics)
    assert time.time() - start < 60.0 and "reward.batch_timeout=60 s reached" not in caplog.text
    first = next(r for r in caplog.records if "did not return within reward.compute_score_timeout=2 s" in r.message)
    assert first.created - start < 2.0 + 4.0
    named = re.search(r"sample (\d) \(data_source='src(\d)'\)", first.message)
    assert named and named.group(1) == named.group(2) and int(named.group(1)) < 7  # one of the hanging samples
    assert metrics["reward/num_timed_out"] == 7 and metrics["reward/num_failed"] == 7
    assert batch.batch["token_level_scores"][:7].abs().sum() == 0 and batch.batch["token_level_scores"][7].sum() > 0
    hung = [int(p) for name in os.listdir(pid_dir) for p in name.split("-")]
    assert len(hung) == 14 and _wait_gone(hung) == []
    assert threading.active_count() == threads_before
    assert manager(make_batch(["Q"], ["A: 1"], ["1"])).sum() > 0
    idle = manager.scorer.pool.worker_pids()
    manager.close()
    assert _wait_gone(idle) == []


@pytest.mark.timeout(180)  # without the batch limit the hang is an hour: fail instead of waiting for it
def test_batch_limit_ends_a_batch_of_hanging_samples(tokenizer, make_batch, reward_file, tmp_path, caplog):
    """8 hanging samples, no per-call limit, reward.batch_timeout=3: the call returns (the hang is an hour), all 8
    score 0.0 as timed out, and one warning names reward.batch_timeout, the count and the first unfinished sample."""
    config = _config(
        reward_file,
        num_workers=4,
        compute_score_timeout=None,
        batch_timeout=3.0,
        reward_kwargs={"pid_dir": str(tmp_path)},
    )
    manager = load_reward_manager(config, tokenizer)
    start = time.monotonic()
    with caplog.at_level(logging.WARNING):
        out = manager(make_batch(["Q"] * 8, ["A: hang"] * 8, ["1"] * 8), return_dict=True)
    assert time.monotonic() - start < 3.0 + 10.0
    manager.close()
    assert out["reward_metrics"] == {"reward/num_failed": 8, "reward/num_timed_out": 8}
    assert "reward.batch_timeout=3 s reached with 0 of 8 samples scored" in caplog.text
    assert "first: sample 0, data_source='openai/gsm8k'" in caplog.text
