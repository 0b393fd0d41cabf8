"""Prompt checks and shaping for RL datasets: chat-message validation, multimodal placeholders, truncation and
left padding to a fixed length, and position ids.

Prompts are **left**-padded so that every prompt ends at the same column and generation appends to the right.
"""

from __future__ import annotations

import copy
import re
from typing import Any

import torch

_PLACEHOLDER_SPLIT = re.compile(r"(<image>|<video>)")
_PLACEHOLDER_PART = {"<image>": {"type": "image"}, "<video>": {"type": "video"}}
OVERLONG_FIX = (
    "raise data.max_prompt_length, set data.truncation=left|right|middle, or data.filter_overlong_prompts=True"
)


def _content_is_empty(content: Any) -> bool:
    """A message content with no text and no media parts."""
    if isinstance(content, str):
        return not content.strip()
    if isinstance(content, list):
        return all(
            isinstance(p, dict) and p.get("type") == "text" and not str(p.get("text", "")).strip() for p in content
        )
    return True


def validate_chat_prompt(prompt: Any, where: str, prompt_key: str) -> None:
    """Raise ValueError unless ``prompt`` is a non-empty list of ``{"role", "content"}`` messages with some content.

    ``where`` names the file and row (``"train.parquet row 7"``) so the user can fix the data.
    """
    if isinstance(prompt, str):
        raise ValueError(
            f"{where}: column {prompt_key!r} (data.prompt_key) holds a plain string; RL datasets store chat messages "
            f'like [{{"role": "user", "content": "..."}}] (see examples/data_preprocess/gsm8k.py).'
        )
    if not isinstance(prompt, list) or not prompt:
        raise ValueError(
            f"{where}: column {prompt_key!r} (data.prompt_key) is empty or not a list of chat messages: "
            f"{str(prompt)[:120]!r}."
        )
    for turn, message in enumerate(prompt):
        if not isinstance(message, dict) or "role" not in message or "content" not in message:
            raise ValueError(
                f"{where}: message {turn} of column {prompt_key!r} needs 'role' and 'content' keys, "
                f"got {str(message)[:120]!r}."
            )
    if all(_content_is_empty(message["content"]) for message in prompt):
        raise ValueError(
            f"{where}: the prompt in column {prompt_key!r} (data.prompt_key) is empty (no message "
            "has any content). Remove the row or fill in the prompt."
        )


def split_media_placeholders(messages: list[dict]) -> list[dict]:
    """Copy of ``messages`` with each string content split at ``<image>``/``<video>`` into typed parts.

    ``"Find x. <image>"`` -> ``[{"type": "text", "text": "Find x. "}, {"type": "image"}]``, the content format
    multimodal chat templates expect; the n-th image part refers to the row's n-th image.
    """
    out = copy.deepcopy(messages)
    for message in out:
        if not isinstance(message["content"], str):
            continue
        parts = []
        for segment in _PLACEHOLDER_SPLIT.split(message["content"]):
            if segment in _PLACEHOLDER_PART:
                parts.append(dict(_PLACEHOLDER_PART[segment]))
            elif segment:
                parts.append({"type": "text", "text": segment})
        message["content"] = parts
    return out


def truncate_ids(ids: list[int], max_length: int, truncation: str, where: str) -> list[int]:
    """Cut a token list to ``max_length`` by ``truncation`` (error | left | right | middle).

    ``left`` keeps the end (the question is usually last), ``right`` the start, ``middle`` both ends
    (``ceil(max/2)`` head + ``floor(max/2)`` tail tokens). ``error`` raises ValueError naming the row and the fix.
    """
    if len(ids) <= max_length:
        return ids
    if truncation == "left":
        return ids[-max_length:]
    if truncation == "right":
        return ids[:max_length]
    if truncation == "middle":
        head = (max_length + 1) // 2
        tail = max_length - head
        return ids[:head] + (ids[-tail:] if tail else [])
    raise ValueError(
        f"{where}: prompt is {len(ids)} tokens after the chat template, longer than data.max_prompt_length="
        f"{max_length} (data.truncation=error). To fix: {OVERLONG_FIX}."
    )


def left_pad(ids: list[int], max_length: int, pad_token_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(input_ids (max_length,), attention_mask (max_length,))`` int64, real tokens right-aligned.

    ``ids`` must already fit (``len(ids) <= max_length``); pads are ``pad_token_id`` with mask 0.
    """
    if len(ids) > max_length:
        raise AssertionError(f"left_pad got {len(ids)} > {max_length} tokens; truncate first")
    num_pad = max_length - len(ids)
    input_ids = torch.tensor([pad_token_id] * num_pad + list(ids), dtype=torch.long)
    attention_mask = torch.tensor([0] * num_pad + [1] * len(ids), dtype=torch.long)
    return input_ids, attention_mask


def compute_position_ids(attention_mask: torch.Tensor) -> torch.Tensor:
    """Position ids that restart at 0 on the first real token: ``clip(cumsum(mask) - 1, min=0)``, same shape.

    Example: mask ``[0, 0, 1, 1, 1]`` -> ``[0, 0, 0, 1, 2]``.
    """
    return torch.clamp(torch.cumsum(attention_mask, dim=-1) - 1, min=0)


def _count_markers(messages: list[dict], marker: str) -> int:
    return sum(m["content"].count(marker) for m in messages if isinstance(m.get("content"), str))


def check_media_markers(messages: list[dict], images, videos, where: str, image_key: str, video_key: str) -> None:
    """Raise ValueError naming the row when the ``<image>``/``<video>`` markers of the prompt and the row's media
    disagree in number: the n-th marker takes the n-th image, so a marker without an image (a missing image, or
    more markers than images) would otherwise fail deep in the processor, or silently feed the wrong image."""
    for marker, media, key in (("<image>", images, image_key), ("<video>", videos, video_key)):
        markers, count = _count_markers(messages, marker), len(media or [])
        if markers == count or (markers == 0 and not media):
            continue
        raise ValueError(
            f"{where}: the prompt has {markers} {marker} marker(s) but the row has {count} {key!r} value(s) "
            f"(data.{'image_key' if key == image_key else 'video_key'}={key!r}); every marker needs one entry of "
            f"the {key!r} column, in order. Fix the row or its markers."
        )
