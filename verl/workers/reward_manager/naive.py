"""``NaiveRewardManager``: score each rollout with ``compute_score`` and put the score on its last response token
(upstream ``verl.workers.reward_manager.naive``), robust to reward functions that raise or hang."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import torch

from verl.utils.reward_score import default_compute_score
from verl.workers.reward_manager.abstract import AbstractRewardManager, RawRewardFn
from verl.workers.reward_manager.registry import register
from verl.workers.reward_manager.samples import RewardSample, extract_samples, place_scores
from verl.workers.reward_manager.scorer import SampleScorer, ScoringLimits
from verl.workers.reward_manager.scoring import ScoreResult, collect_extra_info, failure_metrics, warn_failures


def rm_scores_output(data: Any, return_dict: bool) -> torch.Tensor | dict[str, Any]:
    """Rewards a reward model already wrote into the batch (``rm_scores``), returned instead of rule scores."""
    reward_tensor = data.batch["rm_scores"]
    if not return_dict:
        return reward_tensor
    keys = data.meta_info.get("reward_extra_keys", [])
    return {"reward_tensor": reward_tensor, "reward_extra_info": {k: list(data.non_tensor_batch[k]) for k in keys}}


def compute_score_kwargs(sample: RewardSample) -> dict[str, Any]:
    """The keyword arguments of the documented reward-function signature for one sample."""
    return {
        "data_source": sample.data_source,
        "solution_str": sample.response_str,
        "ground_truth": sample.ground_truth,
        "extra_info": sample.extra_info,
    }


class ExaminePrinter:
    """Prints up to ``num_examine`` scored samples per data source (upstream's console preview)."""

    def __init__(self, num_examine: int):
        self.num_examine = num_examine
        self.printed: dict[str, int] = defaultdict(int)

    def maybe_print(self, sample: RewardSample, result: ScoreResult) -> None:
        if self.printed[sample.data_source] >= self.num_examine:
            return
        self.printed[sample.data_source] += 1
        print("[prompt]", sample.prompt_str)
        print("[response]", sample.response_str)
        print("[ground_truth]", sample.ground_truth)
        for key, value in (result.extra or {"score": result.score}).items():
            print(f"[{key}]", value)
        if result.failed:
            print("[error]", result.error)


def finish(
    data: Any, samples: list[RewardSample], results: list[ScoreResult], scores: list[float], return_dict: bool
) -> torch.Tensor | dict[str, Any]:
    """Token-level reward tensor (and, with ``return_dict``, per-sample extra info and failure metrics)."""
    reward_tensor = place_scores(data.batch["responses"], samples, scores)
    if not return_dict:
        return reward_tensor
    return {
        "reward_tensor": reward_tensor,
        "reward_extra_info": collect_extra_info(results),
        "reward_metrics": failure_metrics(results),
    }


@register("naive")
class NaiveRewardManager(AbstractRewardManager):
    """One ``compute_score`` call per sample.

    Args:
        tokenizer: decodes prompts and responses (special tokens skipped).
        num_examine: samples per data source printed to the console on each call.
        compute_score: ``fn(data_source, solution_str, ground_truth, extra_info) -> float | dict``;
            None = :func:`verl.utils.reward_score.default_compute_score`.
        reward_fn_key: non-tensor column with the data source (``data.reward_fn_key``).
        compute_score_timeout: seconds per call before the sample scores 0.0 (``reward.compute_score_timeout``;
            None = no limit).
        num_workers: worker processes scoring in parallel (``reward.num_workers``).
        batch_timeout: seconds for the whole batch (``reward.batch_timeout``; None = no limit).

    With ``num_workers``, ``compute_score_timeout`` and ``batch_timeout`` all None (the default when built
    directly), the samples are scored one by one in this process; otherwise in worker processes
    (:mod:`verl.workers.reward_manager.scorer`), with the same scores. A sample whose function raises, returns an
    unusable value or times out scores 0.0; a warning shows the sample and ``reward_metrics["reward/num_failed"]``
    (plus ``reward_extra_info["reward_failed"]``) counts it.
    """

    def __init__(
        self,
        tokenizer: Any,
        num_examine: int,
        compute_score: RawRewardFn | None = None,
        reward_fn_key: str = "data_source",
        compute_score_timeout: float | None = None,
        num_workers: int | None = None,
        batch_timeout: float | None = None,
        **kwargs: Any,
    ):
        self.tokenizer = tokenizer
        self.num_examine = num_examine
        self.compute_score = compute_score or default_compute_score
        self.reward_fn_key = reward_fn_key
        self.compute_score_timeout = compute_score_timeout
        self.scorer = SampleScorer(
            self.compute_score, ScoringLimits(num_workers, compute_score_timeout, batch_timeout), type(self).__name__
        )
        self.num_failed_total = 0
        """Failed samples over the manager's lifetime (all calls)."""

    def close(self) -> None:
        """Stop the scoring worker processes (they also stop with the manager or the process)."""
        self.scorer.close()

    def __call__(self, data: Any, return_dict: bool = False) -> torch.Tensor | dict[str, Any]:
        if "rm_scores" in data.batch.keys():
            return rm_scores_output(data, return_dict)
        samples = extract_samples(data, self.tokenizer, self.reward_fn_key)
        results = self.scorer.score([compute_score_kwargs(s) for s in samples], [s.data_source for s in samples])
        printer = ExaminePrinter(self.num_examine)
        for sample, result in zip(samples, results, strict=True):
            printer.maybe_print(sample, result)
        warn_failures(samples, results, type(self).__name__)
        self.num_failed_total += sum(r.failed for r in results)
        return finish(data, samples, results, [r.score for r in results], return_dict)
