"""RLHFDataset over upstream-format parquet: item fields, padding, config keys, max_samples, overlong filter."""

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf

from verl.utils.dataset.rl_dataset import RLHFDataset, collate_fn


def data_config(**overrides):
    """The data.* node as Hydra gives it (a DictConfig), with upstream defaults for the keys the dataset reads."""
    base = {
        "prompt_key": "prompt",
        "max_prompt_length": 64,
        "truncation": "error",
        "filter_overlong_prompts": False,
        "return_raw_chat": True,
        "return_full_prompt": False,
        "image_key": "images",
        "video_key": "videos",
        "apply_chat_template_kwargs": {},
        "shuffle": True,
        "seed": None,
        "train_files": "ignored",  # unrelated data.* keys are ignored
    }
    base.update(overrides)
    return OmegaConf.create(base)


def test_item_fields_match_the_templated_prompt(tokenizer, write_parquet, rl_row):
    """input_ids = left-padded template tokens; mask/positions consistent; pass-through columns intact."""
    path = write_parquet([rl_row("What is 2+3?", answer="5", index=7)])
    item = RLHFDataset(path, tokenizer, data_config(return_full_prompt=True))[0]
    text = "<|im_start|>user\nWhat is 2+3?<|im_end|>\n<|im_start|>assistant\n"
    expected = tokenizer.encode(text, add_special_tokens=False)
    n = len(expected)
    assert item["full_prompts"] == text
    assert item["raw_prompt_ids"] == expected
    assert item["input_ids"].shape == (64,) and item["input_ids"].dtype == torch.long
    assert item["input_ids"][-n:].tolist() == expected
    assert item["input_ids"][:-n].eq(tokenizer.pad_token_id).all()
    assert item["attention_mask"].tolist() == [0] * (64 - n) + [1] * n
    assert item["position_ids"][-n:].tolist() == list(range(n)) and item["position_ids"][:-n].eq(0).all()
    assert item["raw_prompt"] == [{"role": "user", "content": "What is 2+3?"}]
    assert item["reward_model"] == {"style": "rule", "ground_truth": "5"}
    assert item["data_source"] == "openai/gsm8k" and item["ability"] == "math"
    assert item["index"] == 7 and item["tools_kwargs"] == {} and "prompt" not in item


def test_return_flags_and_chat_template_kwargs(tokenizer, write_parquet, rl_row):
    """return_raw_chat=False drops raw_prompt; apply_chat_template_kwargs reach the template."""
    path = write_parquet([rl_row("hi")])
    item = RLHFDataset(path, tokenizer, data_config(return_raw_chat=False))[0]
    assert "raw_prompt" not in item and "full_prompts" not in item
    tokenizer_kwargs = data_config(apply_chat_template_kwargs={"add_generation_prompt": False})
    with pytest.raises(TypeError):  # passed through: duplicates the dataset's own add_generation_prompt
        RLHFDataset(path, tokenizer, tokenizer_kwargs)[0]


def test_truncation_modes_through_the_dataset(tokenizer, write_parquet, rl_row):
    """A 30-token cap: left keeps the template's tail (assistant header), right keeps its head (user header)."""
    path = write_parquet([rl_row("apples " * 40)])
    left = RLHFDataset(path, tokenizer, data_config(max_prompt_length=30, truncation="left"))[0]
    right = RLHFDataset(path, tokenizer, data_config(max_prompt_length=30, truncation="right"))[0]
    assert left["attention_mask"].sum() == 30 and len(left["raw_prompt_ids"]) == 30
    assert tokenizer.decode(left["raw_prompt_ids"]).endswith("<|im_start|>assistant\n")
    assert tokenizer.decode(right["raw_prompt_ids"]).startswith("<|im_start|>user\n")


def test_filter_overlong_prompts_and_max_samples(tokenizer, write_parquet, rl_row):
    """Overlong rows are dropped at build time; max_samples keeps a seeded subset (or the first rows)."""
    rows = [rl_row("short", index=i) for i in range(6)] + [rl_row("apples " * 60, index=99)]
    path = write_parquet(rows)
    filtered = RLHFDataset(path, tokenizer, data_config(filter_overlong_prompts=True))
    assert len(filtered) == 6 and all(filtered[i]["index"] != 99 for i in range(6))
    first = RLHFDataset(path, tokenizer, data_config(shuffle=False), max_samples=3)
    assert [first[i]["index"] for i in range(3)] == [0, 1, 2]
    a = RLHFDataset(path, tokenizer, data_config(seed=1), max_samples=3)
    b = RLHFDataset(path, tokenizer, data_config(seed=1), max_samples=3)
    assert len(a) == 3 and [a[i]["index"] for i in range(3)] == [b[i]["index"] for i in range(3)]


def test_several_files_and_collate(tokenizer, write_parquet, rl_row):
    """Two files concatenate in order; a DataLoader batch has (B, L) tensors and object arrays."""
    first = write_parquet([rl_row("a", index=0), rl_row("b", index=1)], "a.parquet")
    second = write_parquet([rl_row("c", index=2)], "b.parquet")
    dataset = RLHFDataset([first, second], tokenizer, data_config(max_prompt_length=24))
    loader = torch.utils.data.DataLoader(dataset, batch_size=3, collate_fn=collate_fn)
    batch = next(iter(loader))
    assert batch["input_ids"].shape == (3, 24)
    assert isinstance(batch["reward_model"], np.ndarray) and batch["reward_model"].dtype == object
    assert list(batch["index"]) == [0, 1, 2]


def test_plain_dict_config_and_defaults(tokenizer, write_parquet, rl_row):
    """A plain dict (or None) config works; absent keys take upstream defaults (max_prompt_length=512)."""
    path = write_parquet([rl_row("hi")])
    assert RLHFDataset(path, tokenizer, None)[0]["input_ids"].shape == (512,)
    assert RLHFDataset(path, tokenizer, {"max_prompt_length": 20})[0]["input_ids"].shape == (20,)
