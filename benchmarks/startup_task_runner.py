"""Launch -> first step of the CPU quickstart with the TaskRunner in the driver vs as a Ray actor, alternating.

Each round launches ``python -m verl.trainer.main_ppo --config-name quickstart_cpu`` (Ray included, as a user runs
it) twice, once with ``ray_kwargs.task_runner=driver`` and once with ``ray_kwargs.task_runner=actor`` (upstream's
layout), in alternating order, and measures start-up as ``step_vs_trl.py`` does (the first metrics line minus
that step's own time). Prints each round and the median over rounds of the per-round ratio driver / actor, so that
load from other jobs, which moves both runs of a round together, cancels as far as it can.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

PLACES = ("driver", "actor")


def main() -> int:
    from benchmarks.step_vs_trl import run_ours
    from verl.trainer.quickstart import prepare

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=3, help="steps per run (start-up needs one)")
    parser.add_argument("--dir", type=Path, default=ROOT / ".quickstart", help="quickstart assets")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds per run")
    args = parser.parse_args()
    paths = prepare(args.dir)
    paths["root"] = args.dir
    startup: dict[str, list[float]] = {place: [] for place in PLACES}
    print("| round | task_runner=driver | task_runner=actor | ratio |\n|---|---|---|---|")
    for i in range(args.rounds):
        for place in PLACES if i % 2 == 0 else PLACES[::-1]:
            run = run_ours(paths, args.steps, [f"ray_kwargs.task_runner={place}"], args.timeout)
            startup[place].append(run["startup"])
        driver, actor = startup["driver"][-1], startup["actor"][-1]
        print(f"| {i + 1} | {driver:.1f} s | {actor:.1f} s | {driver / actor:.2f} |", flush=True)
    ratio = statistics.median(d / a for d, a in zip(startup["driver"], startup["actor"], strict=True))
    print(
        f"| median | {statistics.median(startup['driver']):.1f} s | {statistics.median(startup['actor']):.1f} s "
        f"| {ratio:.2f} |"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
