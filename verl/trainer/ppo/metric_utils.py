"""Per-step metrics of the RL loop, with upstream's metric names (``critic/score/mean``, ``timing_s/gen``, ...)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np
import torch

from verl import DataProto
from verl.upstream_gaps import missing_name_getattr


def reduce_metrics(metrics: dict[str, Any]) -> dict[str, float]:
    """Mean of each metric's list of values (workers return ``{name: [per-micro-batch values]}``)."""
    reduced = {}
    for name, values in metrics.items():
        if isinstance(values, torch.Tensor):
            values = values.detach().float().cpu().numpy()
        if isinstance(values, list | tuple | np.ndarray):
            if len(values) == 0:
                continue
            reduced[name] = float(np.mean(np.asarray(values, dtype=np.float64)))
        else:
            reduced[name] = float(values)
    return reduced


def _stats(prefix: str, values: torch.Tensor) -> dict[str, float]:
    if values.numel() == 0:
        return {}
    values = values.detach().float()
    return {
        f"{prefix}/mean": values.mean().item(),
        f"{prefix}/max": values.max().item(),
        f"{prefix}/min": values.min().item(),
    }


def _prompt_and_response_lengths(batch: DataProto) -> tuple[torch.Tensor, torch.Tensor, int, int]:
    response_len = batch.batch["responses"].shape[-1]
    attention_mask = batch.batch["attention_mask"]
    prompt_len = attention_mask.shape[-1] - response_len
    prompt_length = attention_mask[:, :prompt_len].sum(-1).float()
    response_length = batch.batch["response_mask"].sum(-1).float()
    return prompt_length, response_length, prompt_len, response_len


def compute_data_metrics(batch: DataProto, use_critic: bool = True) -> dict[str, float]:
    """Scores, rewards, advantages, returns, values and lengths of one training batch.

    ``critic/score`` is the summed ``token_level_scores`` per sequence (the task reward), ``critic/rewards`` the summed
    ``token_level_rewards`` (after any KL penalty). Advantages and returns are averaged over valid response tokens.
    """
    response_mask = batch.batch["response_mask"].bool()
    metrics: dict[str, float] = {}
    metrics.update(_stats("critic/score", batch.batch["token_level_scores"].sum(-1)))
    metrics.update(_stats("critic/rewards", batch.batch["token_level_rewards"].sum(-1)))
    metrics.update(_stats("critic/advantages", torch.masked_select(batch.batch["advantages"], response_mask)))
    metrics.update(_stats("critic/returns", torch.masked_select(batch.batch["returns"], response_mask)))
    if use_critic and "values" in batch.batch.keys():
        values = torch.masked_select(batch.batch["values"], response_mask)
        returns = torch.masked_select(batch.batch["returns"], response_mask)
        metrics.update(_stats("critic/values", values))
        # 1 - Var(returns - values) / Var(returns): how much of the return variance the critic explains.
        var_returns = torch.var(returns)
        metrics["critic/vf_explained_var"] = (1.0 - torch.var(returns - values) / (var_returns + 1e-5)).item()
    prompt_length, response_length, max_prompt_len, max_response_len = _prompt_and_response_lengths(batch)
    metrics.update(_stats("response_length", response_length))
    metrics["response_length/clip_ratio"] = (response_length == max_response_len).float().mean().item()
    metrics.update(_stats("prompt_length", prompt_length))
    metrics["prompt_length/clip_ratio"] = (prompt_length == max_prompt_len).float().mean().item()
    return metrics


def compute_timing_metrics(batch: DataProto, timing_raw: dict[str, float]) -> dict[str, float]:
    """``timing_s/<stage>`` in seconds and ``timing_per_token_ms/<stage>`` over the tokens that stage processed."""
    prompt_length, response_length, _, _ = _prompt_and_response_lengths(batch)
    num_prompt_tokens = prompt_length.sum().item()
    num_response_tokens = response_length.sum().item()
    num_overall_tokens = num_prompt_tokens + num_response_tokens
    tokens_of_stage = {"gen": num_response_tokens}
    metrics = {f"timing_s/{name}": value for name, value in timing_raw.items()}
    for name, seconds in timing_raw.items():
        tokens = tokens_of_stage.get(name, num_overall_tokens)
        if name != "step" and tokens > 0:
            metrics[f"timing_per_token_ms/{name}"] = seconds * 1000.0 / tokens
    return metrics


def compute_throughout_metrics(batch: DataProto, timing_raw: dict[str, float], n_gpus: int) -> dict[str, float]:
    """Tokens per second per device over the whole step (``perf/throughput``); upstream's spelling kept."""
    total_num_tokens = int(batch.batch["attention_mask"].sum().item())
    step_seconds = timing_raw["step"]
    return {
        "perf/total_num_tokens": total_num_tokens,
        "perf/time_per_step": step_seconds,
        "perf/throughput": total_num_tokens / (step_seconds * max(n_gpus, 1)),
    }


def process_validation_metrics(
    data_sources: Iterable[str], scores: Iterable[float], prefix: str = "val-core"
) -> dict[str, float]:
    """Mean validation score per data source: ``val-core/<data_source>/reward/mean@1``."""
    per_source: dict[str, list[float]] = {}
    for source, score in zip(data_sources, scores, strict=True):
        per_source.setdefault(str(source), []).append(float(score))
    return {f"{prefix}/{source}/reward/mean@1": float(np.mean(values)) for source, values in per_source.items()}


__getattr__ = missing_name_getattr(__name__)  # upstream names missing here raise with the reason (verl.upstream_gaps)
