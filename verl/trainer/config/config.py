"""Config pieces shared by several roles: what a checkpoint contains, and the common model-path block."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

from verl.base_config import BaseConfig, ConfigError

__all__ = ["CHECKPOINT_CONTENTS", "BaseModelConfig", "CheckpointConfig"]

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
