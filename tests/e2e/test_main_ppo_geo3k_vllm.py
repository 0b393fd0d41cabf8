"""Multimodal GRPO with the REAL vLLM engine as the rollout (its CPU build, ``.venv-vllm``): ``python -m
verl.trainer.quickstart --task geo3k actor_rollout_ref.rollout.name=vllm`` — main_ppo on Ray, FSDP actor, the tiny
Qwen3.5 VL model (``vllm`` profile), geo3k-format image rows, the geo3k scorer, the weights (vision tower included)
synced into the engine before every generation.

Invariants (3 steps, ~60-90 s on 2 cores):
* the images reach vLLM as the actor sees them, checked on token ids: the rollout compares, for every image row of
  every batch, the prompt ids vLLM built (one ``<|image_pad|>`` per image, expanded by vLLM's own processor) with
  the actor's input ids and fails the run on a difference (``check_engine_prompts``; its line in the log shows it
  ran), and the actor's prompt length is the text's plus the grid's image tokens, worked out here: a 32x32 image,
  4-pixel patches -> an 8x8 grid, merged 2x2 -> 16 tokens in place of the one placeholder;
* every step's rewards are finite and graded (no reward failure), and the engine's sampled-token log-probs stay
  within bf16 rounding of the fp32 actor's: mean |d log p| < 0.01 nats, the bound of the text vLLM e2e
  (test_main_ppo_vllm.py; a stale or wrong sync is off by 0.05+).
"""

from __future__ import annotations

import importlib.util
import math
import sys
from pathlib import Path

import pytest

from verl.trainer import quickstart, quickstart_geo3k

pytestmark = [pytest.mark.e2e, pytest.mark.vllm]

STEPS = 3
IMAGE_TOKENS = (32 // 4) ** 2 // 2**2  # (image side / patch)^2 patches, merged 2x2: 16


def _geo3k_e2e():
    """tests/e2e/test_main_ppo_geo3k.py (its ``_train``), loaded by path: with --import-mode=importlib the tests
    directory is not on sys.path."""
    name = "geo3k_e2e_helpers"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, Path(__file__).with_name("test_main_ppo_geo3k.py"))
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


@pytest.fixture(scope="module")
def assets(tmp_path_factory):
    # the short format warm-up of test_main_ppo_geo3k: responses score 0.1 or 1.0, so the steps have gradients
    out = tmp_path_factory.mktemp("geo3k_vllm")
    quickstart_geo3k.prepare(out, warmup_steps=30, profile="vllm")
    return out


def _expected_prompt_length(assets: Path) -> int:
    """Tokens of the chat-templated geo3k prompt with one image placeholder, plus the image's other 15 tokens."""
    import pandas as pd

    from verl.utils.dataset.prompt_utils import split_media_placeholders
    from verl.utils.tokenizer import hf_processor

    processor = hf_processor(str(assets / quickstart_geo3k.model_dir_name("vllm")), trust_remote_code=True)
    row = pd.read_parquet(assets / "data_geo3k" / "train.parquet").iloc[0]
    text = processor.apply_chat_template(split_media_placeholders(list(row["prompt"])), add_generation_prompt=True)
    ids = processor.tokenizer(text)["input_ids"]
    assert ids.count(processor.tokenizer.convert_tokens_to_ids("<|image_pad|>")) == 1
    return len(ids) - 1 + IMAGE_TOKENS


def test_geo3k_quickstart_with_vllm(assets, tmp_path, capsys):
    log = tmp_path / "run.log"
    metrics = _geo3k_e2e()._train(
        assets,
        tmp_path,
        quickstart.VLLM_ROLLOUT_OVERRIDE,
        f"trainer.total_training_steps={STEPS}",
        "data.train_batch_size=4",
        "actor_rollout_ref.actor.ppo_mini_batch_size=4",
        "actor_rollout_ref.rollout.n=4",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=16",
        log_to=log,
    )
    assert sorted(metrics) == list(range(1, STEPS + 1))
    output = log.read_text()
    assert "[verl] vLLM rollout: prompt ids of 16 image rows equal the actor's" in output
    expected_length = _expected_prompt_length(assets)
    worst = 0.0
    for step, data in metrics.items():
        assert data["prompt_length/min"] == data["prompt_length/max"] == expected_length, step
        # the geo3k scorer grades with mathruler (setup.py); an environment built before it was declared lacks it
        assert data["reward/num_failed"] == 0, f"step {step}: reward failures, see the log: {log}"
        assert all(math.isfinite(data[f"critic/score/{k}"]) for k in ("mean", "min", "max")), step
        worst = max(worst, data["training/rollout_log_probs_diff_mean"])
    scores = [round(metrics[s]["critic/score/mean"], 3) for s in sorted(metrics)]
    with capsys.disabled():
        print(f"\n[geo3k vllm] scores {scores}; worst mean |dlogp| engine vs actor {worst:.4f}")
    assert worst < 0.01, f"engine vs actor log-probs differ by {worst} nats on average in some step"
