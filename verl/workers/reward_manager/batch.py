"""``BatchRewardManager``: one ``compute_score`` call for the whole batch (upstream
``verl.workers.reward_manager.batch``), for reward functions that vectorise or call a remote service."""

from __future__ import annotations

from typing import Any

import torch

from verl.workers.reward_manager.abstract import AbstractRewardManager, RawRewardFn
from verl.workers.reward_manager.naive import ExaminePrinter, finish, rm_scores_output
from verl.workers.reward_manager.registry import register
from verl.workers.reward_manager.samples import RewardSample, extract_samples
from verl.workers.reward_manager.scorer import SampleScorer, ScoringLimits
from verl.workers.reward_manager.scoring import ScoreResult, to_score, warn_failures


def _batch_results(raw: Any, n: int) -> list[ScoreResult]:
    """Per-sample results from the batch function's list; a wrong length or value is a per-sample failure."""
    if not isinstance(raw, (list, tuple)) or len(raw) != n:
        got = f"{type(raw).__name__} of length {len(raw)}" if hasattr(raw, "__len__") else type(raw).__name__
        return [ScoreResult(error=f"TypeError: batch reward function must return a list of {n} scores, got {got}")] * n
    results = []
    for value in raw:
        try:
            score, extra = to_score(value)
            results.append(ScoreResult(score=score, extra=extra))
        except (TypeError, ValueError) as exc:
            results.append(ScoreResult(error=f"{type(exc).__name__}: {exc}"))
    return results


@register("batch")
class BatchRewardManager(AbstractRewardManager):
    """Calls ``compute_score(data_sources=, solution_strs=, ground_truths=, extra_infos=, **reward_kwargs)`` once.

    If that call raises or exceeds ``compute_score_timeout`` (or ``batch_timeout``) seconds, every sample of the
    batch scores 0.0 and is counted in ``reward/num_failed``; the run goes on. With a limit set the call runs in a
    worker process, killed when the limit is reached; ``num_workers`` does not apply (there is one call).
    """

    def __init__(
        self,
        tokenizer: Any,
        num_examine: int,
        compute_score: RawRewardFn,
        reward_fn_key: str = "data_source",
        compute_score_timeout: float | None = None,
        num_workers: int | None = None,
        batch_timeout: float | None = None,
        **reward_kwargs: Any,
    ):
        if compute_score is None:
            raise ValueError(
                "BatchRewardManager needs a batch reward function: set reward.custom_reward_function.path/name to a "
                "function taking (data_sources, solution_strs, ground_truths, extra_infos) and returning a list."
            )
        self.tokenizer = tokenizer
        self.num_examine = num_examine
        self.compute_score = compute_score
        self.reward_fn_key = reward_fn_key
        self.compute_score_timeout = compute_score_timeout
        self.reward_kwargs = reward_kwargs
        self.num_failed_total = 0
        self.scorer = SampleScorer(
            compute_score, ScoringLimits(None, compute_score_timeout, batch_timeout), type(self).__name__
        )

    def close(self) -> None:
        """Stop the scoring worker process (it also stops with the manager or the process)."""
        self.scorer.close()

    def _score(self, samples: list[RewardSample]) -> list[ScoreResult]:
        kwargs = {
            "data_sources": [s.data_source for s in samples],
            "solution_strs": [s.response_str for s in samples],
            "ground_truths": [s.ground_truth for s in samples],
            "extra_infos": [s.extra_info for s in samples],
            **self.reward_kwargs,
        }
        (outcome,) = self.scorer.run([kwargs], [f"batch of {len(samples)} samples"])
        if outcome.error is not None:
            return [ScoreResult(error=outcome.error, timed_out=outcome.timed_out) for _ in samples]
        return _batch_results(outcome.value, len(samples))

    def __call__(self, data: Any, return_dict: bool = False) -> torch.Tensor | dict[str, Any]:
        if "rm_scores" in data.batch.keys():
            return rm_scores_output(data, return_dict)
        samples = extract_samples(data, self.tokenizer, self.reward_fn_key)
        results = self._score(samples)
        printer = ExaminePrinter(self.num_examine)
        for sample, result in zip(samples, results, strict=True):
            printer.maybe_print(sample, result)
        warn_failures(samples, results, type(self).__name__)
        self.num_failed_total += sum(r.failed for r in results)
        return finish(data, samples, results, [r.score for r in results], return_dict)
