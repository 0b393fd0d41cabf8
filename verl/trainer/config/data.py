"""Dataset settings: `data` (`data/legacy_data.yaml`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional, Union

from verl.base_config import BaseConfig, ConfigError, require_choice, require_positive

__all__ = [
    "DEFAULT_SHUFFLE_SEED",
    "TRUNCATION_MODES",
    "CustomClsConfig",
    "DataConfig",
    "DatagenConfig",
    "SamplerConfig",
    "shuffle_seed",
]

TRUNCATION_MODES = ("error", "left", "right", "middle")

DEFAULT_SHUFFLE_SEED = 1
"""Seed of the training-set shuffle when ``data.seed`` is null (upstream's sampler uses 1 too)."""


def shuffle_seed(seed: int | None) -> int:
    """The seed the training sampler shuffles with: ``data.seed``, or :data:`DEFAULT_SHUFFLE_SEED` when null."""
    return DEFAULT_SHUFFLE_SEED if seed is None else int(seed)


@dataclass
class CustomClsConfig(BaseConfig):
    """`data.custom_cls`: a user Dataset class used instead of RLHFDataset."""

    path: Optional[str] = None
    """Python file that defines the class."""

    name: Optional[str] = None
    """Class name in that file."""

    def __post_init__(self) -> None:
        if (self.path is None) != (self.name is None):
            raise ConfigError("name" if self.name is None else "path", "custom_cls needs both path and name.")


@dataclass
class SamplerConfig(BaseConfig):
    """`data.sampler`: a user sampler class (curriculum learning)."""

    class_path: Optional[str] = None
    """Python file that defines the sampler."""

    class_name: Optional[str] = None
    """Class name in that file."""


@dataclass
class DatagenConfig(BaseConfig):
    """`data.datagen`: a user dynamic-data generator."""

    path: Optional[str] = None
    """Python file that defines the generator."""

    name: Optional[str] = None
    """Class name in that file."""


@dataclass
class DataConfig(BaseConfig):
    """Where prompts come from and how they are shaped and batched."""

    tokenizer: Optional[str] = None
    """Unused placeholder kept for key compatibility (the tokenizer comes from actor_rollout_ref.model)."""

    use_shm: bool = False
    """Copy the data files to /dev/shm before reading."""

    train_files: Union[str, list[str]] = "~/data/rlhf/gsm8k/train.parquet"
    """Training parquet file(s)."""

    val_files: Union[str, list[str]] = "~/data/rlhf/gsm8k/test.parquet"
    """Validation parquet file(s)."""

    train_max_samples: int = -1
    """Use at most this many training rows; -1 = all."""

    val_max_samples: int = -1
    """Use at most this many validation rows; -1 = all."""

    prompt_key: str = "prompt"
    """Column holding the chat messages."""

    reward_fn_key: str = "data_source"
    """Column the reward function dispatches on."""

    max_prompt_length: int = 512
    """Prompt tokens after the chat template (prompts are left-padded to this length)."""

    max_response_length: int = 512
    """Generated tokens per response."""

    train_batch_size: int = 1024
    """PROMPTS per training step (each generates rollout.n responses)."""

    val_batch_size: Optional[int] = None
    """Prompts per validation batch; null = the whole validation set as one batch. Deprecated upstream (a warning at
    start-up) but still honoured, as upstream's trainer does."""

    tool_config_path: Optional[str] = None
    """Tool config for multi-turn datasets; follows actor_rollout_ref.rollout.multi_turn.tool_config_path."""

    return_raw_input_ids: bool = False
    """Also return the un-templated input ids (for a reward model with a different tokenizer)."""

    return_raw_chat: bool = True
    """Also return the chat messages (raw_prompt), used by server-mode rollouts."""

    return_full_prompt: bool = False
    """Also return the templated prompt string."""

    shuffle: bool = True
    """Shuffle the training set (seeded, checkpointable sampler)."""

    seed: Optional[int] = None
    """Seed of the shuffle; null = DEFAULT_SHUFFLE_SEED (1), a fixed seed, so a resumed run sees the same order."""

    dataloader_num_workers: int = 8
    """DataLoader worker processes."""

    image_patch_size: int = 14
    """Vision patch size used to estimate image token counts."""

    validation_shuffle: bool = False
    """Shuffle the validation set."""

    filter_overlong_prompts: bool = False
    """Drop rows whose templated prompt is longer than max_prompt_length."""

    filter_overlong_prompts_workers: int = 1
    """Processes used for that filtering."""

    truncation: str = "error"
    """Longer prompts: error | left (keep the end) | right (keep the start) | middle."""

    image_key: str = "images"
    """Column with a row's images."""

    video_key: str = "videos"
    """Column with a row's videos."""

    trust_remote_code: bool = False
    """Allow remote code for the tokenizer/processor loaded by the dataset."""

    custom_cls: CustomClsConfig = field(default_factory=CustomClsConfig)
    """User Dataset class."""

    return_multi_modal_inputs: bool = True
    """Return processor tensors (pixel_values, image_grid_thw) for multimodal rows."""

    sampler: SamplerConfig = field(default_factory=SamplerConfig)
    """User sampler class."""

    datagen: DatagenConfig = field(default_factory=DatagenConfig)
    """User data generator."""

    apply_chat_template_kwargs: dict[str, Any] = field(default_factory=dict)
    """Extra keyword arguments for apply_chat_template (e.g. {enable_thinking: false})."""

    def __post_init__(self) -> None:
        require_choice("truncation", self.truncation, TRUNCATION_MODES)
        require_positive("max_prompt_length", self.max_prompt_length)
        require_positive("max_response_length", self.max_response_length)
        require_positive("train_batch_size", self.train_batch_size)
        if self.dataloader_num_workers < 0:
            raise ConfigError("dataloader_num_workers", f"must be >= 0, got {self.dataloader_num_workers}.")
        if self.sampler.class_path is not None and self.dataloader_num_workers != 0:
            raise ConfigError(
                "dataloader_num_workers",
                f"({self.dataloader_num_workers}) must be 0 with a custom sampler ({{node}}.sampler.class_path): the "
                f"sampler reads training state that worker processes would not see.",
            )
        for key in ("train_max_samples", "val_max_samples"):
            if getattr(self, key) == 0 or getattr(self, key) < -1:
                raise ConfigError(key, f"must be -1 (all rows) or a positive count, got {getattr(self, key)}.")
