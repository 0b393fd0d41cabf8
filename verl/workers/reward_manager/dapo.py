"""``DAPORewardManager``: per-sample scores plus DAPO's soft overlong penalty (upstream
``verl.workers.reward_manager.dapo``; Yu et al., 2025, "DAPO", section 3.4)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from verl.utils.reward_score import default_compute_score
from verl.workers.reward_manager.abstract import AbstractRewardManager, RawRewardFn
from verl.workers.reward_manager.naive import ExaminePrinter, compute_score_kwargs, finish, rm_scores_output
from verl.workers.reward_manager.registry import register
from verl.workers.reward_manager.samples import extract_samples
from verl.workers.reward_manager.scorer import SampleScorer, ScoringLimits
from verl.workers.reward_manager.scoring import warn_failures


@dataclass(frozen=True)
class OverlongBufferConfig:
    """``reward_kwargs.overlong_buffer_cfg``: the last ``len`` tokens before ``max_resp_len`` are a penalty ramp."""

    enable: bool = False
    len: int = 0
    penalty_factor: float = 1.0
    log: bool = False

    @classmethod
    def from_any(cls, cfg: Any) -> OverlongBufferConfig | None:
        """From a dict / DictConfig / object with these attributes; None stays None."""
        if cfg is None or isinstance(cfg, cls):
            return cfg
        source = {key: cfg[key] for key in cfg.keys()} if hasattr(cfg, "keys") else vars(cfg)
        return cls(**{name: source[name] for name in cls.__dataclass_fields__ if name in source})


def overlong_penalty(valid_response_length: int, max_resp_len: int, buffer: OverlongBufferConfig) -> float:
    """``min(-(L - (max - buf)) / buf * factor, 0)``: 0 up to ``max - buf`` tokens, then linear down to ``-factor``.

    Example: max 20, buffer 4, factor 1: L=16 -> 0, L=18 -> -0.5, L=20 -> -1.
    """
    expected_len = max_resp_len - buffer.len
    exceed_len = valid_response_length - expected_len
    return min(-exceed_len / buffer.len * buffer.penalty_factor, 0.0)


@register("dapo")
class DAPORewardManager(AbstractRewardManager):
    """Naive scoring plus the overlong penalty; scoring, limits and per-sample failures as in
    ``NaiveRewardManager``."""

    def __init__(
        self,
        tokenizer: Any,
        num_examine: int,
        compute_score: RawRewardFn | None = None,
        reward_fn_key: str = "data_source",
        max_resp_len: int | None = None,
        overlong_buffer_cfg: Any = None,
        compute_score_timeout: float | None = None,
        num_workers: int | None = None,
        batch_timeout: float | None = None,
        **kwargs: Any,
    ):
        self.tokenizer = tokenizer
        self.num_examine = num_examine
        self.compute_score = compute_score or default_compute_score
        self.reward_fn_key = reward_fn_key
        self.max_resp_len = max_resp_len
        self.overlong_buffer_cfg = OverlongBufferConfig.from_any(overlong_buffer_cfg)
        self.compute_score_timeout = compute_score_timeout
        self.num_failed_total = 0
        buffer = self.overlong_buffer_cfg
        if buffer is not None and buffer.enable:
            if max_resp_len is None:
                raise ValueError(
                    "DAPORewardManager: overlong_buffer_cfg.enable needs max_resp_len (the rollout's "
                    "response_length) in reward_kwargs."
                )
            if not 0 < buffer.len <= max_resp_len:
                raise ValueError(
                    f"DAPORewardManager: overlong_buffer_cfg.len={buffer.len} must be in "
                    f"(0, max_resp_len={max_resp_len}]."
                )
        self.scorer = SampleScorer(
            self.compute_score, ScoringLimits(num_workers, compute_score_timeout, batch_timeout), type(self).__name__
        )

    def close(self) -> None:
        """Stop the scoring worker processes (they also stop with the manager or the process)."""
        self.scorer.close()

    def __call__(self, data: Any, return_dict: bool = False) -> torch.Tensor | dict[str, Any]:
        if "rm_scores" in data.batch.keys():
            return rm_scores_output(data, return_dict)
        samples = extract_samples(data, self.tokenizer, self.reward_fn_key)
        results = self.scorer.score([compute_score_kwargs(s) for s in samples], [s.data_source for s in samples])
        printer = ExaminePrinter(self.num_examine)
        buffer = self.overlong_buffer_cfg
        rewards = []
        for sample, result in zip(samples, results, strict=True):
            reward = result.score
            if buffer is not None and buffer.enable:
                penalty = overlong_penalty(sample.valid_response_length, self.max_resp_len, buffer)
                reward += penalty
                if buffer.log:
                    result.extra.update(overlong_reward=penalty, overlong=penalty < 0)
            printer.maybe_print(sample, result)
            rewards.append(reward)
        warn_failures(samples, results, type(self).__name__)
        self.num_failed_total += sum(r.failed for r in results)
        return finish(data, samples, results, rewards, return_dict)
