"""The multimodal quickstart task (``python -m verl.trainer.quickstart --task geo3k``): a synthetic geometry set in
upstream's geo3k parquet format, and a tiny Qwen3.5 vision-language model taught the answer format only.

Data: each image (drawn with PIL, 32x32) is one filled shape — circle, square or triangle, at a random place and
size — in one of three colours on white; the question asks for the colour. Rows are built by the same
``geo3k_row`` as ``examples/data_preprocess/geo3k.py``: an ``images`` column of ``{"bytes", "path"}`` PNG structs,
the prompt with its ``<image>`` marker and upstream's ``<think>`` / ``\\boxed{}`` instruction,
``reward_model.ground_truth`` the colour name, ``data_source`` ``hiyouga/geometry3k`` — so the reward is the
project's geo3k scorer (0.9 accuracy + 0.1 format), reached through ``default_compute_score`` as for real geo3k.

Model: the random-initialised tiny VL model would never write ``<think>...</think>...\\boxed{...}``, so
:func:`format_warmup` first fine-tunes it (cross-entropy, a few seconds) on responses whose colour is drawn at
random, independently of the image: it learns the format and a uniform guess over the three colours (mean geo3k
score about 0.1 + 0.9 / 3 = 0.4), but nothing about which colour is right. Raising the score above that needs the
answer to be read from the image, through the vision tower, which is what the GRPO run must learn.
"""

from __future__ import annotations

import random
from pathlib import Path

DATA_SOURCE = "hiyouga/geometry3k"
COLOURS = {"red": (220, 30, 30), "green": (30, 170, 40), "blue": (40, 60, 220)}
SHAPES = ("circle", "square", "triangle")
QUESTION = "<image>What colour is the shape?"
IMAGE_SIZE = 32


def draw_shape(rng: random.Random, colour: str, size: int = IMAGE_SIZE):
    """A white ``size`` x ``size`` RGB image with one filled shape of ``colour`` (random kind, place, extent)."""
    from PIL import Image, ImageDraw

    image = Image.new("RGB", (size, size), "white")
    extent = rng.randint(size // 2, size - 4)
    x0, y0 = rng.randint(0, size - extent), rng.randint(0, size - extent)
    box, fill = [x0, y0, x0 + extent, y0 + extent], COLOURS[colour]
    kind = rng.choice(SHAPES)
    draw = ImageDraw.Draw(image)
    if kind == "circle":
        draw.ellipse(box, fill=fill)
    elif kind == "square":
        draw.rectangle(box, fill=fill)
    else:
        draw.polygon([(x0, y0 + extent), (x0 + extent, y0 + extent), (x0 + extent // 2, y0)], fill=fill)
    return image


def make_rows(num_rows: int, seed: int, split: str) -> list[dict]:
    """Rows in upstream's geo3k schema (module docstring); the colours cycle so each split is balanced."""
    from verl.utils.dataset.preprocess import geo3k_row

    rng = random.Random(seed)
    names = list(COLOURS)
    rows = []
    for index in range(num_rows):
        colour = names[index % len(names)]
        record = {"problem": QUESTION, "answer": colour, "images": [draw_shape(rng, colour)]}
        rows.append(geo3k_row(record, index, split))
    rng.shuffle(rows)
    return rows


def response_text(colour: str) -> str:
    """A well-formed response (geo3k format reward 1) answering ``colour``."""
    return f"<think>{colour}</think>\\boxed{{{colour}}}"


def tokenizer_corpus(rows: list[dict]) -> list[str]:
    from verl.utils.dataset.preprocess import GEO3K_INSTRUCTION

    return [QUESTION, GEO3K_INSTRUCTION, *(response_text(c) for c in COLOURS)] * 20 + [
        r["prompt"][0]["content"] for r in rows[:8]
    ]


def build_tokenizer(rows: list[dict]):
    """A byte-level BPE (no download) with ChatML and the Qwen-VL vision tokens, merged on the task's text."""
    from verl.models.tiny import VISION_TOKENS
    from verl.utils.tokenizer import build_offline_tokenizer

    tokenizer = build_offline_tokenizer(
        tokenizer_corpus(rows), vocab_size=384, extra_special_tokens=list(VISION_TOKENS.values())
    )
    tokenizer.padding_side = "left"
    return tokenizer


def format_warmup(model_dir: Path, rows: list[dict], *, steps: int = 120, seed: int = 0, lr: float = 3e-3) -> None:
    """Fine-tune the saved tiny VL model in place on (prompt + image, response with a RANDOM colour) pairs: it learns
    the ``<think>``/``\\boxed{}`` format, not the colour (module docstring). Full-sequence cross-entropy on the
    response tokens, through HF's own multimodal forward."""
    import torch
    from transformers import AutoModelForImageTextToText

    from verl.utils.dataset.prompt_utils import split_media_placeholders
    from verl.utils.dataset.vision_utils import process_image
    from verl.utils.tokenizer import hf_processor

    processor = hf_processor(str(model_dir), trust_remote_code=True)
    model = AutoModelForImageTextToText.from_pretrained(model_dir, dtype=torch.float32)
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr)
    rng = random.Random(seed)
    eos = processor.tokenizer.eos_token
    for step in range(steps):
        batch = [rows[(step * 8 + i) % len(rows)] for i in range(8)]
        prompts = [
            processor.apply_chat_template(split_media_placeholders(r["prompt"]), add_generation_prompt=True)
            for r in batch
        ]
        texts = [p + response_text(rng.choice(list(COLOURS))) + eos for p in prompts]
        images = [process_image(r["images"][0]) for r in batch]
        inputs = processor(text=texts, images=images, return_tensors="pt", padding=True)
        prompt_lengths = [len(processor(text=[p], images=[im])["input_ids"][0]) for p, im in zip(prompts, images)]
        labels = _response_labels(inputs["input_ids"], inputs["attention_mask"], prompt_lengths)
        loss = model(**inputs, labels=labels, use_cache=False).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    model.eval()
    model.save_pretrained(model_dir)


def _response_labels(input_ids, attention_mask, prompt_lengths: list[int]):
    """Labels that score only the response tokens (-100 on padding and prompt) of a left-padded batch."""
    labels = input_ids.clone()
    width = input_ids.shape[1]
    for row, prompt_length in enumerate(prompt_lengths):
        start = width - int(attention_mask[row].sum()) + prompt_length
        labels[row, :start] = -100
    return labels


def model_dir_name(profile: str = "default") -> str:
    """Directory (under the quickstart's ``--dir``) of the tiny VL model in ``profile`` (``verl.models.tiny``)."""
    return "model_vl" if profile == "default" else f"model_vl_{profile}"


def prepare(out_dir: Path, seed: int = 0, warmup_steps: int = 120, profile: str = "default") -> dict[str, Path]:
    """Write the geo3k-format parquet files and the format-warmed tiny VL model under ``out_dir`` (the model once;
    ``warmup_steps=0``: the random-initialised model, for tests that only need the pipeline to run).

    ``profile="vllm"`` (the vLLM rollout): the model in the widths vLLM's CPU kernels accept, saved with the video
    processor config vLLM's Qwen-VL input processing loads even for image-only prompts (it needs torchvision, which
    the vLLM environment has)."""
    from verl.models.tiny_vl import save_tiny_vl_checkpoint
    from verl.utils.dataset.preprocess import write_parquet

    model_dir, data_dir = out_dir / model_dir_name(profile), out_dir / "data_geo3k"
    train_rows, val_rows = make_rows(192, seed, "train"), make_rows(24, seed + 1, "test")
    paths = {"model": model_dir, "train": data_dir / "train.parquet", "val": data_dir / "test.parquet"}
    write_parquet(train_rows, str(paths["train"]))
    write_parquet(val_rows, str(paths["val"]))
    if not (model_dir / "config.json").is_file():
        save_tiny_vl_checkpoint(
            build_tokenizer(train_rows), str(model_dir), seed=seed, profile=profile, video_processor=profile == "vllm"
        )
        if warmup_steps:
            format_warmup(model_dir, train_rows, steps=warmup_steps, seed=seed)
    return paths


def main_ppo_overrides(out_dir: Path, vllm: bool = False) -> list[str]:
    """The overrides of ``quickstart_cpu`` (``quickstart_cpu_vllm`` with ``vllm``) for this task (paths, lengths, the
    processor, the default scorer).

    With vLLM: the engine turns each image into its prompt tokens with its own Qwen-VL processor, which needs the
    tokenizer, so ``rollout.skip_tokenizer_init`` (True by default: token-id prompts need none) is off."""
    vllm_only = ["actor_rollout_ref.rollout.skip_tokenizer_init=False"] if vllm else []
    return vllm_only + [
        f"actor_rollout_ref.model.path={out_dir / model_dir_name('vllm' if vllm else 'default')}",
        "actor_rollout_ref.model.trust_remote_code=True",
        "data.trust_remote_code=True",  # main_ppo loads the processor with this key (upstream)
        f"data.train_files={out_dir / 'data_geo3k' / 'train.parquet'}",
        f"data.val_files={out_dir / 'data_geo3k' / 'test.parquet'}",
        "data.max_prompt_length=96",
        "data.max_response_length=24",
        "data.image_key=images",
        "reward.custom_reward_function.path=null",
        "trainer.experiment_name=tiny_qwen3_5_vl_geo3k_colour",
    ]
