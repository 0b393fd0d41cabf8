"""A PNG of reward and the key metrics per step, from a run's records or its ``metrics.jsonl``.

The trainer writes ``<log_dir>/metrics.png`` at the end of a run; the same picture of any run (also one still
going, or one killed mid-way: ``metrics.jsonl`` is flushed per step) comes from::

    python -m verl.utils.plot_metrics <log_dir>/metrics.jsonl [-o out.png] [--keys critic/score/mean actor/pg_loss]

matplotlib is optional (``pip install matplotlib``, in the ``plot`` extra); without it :class:`PlotUnavailableError`
says so and training is unaffected.
"""

from __future__ import annotations

import argparse
import json
import math
from collections.abc import Iterable, Sequence
from pathlib import Path

__all__ = ["DEFAULT_KEYS", "PlotUnavailableError", "read_metrics_jsonl", "select_keys", "write_metrics_png"]

# What a user watches first, in panel order: the task reward, validation, the policy's health, length and cost.
DEFAULT_KEYS = (
    "critic/score/mean",
    "val-core/*",
    "actor/entropy",
    "actor/pg_loss",
    "actor/kl_loss",
    "actor/grad_norm",
    "response_length/mean",
    "timing_s/step",
    "perf/max_memory_allocated_gb",
    "perf/cpu_memory_used_gb",
)


class PlotUnavailableError(RuntimeError):
    """matplotlib is not installed."""


Records = Sequence[tuple[int, dict]]


def read_metrics_jsonl(path: str | Path) -> list[tuple[int, dict]]:
    """``[(step, metrics)]`` sorted by step from the file backend's lines ``{"step": N, "data": {...}}``.

    Several lines of one step (training and validation, or a resumed run repeating a step) merge; the later value
    of a key wins. A truncated last line (a run killed while writing) is skipped.
    """
    by_step: dict[int, dict] = {}
    with open(path, encoding="utf-8") as fp:
        for number, line in enumerate(fp, start=1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                continue
            if not isinstance(record, dict) or "step" not in record or not isinstance(record.get("data"), dict):
                raise ValueError(f"{path}:{number}: not a metrics record {{'step': N, 'data': {{...}}}}: {line[:80]!r}")
            by_step.setdefault(int(record["step"]), {}).update(record["data"])
    return sorted(by_step.items())


def _numeric(value) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) else None


def select_keys(records: Records, keys: Iterable[str] = DEFAULT_KEYS) -> list[str]:
    """The metric names to draw: each of ``keys`` that has a numeric value in some record; ``prefix/*`` expands to
    every such name under the prefix (sorted), leaving out ``.../std`` (the bootstrap spread of a best@n)."""
    present = sorted({k for _, data in records for k, v in data.items() if _numeric(v) is not None})
    chosen: list[str] = []
    for key in keys:
        if key.endswith("*"):  # a family: its values, not their bootstrap spreads
            matches = [k for k in present if k.startswith(key[:-1]) and not k.endswith("/std")]
        else:
            matches = [key] * (key in present)
        chosen += [m for m in matches if m not in chosen]
    return chosen


def _series(records: Records, key: str) -> tuple[list[int], list[float]]:
    points = [(step, _numeric(data.get(key))) for step, data in records]
    points = [(step, value) for step, value in points if value is not None]
    return [p[0] for p in points], [p[1] for p in points]


def write_metrics_png(
    records: Records, out_path: str | Path, keys: Iterable[str] = DEFAULT_KEYS, title: str | None = None
) -> Path:
    """One panel per selected metric (value against step), saved as ``out_path``; returns the path."""
    try:
        import matplotlib

        matplotlib.use("Agg")  # files only: no display on a training node
        import matplotlib.pyplot as plt
    except ImportError as exc:
        raise PlotUnavailableError("matplotlib is not installed (pip install matplotlib, or '.[plot]')") from exc
    names = select_keys(records, keys)
    if not names:
        raise ValueError(f"none of the metrics {list(keys)} has a numeric value in the records")
    cols = min(3, len(names))
    rows = math.ceil(len(names) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(4.2 * cols, 3.0 * rows), squeeze=False)
    for ax, name in zip(axes.flat, names, strict=False):
        steps, values = _series(records, name)
        ax.plot(steps, values, marker="o" if len(steps) < 30 else None, markersize=3)
        ax.set_title(name, fontsize=9)
        ax.set_xlabel("step", fontsize=8)
        ax.tick_params(labelsize=7)
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[len(names) :]:
        ax.set_visible(False)
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    out_path = Path(out_path)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out_path, dpi=100)
    plt.close(fig)
    return out_path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Draw reward and key metrics per step from a metrics.jsonl.")
    parser.add_argument("metrics", type=Path, help="the file logger's metrics.jsonl")
    parser.add_argument("-o", "--out", type=Path, help="PNG to write [metrics.png beside the input]")
    parser.add_argument("--keys", nargs="+", default=list(DEFAULT_KEYS), help="metric names; 'prefix/*' for all")
    parser.add_argument("--title", help="figure title")
    args = parser.parse_args(argv)
    if not args.metrics.is_file():
        parser.error(f"{args.metrics} does not exist (trainer.logger needs 'file' to write it)")
    records = read_metrics_jsonl(args.metrics)
    if not records:
        parser.error(f"{args.metrics} holds no metrics records")
    out = write_metrics_png(records, args.out or args.metrics.with_name("metrics.png"), args.keys, args.title)
    print(out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
