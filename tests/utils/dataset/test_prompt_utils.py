"""Prompt shaping: truncation modes, left padding, position ids, placeholder splitting, prompt validation."""

import pytest
import torch

from verl.utils.dataset.prompt_utils import (
    compute_position_ids,
    left_pad,
    split_media_placeholders,
    truncate_ids,
    validate_chat_prompt,
)


def test_truncation_modes():
    """ids 0..9 cut to 5: left keeps the end, right the start, middle 3 head + 2 tail; short lists untouched."""
    ids = list(range(10))
    assert truncate_ids(ids, 5, "left", "f row 0") == [5, 6, 7, 8, 9]
    assert truncate_ids(ids, 5, "right", "f row 0") == [0, 1, 2, 3, 4]
    assert truncate_ids(ids, 5, "middle", "f row 0") == [0, 1, 2, 8, 9]  # ceil(5/2)=3 head, 2 tail
    assert truncate_ids(ids, 1, "middle", "f row 0") == [0]
    assert truncate_ids(ids[:3], 5, "error", "f row 0") == [0, 1, 2]


def test_error_mode_names_row_and_fix():
    """truncation=error raises with the row, the lengths and every config key that fixes it."""
    with pytest.raises(ValueError) as info:
        truncate_ids(list(range(10)), 5, "error", "train.parquet row 3")
    message = str(info.value)
    for fragment in ("train.parquet row 3", "10 tokens", "max_prompt_length=5", "data.truncation", "filter_overlong"):
        assert fragment in message


def test_left_pad_and_position_ids():
    """[7, 8, 9] padded to 5 -> ids [p, p, 7, 8, 9], mask [0, 0, 1, 1, 1], positions [0, 0, 0, 1, 2]."""
    input_ids, mask = left_pad([7, 8, 9], 5, pad_token_id=0)
    assert input_ids.tolist() == [0, 0, 7, 8, 9]
    assert mask.tolist() == [0, 0, 1, 1, 1]
    assert compute_position_ids(mask).tolist() == [0, 0, 0, 1, 2]
    assert compute_position_ids(torch.tensor([[1, 1, 0], [0, 1, 1]])).tolist() == [[0, 1, 1], [0, 0, 1]]


def test_split_media_placeholders_does_not_mutate_input():
    """'<image>' and '<video>' become typed parts in order; the original messages are left as they were."""
    messages = [{"role": "user", "content": "Find x. <image>then<video>"}]
    out = split_media_placeholders(messages)
    assert out[0]["content"] == [
        {"type": "text", "text": "Find x. "},
        {"type": "image"},
        {"type": "text", "text": "then"},
        {"type": "video"},
    ]
    assert messages[0]["content"] == "Find x. <image>then<video>"


@pytest.mark.parametrize(
    ("prompt", "match"),
    [
        ("just a string", "plain string"),
        ([], "empty or not a list"),
        (None, "empty or not a list"),
        ([{"content": "hi"}], "'role' and 'content'"),
        ([{"role": "user", "content": "   "}], "prompt .* is empty"),
        ([{"role": "user", "content": [{"type": "text", "text": ""}]}], "is empty"),
    ],
)
def test_validate_chat_prompt_rejects(prompt, match):
    """Each malformed prompt is a ValueError naming the row and the data.prompt_key column."""
    with pytest.raises(ValueError, match=match) as info:
        validate_chat_prompt(prompt, "a.parquet row 2", "prompt")
    assert "a.parquet row 2" in str(info.value)


def test_validate_chat_prompt_accepts_media_only_content():
    """A message whose only content is an image part is not empty."""
    validate_chat_prompt([{"role": "user", "content": [{"type": "image"}]}], "r", "prompt")
