"""Upstream config keys this distribution accepts but does not implement: refused or reported before Ray starts.

Users bring upstream scripts unchanged, so every upstream key parses. A key whose feature is missing here must not
be ignored silently, and what happens depends on what ignoring it would do:

* it would change what is trained or computed (a frozen vision tower trained anyway, an importance-sampling
  correction not applied, LoRA trained as full fine-tuning): ``check_supported_features`` raises ``ConfigError``
  naming the key and what to do;
* it only tunes speed, memory, logging or debugging, so results are the same without it:
  ``report_inert_settings`` logs one warning naming every such key that is set, and returns them.

Both look only at values that differ from the default; a default config passes silently. The tables are the
one place to look (and to edit when a feature lands: delete its row and add the test that proves the feature).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from verl.base_config import ConfigError

__all__ = [
    "CONFIG_ONLY",
    "COVERED_BY",
    "INERT_SETTINGS",
    "UNSUPPORTED_FEATURES",
    "Setting",
    "check_supported_features",
    "report_inert_settings",
]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Setting:
    """``key`` (dotted path from the config root) is in use when ``in_use(value)``; ``note`` says what to do."""

    key: str
    in_use: Callable[[Any], bool]
    note: str


def _true(value: Any) -> bool:
    return bool(value)


def _set(value: Any) -> bool:
    return value is not None


UNSUPPORTED_FEATURES: tuple[Setting, ...] = (
    Setting(
        "actor_rollout_ref.actor.calculate_sum_pi_squared",
        _true,
        "the actors do not compute the per-token sum of squared probabilities (needed by the optimal-token-baseline "
        "estimators); remove the override and use grpo, rloo, gae or another estimator",
    ),
    Setting(
        "algorithm.adv_estimator",
        lambda v: v in ("optimal_token_baseline", "tir_optimal_token_baseline"),
        "needs actor_rollout_ref.actor.calculate_sum_pi_squared, which the actors here do not compute; use grpo, "
        "rloo, gae or another estimator",
    ),
    Setting(
        "actor_rollout_ref.model.lora_rank",
        lambda v: v > 0,
        "LoRA is not implemented: the model would be fully fine-tuned; set lora_rank=0",
    ),
    Setting("actor_rollout_ref.model.lora_adapter_path", _set, "LoRA is not implemented; remove the adapter path"),
    Setting("critic.model.lora_rank", lambda v: v > 0, "LoRA is not implemented; set lora_rank=0"),
    Setting(
        "actor_rollout_ref.rollout.multi_turn.enable",
        _true,
        "multi-turn / tool-calling rollouts are not implemented: responses would be single-turn; set it to false",
    ),
    Setting(
        "actor_rollout_ref.rollout.agent.default_agent_loop",
        lambda v: v != "single_turn_agent",
        "agent loops are not implemented: generation is single-turn; use single_turn_agent",
    ),
    Setting(
        "actor_rollout_ref.rollout.agent.agent_loop_config_path",
        _set,
        "agent loops are not implemented: generation is single-turn; remove the file",
    ),
    Setting(
        "actor_rollout_ref.rollout.agent.custom_async_server.path",
        _set,
        "a custom async rollout server is not supported: the configured rollout (rollout.name) generates; remove it",
    ),
    Setting(
        "data.datagen.path",
        _set,
        "dynamic data generation is not implemented: the training set would stay as loaded; remove it",
    ),
    Setting(
        "actor_rollout_ref.rollout.quantization_config_file",
        _set,
        "rollout quantization is not implemented: the rollout would run unquantized; remove the file",
    ),
    Setting(
        "reward.reward_model.enable",
        _true,
        "model-based reward serving is not supported by this distribution; use a rule-based reward "
        "(reward.custom_reward_function.path, or the built-in scores by data_source)",
    ),
    Setting(
        "algorithm.use_pf_ppo",
        _true,
        "PF-PPO resampling is not wired into the trainer: the batch would be trained unweighted; set it to false",
    ),
    Setting(
        "algorithm.adv_estimator",
        lambda v: v == "remax",
        "remax needs a greedy baseline response per prompt (reward_baselines), which the trainer here does not "
        "generate; use grpo, rloo or reinforce_plus_plus",
    ),
)
"""Features whose absence would change what is trained: refused."""

INERT_SETTINGS: tuple[Setting, ...] = (
    Setting("actor_rollout_ref.model.use_liger", _true, "Liger kernels are not used (same maths, no speed-up)"),
    Setting("actor_rollout_ref.model.tiled_mlp.enabled", _true, "the MLP is not tiled (more activation memory)"),
    Setting("actor_rollout_ref.model.use_shm", _true, "the model is read from its path, not copied to /dev/shm"),
    Setting("critic.model.use_shm", _true, "the critic model is read from its path, not copied to /dev/shm"),
    Setting("data.use_shm", _true, "data files are read from their paths, not copied to /dev/shm"),
    Setting("actor_rollout_ref.actor.use_prefix_grouper", _true, "shared prompts are not grouped (same maths)"),
    Setting("actor_rollout_ref.actor.checkpoint.async_save", _true, "checkpoints are written synchronously"),
    Setting("actor_rollout_ref.rollout.layered_summon", _true, "weights are synced to the rollout in one pass"),
    Setting("actor_rollout_ref.rollout.multi_stage_wake_up", _true, "the rollout engine wakes up in one stage"),
    Setting("actor_rollout_ref.rollout.over_sample_rate", lambda v: v > 0, "no requests are over-sampled"),
    Setting("actor_rollout_ref.rollout.skip_rollout", _true, "every step generates (no dump/replay)"),
    Setting("trainer.log_val_generations", lambda v: v > 0, "validation generations are not logged"),
    Setting("trainer.validation_data_dir", _set, "validation generations are not dumped"),
    Setting("trainer.esi_redundant_time", lambda v: v != 0, "no elastic-server-instance (ESI) save deadline"),
    Setting("trainer.default_hdfs_dir", _set, "checkpoints are not copied to HDFS (only default_local_dir)"),
    Setting("trainer.del_local_ckpt_after_load", _true, "the loaded local checkpoint is kept"),
    Setting(
        "trainer.max_critic_ckpt_to_keep",
        _set,
        "a step's checkpoint holds every role; trainer.max_actor_ckpt_to_keep bounds them all",
    ),
    Setting("trainer.ray_wait_register_center_timeout", lambda v: v != 300, "workers register without a Ray timeout"),
    Setting("ray_kwargs.timeline_json_file", _set, "no Ray timeline is written"),
    Setting(
        "global_profiler.tool",
        _set,
        "step profiling is not wired into the trainer: nothing is profiled (global_profiler.* has no effect)",
    ),
    Setting("actor_rollout_ref.rollout.mode", lambda v: v == "sync", "generation runs the same in both modes"),
    Setting(
        "actor_rollout_ref.rollout.data_parallel_size",
        lambda v: v != 1,
        "the rollout runs one engine per training rank (data parallel over the training ranks)",
    ),
    Setting(
        "actor_rollout_ref.rollout.checkpoint_engine.backend",
        lambda v: v != "naive",
        "weights are synced in-process into the colocated engine",
    ),
    Setting(
        "actor_rollout_ref.rollout.checkpoint_engine.update_weights_bucket_megabytes",
        lambda v: v != 2048,
        "weights are synced one decoder block at a time (the peak extra memory is one block), not in buckets",
    ),
    Setting("actor_rollout_ref.actor.use_torch_compile", _true, "torch.compile is not applied (eager kernels)"),
    Setting("actor_rollout_ref.ref.use_torch_compile", _true, "torch.compile is not applied (eager kernels)"),
    Setting("actor_rollout_ref.actor.fsdp_config.use_torch_compile", _true, "torch.compile is not applied"),
    Setting("actor_rollout_ref.ref.fsdp_config.use_torch_compile", _true, "torch.compile is not applied"),
    Setting("critic.model.fsdp_config.use_torch_compile", _true, "torch.compile is not applied"),
    Setting(
        "actor_rollout_ref.actor.fsdp_config.full_determinism",
        _true,
        "kernels are not forced into deterministic modes (CPU runs are deterministic anyway)",
    ),
    Setting("actor_rollout_ref.ref.fsdp_config.full_determinism", _true, "kernels are not forced deterministic"),
    Setting("critic.model.fsdp_config.full_determinism", _true, "kernels are not forced deterministic"),
    Setting("critic.checkpoint.async_save", _true, "checkpoints are written synchronously"),
    Setting("actor_rollout_ref.actor.checkpoint.mbridge_config", _true, "a Megatron-bridge option (no Megatron here)"),
    Setting("critic.checkpoint.mbridge_config", _true, "a Megatron-bridge option (no Megatron here)"),
    Setting(
        "actor_rollout_ref.model.fused_kernel_options.impl_backend",
        lambda v: v != "torch",
        "the fused log-prob kernel here is the chunked torch one",
    ),
    Setting("reward.sandbox_fusion.max_concurrent", lambda v: v != 64, "reward.num_workers bounds parallel scoring"),
    Setting("data.return_raw_input_ids", _true, "raw_input_ids are not returned (only a reward model reads them)"),
    Setting("data.image_patch_size", lambda v: v != 14, "the processor's own patch size is used"),
    Setting("data.validation_shuffle", _true, "the validation set is read in order"),
    Setting("data.filter_overlong_prompts_workers", lambda v: v > 1, "prompts are filtered in one process"),
)
"""Knobs of speed, memory, logging or debugging: reported once, results unchanged."""

COVERED_BY: dict[str, str] = {
    "data.datagen.": "data.datagen.path",
    "data.tool_config_path": "actor_rollout_ref.rollout.multi_turn.enable",
    "actor_rollout_ref.rollout.multi_turn.": "actor_rollout_ref.rollout.multi_turn.enable",
    "actor_rollout_ref.rollout.agent.": "actor_rollout_ref.rollout.agent.default_agent_loop",
    "actor_rollout_ref.model.lora_alpha": "actor_rollout_ref.model.lora_rank",
    "actor_rollout_ref.model.target_modules": "actor_rollout_ref.model.lora_rank",
    "actor_rollout_ref.model.exclude_modules": "actor_rollout_ref.model.lora_rank",
    "critic.model.lora_alpha": "critic.model.lora_rank",
    "critic.model.target_modules": "critic.model.lora_rank",
    "actor_rollout_ref.model.tiled_mlp.": "actor_rollout_ref.model.tiled_mlp.enabled",
    "actor_rollout_ref.actor.sum_pi_squared_checkpointing": "actor_rollout_ref.actor.calculate_sum_pi_squared",
    "actor_rollout_ref.rollout.skip_dump_dir": "actor_rollout_ref.rollout.skip_rollout",
    "algorithm.rollout_correction.": "algorithm.rollout_correction.rollout_is",
    "algorithm.pf_ppo.": "algorithm.use_pf_ppo",
    "reward.reward_model.": "reward.reward_model.enable",
    "global_profiler.": "global_profiler.tool",
    "actor_rollout_ref.rollout.checkpoint_engine.engine_kwargs": "actor_rollout_ref.rollout.checkpoint_engine.backend",
}
"""Sub-keys of a feature whose switch (a key of the tables above) refuses or reports it: they have no effect of
their own. A key prefix ends with a dot."""

CONFIG_ONLY: dict[str, str] = {
    "model_engine": "selects the config family (dp | veomni) at composition; checked against the composed nodes",
    "actor_rollout_ref.hybrid_engine": "validated: only the hybrid engine (true) is supported, false is refused",
    "actor_rollout_ref.actor.rollout_n": "linked to actor_rollout_ref.rollout.n (a different value is refused)",
    "actor_rollout_ref.ref.rollout_n": "linked to actor_rollout_ref.rollout.n",
    "critic.rollout_n": "linked to actor_rollout_ref.rollout.n",
    "data.max_response_length": "interpolated into actor_rollout_ref.rollout.response_length",
    "actor_rollout_ref.model.hf_config_path": "read by HFModelConfig.hf_config, the workers' config loader",
    "actor_rollout_ref.model.custom_chat_template": "applied by HFModelConfig.tokenizer / processor",
    "actor_rollout_ref.actor.optim.warmup_style": "upstream's deprecated alias, validated against lr_scheduler_type",
    "critic.optim.warmup_style": "upstream's deprecated alias, validated against lr_scheduler_type",
}
"""Keys consumed inside the config modules themselves (selection, validation, links, the workers' loaders)."""


_ABSENT = object()


def _value(config: Any, key: str) -> Any:
    """The value at ``key``, or ``_ABSENT`` where the composed family has no such node (e.g. ``fsdp_config`` of a
    VeOmni actor)."""
    node = config
    for part in key.split("."):
        node = getattr(node, part, _ABSENT)
        if node is _ABSENT:
            return _ABSENT
    return node


def _in_use(config: Any, settings: tuple[Setting, ...]) -> list[tuple[Setting, Any]]:
    used = []
    for setting in settings:
        value = _value(config, setting.key)
        if value is not _ABSENT and setting.in_use(value):
            used.append((setting, value))
    return used


def check_supported_features(config: Any) -> None:
    """Raise ``ConfigError`` for the first key of ``UNSUPPORTED_FEATURES`` in use in the typed ``config``."""
    for setting, value in _in_use(config, UNSUPPORTED_FEATURES):
        raise ConfigError(setting.key, f"({value!r}): {setting.note}.")


def report_inert_settings(config: Any) -> list[str]:
    """Log one warning listing the keys of ``INERT_SETTINGS`` in use (results unchanged); returns those keys."""
    used = _in_use(config, INERT_SETTINGS)
    if used:
        lines = "\n".join(f"  {s.key}={v!r}: {s.note}" for s, v in used)
        logger.warning("These settings have no effect in this distribution (results are unchanged):\n%s", lines)
    return [s.key for s, _ in used]
