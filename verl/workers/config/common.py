"""Config pieces shared by several roles and by the trainer's own config: what a checkpoint contains, the common
model-path block, and the KL estimator names (the actor's ``kl_loss_type``, the algorithm's ``kl_penalty``).

They live at the workers' config layer because the trainer's config (``verl.trainer.config``) is built on top of
it; ``verl.trainer.config`` re-exports them under their upstream import paths.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

from verl.base_config import BaseConfig, ConfigError

__all__ = ["CHECKPOINT_CONTENTS", "KL_ESTIMATORS", "BaseModelConfig", "CheckpointConfig", "check_kl_estimator"]

KL_ESTIMATORS = ("kl", "k1", "abs", "mse", "k2", "low_var_kl", "k3")
"""KL estimators of core_algos.kl_penalty; a trailing '+' (e.g. 'k3+') uses the k2 gradient (straight-through)."""


def check_kl_estimator(name: str, value: str) -> None:
    """Raise ConfigError unless `value` is a KL estimator name, optionally with the straight-through '+'."""
    base = value[:-1] if value.endswith("+") else value
    if base == "full":
        raise ConfigError(name, "'full' (exact KL over the vocabulary) is not implemented; use low_var_kl (k3) or kl.")
    if base not in KL_ESTIMATORS:
        raise ConfigError(
            name,
            f"{value!r} is not a KL estimator; choose one of {', '.join(KL_ESTIMATORS)} "
            f"(append '+' for the straight-through k2 gradient).",
        )


CHECKPOINT_CONTENTS = ("model", "optimizer", "extra", "hf_model")
"""model/optimizer = sharded FSDP state; extra = lr scheduler + RNG; hf_model = a full HF-format export."""


@dataclass
class CheckpointConfig(BaseConfig):
    """What a role saves and loads (`actor_rollout_ref.actor.checkpoint`, `critic.checkpoint`)."""

    save_contents: list[str] = field(default_factory=lambda: ["model", "optimizer", "extra"])
    """Parts written at each save: model | optimizer | extra | hf_model."""

    load_contents: list[str] = field(default_factory=lambda: ["model", "optimizer", "extra"])
    """Parts read on resume; the YAML makes it follow save_contents."""

    async_save: bool = False
    """Write checkpoints in a background thread (Megatron-only upstream; the FSDP checkpoint manager decides)."""

    mbridge_config: dict[str, Any] = field(default_factory=dict)
    """Megatron-bridge export options (kept for key compatibility; unused by FSDP)."""

    def __post_init__(self) -> None:
        for name in ("save_contents", "load_contents"):
            unknown = [c for c in getattr(self, name) if c not in CHECKPOINT_CONTENTS]
            if unknown:
                raise ConfigError(name, f"unknown part(s) {unknown}; choose from {list(CHECKPOINT_CONTENTS)}.")


@dataclass
class BaseModelConfig(BaseConfig):
    """Where a model and its tokenizer come from."""

    path: str = "~/models/deepseek-llm-7b-chat"
    """Local directory or HF hub id of the model."""

    tokenizer_path: Optional[str] = None
    """Tokenizer location; null = `path`."""

    override_config: dict[str, Any] = field(default_factory=dict)
    """Overrides applied to the HF model config before the model is built (e.g. {attn_implementation: sdpa})."""

    external_lib: Optional[str] = None
    """Python module imported before loading (registers custom model classes)."""

    trust_remote_code: bool = False
    """Allow HF remote code for model, tokenizer and processor."""
