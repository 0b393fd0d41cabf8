"""Rollout correction: importance weights and rejection masks for the rollout-vs-training mismatch.

The rollout engine (vLLM in bf16, its own kernels) and the trainer (fp32, other kernels) give the same sampled
token different probabilities, and for an MoE they may route it to other experts. With ``ρ_t = π_train / π_rollout``
of each response token (``log_ratio = old_log_probs - rollout_log_probs``), ``algorithm.rollout_correction`` offers:

* ``rollout_is`` (``token`` | ``sequence``): importance weights, per token ``ρ_t`` or per sequence ``Π_t ρ_t``
  broadcast to the sequence's tokens; ``rollout_is_threshold`` ``u`` truncates them to ``min(w, u)`` (TIS), or,
  written ``"l_u"``, zeroes every weight outside ``[l, u]`` (IcePop). ``rollout_is_batch_normalize`` divides them by
  their batch mean (token level: over valid tokens; sequence level: over sequences). The weights are constants
  (no gradient): they change the measure, not the objective.
* ``rollout_rs``: rejection of tokens or whole sequences whose divergence estimate is out of bounds; a
  comma-separated list of options that must all pass. Per token, with ``r = log_ratio`` clamped to ±20:
  ``k1 = -r``, ``k2 = r²/2``, ``k3 = exp(r) - 1 - r``; ``token_k*`` test each token, ``seq_sum_k*`` /
  ``seq_mean_k*`` / ``seq_max_k*`` test the sum / mean / max over the sequence's valid tokens and reject the whole
  sequence. k1 options keep ``log l <= stat <= log u`` (threshold ``"l_u"``, or ``u`` alone meaning ``l = 1/u``);
  k2/k3 keep ``stat <= u``. ``binary_kl`` keeps tokens whose larger Bernoulli KL between ``p = π_train`` and
  ``q = π_rollout`` (both directions) is at most ``u``. ``rollout_rs_threshold`` gives one bound per option, or one
  for all. Rejected tokens leave ``response_mask``.
* ``bypass_mode``: no old-log-prob forward; the rollout's log-probs serve as old log-probs and the actor's loss
  is ``bypass_mode`` (``loss_type`` ppo_clip: PPO on ``π_θ/π_rollout`` without extra weights; reinforce:
  ``-sg(w)·A·log π_θ`` with the weights above computed from the current ``π_θ``).

Metrics are upstream's ``rollout_corr/*`` names (``rollout_is_*``, ``rollout_rs_*``, and the off-policy
diagnostics ``kl``, ``k3_kl``, ``training_ppl``, ``rollout_ppl``, ``log_ppl_*``, ``ppl_ratio``, ``chi2_*``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import torch

from verl.utils import torch_functional as verl_F

__all__ = [
    "SUPPORTED_ROLLOUT_RS_OPTIONS",
    "apply_bypass_mode",
    "compute_offpolicy_metrics",
    "compute_rollout_correction_and_add_to_batch",
    "compute_rollout_correction_and_rejection_mask",
    "compute_rollout_correction_weights",
    "compute_rollout_rejection_mask",
    "parse_rollout_is_threshold",
    "parse_rollout_rs_options",
    "parse_rollout_rs_thresholds",
]

SAFETY_BOUND = 20.0
"""|log ratio| is clamped to this before exp(): exp(20) ≈ 4.9e8 stays finite in fp32."""

_TOKEN_OPTIONS = ("token_k1", "token_k2", "token_k3", "binary_kl")
_SEQ_OPTIONS = tuple(f"seq_{agg}_k{k}" for agg in ("sum", "mean") for k in (1, 2, 3)) + ("seq_max_k2", "seq_max_k3")
SUPPORTED_ROLLOUT_RS_OPTIONS = _TOKEN_OPTIONS + _SEQ_OPTIONS
"""The ``rollout_rs`` options (upstream's names)."""

_BINARY_KL_EPS = 1e-6


# ---------------------------------------------------------------------------------------------------- parsing
def _to_float(text: str, key: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise ValueError(f"algorithm.rollout_correction.{key}: {text!r} is not a number.") from None


def parse_rollout_is_threshold(spec: Any) -> tuple[float, float | None]:
    """``rollout_is_threshold`` -> ``(upper, lower)``: a number ``u`` (TIS, lower None) or ``"l_u"`` (IcePop)."""
    key = "rollout_is_threshold"
    if isinstance(spec, bool) or not isinstance(spec, int | float | str):
        raise ValueError(f"algorithm.rollout_correction.{key}: expected a number or 'lower_upper', got {spec!r}.")
    lower = None
    if isinstance(spec, str) and "_" in spec:
        low_text, _, up_text = spec.strip().partition("_")
        lower, upper = _to_float(low_text, key), _to_float(up_text, key)
    else:
        upper = _to_float(str(spec).strip(), key) if isinstance(spec, str) else float(spec)
    if upper <= 0 or (lower is not None and not 0 < lower <= upper):
        raise ValueError(
            f"algorithm.rollout_correction.{key}={spec!r}: bounds must be positive with lower <= upper "
            "(e.g. 2.0 or '0.5_5.0')."
        )
    return upper, lower


def parse_rollout_rs_options(spec: str) -> list[str]:
    """``rollout_rs`` -> its distinct options in order; unknown names raise naming the choices."""
    options: list[str] = []
    for part in str(spec).split(","):
        option = part.strip()
        if not option:
            continue
        if option not in SUPPORTED_ROLLOUT_RS_OPTIONS:
            raise ValueError(
                f"algorithm.rollout_correction.rollout_rs: {option!r} is not an option; choose from "
                f"{', '.join(SUPPORTED_ROLLOUT_RS_OPTIONS)} (comma-separated for several)."
            )
        if option not in options:
            options.append(option)
    if not options:
        raise ValueError("algorithm.rollout_correction.rollout_rs is empty; set an option or null.")
    return options


def parse_rollout_rs_thresholds(options: list[str], spec: Any) -> dict[str, tuple[float | None, float]]:
    """One ``(lower, upper)`` per option from ``rollout_rs_threshold`` (one entry for all, or one per option).

    k1 options take ratio bounds ``"l_u"`` (or ``u`` alone: ``l = 1/u``), compared in log space; the others take an
    upper bound only (lower None).
    """
    key = "rollout_rs_threshold"
    if spec is None:
        raise ValueError(f"algorithm.rollout_correction.{key} must be set when rollout_rs is set (e.g. 0.01).")
    parts = [p.strip() for p in spec.split(",") if p.strip()] if isinstance(spec, str) else [str(spec)]
    if len(parts) == 1:
        parts = parts * len(options)
    if len(parts) != len(options):
        raise ValueError(
            f"algorithm.rollout_correction.{key}={spec!r}: give one threshold for all rollout_rs options or one per "
            f"option ({len(options)})."
        )
    bounds: dict[str, tuple[float | None, float]] = {}
    for option, part in zip(options, parts, strict=True):
        if option.endswith("k1"):
            low_text, sep, up_text = part.partition("_")
            upper = _to_float(up_text if sep else low_text, key)
            lower = _to_float(low_text, key) if sep else (1.0 / upper if upper > 0 else -1.0)
        else:
            if "_" in part:
                raise ValueError(f"algorithm.rollout_correction.{key}: {option} takes one upper bound, got {part!r}.")
            lower, upper = None, _to_float(part, key)
        if upper <= 0 or (lower is not None and lower <= 0):
            raise ValueError(f"algorithm.rollout_correction.{key}: {option} bounds must be positive, got {part!r}.")
        bounds[option] = (lower, upper)
    return bounds


# ---------------------------------------------------------------------------------------------------- weights
def _masked_max(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return values.masked_fill(~mask.bool(), float("-inf")).max()


def _masked_min(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return values.masked_fill(~mask.bool(), float("inf")).min()


def _raw_is_weights(log_ratio: torch.Tensor, mask: torch.Tensor, level: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(weights before truncation, masked; the log ratio the metrics use: per token, or per sequence ``(bs, 1)``)."""
    if level == "token":
        log_for_metrics = log_ratio
        raw = torch.exp(log_ratio.clamp(-SAFETY_BOUND, SAFETY_BOUND))
    elif level == "sequence":
        log_for_metrics = verl_F.masked_sum(log_ratio, mask, axis=-1).unsqueeze(-1)
        raw = torch.exp(log_for_metrics.clamp(-SAFETY_BOUND, SAFETY_BOUND)).expand_as(log_ratio)
    else:
        raise ValueError(f"algorithm.rollout_correction.rollout_is={level!r}; choose token, sequence or null.")
    return raw * mask, log_for_metrics


def compute_rollout_correction_weights(
    log_ratio: torch.Tensor,
    response_mask: torch.Tensor,
    rollout_is: str = "token",
    rollout_is_threshold: Any = 2.0,
    rollout_is_batch_normalize: bool = False,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Truncated (TIS) or windowed (IcePop) IS weights ``(bs, T)``, zero on padding, detached; plus metrics."""
    upper, lower = parse_rollout_is_threshold(rollout_is_threshold)
    raw, log_for_metrics = _raw_is_weights(log_ratio.detach(), response_mask, rollout_is)
    if lower is None:
        weights = raw.clamp(max=upper)
    else:
        weights = torch.where((raw >= lower) & (raw <= upper), raw, torch.zeros_like(raw))
    metrics = _is_metrics(weights, raw, log_for_metrics, response_mask, rollout_is, upper, lower)
    if rollout_is_batch_normalize:
        weights, metrics["rollout_is_batch_norm_factor"] = _batch_normalize(weights, response_mask, rollout_is)
    return weights.detach(), metrics


def _batch_normalize(weights: torch.Tensor, mask: torch.Tensor, level: str) -> tuple[torch.Tensor, float]:
    """Divide by the mean weight over valid tokens (token) or over sequences with a valid token (sequence)."""
    if level == "token":
        mean = verl_F.masked_mean(weights, mask)
    else:
        seq_valid = (mask.sum(-1) > 0).to(weights.dtype)
        seq_weights = verl_F.masked_mean(weights, mask, axis=-1)
        mean = (seq_weights * seq_valid).sum() / seq_valid.sum().clamp(min=1.0)
    if mean <= 1e-8:
        return weights, 1.0
    return weights / mean, mean.item()


def _is_metrics(
    weights: torch.Tensor,
    raw: torch.Tensor,
    log_for_metrics: torch.Tensor,
    mask: torch.Tensor,
    level: str,
    upper: float,
    lower: float | None,
) -> dict[str, float]:
    low_bound = 1.0 / upper if lower is None else lower
    metrics = {"rollout_is_mean": verl_F.masked_mean(weights, mask).item()}
    if level == "sequence":
        seq_valid = mask.sum(-1) > 0
        seq_log = log_for_metrics.squeeze(-1)[seq_valid]
        metrics["rollout_is_max"] = math.exp(min(seq_log.max().item(), SAFETY_BOUND))
        metrics["rollout_is_min"] = math.exp(seq_log.min().item())
        metrics["rollout_is_ratio_fraction_high"] = (seq_log > math.log(upper)).float().mean().item()
        metrics["rollout_is_ratio_fraction_low"] = (seq_log < math.log(low_bound)).float().mean().item()
    else:
        metrics["rollout_is_max"] = _masked_max(weights, mask).item()
        metrics["rollout_is_min"] = _masked_min(weights, mask).item()
        metrics["rollout_is_ratio_fraction_high"] = verl_F.masked_mean((raw > upper).float(), mask).item()
        metrics["rollout_is_ratio_fraction_low"] = verl_F.masked_mean((raw < low_bound).float(), mask).item()
    bounded = weights.clamp(min=0.0, max=upper)
    mean = verl_F.masked_mean(bounded, mask)
    variance = verl_F.masked_mean(bounded.square(), mask) - mean.square()
    metrics["rollout_is_std"] = variance.clamp(min=0.0).sqrt().item() if mask.sum() > 1 else 0.0
    normalized = bounded / (mean + 1e-8)
    metrics["rollout_is_eff_sample_size"] = 1.0 / verl_F.masked_mean(normalized.square(), mask).item()
    seq_mean = verl_F.masked_mean(weights, mask, axis=-1)
    raw_seq_mean = verl_F.masked_mean(raw, mask, axis=-1)
    metrics["rollout_is_seq_mean"] = seq_mean.mean().item()
    metrics["rollout_is_seq_std"] = seq_mean.std().item() if seq_mean.numel() > 1 else 0.0
    metrics["rollout_is_seq_max"] = seq_mean.max().item()
    metrics["rollout_is_seq_min"] = seq_mean.min().item()
    metrics["rollout_is_seq_max_deviation"] = (seq_mean - 1.0).abs().max().item()
    metrics["rollout_is_seq_fraction_high"] = (raw_seq_mean > upper).float().mean().item()
    metrics["rollout_is_seq_fraction_low"] = (raw_seq_mean < low_bound).float().mean().item()
    if lower is not None:
        outside = (raw < lower) | (raw > upper)
        metrics["rollout_is_oob_ratio"] = verl_F.masked_mean(outside.float(), mask).item()
    return metrics


# ---------------------------------------------------------------------------------------------------- rejection
def _binary_kl(log_p: torch.Tensor, log_q: torch.Tensor) -> torch.Tensor:
    """KL(Bern(p) || Bern(q)) per token, p and q clamped into [eps, 1 - eps] so 1 - q never rounds to 0."""
    p = log_p.float().exp().clamp(_BINARY_KL_EPS, 1.0 - _BINARY_KL_EPS)
    q = log_q.float().exp().clamp(_BINARY_KL_EPS, 1.0 - _BINARY_KL_EPS)
    return p * torch.log(p / q) + (1 - p) * torch.log((1 - p) / (1 - q))


def _token_statistic(option: str, log_ratio: torch.Tensor, old: torch.Tensor | None, rollout: torch.Tensor | None):
    r = log_ratio.clamp(-SAFETY_BOUND, SAFETY_BOUND)
    if option == "binary_kl":
        if old is None or rollout is None:
            raise ValueError("rollout_rs=binary_kl needs both old_log_prob and rollout_log_prob.")
        return torch.maximum(_binary_kl(old, rollout), _binary_kl(rollout, old))
    kind = option[-2:]
    if kind == "k1":
        return -r
    if kind == "k2":
        return 0.5 * r.square()
    return torch.exp(r) - 1.0 - r


def _sequence_statistic(option: str, per_token: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    if option.startswith("seq_sum"):
        return verl_F.masked_sum(per_token, mask, axis=-1)
    if option.startswith("seq_mean"):
        return verl_F.masked_mean(per_token, mask, axis=-1)
    maxima = per_token.masked_fill(~mask.bool(), float("-inf")).max(dim=-1).values
    return torch.where(torch.isinf(maxima), torch.zeros_like(maxima), maxima)


def _keep(stat: torch.Tensor, option: str, lower: float | None, upper: float) -> torch.Tensor:
    if option.endswith("k1"):
        return (stat >= math.log(lower)) & (stat <= math.log(upper))
    return stat <= upper


def compute_rollout_rejection_mask(
    log_ratio: torch.Tensor,
    response_mask: torch.Tensor,
    rollout_rs: str = "token_k1",
    rollout_rs_threshold: Any = None,
    old_log_prob: torch.Tensor | None = None,
    rollout_log_prob: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """``response_mask`` with every rejected token (or sequence) set to 0, and the rejection metrics."""
    options = parse_rollout_rs_options(rollout_rs)
    bounds = parse_rollout_rs_thresholds(options, rollout_rs_threshold)
    log_ratio = log_ratio.detach()
    mask_bool = response_mask.bool()
    seq_valid = mask_bool.any(dim=-1)
    keep_all = torch.ones_like(mask_bool)
    metrics: dict[str, float] = {}
    for option in options:
        lower, upper = bounds[option]
        per_token = _token_statistic(option, log_ratio, old_log_prob, rollout_log_prob)
        if option in _TOKEN_OPTIONS:
            keep = _keep(per_token, option, lower, upper)
            stat_values = per_token[mask_bool]
        else:
            seq_stat = _sequence_statistic(option, per_token, response_mask)
            keep = _keep(seq_stat, option, lower, upper).unsqueeze(-1).expand_as(mask_bool)
            stat_values = seq_stat[seq_valid]
        keep_all &= keep
        metrics.update(_rs_option_metrics(option, stat_values, keep, mask_bool, seq_valid, lower, upper))
    kept_mask = (response_mask * keep_all.to(response_mask.dtype)).to(response_mask.dtype)
    metrics["rollout_rs_masked_fraction"] = verl_F.masked_mean((~keep_all).float(), response_mask).item()
    metrics["rollout_rs_seq_masked_fraction"] = ((~keep_all) & mask_bool).any(dim=-1).float().mean().item()
    return kept_mask, metrics


def _rs_option_metrics(option, stat_values, keep, mask_bool, seq_valid, lower, upper) -> dict[str, float]:
    """Per option: mean/max/min of its statistic (over tokens, or over sequences for seq_*), the fraction above the
    upper / below the lower bound, and the token / sequence fractions it rejects."""
    prefix = f"rollout_rs_{option}"
    is_k1 = option.endswith("k1")
    high = math.log(upper) if is_k1 else upper
    low = math.log(lower) if is_k1 else None
    rejected = (~keep) & mask_bool
    metrics = {
        f"{prefix}_mean": stat_values.mean().item(),
        f"{prefix}_max": stat_values.max().item(),
        f"{prefix}_min": stat_values.min().item(),
        f"{prefix}_fraction_high": (stat_values > high).float().mean().item(),
        f"{prefix}_fraction_low": (stat_values < low).float().mean().item() if low is not None else 0.0,
        f"{prefix}_masked_fraction": (rejected.sum() / mask_bool.sum().clamp(min=1)).item(),
        f"{prefix}_seq_masked_fraction": (rejected.any(dim=-1) & seq_valid).float().sum().item()
        / max(int(seq_valid.sum()), 1),
    }
    return metrics


# ---------------------------------------------------------------------------------------------------- diagnostics
def compute_offpolicy_metrics(
    old_log_prob: torch.Tensor, rollout_log_prob: torch.Tensor | None, response_mask: torch.Tensor
) -> dict[str, float]:
    """Mismatch diagnostics over valid tokens: KL(π_rollout || π_train) estimated by ``mean(log π_r - log π_t)``
    (``kl``) and by ``mean(ρ - log ρ - 1)`` (``k3_kl``); per-sequence perplexities averaged over the batch;
    ``χ²`` of the token weights ``mean(ρ²) - 1`` and of the sequence weights ``mean((Πρ)²) - 1``."""
    old_log_prob = old_log_prob.detach()
    mean_train = verl_F.masked_mean(old_log_prob, response_mask, axis=-1)
    metrics = {
        "training_ppl": torch.exp(-mean_train).mean().item(),
        "training_log_ppl": (-mean_train).mean().item(),
    }
    if rollout_log_prob is None:
        return metrics
    rollout_log_prob = rollout_log_prob.detach()
    log_ratio = old_log_prob - rollout_log_prob
    mean_rollout = verl_F.masked_mean(rollout_log_prob, response_mask, axis=-1)
    log_ppl_diff = mean_rollout - mean_train
    rho = torch.exp(log_ratio.clamp(-SAFETY_BOUND, SAFETY_BOUND))
    seq_log = verl_F.masked_sum(log_ratio, response_mask, axis=-1).clamp(-SAFETY_BOUND, SAFETY_BOUND)
    metrics.update(
        {
            "kl": verl_F.masked_mean(-log_ratio, response_mask).item(),
            "k3_kl": verl_F.masked_mean(torch.exp(log_ratio) - log_ratio - 1, response_mask).item(),
            "rollout_ppl": torch.exp(-mean_rollout).mean().item(),
            "rollout_log_ppl": (-mean_rollout).mean().item(),
            "log_ppl_diff": log_ppl_diff.mean().item(),
            "log_ppl_abs_diff": log_ppl_diff.abs().mean().item(),
            "log_ppl_diff_max": log_ppl_diff.max().item(),
            "log_ppl_diff_min": log_ppl_diff.min().item(),
            "ppl_ratio": torch.exp(log_ppl_diff).mean().item(),
            "chi2_token": (verl_F.masked_mean(rho.square(), response_mask) - 1.0).item(),
            "chi2_seq": (torch.exp(2.0 * seq_log).mean() - 1.0).item(),
        }
    )
    return metrics


# ---------------------------------------------------------------------------------------------------- entry points
def compute_rollout_correction_and_rejection_mask(
    old_log_prob: torch.Tensor,
    rollout_log_prob: torch.Tensor,
    response_mask: torch.Tensor,
    rollout_is: str | None = None,
    rollout_is_threshold: Any = 2.0,
    rollout_is_batch_normalize: bool = False,
    rollout_rs: str | None = None,
    rollout_rs_threshold: Any = None,
) -> tuple[torch.Tensor | None, torch.Tensor, dict[str, float]]:
    """(IS weights or None, response mask after rejection, ``rollout_corr/*`` metrics) for ``(bs, T)`` inputs.

    ``old_log_prob`` is the training policy's log-prob (decoupled mode: the old-log-prob forward; bypass mode: the
    current π_θ), ``rollout_log_prob`` the engine's.
    """
    if old_log_prob.shape != rollout_log_prob.shape or old_log_prob.shape != response_mask.shape:
        raise ValueError(
            f"rollout correction: old_log_prob {tuple(old_log_prob.shape)}, rollout_log_prob "
            f"{tuple(rollout_log_prob.shape)} and response_mask {tuple(response_mask.shape)} must have one shape."
        )
    if not response_mask.any():
        return None, response_mask, {}
    log_ratio = (old_log_prob - rollout_log_prob).detach()
    metrics: dict[str, float] = {}
    weights = None
    if rollout_is is not None:
        weights, is_metrics = compute_rollout_correction_weights(
            log_ratio, response_mask, rollout_is, rollout_is_threshold, rollout_is_batch_normalize
        )
        metrics.update(is_metrics)
    kept_mask = response_mask
    if rollout_rs is not None:
        kept_mask, rs_metrics = compute_rollout_rejection_mask(
            log_ratio, response_mask, rollout_rs, rollout_rs_threshold, old_log_prob, rollout_log_prob
        )
        metrics.update(rs_metrics)
    metrics.update(compute_offpolicy_metrics(old_log_prob, rollout_log_prob, response_mask))
    return weights, kept_mask, {f"rollout_corr/{key}": value for key, value in metrics.items()}


def _corr_kwargs(config: Mapping | Any) -> dict[str, Any]:
    get = config.get if hasattr(config, "get") else lambda k, d=None: getattr(config, k, d)
    return {
        "rollout_is": get("rollout_is", None),
        "rollout_is_threshold": get("rollout_is_threshold", 2.0),
        "rollout_is_batch_normalize": get("rollout_is_batch_normalize", False),
        "rollout_rs": get("rollout_rs", None),
        "rollout_rs_threshold": get("rollout_rs_threshold", None),
    }


def compute_rollout_correction_and_add_to_batch(batch, rollout_corr_config) -> tuple[Any, dict[str, float]]:
    """Decoupled mode, on the driver after the old-log-prob forward: rejection applied to ``response_mask``,
    ``rollout_is_weights`` added when ``rollout_is`` is set; returns the batch and the ``rollout_corr/*`` metrics."""
    for key in ("old_log_probs", "rollout_log_probs", "response_mask"):
        if key not in batch.batch.keys():
            raise ValueError(
                f"algorithm.rollout_correction needs '{key}' in the batch (rollout_log_probs comes from "
                "actor_rollout_ref.rollout.calculate_log_probs=True)."
            )
    weights, kept_mask, metrics = compute_rollout_correction_and_rejection_mask(
        batch.batch["old_log_probs"],
        batch.batch["rollout_log_probs"],
        batch.batch["response_mask"],
        **_corr_kwargs(rollout_corr_config),
    )
    batch.batch["response_mask"] = kept_mask
    if weights is not None:
        batch.batch["rollout_is_weights"] = weights
    return batch, metrics


def apply_bypass_mode(batch) -> None:
    """Bypass mode: the rollout's log-probs become ``old_log_probs`` (no old-log-prob forward)."""
    if "rollout_log_probs" not in batch.batch.keys():
        raise ValueError(
            "algorithm.rollout_correction.bypass_mode=True needs rollout_log_probs in the batch: set "
            "actor_rollout_ref.rollout.calculate_log_probs=True."
        )
    batch.batch["old_log_probs"] = batch.batch["rollout_log_probs"].clone()
