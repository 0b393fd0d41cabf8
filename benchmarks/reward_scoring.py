"""Reward scoring in worker processes (``reward.num_workers``) against serial in-process scoring.

1. ``timing_s/reward`` of one step: a batch of rollouts scored by a reward function that sleeps (a stand-in for a
   slow verifier, sandbox or judge call), serially in the trainer process (the baseline: what a manager built
   without limits does, and what every run did before) and with ``reward.num_workers`` worker processes, timed with
   the trainer's own ``marked_timer("reward")``. The first parallel step includes starting the workers ("cold");
   later steps reuse them ("warm"). Scores must be identical.
2. What the processes cost: starting workers (cold pool, no-op function) and the per-call overhead of a round trip
   to a worker against a direct call.

    python benchmarks/reward_scoring.py            # 64 samples x 0.5 s, 4 workers: ~1 min
    python benchmarks/reward_scoring.py --quick    # 16 samples x 0.2 s: ~10 s
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from omegaconf import OmegaConf

REWARD_FILE = """
import time

def compute_score(data_source, solution_str, ground_truth, extra_info=None, nap_s=0.0):
    time.sleep(nap_s)
    return {"score": float(solution_str.endswith(ground_truth)), "length": len(solution_str)}
"""


def _noop(x: int) -> int:
    return x


def _batch(tokenizer, n: int):
    from verl.protocol import DataProto

    prompt_len, response_len = 8, 8
    ids = [tokenizer.encode(f"{i % 10}", add_special_tokens=False) for i in range(n)]
    prompts = torch.full((n, prompt_len), tokenizer.pad_token_id)
    responses = torch.full((n, response_len), tokenizer.pad_token_id)
    mask = torch.zeros((n, prompt_len + response_len), dtype=torch.long)
    for i, r in enumerate(ids):
        prompts[i, -1] = r[0]
        responses[i, : len(r)] = torch.tensor(r)
        mask[i, prompt_len - 1 : prompt_len + len(r)] = 1
    non_tensors = {
        "data_source": np.array(["bench"] * n, dtype=object),
        "reward_model": np.array([{"ground_truth": str(i % 3)} for i in range(n)], dtype=object),
    }
    return DataProto.from_dict({"prompts": prompts, "responses": responses, "attention_mask": mask}, non_tensors)


def _timed_reward(manager, batch) -> tuple[float, dict]:
    from verl.trainer.ppo.ray_trainer import marked_timer

    timing: dict[str, float] = {}
    with marked_timer("reward", timing):
        out = manager(batch, return_dict=True)
    return timing["reward"], out


def step_timing(n: int, nap_s: float, workers: int) -> None:
    from verl.trainer.ppo.reward import load_reward_manager
    from verl.utils.tokenizer import build_offline_tokenizer
    from verl.workers.reward_manager import NaiveRewardManager

    tokenizer = build_offline_tokenizer([str(i) for i in range(10)], vocab_size=300)
    batch = _batch(tokenizer, n)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "slow_reward.py"
        path.write_text(REWARD_FILE)
        custom = {"path": str(path), "name": "compute_score", "reward_kwargs": {"nap_s": nap_s}}
        config = OmegaConf.create(
            {"data": {"reward_fn_key": "data_source"}, "reward": {"custom_reward_function": custom}}
        )
        parallel = load_reward_manager(OmegaConf.merge(config, {"reward": {"num_workers": workers}}), tokenizer)
        serial = NaiveRewardManager(tokenizer, 0, compute_score=parallel.compute_score)
        serial_s, serial_out = _timed_reward(serial, batch)
        cold_s, cold_out = _timed_reward(parallel, batch)
        warm_s, warm_out = _timed_reward(parallel, batch)
        parallel.close()
    same = all(torch.equal(serial_out["reward_tensor"], o["reward_tensor"]) for o in (cold_out, warm_out))
    print(f"\n1. timing_s/reward, {n} samples x {nap_s} s reward")
    print(f"   serial, in process (baseline)        {serial_s:8.2f} s   1.00")
    print(f"   reward.num_workers={workers}, first step   {cold_s:8.2f} s   {cold_s / serial_s:.2f}")
    print(f"   reward.num_workers={workers}, later steps  {warm_s:8.2f} s   {warm_s / serial_s:.2f}")
    print(f"   ideal (serial / {workers})                  {serial_s / workers:8.2f} s   {1 / workers:.2f}")
    print(f"   scores identical to serial: {same}")
    if not same:
        sys.exit("parallel scores differ from serial scores")


def process_cost(calls: int) -> None:
    from verl.utils.process_pool import ProcessCallPool

    print("\n2. what the worker processes cost (no-op function)")
    for workers in (1, 4):
        pool = ProcessCallPool(_noop, workers)
        start = time.perf_counter()
        pool.map([{"x": i} for i in range(workers)])
        print(f"   start {workers} worker(s) and get the first results   {time.perf_counter() - start:8.3f} s")
        pool.close()
    direct_start = time.perf_counter()
    for i in range(calls):
        _noop(i)
    direct = (time.perf_counter() - direct_start) / calls
    for workers in (1, 4):
        pool = ProcessCallPool(_noop, workers)
        pool.map([{"x": i} for i in range(workers)])  # started
        start = time.perf_counter()
        pool.map([{"x": i} for i in range(calls)])
        per_call = (time.perf_counter() - start) / calls
        pool.close()
        print(
            f"   per call, {workers} worker(s), {calls} calls             {per_call * 1e6:8.0f} us   "
            f"(direct call {direct * 1e6:.2f} us)"
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="16 samples x 0.2 s, 64 no-op calls")
    parser.add_argument("--workers", type=int, default=4)
    args = parser.parse_args(argv)
    n, nap_s, calls = (16, 0.2, 64) if args.quick else (64, 0.5, 512)
    torch.set_num_threads(1)
    step_timing(n, nap_s, args.workers)
    process_cost(calls)
    return 0


if __name__ == "__main__":
    sys.exit(main())
