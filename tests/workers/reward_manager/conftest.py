"""Fixtures: an offline tokenizer and a builder for rollout batches in the trainer's DataProto layout."""

import numpy as np
import pytest
import torch

from verl.protocol import DataProto
from verl.utils.tokenizer import build_offline_tokenizer


@pytest.fixture(scope="session")
def tokenizer():
    corpus = [f"Q: what is {i} plus {i}? A: {2 * i} #### {2 * i} Answer: {i}" for i in range(200)]
    return build_offline_tokenizer(corpus, vocab_size=350)


def _make_batch(
    tokenizer, prompts, responses, ground_truths, data_sources=None, prompt_len=24, response_len=16, **cols
):
    """DataProto with left-padded ``prompts (B, P)``, right-padded ``responses (B, R)`` and their attention mask."""
    pad = tokenizer.pad_token_id
    batch_size = len(prompts)
    prompt_ids = torch.full((batch_size, prompt_len), pad, dtype=torch.long)
    response_ids = torch.full((batch_size, response_len), pad, dtype=torch.long)
    mask = torch.zeros((batch_size, prompt_len + response_len), dtype=torch.long)
    for i, (prompt, response) in enumerate(zip(prompts, responses, strict=True)):
        p = tokenizer.encode(prompt, add_special_tokens=False)
        r = tokenizer.encode(response, add_special_tokens=False)
        assert len(p) <= prompt_len and len(r) <= response_len, (len(p), len(r))
        prompt_ids[i, prompt_len - len(p) :] = torch.tensor(p)
        mask[i, prompt_len - len(p) : prompt_len] = 1
        if r:
            response_ids[i, : len(r)] = torch.tensor(r)
            mask[i, prompt_len : prompt_len + len(r)] = 1
    sources = data_sources or ["openai/gsm8k"] * batch_size
    non_tensors = {
        "data_source": np.array(sources, dtype=object),
        "reward_model": np.array([{"style": "rule", "ground_truth": gt} for gt in ground_truths], dtype=object),
        **{k: np.array(v, dtype=object) for k, v in cols.items()},
    }
    tensors = {
        "prompts": prompt_ids,
        "responses": response_ids,
        "attention_mask": mask,
        "input_ids": torch.cat([prompt_ids, response_ids], dim=1),
    }
    return DataProto.from_dict(tensors=tensors, non_tensors=non_tensors)


@pytest.fixture
def make_batch(tokenizer):
    """make_batch(prompts, responses, ground_truths, data_sources=None, prompt_len=24, response_len=16, **columns)."""

    def _make(*args, **kwargs):
        return _make_batch(tokenizer, *args, **kwargs)

    return _make
