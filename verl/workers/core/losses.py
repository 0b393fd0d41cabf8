"""Loss assembly of one micro-batch: the actor's policy loss and the critic's value loss.

Actor: ``loss = pg_loss - entropy_coeff * entropy + kl_loss_coef * kl_loss`` where each term is aggregated with
``core_algos.agg_loss(..., loss_agg_mode, **global_batch_info)`` (see ``micro_batching`` for why the counts are
global). The policy loss comes from the ``core_algos`` registry by ``actor.policy_loss.loss_mode``.

Metrics use upstream names. Loss terms (``actor/pg_loss``, ``actor/entropy``, ``actor/kl_loss``,
``critic/vf_loss``) are globally normalised partial sums, so they are *summed* over the micro-batches of a
mini-batch; ratios reported by the loss functions (``actor/pg_clipfrac``, ``actor/ppo_kl``, ...) are averaged.
``actor/entropy`` exists only when the entropy was computed (never a placeholder zero: field-report item 2).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from verl.trainer.ppo import core_algos
from verl.utils.torch_functional import masked_mean
from verl.workers.config.actor import ActorConfig
from verl.workers.config.critic import CriticConfig
from verl.workers.core.micro_batching import GlobalBatchInfo

__all__ = ["LossConfigView", "MetricAccumulator", "actor_loss", "bind_rollout_correction", "critic_loss", "value_loss"]

SUMMED_METRICS = frozenset({"actor/pg_loss", "actor/entropy", "actor/kl_loss", "critic/vf_loss"})


class LossConfigView:
    """The actor config as a policy loss sees it: every key, plus this mini-batch's ``global_batch_info``.

    Registered policy losses read ``config.global_batch_info`` (upstream's runtime attribute) to normalise over
    the global batch; the typed config itself is frozen, so the runtime counts travel on this view.
    """

    def __init__(self, config: Any, info: GlobalBatchInfo):
        self._config = config
        self.global_batch_info = info.as_kwargs()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._config, name)


ROLLOUT_CORRECTION_META_KEY = "rollout_correction"
"""``meta_info`` key under which the trainer sends ``algorithm.rollout_correction`` (a dict) to ``update_actor`` in
bypass mode; the actor node itself has no such key (as upstream, where it is attached at run time)."""


def bind_rollout_correction(actor_config: ActorConfig, meta_info: Mapping[str, Any]) -> None:
    """Attach the trainer's bypass-mode settings to ``actor_config.policy_loss`` (a run-time attribute).

    The ``bypass_mode`` policy loss reads ``config.policy_loss.rollout_correction``; both worker paths call this
    before the update, so the legacy actor and the engine path compute the same loss.
    """
    corr = meta_info.get(ROLLOUT_CORRECTION_META_KEY)
    if corr is None:
        return
    loss_mode = actor_config.policy_loss.loss_mode
    if loss_mode != "bypass_mode":
        raise ValueError(
            f"update_actor got algorithm.rollout_correction settings for bypass mode, but "
            f"actor_rollout_ref.actor.policy_loss.loss_mode={loss_mode!r}; the trainer sets it to bypass_mode when "
            "algorithm.rollout_correction.bypass_mode=True (do not override it)."
        )
    actor_config.policy_loss.rollout_correction = dict(corr)


def _agg(values: torch.Tensor, mask: torch.Tensor, config: Any, info: GlobalBatchInfo) -> torch.Tensor:
    return core_algos.agg_loss(
        values, mask, config.loss_agg_mode, loss_scale_factor=config.loss_scale_factor, **info.as_kwargs()
    )


def actor_loss(
    config: ActorConfig,
    outputs: Mapping[str, torch.Tensor],
    micro_batch: Mapping[str, torch.Tensor],
    info: GlobalBatchInfo,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Loss and metrics of one actor micro-batch.

    Args:
        config: the actor config (``policy_loss.loss_mode``, ``loss_agg_mode``, ``entropy_coeff``,
            ``use_kl_loss``, ``kl_loss_coef``, ``kl_loss_type``, clip ratios ...).
        outputs: ``log_probs`` (B, R) and, when computed, ``entropys`` (B, R) of the current policy.
        micro_batch: ``old_log_probs``, ``advantages``, ``response_mask`` (B, R); ``ref_log_prob`` with the KL
            loss; optional ``rollout_is_weights``.
        info: global counts of the mini-batch.
    """
    log_prob, mask = outputs["log_probs"], micro_batch["response_mask"]
    policy_loss = core_algos.get_policy_loss_fn(config.policy_loss.loss_mode)
    weights = micro_batch["rollout_is_weights"] if "rollout_is_weights" in micro_batch.keys() else None
    pg_loss, pg_metrics = policy_loss(
        old_log_prob=micro_batch["old_log_probs"],
        log_prob=log_prob,
        advantages=micro_batch["advantages"],
        response_mask=mask,
        loss_agg_mode=config.loss_agg_mode,
        config=LossConfigView(config, info),
        rollout_is_weights=weights,
    )
    loss = pg_loss
    metrics = {"actor/pg_loss": pg_loss.item(), **{k: _scalar(v) for k, v in pg_metrics.items()}}
    if "entropys" in outputs:
        entropy = _agg(outputs["entropys"], mask, config, info)
        metrics["actor/entropy"] = entropy.item()
        if config.entropy_coeff != 0:
            loss = loss - config.entropy_coeff * entropy
    if config.use_kl_loss:
        if "ref_log_prob" not in micro_batch.keys():
            raise ValueError(
                "actor_rollout_ref.actor.use_kl_loss=True needs ref_log_prob in the batch: the reference policy must "
                "run (compute_ref_log_prob) before update_actor"
            )
        kl = core_algos.kl_penalty(log_prob, micro_batch["ref_log_prob"], config.kl_loss_type)
        kl_loss = _agg(kl, mask, config, info)
        loss = loss + config.kl_loss_coef * kl_loss
        metrics["actor/kl_loss"] = kl_loss.item()
        metrics["actor/kl_coef"] = config.kl_loss_coef
    return loss, metrics


def critic_loss(
    config: CriticConfig, vpreds: torch.Tensor, micro_batch: Mapping[str, torch.Tensor], info: GlobalBatchInfo
) -> tuple[torch.Tensor, dict[str, float]]:
    """Clipped value loss (``core_algos.compute_value_loss``, ``critic.cliprange_value``) and metrics."""
    mask = micro_batch["response_mask"]
    vf_loss, vf_clipfrac = core_algos.compute_value_loss(
        vpreds=vpreds,
        returns=micro_batch["returns"],
        values=micro_batch["values"],
        response_mask=mask,
        cliprange_value=config.cliprange_value,
        loss_agg_mode=config.loss_agg_mode,
        **info.as_kwargs(),
    )
    metrics = {
        "critic/vf_loss": vf_loss.item(),
        "critic/vf_clipfrac": vf_clipfrac.item(),
        "critic/vpred_mean": masked_mean(vpreds.detach(), mask).item(),
    }
    return vf_loss, metrics


def value_loss(
    config: CriticConfig,
    model_output: Mapping[str, torch.Tensor],
    micro_batch: Mapping[str, torch.Tensor],
    info: GlobalBatchInfo,
) -> tuple[torch.Tensor, dict[str, float]]:
    """:func:`critic_loss` in the loss-function form of the update loop: ``model_output["values"]`` (b, R)."""
    return critic_loss(config, model_output["values"], micro_batch, info)


def _scalar(value: Any) -> float:
    return value.item() if isinstance(value, torch.Tensor) else float(value)


@dataclass
class MetricAccumulator:
    """Collects micro-batch metrics into one value per mini-batch (loss terms summed, ratios averaged)."""

    sums: dict[str, float] = field(default_factory=dict)
    counts: dict[str, int] = field(default_factory=dict)

    def add(self, metrics: Mapping[str, float]) -> None:
        for key, value in metrics.items():
            self.sums[key] = self.sums.get(key, 0.0) + value
            self.counts[key] = self.counts.get(key, 0) + 1

    def result(self) -> dict[str, float]:
        return {k: v if k in SUMMED_METRICS else v / self.counts[k] for k, v in self.sums.items()}
