"""Batch-size arithmetic shared by the actor, critic, reference and rollout configs.

Units: `ppo_mini_batch_size` counts PROMPTS globally; `*_micro_batch_size_per_gpu` counts RESPONSES per GPU;
`*_max_token_len_per_gpu` counts tokens per GPU. The data-parallel size is n_gpus / ulysses_sp_size.
"""

from __future__ import annotations

from typing import Optional, Protocol

from verl.base_config import ConfigError, require_positive

__all__ = [
    "PPOBatchConfig",
    "check_micro_batch_settings",
    "mini_batch_responses_per_rank",
    "per_gpu_micro_batch",
    "validate_ppo_batch",
]


class PPOBatchConfig(Protocol):
    """The fields an actor or critic config shares for its update batches."""

    ppo_mini_batch_size: int
    rollout_n: int
    ppo_micro_batch_size: Optional[int]
    ppo_micro_batch_size_per_gpu: Optional[int]
    use_dynamic_bsz: bool

    @property
    def ulysses_sp_size(self) -> int: ...


def check_micro_batch_settings(
    global_key: str, global_value: Optional[int], per_gpu_key: str, per_gpu_value: Optional[int]
) -> None:
    """The deprecated global micro-batch key and its per-GPU replacement are mutually exclusive."""
    if global_value is not None and per_gpu_value is not None:
        raise ConfigError(
            global_key,
            f"({global_value}) and {{node}}.{per_gpu_key} ({per_gpu_value}) are both set; remove {global_key}: only "
            f"the per-GPU form is supported (the global one is deprecated).",
        )
    for key, value in ((global_key, global_value), (per_gpu_key, per_gpu_value)):
        require_positive(key, value, allow_none=True)


def per_gpu_micro_batch(
    global_key: str, global_value: Optional[int], per_gpu_value: Optional[int], dp_size: int
) -> Optional[int]:
    """The per-GPU micro-batch size, converting the deprecated global form (global // dp_size)."""
    if per_gpu_value is not None or global_value is None:
        return per_gpu_value
    if global_value < dp_size:
        raise ConfigError(
            global_key,
            f"({global_value}) must be >= the data-parallel size ({dp_size}); better, set {global_key}_per_gpu.",
        )
    return global_value // dp_size


def mini_batch_responses_per_rank(cfg: PPOBatchConfig, dp_size: int) -> int:
    """Responses per data-parallel rank in one optimizer step: ppo_mini_batch_size * rollout_n / dp_size.

    Example: ppo_mini_batch_size=32 prompts, rollout_n=4, dp_size=8 -> 32 * 4 / 8 = 16 responses per rank.
    """
    total = cfg.ppo_mini_batch_size * cfg.rollout_n
    if total % dp_size != 0:
        raise ConfigError(
            "ppo_mini_batch_size",
            f"({cfg.ppo_mini_batch_size}) * rollout.n ({cfg.rollout_n}) = {total} responses must be divisible by "
            f"the data-parallel size {dp_size} (n_gpus / ulysses_sequence_parallel_size).",
        )
    return total // dp_size


def validate_ppo_batch(cfg: PPOBatchConfig, n_gpus: int, train_batch_size: int) -> None:
    """Check mini/micro batch sizes of an actor or critic against the cluster size.

    Example that passes: n_gpus=8, sp=1, train_batch_size=64, ppo_mini_batch_size=32, rollout_n=4,
    ppo_micro_batch_size_per_gpu=4: 32*4/8 = 16 responses per rank, 16 % 4 == 0 -> 4 accumulation steps.
    """
    sp = cfg.ulysses_sp_size
    if n_gpus % sp != 0:
        raise ConfigError("ulysses_sequence_parallel_size", f"({sp}) must divide the number of GPUs ({n_gpus}).")
    if train_batch_size < cfg.ppo_mini_batch_size:
        raise ConfigError(
            "ppo_mini_batch_size",
            f"({cfg.ppo_mini_batch_size} prompts) must be <= data.train_batch_size ({train_batch_size} prompts).",
        )
    dp_size = n_gpus // sp
    per_rank = mini_batch_responses_per_rank(cfg, dp_size)
    if cfg.use_dynamic_bsz:
        return
    micro = per_gpu_micro_batch(
        "ppo_micro_batch_size", cfg.ppo_micro_batch_size, cfg.ppo_micro_batch_size_per_gpu, dp_size
    )
    if micro is None:
        raise ConfigError(
            "ppo_micro_batch_size_per_gpu",
            "is not set: set it (responses per GPU per forward/backward) or turn on {node}.use_dynamic_bsz.",
        )
    if per_rank % micro != 0:
        raise ConfigError(
            "ppo_micro_batch_size_per_gpu",
            f"({micro}) must divide the responses per GPU per mini-batch: {{node}}.ppo_mini_batch_size "
            f"({cfg.ppo_mini_batch_size}) * rollout.n ({cfg.rollout_n}) / dp size ({dp_size}) = {per_rank}.",
        )
