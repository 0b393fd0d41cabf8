"""The ``data.*`` keys ``RLHFDataset`` reads, as one typed config (defaults = upstream ``ppo_trainer.yaml``)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from verl.base_config import BaseConfig, ConfigError

TRUNCATION_MODES = ("error", "left", "right", "middle")


@dataclass
class RLDatasetConfig(BaseConfig):
    """The subset of ``data.*`` that shapes RL prompts; unknown ``data.*`` keys are not this node's business."""

    prompt_key: str = "prompt"
    """Column holding the chat messages ``[{"role": ..., "content": ...}, ...]``."""
    reward_fn_key: str = "data_source"
    """Column the reward manager dispatches on; checked for presence (warning) at load time."""
    max_prompt_length: int = 512
    """Prompt tokens after the chat template; prompts are left-padded to exactly this length."""
    truncation: str = "error"
    """What to do with a longer prompt: error | left (keep the end) | right (keep the start) | middle."""
    filter_overlong_prompts: bool = False
    """Drop rows whose templated prompt exceeds max_prompt_length when the dataset is built."""
    filter_overlong_prompts_workers: int = 1
    """Accepted for compatibility; filtering runs in the calling process."""
    return_raw_chat: bool = True
    """Add ``raw_prompt`` (the chat messages) to each item, for server-mode rollouts that template themselves."""
    return_full_prompt: bool = False
    """Add ``full_prompts`` (the templated prompt string) to each item."""
    return_raw_input_ids: bool = False
    """Accepted for compatibility (upstream's reward-model tokenizer path); no effect here."""
    image_key: str = "images"
    """Column with a row's images (PIL, {"bytes", "path"} dicts or paths); needs a processor."""
    video_key: str = "videos"
    """Column with a row's videos (each a list of frames); needs a processor."""
    return_multi_modal_inputs: bool = True
    """Add ``multi_modal_inputs`` (processor tensors such as pixel_values, image_grid_thw) to multimodal items."""
    apply_chat_template_kwargs: dict = field(default_factory=dict)
    """Extra keyword arguments for ``apply_chat_template`` (e.g. ``enable_thinking``)."""
    shuffle: bool = True
    """With max_samples, pick a random subset (seeded) instead of the first rows."""
    seed: int | None = None
    """Seed for the max_samples subset (None -> 0)."""

    def __post_init__(self) -> None:
        if self.truncation not in TRUNCATION_MODES:
            raise ConfigError("truncation", f"must be one of {TRUNCATION_MODES}, got {self.truncation!r}")
        if self.max_prompt_length <= 0:
            raise ConfigError("max_prompt_length", f"must be > 0, got {self.max_prompt_length}")
        if not self.prompt_key:
            raise ConfigError("prompt_key", "must name the parquet column holding the chat messages")

    @classmethod
    def from_data_config(cls, config: Any) -> RLDatasetConfig:
        """Build from the ``data`` node (DictConfig, Mapping, dataclass or this class); absent keys keep defaults."""
        if isinstance(config, cls):
            return config
        if config is None:
            return cls()
        source = config if isinstance(config, Mapping) or hasattr(config, "keys") else vars(config)
        values = {}
        for f in dataclasses.fields(cls):
            if f.name != "_target_" and f.name in source and source[f.name] is not None:
                values[f.name] = _plain(source[f.name])
        try:
            return cls(**values)
        except ConfigError as exc:
            raise exc.under("data") from None


def _plain(value: Any) -> Any:
    """OmegaConf containers -> plain Python (``apply_chat_template_kwargs`` is passed on to tokenizers)."""
    if hasattr(value, "_metadata") and hasattr(value, "items"):  # DictConfig
        return {k: _plain(v) for k, v in value.items()}
    return value
