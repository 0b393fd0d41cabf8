"""Multimodal rows: <image> placeholders, images from parquet bytes, processor outputs in the item.

The processor is a small stand-in with the Qwen-VL contract (each image expands one ``<|image_pad|>`` into
4 tokens and yields pixel rows + ``image_grid_thw``): the real Qwen-VL processors need torchvision, which the
CPU environment does not have. What is tested is the dataset's plumbing, not a vision encoder.
"""

import io

import numpy as np
import pytest
import torch
from PIL import Image

from verl.utils.dataset.rl_dataset import RLHFDataset, collate_fn

TOKENS_PER_IMAGE = 4


class TinyVLProcessor:
    """Qwen-VL-like processor: ``<|image_pad|>`` x4 per image, pixel_values = 4 rows of the image's mean RGB."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer

    def apply_chat_template(self, messages, **kwargs):
        return self.tokenizer.apply_chat_template(messages, **kwargs)

    def __call__(self, text, images=None, videos=None, return_tensors="pt"):
        assert videos is None and return_tensors == "pt"
        images = images or []
        expanded = text[0].replace("<|image_pad|>", "<|image_pad|>" * TOKENS_PER_IMAGE)
        encoded = self.tokenizer([expanded], return_tensors="pt", add_special_tokens=False)
        means = [torch.tensor(np.asarray(image), dtype=torch.float32).mean(dim=(0, 1)) for image in images]
        return {
            "input_ids": encoded["input_ids"],
            "attention_mask": encoded["attention_mask"],
            "pixel_values": torch.stack([m for m in means for _ in range(TOKENS_PER_IMAGE)]),
            "image_grid_thw": torch.tensor([[1, 2, 2]] * len(images)),
        }


def png_bytes(color):
    buffer = io.BytesIO()
    Image.new("RGB", (8, 8), color).save(buffer, format="PNG")
    return buffer.getvalue()


@pytest.fixture
def geo_row(rl_row):
    def _row(color=(10, 20, 30), question="<image>Find x."):
        return rl_row(question, images=[{"bytes": png_bytes(color), "path": None}])

    return _row


def test_image_row_through_processor(tokenizer, write_parquet, geo_row):
    """The image expands to 4 pad tokens in input_ids, stays 1 in raw_prompt_ids; pixels come from the bytes."""
    path = write_parquet([geo_row(color=(10, 20, 30))])
    item = RLHFDataset(path, tokenizer, {"max_prompt_length": 64}, processor=TinyVLProcessor(tokenizer))[0]
    pad_id = tokenizer.convert_tokens_to_ids("<|image_pad|>")
    assert item["input_ids"].tolist().count(pad_id) == TOKENS_PER_IMAGE
    assert item["raw_prompt_ids"].count(pad_id) == 1
    assert item["raw_prompt"][0]["content"] == [{"type": "image"}, {"type": "text", "text": "Find x."}]
    assert item["multi_modal_data"]["image"][0].getpixel((0, 0)) == (10, 20, 30)
    assert torch.equal(item["multi_modal_inputs"]["pixel_values"], torch.tensor([[10.0, 20.0, 30.0]] * 4))
    assert item["multi_modal_inputs"]["image_grid_thw"].tolist() == [[1, 2, 2]]
    assert "images" not in item


def test_batch_of_image_rows(tokenizer, write_parquet, geo_row):
    """Two image rows collate: stacked ids, object arrays of per-row multimodal dicts."""
    path = write_parquet([geo_row(color=(1, 2, 3)), geo_row(color=(4, 5, 6))])
    dataset = RLHFDataset(path, tokenizer, {"max_prompt_length": 64}, processor=TinyVLProcessor(tokenizer))
    batch = collate_fn([dataset[0], dataset[1]])
    assert batch["input_ids"].shape == (2, 64)
    assert batch["multi_modal_inputs"][1]["pixel_values"][0].tolist() == [4.0, 5.0, 6.0]


def test_return_multi_modal_inputs_false(tokenizer, write_parquet, geo_row):
    """data.return_multi_modal_inputs=False keeps multi_modal_data but drops the processor tensors."""
    path = write_parquet([geo_row()])
    config = {"max_prompt_length": 64, "return_multi_modal_inputs": False}
    item = RLHFDataset(path, tokenizer, config, processor=TinyVLProcessor(tokenizer))[0]
    assert "multi_modal_inputs" not in item and len(item["multi_modal_data"]["image"]) == 1


def test_overlong_multimodal_prompt_is_never_truncated(tokenizer, write_parquet, geo_row):
    """Even with truncation=left, a multimodal prompt over the limit raises (cutting would orphan image tokens)."""
    path = write_parquet([geo_row(question="<image>" + "apples " * 40)])
    dataset = RLHFDataset(
        path, tokenizer, {"max_prompt_length": 30, "truncation": "left"}, processor=TinyVLProcessor(tokenizer)
    )
    with pytest.raises(ValueError, match=r"row 0: multimodal prompt .*cannot be truncated"):
        dataset[0]


def test_corrupt_image_names_row(tokenizer, write_parquet, rl_row):
    """Undecodable image bytes -> ValueError naming the file and row."""
    path = write_parquet([rl_row("<image>x", images=[{"bytes": b"not a png", "path": None}])])
    dataset = RLHFDataset(path, tokenizer, {"max_prompt_length": 64}, processor=TinyVLProcessor(tokenizer))
    with pytest.raises(ValueError, match=rf"{path} row 0: cannot read media"):
        dataset[0]


def test_without_processor_images_are_ignored(tokenizer, write_parquet, geo_row):
    """A text-only model (no processor) reads the same file; '<image>' stays literal text."""
    path = write_parquet([geo_row()])
    item = RLHFDataset(path, tokenizer, {"max_prompt_length": 64})[0]
    assert "multi_modal_data" not in item and "<image>" in tokenizer.decode(item["raw_prompt_ids"])
