"""Shared builders of the vLLM rollout tests: the tiny Qwen3.5 MoE checkpoint and left-padded prompts (text tests),
the tiny Qwen3.5 VL checkpoint in the ``vllm`` profile and geo3k-format image prompts batched by the real dataset
path (``RLHFDataset`` with the checkpoint's processor)."""

from __future__ import annotations

import pytest

MAX_PROMPT = 160
# (question, image sizes): one prompt with 1 image, one with 3 images of different sizes
IMAGE_ROWS = (
    ("<image>what colour is the shape?", [(32, 32)]),
    ("compare <image> the shapes <image> and <image>", [(24, 40), (32, 32), (16, 48)]),
)


@pytest.fixture(scope="session")
def moe_checkpoint(tmp_path_factory) -> str:
    """The tiny Qwen3.5 MoE (``vllm`` profile, seed 0) with the character tokenizer; read-only for the tests."""
    from verl.models.tiny import save_tiny_checkpoint
    from verl.trainer.quickstart import build_char_tokenizer

    path = tmp_path_factory.mktemp("qwen3_5_moe")
    save_tiny_checkpoint("qwen3_5_moe", build_char_tokenizer(path), str(path), seed=0, profile="vllm")
    return str(path)


def left_padded_prompts(vocab: int, eos: int, pad: int):
    """4 left-padded prompts (lengths 12, 10, 12, 8) of ids that are neither EOS nor pad, 2 samples each."""
    import torch

    from verl.protocol import DataProto

    g = torch.Generator().manual_seed(0)
    lengths, width = [12, 10, 12, 8], 12
    ids = torch.full((len(lengths), width), pad)
    mask = torch.zeros_like(ids)
    for row, length in enumerate(lengths):
        ids[row, width - length :] = torch.randint(4, vocab, (length,), generator=g)
        mask[row, width - length :] = 1
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    meta = {"eos_token_id": eos, "pad_token_id": pad, "do_sample": True, "validate": False, "n": 2}
    return DataProto.from_dict({"input_ids": ids, "attention_mask": mask, "position_ids": positions}, meta_info=meta)


@pytest.fixture(scope="session")
def tiny_vl_vllm_checkpoint(tmp_path_factory) -> str:
    """The tiny Qwen3.5 VL model (``vllm`` profile: widths vLLM's CPU kernels accept) with its processor and the
    video-processor config vLLM's Qwen-VL input processing loads."""
    from verl.models.tiny import VISION_TOKENS
    from verl.models.tiny_vl import save_tiny_vl_checkpoint
    from verl.utils.tokenizer import build_offline_tokenizer

    out = tmp_path_factory.mktemp("tiny_vl_vllm")
    tokenizer = build_offline_tokenizer(
        ["what colour is the shape? compare the shapes. red green blue"] * 4,
        vocab_size=300,
        extra_special_tokens=list(VISION_TOKENS.values()),
    )
    return str(save_tiny_vl_checkpoint(tokenizer, str(out), profile="vllm", video_processor=True))


@pytest.fixture(scope="session")
def image_prompts(tmp_path_factory):
    """``image_prompts(checkpoint, seed=0)``: a ``DataProto`` of the :data:`IMAGE_ROWS` prompts as the trainer hands
    them to the rollout (input ids with the expanded image tokens, ``raw_prompt_ids``, ``multi_modal_data``,
    ``multi_modal_inputs``); ``seed`` draws the shapes and colours (same sizes, so the same token ids)."""

    out_dir = tmp_path_factory.mktemp("image_prompts")

    def build(checkpoint: str, seed: int = 0):
        import random

        from verl.protocol import DataProto
        from verl.trainer.quickstart_geo3k import draw_shape
        from verl.utils.dataset.preprocess import encode_image, write_parquet
        from verl.utils.dataset.rl_dataset import RLHFDataset, collate_fn
        from verl.utils.tokenizer import hf_processor, hf_tokenizer

        rng = random.Random(seed)
        records = [
            {
                "data_source": "hiyouga/geometry3k",
                "prompt": [{"role": "user", "content": question}],
                "images": [encode_image(draw_shape(rng, rng.choice(["red", "blue"]), max(s)).resize(s)) for s in sizes],
                "reward_model": {"style": "rule", "ground_truth": "red"},
            }
            for question, sizes in IMAGE_ROWS
        ]
        path = write_parquet(records, str(out_dir / f"rows{seed}.parquet"))
        dataset = RLHFDataset(
            path,
            hf_tokenizer(checkpoint),
            {"max_prompt_length": MAX_PROMPT},
            processor=hf_processor(checkpoint, trust_remote_code=True),
        )
        batch = DataProto.from_single_dict(collate_fn([dataset[i] for i in range(len(dataset))]))
        batch.meta_info.update(eos_token_id=dataset.tokenizer.eos_token_id, pad_token_id=dataset.tokenizer.pad_token_id)
        return batch

    return build
