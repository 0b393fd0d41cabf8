"""Run the reward function over the samples of a batch: in parallel worker processes with time limits, or serially
in this process.

Settings (``reward.*``, passed to the managers by ``load_reward_manager``):

* ``num_workers``: worker processes scoring in parallel (``verl.utils.process_pool``: a hung call is ended by
  killing its process, never left running in a thread). Scores come back in batch order, so they equal serial
  scoring exactly.
* ``compute_score_timeout``: seconds one call may take; a call over it scores 0.0, is counted in
  ``reward/num_timed_out`` and reported the moment it happens (sample index and data source).
* ``batch_timeout``: seconds the whole batch may take; what is unfinished then scores 0.0 and is counted.

With none of them set (a manager built directly, upstream style) every call runs in this process, one after the
other, without limits. While a batch is slow, a progress line is logged every
:attr:`~verl.utils.process_pool.ProcessCallPool.progress_every_s` seconds.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from verl.utils.process_pool import CallOutcome, PoolEvent, ProcessCallPool
from verl.workers.reward_manager.scoring import ScoreResult, call_in_process, to_score

logger = logging.getLogger(__name__)

__all__ = ["SampleScorer", "ScoringLimits"]


@dataclass(frozen=True)
class ScoringLimits:
    """How a manager runs its reward function (see the module docstring); all None = in process, no limits."""

    num_workers: int | None = None
    compute_score_timeout: float | None = None
    batch_timeout: float | None = None

    def __post_init__(self) -> None:
        for key in ("num_workers", "compute_score_timeout", "batch_timeout"):
            value = getattr(self, key)
            if value is not None and value <= 0:
                raise ValueError(f"reward.{key} must be > 0 (or null for no limit), got {value}")

    @property
    def in_process(self) -> bool:
        return self.num_workers is None and self.compute_score_timeout is None and self.batch_timeout is None

    def describe(self) -> str:
        return (
            f"reward.num_workers={self.num_workers}, reward.compute_score_timeout={self.compute_score_timeout}, "
            f"reward.batch_timeout={self.batch_timeout}"
        )


def _in_process(fn: Callable[..., Any], kwargs: dict) -> CallOutcome:
    try:
        return CallOutcome(value=call_in_process(fn, kwargs))
    except Exception as exc:  # noqa: BLE001 - any user exception scores 0 and is reported
        return CallOutcome(error=f"{type(exc).__name__}: {exc}")


class SampleScorer:
    """Calls ``fn(**kwargs)`` once per entry of a batch under :class:`ScoringLimits`; never raises for what the
    user function does (raises RuntimeError only when a worker cannot even load the function).

    ``labels[i]`` names entry ``i`` in reports (its data source). The worker processes stay between batches and
    are shared with the other scorers of this process that have the same function and size; :meth:`close` stops
    them (a later batch starts them again; they also stop when the last scorer is collected or the process exits).
    """

    def __init__(self, fn: Callable[..., Any], limits: ScoringLimits, manager: str):
        self.fn, self.limits, self.manager = fn, limits, manager
        # Managers of one run with the same function (training and validation) share their workers.
        self.pool = None if limits.in_process else ProcessCallPool.shared(fn, limits.num_workers or 1)

    def close(self) -> None:
        if self.pool is not None:
            self.pool.close()

    def run(self, calls: Sequence[dict], labels: Sequence[str]) -> list[CallOutcome]:
        """One outcome per call, in order."""
        if self.pool is None:
            return [_in_process(self.fn, kwargs) for kwargs in calls]
        report = _Reporter(self.manager, self.limits, labels)
        outcomes = self.pool.map(
            calls,
            call_timeout_s=self.limits.compute_score_timeout,
            batch_timeout_s=self.limits.batch_timeout,
            on_event=report,
        )
        for outcome in outcomes:
            if outcome.limit == "call":
                outcome.error = (
                    f"TimeoutError: did not return within {self.limits.compute_score_timeout:g} s "
                    "(reward.compute_score_timeout); its worker process was killed"
                )
            elif outcome.limit == "batch":
                outcome.error = (
                    f"TimeoutError: not scored when reward.batch_timeout={self.limits.batch_timeout:g} s ran out"
                )
        return outcomes

    def score(self, calls: Sequence[dict], labels: Sequence[str]) -> list[ScoreResult]:
        """:meth:`run`, each outcome turned into a score (a failure scores 0.0 with its reason)."""
        return [to_result(outcome) for outcome in self.run(calls, labels)]


def to_result(outcome: CallOutcome) -> ScoreResult:
    """The score of one call; an error, a timeout or an unusable return value is a failed 0.0."""
    if outcome.error is not None:
        return ScoreResult(error=outcome.error, timed_out=outcome.timed_out)
    try:
        score, extra = to_score(outcome.value)
    except (TypeError, ValueError) as exc:
        return ScoreResult(error=f"{type(exc).__name__}: {exc}")
    return ScoreResult(score=score, extra=extra)


class _Reporter:
    """Logs pool events as they happen: the batch's first timeout, the batch limit, progress of a slow batch."""

    def __init__(self, manager: str, limits: ScoringLimits, labels: Sequence[str]):
        self.manager, self.limits, self.labels = manager, limits, labels
        self.timeouts = 0

    def __call__(self, event: PoolEvent) -> None:
        if event.kind == "timeout":
            self.timeouts += 1
            if self.timeouts == 1:
                logger.warning(
                    "%s: sample %d (data_source=%r) did not return within reward.compute_score_timeout=%g s; its "
                    "worker process was killed, the sample scores 0.0 and the run continues (%d of %d samples done "
                    "after %.1f s; further timeouts of this batch are counted in reward/num_timed_out)",
                    self.manager,
                    event.index,
                    self.labels[event.index],
                    self.limits.compute_score_timeout,
                    event.done,
                    event.total,
                    event.elapsed_s,
                )
        elif event.kind == "deadline":
            logger.warning(
                "%s: reward.batch_timeout=%g s reached with %d of %d samples scored; the %d unfinished samples "
                "(first: sample %d, data_source=%r) score 0.0 and count in reward/num_timed_out",
                self.manager,
                self.limits.batch_timeout,
                event.total - event.unfinished,
                event.total,
                event.unfinished,
                event.index,
                self.labels[event.index],
            )
        elif event.kind == "progress":
            logger.warning(
                "%s: reward scoring is slow: %d of %d samples scored after %.0f s (%d failed so far; %s)",
                self.manager,
                event.done,
                event.total,
                event.elapsed_s,
                event.failed,
                self.limits.describe(),
            )
