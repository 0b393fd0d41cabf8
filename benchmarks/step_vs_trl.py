"""This project's GRPO step vs TRL's ``GRPOTrainer`` on the CPU quickstart task, alternating runs on one machine.

Both sides train the quickstart's tiny Qwen3.5-MoE checkpoint (``verl.trainer.quickstart.prepare``) on its
"digits" prompts with its reward (``verl.trainer.quickstart.score``): 8 prompts x 8 samples per step, 4 response
tokens, lr 2e-3 (constant, AdamW, weight decay 0.01, betas 0.9/0.999), grad-norm clip 1.0, clip ratio 0.2,
token-mean loss over the batch, group-std-normalised advantages, no KL, one optimizer step per batch, one epoch,
fp32, one torch thread per process (``OMP_NUM_THREADS=1``), temperature 1.0, top-p 1, no top-k. Settings that
cannot be matched are printed with the table (``UNMATCHED``).

Each round launches one fresh run of this project (``python -m verl.trainer.main_ppo --config-name
quickstart_cpu``, Ray included, as a user runs it) and one fresh TRL run (``benchmarks/trl_grpo_quickstart.py``
in TRL's own virtualenv), in alternating order. Per step it records the phase times each trainer reports, the
wall time and the CPU seconds of the whole process tree (driver, Ray's processes, workers: sampled with psutil
when the step's metrics line appears). The first ``--drop`` steps of every run are dropped (warm-up). Printed: per
side the median over all kept steps of all rounds, and the ratio as the median over rounds of (ours / TRL) of the
per-round medians, so that load from other jobs on a shared machine, which moves both sides of a round together,
cancels as far as it can. Start-up is launch -> the first step begins (first metrics line minus that step's time).

``--padded`` adds a third side to every round: this project again with ``use_remove_padding=False`` (the padded
(64, L) batch instead of the packed row), in the same alternating order, and prints packed / padded per phase.

TRL is not a dependency of this package: make ``bench-trl`` creates ``/tmp/venv-trl`` (see benchmarks/README.md)
and ``--trl-python`` points at it.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

TRL_SCRIPT = ROOT / "benchmarks" / "trl_grpo_quickstart.py"
ENV = {
    "OMP_NUM_THREADS": "1",
    "MKL_NUM_THREADS": "1",
    "TOKENIZERS_PARALLELISM": "false",
    "RAY_AUTH_MODE": "disabled",
    "HF_HUB_OFFLINE": "1",
}
# Phases printed, in order: (label, this project's timing key, TRL's key). None: that side has no such phase.
PHASES = [
    ("generation", "timing_s/gen", "gen"),
    ("reward + advantage", ("timing_s/reward", "timing_s/adv"), "score"),
    ("old log-prob", "timing_s/old_log_prob", None),
    ("update (fwd+bwd+optim)", "timing_s/update_actor", "update"),
    ("whole step", "timing_s/step", "step"),
]
MATCHED = [
    "checkpoint: the quickstart's tiny Qwen3.5-MoE (same files), fp32 weights and maths",
    "task: the quickstart's 256 'digits' prompts in dataset order, chat template, reward quickstart.score",
    "batch: 8 prompts x 8 samples = 64 responses, max 4 new tokens, temperature 1.0, top-p 1.0, no top-k",
    "loss: clipped PPO ratio, eps 0.2/0.2, token-mean over the 64 responses, advantages (r - mean)/(std + eps) per group",
    "no KL (verl use_kl_loss=False, TRL beta=0), no entropy bonus, no MoE router aux loss (TRL router_aux_loss_coef=0)",
    "optimizer: AdamW lr 2e-3 constant, weight decay 0.01, betas (0.9, 0.999), grad-norm clip 1.0, 1 step per batch",
    "one epoch over one mini-batch (TRL num_iterations=1, steps_per_generation=1, gradient_accumulation_steps=1)",
    "CPU, one torch thread per process, HF generate as the rollout on both sides",
]
UNMATCHED = [
    "process layout: this project runs a Ray driver + one worker process (as `make quickstart` does); TRL one process",
    "old log-prob: skipped on both sides here (this project: actor.skip_old_log_prob_on_policy, on where exact; "
    "TRL: num_iterations=1); `actor_rollout_ref.actor.skip_old_log_prob_on_policy=False` measures the extra pass",
    "model code: TRL runs the stock HF Qwen3.5-MoE forward (torch fallbacks of the GDN kernels); this project its "
    "patched packed forward (varlen GDN kernels in torch)",
    "group std: this project uses torch.std (unbiased) per group, TRL too; eps 1e-6 (verl) vs 1e-4 (TRL)",
    "sampling RNG streams differ, so the sampled responses differ (the learning curves are compared, not tokens)",
    "TRL pads prompts per batch and runs the model on the padded (64, L) batch; this project packs (use_remove_padding)",
]


def tree_cpu_seconds(proc: psutil.Process) -> float:
    """User + system CPU seconds of a process and all its live descendants."""
    total = 0.0
    for p in [proc, *proc.children(recursive=True)]:
        try:
            t = p.cpu_times()
            total += t.user + t.system + t.children_user + t.children_system
        except psutil.Error:
            continue
    return total


def run_monitored(command: list[str], metrics_file: Path, timeout_s: float, log_file: Path) -> list[dict]:
    """Run ``command``; each time ``metrics_file`` gains a JSON line, record it with the wall time since launch and
    the process tree's CPU seconds. Returns one dict per line: ``{"data", "t", "cpu"}``."""
    env = dict(os.environ, **ENV)
    start = time.perf_counter()
    with open(log_file, "w") as log:
        popen = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT)
    proc = psutil.Process(popen.pid)
    records: list[dict] = []
    seen = 0
    while True:
        done = popen.poll() is not None
        if metrics_file.is_file():
            lines = metrics_file.read_text().splitlines()
            complete = [line for line in lines if line.endswith("}")]
            for line in complete[seen:]:
                records.append(
                    {"data": json.loads(line), "t": time.perf_counter() - start, "cpu": tree_cpu_seconds(proc)}
                )
            seen = len(complete)
        if done:
            break
        if time.perf_counter() - start > timeout_s:
            popen.kill()
            raise RuntimeError(f"{command[:3]} ran past {timeout_s} s; log: {log_file}")
        time.sleep(0.02)
    if popen.returncode != 0:
        raise RuntimeError(
            f"{' '.join(command[:4])} ... exited {popen.returncode}; last lines of {log_file}:\n"
            + "\n".join(log_file.read_text().splitlines()[-30:])
        )
    return records


def ours_command(paths: dict, work: Path, steps: int, overrides: list[str]) -> list[str]:
    from verl.trainer.quickstart import main_ppo_command

    # Drop the quickstart's own log/checkpoint dirs: each run writes under its temporary directory.
    base = [
        a
        for a in main_ppo_command(paths["root"], [])
        if not a.startswith(("trainer.log_dir=", "trainer.default_local_dir="))
    ]
    return [
        *base,
        f"trainer.total_training_steps={steps}",
        "trainer.val_before_train=False",
        "trainer.test_freq=-1",
        "trainer.logger=[file]",
        f"trainer.log_dir={work / 'logs'}",
        f"trainer.default_local_dir={work / 'ckpt'}",
        *overrides,
    ]


def ours_step(record: dict) -> dict:
    d = record["data"]["data"] if "data" in record["data"] else record["data"]
    out = {}
    for label, key, _ in PHASES:
        keys = key if isinstance(key, tuple) else (key,)
        out[label] = sum(d.get(k, 0.0) for k in keys) if any(k in d for k in keys) else None
    out["reward"] = d["critic/score/mean"]
    out["tokens"] = 64 * (d["response_length/mean"] + d["prompt_length/mean"])
    return out


def trl_step(record: dict) -> dict:
    d = record["data"]
    out = {label: (d[key] if key else None) for label, _, key in PHASES}
    out["reward"] = d["reward"]
    out["tokens"] = d["tokens"]
    return out


def run_ours(paths: dict, steps: int, overrides: list[str], timeout_s: float) -> dict:
    with tempfile.TemporaryDirectory(prefix="bench_ours_") as tmp:
        work = Path(tmp)
        records = run_monitored(
            ours_command(paths, work, steps, overrides), work / "logs" / "metrics.jsonl", timeout_s, work / "log.txt"
        )
        return summarise(records, ours_step)


def run_trl(paths: dict, steps: int, trl_python: str, timeout_s: float) -> dict:
    with tempfile.TemporaryDirectory(prefix="bench_trl_") as tmp:
        work = Path(tmp)
        command = [
            trl_python,
            str(TRL_SCRIPT),
            "--model",
            str(paths["model"]),
            "--train",
            str(paths["train"]),
            "--steps",
            str(steps),
            "--out",
            str(work / "steps.jsonl"),
            "--work",
            str(work),
        ]
        records = run_monitored(command, work / "steps.jsonl", timeout_s, work / "log.txt")
        return summarise(records, trl_step)


def summarise(records: list[dict], parse) -> dict:
    """Per step: the phases, reward, tokens, wall interval between metric lines and the tree CPU over it."""
    steps = [parse(r) for r in records]
    for i, r in enumerate(records):
        steps[i]["cpu"] = r["cpu"] - records[i - 1]["cpu"] if i else None
        steps[i]["wall"] = r["t"] - records[i - 1]["t"] if i else None
    startup = records[0]["t"] - steps[0]["whole step"]
    return {"steps": steps, "startup": startup}


def median_of(runs: list[dict], key: str, drop: int) -> float | None:
    values = [s[key] for run in runs for s in run["steps"][drop:] if s[key] is not None]
    return statistics.median(values) if values else None


def ratio_of(ours: list[dict], trl: list[dict], key: str, drop: int) -> float | None:
    ratios = []
    for a, b in zip(ours, trl, strict=True):
        ma, mb = median_of([a], key, drop), median_of([b], key, drop)
        if ma is not None and mb:
            ratios.append(ma / mb)
    return statistics.median(ratios) if ratios else None


def fmt(value: float | None, digits: int = 3) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def print_report(ours: list[dict], trl: list[dict], drop: int, ours_label: str) -> None:
    rounds = len(ours)
    print(f"\nGRPO step, {ours_label} vs TRL, {rounds} rounds, first {drop} steps of each run dropped, medians (s)")
    print(f"| phase | this project | TRL | ratio (median of per-round ratios, {rounds} rounds) |")
    print("|---|---|---|---|")
    rows = [(label, label) for label, _, _ in PHASES] + [
        ("wall between steps", "wall"),
        ("CPU s per step, process tree", "cpu"),
    ]
    for label, key in rows:
        print(
            f"| {label} | {fmt(median_of(ours, key, drop))} | {fmt(median_of(trl, key, drop))} "
            f"| {fmt(ratio_of(ours, trl, key, drop), 2)} |"
        )
    s_ours = statistics.median(r["startup"] for r in ours)
    s_trl = statistics.median(r["startup"] for r in trl)
    ratios = statistics.median(a["startup"] / b["startup"] for a, b in zip(ours, trl, strict=True))
    print(f"| launch -> first step | {s_ours:.1f} | {s_trl:.1f} | {ratios:.2f} |")
    print(f"| tokens per step | {median_of(ours, 'tokens', 0):.0f} | {median_of(trl, 'tokens', 0):.0f} | |")
    print("\nmean reward per step (mean over rounds):")
    n = min(len(r["steps"]) for r in ours + trl)
    for name, runs in (("this project", ours), ("TRL", trl)):
        curve = [statistics.mean(r["steps"][i]["reward"] for r in runs) for i in range(n)]
        print(f"  {name:>12}: " + " ".join(f"{v:.2f}" for v in curve))
    print("\nmatched: " + "\n         ".join(MATCHED))
    print("UNMATCHED: " + "\n           ".join(UNMATCHED))


PADDED_OVERRIDE = "actor_rollout_ref.model.use_remove_padding=False"


def print_packed_vs_padded(packed: list[dict], padded: list[dict], drop: int) -> None:
    """This project's packed run (``use_remove_padding=True``, the quickstart's) against its padded run."""
    rounds = len(packed)
    print(f"\nthis project, packed vs padded ({PADDED_OVERRIDE}), {rounds} rounds, medians (s)")
    print(f"| phase | packed | padded | ratio packed / padded (median of per-round ratios, {rounds} rounds) |")
    print("|---|---|---|---|")
    for label, _, _ in PHASES:
        if median_of(packed, label, drop) is None:
            continue
        print(
            f"| {label} | {fmt(median_of(packed, label, drop))} | {fmt(median_of(padded, label, drop))} "
            f"| {fmt(ratio_of(packed, padded, label, drop), 2)} |"
        )
    for name, runs in (("packed", packed), ("padded", padded)):
        n = min(len(r["steps"]) for r in runs)
        curve = [statistics.mean(r["steps"][i]["reward"] for r in runs) for i in range(n)]
        print(f"  mean reward per step, {name}: " + " ".join(f"{v:.2f}" for v in curve))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--steps", type=int, default=10, help="steps per run (the first --drop are dropped)")
    parser.add_argument("--drop", type=int, default=2)
    parser.add_argument("--trl-python", default="/tmp/venv-trl/bin/python")
    parser.add_argument("--dir", type=Path, default=ROOT / ".quickstart", help="quickstart assets")
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds per run")
    parser.add_argument("--quick", action="store_true", help="1 round x 4 steps (smoke test)")
    parser.add_argument("--label", default="this project", help="what the 'ours' side is (for the table title)")
    parser.add_argument("--padded", action="store_true", help=f"also run this project with {PADDED_OVERRIDE}")
    parser.add_argument("overrides", nargs="*", help="extra Hydra overrides for this project's run")
    args = parser.parse_args()
    if args.quick:
        args.rounds, args.steps, args.drop = 1, 4, 1
    if not Path(args.trl_python).is_file():
        raise SystemExit(f"--trl-python {args.trl_python} does not exist: run `make bench-trl` (benchmarks/README.md)")
    from verl.trainer.quickstart import prepare

    paths = prepare(args.dir)
    paths["root"] = args.dir
    runs: dict[str, list[dict]] = {"ours": [], "trl": [], "padded": []}
    sides = ("ours", "trl", "padded") if args.padded else ("ours", "trl")
    for i in range(args.rounds):
        order = sides if i % 2 == 0 else sides[::-1]
        for side in order:
            t0 = time.perf_counter()
            if side == "trl":
                runs[side].append(run_trl(paths, args.steps, args.trl_python, args.timeout))
            else:
                extra = [PADDED_OVERRIDE] if side == "padded" else []
                runs[side].append(run_ours(paths, args.steps, [*args.overrides, *extra], args.timeout))
            last = runs[side][-1]
            print(
                f"round {i + 1}/{args.rounds} {side:>6}: {time.perf_counter() - t0:5.1f} s, start-up "
                f"{last['startup']:.1f} s, step median {fmt(median_of([last], 'whole step', args.drop))} s",
                flush=True,
            )
    print_report(runs["ours"], runs["trl"], args.drop, args.label)
    if args.padded:
        print_packed_vs_padded(runs["ours"], runs["padded"], args.drop)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
