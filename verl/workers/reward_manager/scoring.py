"""The reward-function contract: return values become a float score plus extra info, exceptions and unusable
values become a 0.0 score with a warning that shows the sample, and failures are counted for the trainer's metrics.

Where and with which time limits the function runs is :mod:`verl.workers.reward_manager.scorer`'s business (worker
processes, so a hung call is killed with its process); this module has the in-process call it falls back to.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import math
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

logger = logging.getLogger(__name__)

# Full warnings for the first failures of a batch; the rest are summarised in one line.
MAX_FAILURE_WARNINGS_PER_BATCH = 5
_SHOW_CHARS = 200


@dataclass
class ScoreResult:
    """The outcome of scoring one sample (or one batch, for batch managers)."""

    score: float = 0.0
    extra: dict = field(default_factory=dict)
    """Keys of a dict return value (``score`` included), per sample."""
    error: str | None = None
    """Why the score is a fallback 0.0; None on success."""
    timed_out: bool = False

    @property
    def failed(self) -> bool:
        return self.error is not None


def _await(result: Any) -> Any:
    """Run an ``async def`` reward function's coroutine to completion (in this thread, with its own loop)."""
    if not inspect.isawaitable(result):
        return result

    async def _wait() -> Any:
        return await result

    return asyncio.run(_wait())


def call_in_process(fn: Callable[..., Any], kwargs: dict) -> Any:
    """``fn(**kwargs)`` in this process, awaited if it returns a coroutine.

    A coroutine gets a thread and an event loop of its own (the caller may already be inside a running loop, e.g.
    an async Ray actor); the thread is joined before this returns.
    """
    result = fn(**kwargs)
    if not inspect.isawaitable(result):
        return result
    outcome: dict[str, Any] = {}

    def target() -> None:
        try:
            outcome["value"] = _await(result)
        except BaseException as exc:  # noqa: BLE001 - re-raised in the caller's thread below
            outcome["error"] = exc

    worker = threading.Thread(target=target, name="verl-reward-fn")
    worker.start()
    worker.join()
    if "error" in outcome:
        raise outcome["error"]
    return outcome["value"]


def to_score(result: Any) -> tuple[float, dict]:
    """(float score, extra dict) from a reward function's return value; TypeError/ValueError when unusable.

    Accepted: a number (bool included), or a dict with a numeric ``"score"`` (its keys become extra info).
    A non-finite score is rejected: one NaN reward would poison every advantage of its group.
    """
    if isinstance(result, dict):
        if "score" not in result:
            raise TypeError(f"returned a dict without a 'score' key (keys: {sorted(result)})")
        score, extra = result["score"], dict(result)
    else:
        score, extra = result, {}
    if isinstance(score, (list, tuple)) and score:
        score = score[0]  # upstream accepts a sequence and uses its first item
    try:
        value = float(score)
    except (TypeError, ValueError):
        raise TypeError(
            f"returned {type(score).__name__} {str(score)[:50]!r}; expected a float or a dict with a 'score' key"
        ) from None
    if not math.isfinite(value):
        raise ValueError(f"returned a non-finite score {value}")
    return value, extra


def shorten(text: str, limit: int = _SHOW_CHARS) -> str:
    """``text`` if short, else its head and tail around an ellipsis (the answer usually sits at the end)."""
    if len(text) <= limit:
        return text
    half = limit // 2
    return f"{text[:half]} ... {text[-half:]}"


def warn_failures(samples: list[Any], results: list[ScoreResult], manager: str) -> None:
    """Log the first failures of a batch with their sample, then a one-line summary."""
    failures = [(i, r) for i, r in enumerate(results) if r.failed]
    for i, result in failures[:MAX_FAILURE_WARNINGS_PER_BATCH]:
        sample = samples[i]
        logger.warning(
            "%s: reward function failed on sample %d (data_source=%r); scored 0.0 and the run continues.\n"
            "  error: %s\n  prompt: %r\n  response: %r",
            manager,
            i,
            sample.data_source,
            result.error,
            shorten(sample.prompt_str),
            shorten(sample.response_str),
        )
    if failures:
        timed_out = sum(r.timed_out for _, r in failures)
        logger.warning(
            "%s: %d of %d samples failed (%d timed out); see reward/num_failed",
            manager,
            len(failures),
            len(results),
            timed_out,
        )


def collect_extra_info(results: list[ScoreResult]) -> dict[str, list]:
    """Per-sample extra columns: every dict key any sample returned, plus ``reward_failed``/``reward_timed_out``.

    A sample that lacks a key (typically because it failed) gets a neutral fill so each list has one entry per
    sample: 0.0 for numeric/bool keys (a failure counts as wrong), "" for strings, None otherwise.
    """
    keys = list(dict.fromkeys(key for r in results for key in r.extra))
    info: dict[str, list] = {}
    for key in keys:
        example = next(r.extra[key] for r in results if key in r.extra)
        fill = 0.0 if isinstance(example, (int, float, bool)) else ("" if isinstance(example, str) else None)
        info[key] = [r.extra.get(key, fill) for r in results]
    info["reward_failed"] = [r.failed for r in results]
    info["reward_timed_out"] = [r.timed_out for r in results]
    return info


def failure_metrics(results: list[ScoreResult]) -> dict[str, int]:
    """Scalars for the logger: failed samples (exceptions, bad return values, timeouts) and timeouts alone."""
    return {
        "reward/num_failed": sum(r.failed for r in results),
        "reward/num_timed_out": sum(r.timed_out for r in results),
    }
