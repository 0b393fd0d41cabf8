"""Per-rank batch sizes of one worker call and the forward switches of one call: the only readers of both.

Units (``verl.workers.config.batch``): configs count ``ppo_mini_batch_size`` in PROMPTS, globally, micro-batches in
RESPONSES per GPU; a :class:`BatchPlan` holds the per-rank numbers of one call, so no config field changes units
(4 prompts x ``rollout.n`` 2 / 2 ranks = 4 responses per rank per step). Per-call switches travel in
``DataProto.meta_info`` under upstream's names (its wire format); their defaults are the dataclass fields below.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

import torch.distributed as dist

from verl.base_config import ConfigError
from verl.protocol import DataProto
from verl.workers.config.batch import PPOBatchConfig, per_gpu_micro_batch
from verl.workers.config.critic import CriticConfig
from verl.workers.config.ref import RefConfig
from verl.workers.config.rollout import RolloutConfig
from verl.workers.core.micro_batching import split_micro_batches

__all__ = ["BatchPlan", "ForwardSwitches", "actor_update_plan", "critic_update_plan", "forward_plan", "log_prob_plan"]


@dataclass(frozen=True)
class BatchPlan:
    """Per-rank sizes of one call.

    Attributes:
        micro_batch_size: responses per forward/backward (None with ``use_dynamic_bsz``).
        use_dynamic_bsz: micro-batches by token budget ``max_token_len`` instead.
        max_token_len: tokens per micro-batch per rank (already multiplied by the Ulysses size).
        mini_batch_size: responses per optimizer step (training only).
        epochs, shuffle, seed: passes over the batch and the mini-batch shuffle (training only).
    """

    micro_batch_size: int | None
    use_dynamic_bsz: bool = False
    max_token_len: int | None = None
    mini_batch_size: int | None = None
    epochs: int = 1
    shuffle: bool = False
    seed: int = 42

    def meta_info(self) -> dict[str, Any]:
        """The micro-batching switches in upstream's ``meta_info`` names (what a forward pass reads)."""
        return {key: getattr(self, key) for key in ("micro_batch_size", "use_dynamic_bsz", "max_token_len")}

    @classmethod
    def from_meta_info(cls, meta: Mapping[str, Any], *, training: bool = False) -> BatchPlan:
        """The plan a batch carries (upstream's ``train_mini_batch`` / ``infer_batch`` contract); ``training``
        requires ``mini_batch_size``."""
        if training and meta.get("mini_batch_size") is None:
            raise ValueError("train_mini_batch: data.meta_info['mini_batch_size'] (responses per rank) is missing")
        defaults = asdict(cls(None))
        return cls(**{key: meta.get(key, default) for key, default in defaults.items()})

    def split(
        self, data: DataProto, dp_group: dist.ProcessGroup | None = None, micro_batch_key: str = "micro_batch_size"
    ) -> tuple[list[DataProto], list[list[int]] | None]:
        """``data`` in micro-batches of this plan (``micro_batching.split_micro_batches``)."""
        sizes = {"micro_batch_size": self.micro_batch_size, "max_token_len": self.max_token_len}
        dynamic = bool(self.use_dynamic_bsz)
        return split_micro_batches(
            data, **sizes, use_dynamic_bsz=dynamic, dp_group=dp_group, micro_batch_key=micro_batch_key
        )


@dataclass(frozen=True)
class ForwardSwitches:
    """What one forward computes (``meta_info`` keys of the same names).

    Attributes:
        temperature: logits divisor; required by a log-prob forward (the worker sets the rollout's).
        calculate_entropy: also return ``entropys``.
        router_replay: ``record`` | ``replay`` the MoE routing, or None (engine path, see ``core.routing``).
    """

    temperature: float | None = None
    calculate_entropy: bool = False
    router_replay: str | None = None

    @classmethod
    def from_meta_info(cls, meta: Mapping[str, Any]) -> ForwardSwitches:
        defaults = asdict(cls())
        return cls(**{key: meta.get(key, default) for key, default in defaults.items()})

    def require_temperature(self, caller: str) -> float:
        if self.temperature is None:
            raise ValueError(
                f"{caller}: data.meta_info['temperature'] is missing; the trainer/worker sets it from "
                "actor_rollout_ref.rollout.temperature"
            )
        return self.temperature


def forward_plan(
    key: str,
    global_micro: int | None,
    per_gpu_micro: int | None,
    use_dynamic_bsz: bool,
    max_token_len: int,
    dp_size: int,
) -> BatchPlan:
    """Plan of a forward-only pass from a role's ``<key>`` / ``<key>_per_gpu`` micro-batch keys."""
    micro = per_gpu_micro_batch(key, global_micro, per_gpu_micro, dp_size)
    if micro is None and not use_dynamic_bsz:
        raise ValueError(f"{key}_per_gpu is not set: set it (responses per GPU per forward) or use dynamic batch size")
    return BatchPlan(micro, use_dynamic_bsz, max_token_len)


def log_prob_plan(config: RolloutConfig | RefConfig, key: str, sp_size: int, dp_size: int) -> BatchPlan:
    """A log-prob pass from ``log_prob_*`` keys (``rollout``: old log-probs; ``ref``); ``key``: the micro key path."""
    max_tokens = config.log_prob_max_token_len_per_gpu * sp_size
    global_micro, per_gpu = config.log_prob_micro_batch_size, config.log_prob_micro_batch_size_per_gpu
    return forward_plan(key, global_micro, per_gpu, config.log_prob_use_dynamic_bsz, max_tokens, dp_size)


def critic_forward_plan(config: CriticConfig, dp_size: int) -> BatchPlan:
    """``compute_values`` from ``critic.forward_*`` keys (dynamic batching follows ``use_dynamic_bsz``)."""
    max_tokens = config.forward_max_token_len_per_gpu * config.ulysses_sequence_parallel_size
    global_micro, per_gpu = config.forward_micro_batch_size, config.forward_micro_batch_size_per_gpu
    key = "critic.forward_micro_batch_size"
    return forward_plan(key, global_micro, per_gpu, config.use_dynamic_bsz, max_tokens, dp_size)


def _update_plan(cfg: PPOBatchConfig, dp_size: int | None, prefix: str) -> BatchPlan:
    """``dp_size=None``: the config already holds per-rank sizes (see :func:`per_rank_update_plan`)."""
    if dp_size is None:
        micro, mini = cfg.ppo_micro_batch_size_per_gpu, cfg.ppo_mini_batch_size
    else:
        key, global_micro = f"{prefix}.ppo_micro_batch_size", cfg.ppo_micro_batch_size
        micro = per_gpu_micro_batch(key, global_micro, cfg.ppo_micro_batch_size_per_gpu, dp_size)
        mini = cfg.mini_batch_responses_per_rank(dp_size)
        if not cfg.use_dynamic_bsz and (micro is None or mini % micro):
            raise ConfigError(
                f"{prefix}.ppo_micro_batch_size_per_gpu",
                f"({micro}) must be set and divide the {mini} responses per GPU per mini-batch "
                f"({prefix}.ppo_mini_batch_size x rollout.n / {dp_size} ranks)",
            )
    max_tokens = cfg.ppo_max_token_len_per_gpu * cfg.ulysses_sp_size
    return BatchPlan(micro, cfg.use_dynamic_bsz, max_tokens, mini, cfg.ppo_epochs, cfg.shuffle, cfg.data_loader_seed)


def actor_update_plan(actor_config: PPOBatchConfig, dp_size: int) -> BatchPlan:
    """``update_actor`` sizes per rank from ``actor_rollout_ref.actor`` (``ppo_*`` keys)."""
    return _update_plan(actor_config, dp_size, "actor_rollout_ref.actor")


def critic_update_plan(critic_config: PPOBatchConfig, dp_size: int) -> BatchPlan:
    """``update_critic`` sizes per rank from ``critic`` (``ppo_*`` keys)."""
    return _update_plan(critic_config, dp_size, "critic")


def per_rank_update_plan(cfg: PPOBatchConfig) -> BatchPlan:
    """The plan of a ``DataParallelPPOActor``/``Critic`` built without one (upstream's contract for those classes:
    their config holds per-rank sizes, ``ppo_mini_batch_size`` in responses); the workers pass theirs."""
    return _update_plan(cfg, None, "")
