"""``RLHFDataset``: RL prompts from parquet, tokenised with the chat template and left-padded (upstream v0.6/v0.7
tokenising dataset), and ``collate_fn`` that batches items into tensors + numpy object arrays.

Row format (written by ``examples/data_preprocess/*.py``)::

    prompt        [{"role": "user", "content": "... <image> ..."}]   (column named by data.prompt_key)
    data_source   "openai/gsm8k"                                    (column named by data.reward_fn_key)
    ability       "math"
    reward_model  {"style": "rule", "ground_truth": "72"}
    extra_info    {"split": "train", "index": 0, ...}
    images        [{"bytes": b"...", "path": None}]                 (optional; data.image_key)

Item produced by ``__getitem__`` (all other columns are passed through unchanged)::

    input_ids, attention_mask, position_ids    (max_prompt_length,) int64, left-padded
    raw_prompt_ids                             list[int], the unpadded prompt tokens
    raw_prompt (data.return_raw_chat)          the chat messages
    full_prompts (data.return_full_prompt)     the templated prompt string
    multi_modal_data / multi_modal_inputs      for rows with images/videos when a processor is given
    index, tools_kwargs, interaction_kwargs    from extra_info

Bad data fails with an exception that names the file and row (see ``parquet_io`` and ``prompt_utils``).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset

from verl.upstream_gaps import missing_name_getattr
from verl.utils.dataset.dataset_config import RLDatasetConfig
from verl.utils.dataset.parquet_io import normalize_data_files, read_parquet_files
from verl.utils.dataset.prompt_utils import (
    check_media_markers,
    compute_position_ids,
    left_pad,
    split_media_placeholders,
    truncate_ids,
    validate_chat_prompt,
)
from verl.utils.dataset.vision_utils import process_image, process_video
from verl.utils.rope_utils import get_packed_mrope_position_ids

logger = logging.getLogger(__name__)

__all__ = ["RLHFDataset", "collate_fn"]


@dataclass
class EncodedPrompt:
    """A templated prompt: its text, token ids (untruncated) and, for multimodal rows, processor outputs."""

    messages: list[dict]
    text: str
    ids: list[int]
    multi_modal_data: dict | None = None
    multi_modal_inputs: dict = field(default_factory=dict)


def collate_fn(data_list: list[dict]) -> dict:
    """Batch dataset items: tensors are stacked on a new dim 0, everything else becomes a numpy object array.

    Keys missing from some items are filled with None (non-tensors only; a missing tensor is an error).
    """
    keys = list(dict.fromkeys(key for item in data_list for key in item))
    batch: dict[str, Any] = {}
    for key in keys:
        values = [item.get(key) for item in data_list]
        if any(isinstance(v, torch.Tensor) for v in values):
            if not all(isinstance(v, torch.Tensor) for v in values):
                raise ValueError(f"collate_fn: key {key!r} is a tensor in some items and not in others")
            batch[key] = torch.stack(values, dim=0)
        else:
            # np.empty + fill, not np.array(values): equal-length lists must stay objects, not become a 2-D array.
            array = np.empty(len(values), dtype=object)
            array[:] = values
            batch[key] = array
    return batch


class RLHFDataset(Dataset):
    """Prompts of one or more parquet files, tokenised on access (see the module docstring for the format)."""

    def __init__(
        self,
        data_files: str | Sequence[str],
        tokenizer,
        config: Any,
        processor=None,
        max_samples: int = -1,
    ):
        self.config = RLDatasetConfig.from_data_config(config)
        self.tokenizer = tokenizer
        self.processor = processor
        self.data_files = normalize_data_files(data_files)
        self.max_samples = max_samples
        self.pad_token_id = self._pad_token_id(tokenizer)
        self._load()

    # ---------------------------------------------------------------- loading
    @staticmethod
    def _pad_token_id(tokenizer) -> int:
        if tokenizer.pad_token_id is not None:
            return tokenizer.pad_token_id
        if tokenizer.eos_token_id is None:
            raise ValueError("The tokenizer has neither a pad nor an eos token; load it with verl.utils.hf_tokenizer.")
        return tokenizer.eos_token_id

    def _load(self) -> None:
        """Read the files, validate every prompt, then apply max_samples and the overlong filter."""
        cfg = self.config
        self._rows = read_parquet_files(self.data_files, {cfg.prompt_key: "data.prompt_key"})
        self._warn_missing_reward_columns()
        prompts = self._rows.table.column(cfg.prompt_key).to_pylist()
        for row, prompt in enumerate(prompts):
            validate_chat_prompt(prompt, str(self._rows.origin(row)), cfg.prompt_key)
        indices = self._subsample(list(range(len(prompts))))
        if cfg.filter_overlong_prompts:
            indices = self._filter_overlong(indices)
        self._indices = indices

    def _warn_missing_reward_columns(self) -> None:
        """Rule rewards need these columns; warn now rather than fail after the first rollout."""
        present = set(self._rows.table.column_names)
        for column in (self.config.reward_fn_key, "reward_model"):
            if column not in present:
                logger.warning(
                    "%s: no %r column; rule-based reward managers will fail on this data (data.reward_fn_key=%r)",
                    self.data_files,
                    column,
                    self.config.reward_fn_key,
                )

    def _subsample(self, indices: list[int]) -> list[int]:
        """``max_samples`` > 0: keep that many rows, a seeded random subset when data.shuffle, else the first."""
        if self.max_samples is None or self.max_samples <= 0 or self.max_samples >= len(indices):
            return indices
        if self.config.shuffle:
            rng = np.random.default_rng(self.config.seed or 0)
            return [indices[i] for i in rng.choice(len(indices), self.max_samples, replace=False)]
        return indices[: self.max_samples]

    def _filter_overlong(self, indices: list[int]) -> list[int]:
        """Drop rows whose templated prompt is longer than data.max_prompt_length (logged)."""
        limit = self.config.max_prompt_length
        kept = [i for i in indices if len(self._encode(self._row(i), i).ids) <= limit]
        logger.info("filter_overlong_prompts: kept %d of %d rows (<= %d tokens)", len(kept), len(indices), limit)
        if not kept:
            raise ValueError(
                f"{self.data_files}: every prompt is longer than data.max_prompt_length={limit}; raise it."
            )
        return kept

    def resume_dataset_state(self) -> None:
        """Re-read the files (upstream calls this after restoring a checkpoint)."""
        self._load()

    # ---------------------------------------------------------------- items
    def __len__(self) -> int:
        return len(self._indices)

    def _row(self, row: int) -> dict:
        """One record as plain Python values."""
        return self._rows.table.slice(row, 1).to_pylist()[0]

    def _encode(self, record: dict, row: int) -> EncodedPrompt:
        """Apply the chat template (and the processor for rows with media) to one record."""
        cfg = self.config
        messages = record[cfg.prompt_key]
        images, videos = record.get(cfg.image_key), record.get(cfg.video_key)
        if self.processor is not None:
            check_media_markers(messages, images, videos, str(self._rows.origin(row)), cfg.image_key, cfg.video_key)
        if self.processor is not None and (images or videos):
            return self._encode_multimodal(messages, images or [], videos or [], row)
        text = self.tokenizer.apply_chat_template(
            messages, add_generation_prompt=True, tokenize=False, **cfg.apply_chat_template_kwargs
        )
        return EncodedPrompt(messages, text, self.tokenizer.encode(text, add_special_tokens=False))

    def _encode_multimodal(self, messages: list[dict], images: list, videos: list, row: int) -> EncodedPrompt:
        """Processor path: ``<image>``/``<video>`` placeholders become typed parts, media expand to vision tokens."""
        messages = split_media_placeholders(messages)
        where = self._rows.origin(row)
        try:
            pil_images = [process_image(image) for image in images]
            frames = [process_video(video) for video in videos]
        except (TypeError, ValueError, OSError) as exc:
            raise ValueError(f"{where}: cannot read media ({exc})") from exc
        text = self.processor.apply_chat_template(
            messages, add_generation_prompt=True, tokenize=False, **self.config.apply_chat_template_kwargs
        )
        inputs = dict(
            self.processor(text=[text], images=pil_images or None, videos=frames or None, return_tensors="pt")
        )
        ids = inputs.pop("input_ids")[0].tolist()
        inputs.pop("attention_mask", None)
        inputs.pop("second_per_grid_ts", None)
        media = {"image": pil_images, "video": frames}
        return EncodedPrompt(messages, text, ids, multi_modal_data=media, multi_modal_inputs=inputs)

    def __getitem__(self, item: int) -> dict:
        cfg = self.config
        row = self._indices[item]
        record = self._row(row)
        where = str(self._rows.origin(row))
        encoded = self._encode(record, row)
        if encoded.multi_modal_data is not None and len(encoded.ids) > cfg.max_prompt_length:
            # Cutting a multimodal prompt would drop vision tokens the processor's pixel values still refer to.
            raise ValueError(
                f"{where}: multimodal prompt is {len(encoded.ids)} tokens (> data.max_prompt_length="
                f"{cfg.max_prompt_length}) and cannot be truncated. To fix: raise data.max_prompt_length or set "
                "data.filter_overlong_prompts=True."
            )
        ids = truncate_ids(encoded.ids, cfg.max_prompt_length, cfg.truncation, where)
        input_ids, attention_mask = left_pad(ids, cfg.max_prompt_length, self.pad_token_id)
        return self._assemble(record, encoded, ids, input_ids, attention_mask)

    def _uses_mrope(self, encoded: EncodedPrompt) -> bool:
        """A Qwen-VL processor: it returned ``mm_token_type_ids``, declares it does (transformers >= 5.2x), or has a
        spatial-merge image processor (older releases return the ids only when asked) -- text-only rows included."""
        if self.processor is None:
            return False
        image_processor = getattr(self.processor, "image_processor", None)
        return (
            "mm_token_type_ids" in encoded.multi_modal_inputs
            or getattr(self.processor, "return_mm_token_type_ids", False)
            or hasattr(image_processor, "merge_size")
        )

    def _position_ids(self, encoded: EncodedPrompt, attention_mask: torch.Tensor) -> torch.Tensor:
        """``(S,)`` text positions; with a Qwen-VL processor (see :meth:`_uses_mrope`) ``(4, S)``: the
        text row then the T/H/W M-RoPE rows, built for this sample alone and then left-padded with zeros, as
        upstream's dataset does (vision positions cannot be recomputed after padding removal or packing). Text-only
        rows of such a dataset get 4 rows too (all equal), so that a batch stacks."""
        if not self._uses_mrope(encoded):
            return compute_position_ids(attention_mask)
        length = int(attention_mask.sum())
        types = encoded.multi_modal_inputs.pop("mm_token_type_ids", None)
        if types is None:  # processors that do not return them: image tokens are 1, video tokens 2
            ids = torch.tensor(encoded.ids[-length:]).reshape(1, -1)
            types = torch.zeros_like(ids)
            for value, name in ((1, "image_token_id"), (2, "video_token_id")):
                token = getattr(self.processor, name, None)
                if token is not None:
                    types = types.masked_fill(ids == token, value)
        types = types.reshape(1, -1)
        mm = encoded.multi_modal_inputs
        sample = get_packed_mrope_position_ids(
            types,
            torch.ones_like(types),
            mm.get("image_grid_thw"),
            mm.get("video_grid_thw"),
            spatial_merge_size=getattr(self.processor.image_processor, "merge_size", 2),
        )[:, 0]
        return torch.cat([sample.new_zeros(4, attention_mask.numel() - length), sample], dim=1)

    def _assemble(self, record: dict, encoded: EncodedPrompt, ids: list[int], input_ids, attention_mask) -> dict:
        """The item dict: pass-through columns plus the tokenised prompt fields (module docstring)."""
        cfg = self.config
        item = {k: v for k, v in record.items() if k not in (cfg.prompt_key, cfg.image_key, cfg.video_key)}
        item.update(
            input_ids=input_ids, attention_mask=attention_mask, position_ids=self._position_ids(encoded, attention_mask)
        )
        if encoded.multi_modal_data is None:
            item["raw_prompt_ids"] = ids
        else:
            # Server rollouts expand vision tokens themselves: give them the unexpanded placeholder tokens (never
            # longer than the expanded ids, which already fit).
            item["raw_prompt_ids"] = self.tokenizer.encode(encoded.text, add_special_tokens=False)
            item["multi_modal_data"] = encoded.multi_modal_data
            if cfg.return_multi_modal_inputs:
                item["multi_modal_inputs"] = encoded.multi_modal_inputs
        if cfg.return_raw_chat:
            item["raw_prompt"] = encoded.messages
        if cfg.return_full_prompt:
            item["full_prompts"] = encoded.text
        extra_info = record.get("extra_info") or {}
        item["index"] = extra_info.get("index") or 0
        item["tools_kwargs"] = extra_info.get("tools_kwargs") or {}
        item["interaction_kwargs"] = extra_info.get("interaction_kwargs") or {}
        return item


__getattr__ = missing_name_getattr(__name__)  # upstream names missing here raise with the reason (verl.upstream_gaps)
