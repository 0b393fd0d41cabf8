"""Per-step metrics of the RL loop, with upstream's metric names (``critic/score/mean``, ``timing_s/gen``, ...)."""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
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


# Stages whose time does not scale with the batch's tokens: no timing_per_token_ms for them.
_NOT_PER_TOKEN = frozenset({"step", "update_weights", "testing", "save_checkpoint"})


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
        if name not in _NOT_PER_TOKEN and tokens > 0:
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


def bootstrap_metric(
    data: Sequence[Any],
    subset_size: int,
    reduce_fns: Sequence[Callable[[list], float]],
    n_bootstrap: int = 1000,
    seed: int = 42,
) -> list[tuple[float, float]]:
    """(mean, std) over ``n_bootstrap`` resamples (with replacement, ``subset_size`` items each) of every reducer.

    ``best@n`` is ``np.max`` of n responses drawn from the N a prompt got: an estimate of what picking the best of n
    would score, without generating n more. A private generator seeded with ``seed`` keeps the numbers
    reproducible without touching numpy's global state.
    """
    rng = np.random.default_rng(seed)
    values: list[list[float]] = [[] for _ in reduce_fns]
    for _ in range(n_bootstrap):
        picked = [data[i] for i in rng.integers(0, len(data), size=subset_size)]
        for slot, reduce_fn in zip(values, reduce_fns, strict=True):
            slot.append(float(reduce_fn(picked)))
    return [(float(np.mean(v)), float(np.std(v))) for v in values]


def calc_maj_val(data: Sequence[dict], vote_key: str, val_key: str) -> float:
    """``val_key`` of the answer most responses agree on (``vote_key``; ties: the answer seen first)."""
    counts: dict[Any, int] = {}
    first_value: dict[Any, Any] = {}
    for item in data:
        vote = item[vote_key]
        counts[vote] = counts.get(vote, 0) + 1
        first_value.setdefault(vote, item[val_key])
    winner = max(counts, key=counts.__getitem__)  # max keeps the first of equal counts: insertion order
    return first_value[winner]


def _subset_sizes(n_resps: int) -> list[int]:
    """2, 4, 8, ... below N, then N itself: the n of best@n / worst@n / maj@n."""
    sizes, n = [], 2
    while n < n_resps:
        sizes.append(n)
        n *= 2
    return [*sizes, n_resps]


def _prompt_metrics(var_vals: list, preds: list | None, seed: int) -> dict[str, float]:
    """mean@N (and with N > 1: std@N, best@n / worst@n / maj@n as bootstrap mean and std) of one prompt's N values."""
    n_resps = len(var_vals)
    metrics = {f"mean@{n_resps}": float(np.mean(var_vals))}
    if n_resps == 1:
        return metrics
    metrics[f"std@{n_resps}"] = float(np.std(var_vals))
    for n in _subset_sizes(n_resps):
        (best_mean, best_std), (worst_mean, worst_std) = bootstrap_metric(var_vals, n, [np.max, np.min], seed=seed)
        metrics.update({f"best@{n}/mean": best_mean, f"best@{n}/std": best_std})
        metrics.update({f"worst@{n}/mean": worst_mean, f"worst@{n}/std": worst_std})
        if preds is not None:
            votes = [{"val": v, "pred": p} for v, p in zip(var_vals, preds, strict=True)]
            vote = functools.partial(calc_maj_val, vote_key="pred", val_key="val")
            [(maj_mean, maj_std)] = bootstrap_metric(votes, n, [vote], seed=seed)
            metrics.update({f"maj@{n}/mean": maj_mean, f"maj@{n}/std": maj_std})
    return metrics


def process_validation_metrics(
    data_sources: Sequence[str], sample_uids: Sequence[str], infos_dict: dict[str, Sequence[Any]], seed: int = 42
) -> dict[str, dict[str, dict[str, float]]]:
    """``{data_source: {variable: {metric: value}}}`` (upstream's signature and result).

    Each validation prompt (``sample_uids``) got N responses; ``infos_dict`` holds one list per variable
    (``reward`` and every numeric ``reward_extra_info`` key, ``pred`` for majority voting) with one entry per
    response. Metrics are computed per prompt (:func:`_prompt_metrics`) and averaged over the prompts of a source.
    String variables (``pred``) are not reported themselves.
    """
    grouped: dict[str, dict[str, dict[str, list]]] = {}
    for index, (source, uid) in enumerate(zip(data_sources, sample_uids, strict=True)):
        per_var = grouped.setdefault(str(source), {}).setdefault(str(uid), {})
        for var_name, values in infos_dict.items():
            per_var.setdefault(var_name, []).append(values[index])
    result: dict[str, dict[str, dict[str, float]]] = {}
    for source, by_uid in grouped.items():
        collected: dict[str, dict[str, list[float]]] = {}
        for per_var in by_uid.values():
            preds = per_var.get("pred")
            for var_name, var_vals in per_var.items():
                if isinstance(var_vals[0], str):
                    continue
                for name, value in _prompt_metrics(var_vals, preds, seed).items():
                    collected.setdefault(var_name, {}).setdefault(name, []).append(value)
        result[source] = {
            var: {name: float(np.mean(vals)) for name, vals in metrics.items()} for var, metrics in collected.items()
        }
    return result


def _metric_n(metric_name: str) -> int:
    """The n of ``best@4/mean`` (4), ``mean@8`` (8)."""
    return int(metric_name.split("@")[-1].split("/")[0])


def validation_metric_dict(data_src2var2metric2val: dict[str, dict[str, dict[str, float]]]) -> dict[str, float]:
    """Flat names: ``val-core/<source>/<var>/<metric>`` for the headline numbers, ``val-aux/...`` for the rest.

    The core variable is ``acc`` when the scorer reports it, else ``reward``; its ``mean``/``maj``/``best`` at the
    largest n are core (what one compares between runs); everything else (std, worst, smaller n, other variables)
    is auxiliary.
    """
    flat: dict[str, float] = {}
    for source, var2metric2val in data_src2var2metric2val.items():
        core_var = "acc" if "acc" in var2metric2val else "reward"
        for var_name, metric2val in var2metric2val.items():
            n_max = max(_metric_n(name) for name in metric2val)
            for name, value in metric2val.items():
                is_core = var_name == core_var and name.startswith(("mean", "maj", "best")) and _metric_n(name) == n_max
                flat[f"{'val-core' if is_core else 'val-aux'}/{source}/{var_name}/{name}"] = value
    return flat


__getattr__ = missing_name_getattr(__name__)  # upstream names missing here raise with the reason (verl.upstream_gaps)
