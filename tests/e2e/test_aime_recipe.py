"""The AIME path end to end on the CPU: ``examples/data_preprocess/aime.py`` on local fixtures (AIME test problems and
DAPO-Math-17k training records) -> ``python -m verl.trainer.main_ppo`` with the math_dapo scorer, for 3 GRPO steps,
launched with the overrides of ``recipes/qwen3_5/run_qwen3_5_35b_a3b_grpo_fsdp1_aime.sh`` itself.

The command line is derived from the recipe (its ``VERL_PRINT_OVERRIDES=1`` output with the sizes given through
the recipe's own environment variables), so the recipe and this test cannot drift. Only the overrides in
:data:`CPU_REPLACEMENTS` differ, each for a stated reason; everything else (FSDP1, offload, KL loss, chunked
entropy, ...) runs as the recipe sets it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from verl.models.tiny import save_tiny_checkpoint
from verl.utils.tokenizer import build_offline_tokenizer

pytestmark = [pytest.mark.e2e]

REPO = Path(__file__).resolve().parents[2]
RECIPE = REPO / "recipes" / "qwen3_5" / "run_qwen3_5_35b_a3b_grpo_fsdp1_aime.sh"
AIME = [
    {"Problem": "Find the number of positive divisors of 12.", "Answer": 6},
    {"Problem": "What is 7 times 8 minus 50?", "Answer": 6},
]
DAPO_INSTRUCTION = (
    "Solve the following math problem step by step. The last line of your response should be of the form "
    "Answer: $Answer (without quotes) where $Answer is the answer to the problem.\n\n{}\n\n"
    'Remember to put your answer on its own line after "Answer:".'
)
DAPO = [  # records in the shape DAPO-Math-17k publishes them
    {
        "data_source": "math_dapo",
        "prompt": [{"role": "user", "content": DAPO_INSTRUCTION.format(q)}],
        "ability": "MATH",
        "reward_model": {"ground_truth": a, "style": "rule-lighteval/MATH_v2"},
        "extra_info": {"index": f"id-{i}"},
    }
    for i, (q, a) in enumerate([("What is 2 + 3?", "5"), ("What is 10 - 4?", "6"), ("What is 3 * 3?", "9")] * 2)
]
# Overrides replaced on the CPU, with the reason.
CPU_REPLACEMENTS = {
    "actor_rollout_ref.rollout.name": "hf",  # the vLLM CPU build has its own tests (tests marked vllm)
    "trainer.total_epochs": "1",  # with total_training_steps=3 below: 3 steps, not 15 epochs
    "trainer.save_freq": "-1",
    "trainer.test_freq": "-1",
    "trainer.val_before_train": "False",
}
# The recipe's sizes, through its own environment variables: 1 CPU "device", 2 prompts x 2 responses, short lengths.
RECIPE_ENV = dict(
    NNODES="1",
    NPUS_PER_NODE="1",
    DEVICE="cpu",
    ROLLOUT_TP="1",
    TRAIN_BATCH_SIZE="2",
    PPO_MINI_BATCH_SIZE="2",
    N_RESPONSES="2",
    MAX_PROMPT_LENGTH="192",
    MAX_RESPONSE_LENGTH="8",
    LOGGER="['console','file']",
)


def _write_jsonl(path: Path, records: list[dict]) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return str(path)


def recipe_overrides(home: Path, **env: str) -> list[str]:
    """The overrides the recipe launches (VERL_PRINT_OVERRIDES=1), in a clean environment."""
    run_env = {"PATH": os.environ["PATH"], "HOME": str(home), "VERL_PRINT_OVERRIDES": "1", **env}
    done = subprocess.run(["bash", str(RECIPE)], env=run_env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout.splitlines()


def tiny_command(overrides: list[str], extra: list[str]) -> list[str]:
    """``main_ppo`` with the recipe's overrides, the :data:`CPU_REPLACEMENTS` applied (each key must be there)."""
    keys = {o.split("=", 1)[0] for o in overrides}
    missing = sorted(set(CPU_REPLACEMENTS) - keys)
    assert not missing, f"the recipe no longer sets {missing}; update CPU_REPLACEMENTS"
    replaced = [
        f"{key}={CPU_REPLACEMENTS[key]}" if (key := o.split("=", 1)[0]) in CPU_REPLACEMENTS else o for o in overrides
    ]
    return [sys.executable, "-m", "verl.trainer.main_ppo", *replaced, *extra]


def test_aime_preprocess_then_recipe_overrides_train_three_steps(tmp_path):
    """aime.py writes test.parquet (AIME, data_source aime2024) and train.parquet (DAPO-Math, math_dapo) from the
    fixtures; main_ppo with the recipe-derived overrides runs 3 GRPO steps on the tiny Qwen3.5-MoE, and the reward
    comes from the math_dapo scorer (its 'acc' extra is logged)."""
    sys.path.insert(0, str(REPO / "examples" / "data_preprocess"))
    try:
        import aime
    finally:
        sys.path.pop(0)
    data_dir = tmp_path / "data"
    written = aime.main(
        [
            "--input_jsonl",
            _write_jsonl(tmp_path / "aime.jsonl", AIME),
            "--train_set",
            "dapo_math",
            "--train_path",
            _write_jsonl(tmp_path / "dapo.jsonl", DAPO),
            "--local_save_dir",
            str(data_dir / "aime"),
        ]
    )
    assert set(written) == {"train", "test"}

    corpus = [r["prompt"][0]["content"] for r in DAPO] + [a["Problem"] for a in AIME] + ["Answer: 6"]
    tokenizer = build_offline_tokenizer(corpus * 4, vocab_size=400)
    model_dir = save_tiny_checkpoint("qwen3_5_moe", tokenizer, str(tmp_path / "model"))

    overrides = recipe_overrides(
        tmp_path, MODEL_PATH=model_dir, DATA_DIR=str(data_dir), CKPT_DIR=str(tmp_path / "ckpt"), **RECIPE_ENV
    )
    command = tiny_command(
        overrides,
        [
            "trainer.total_training_steps=3",
            f"trainer.log_dir={tmp_path / 'logs'}",
            "ray_kwargs.ray_init.num_cpus=2",
            "data.dataloader_num_workers=0",
        ],
    )
    env = dict(os.environ, OMP_NUM_THREADS="1", RAY_AUTH_MODE="disabled", HF_HUB_OFFLINE="1")
    env.update(TOKENIZERS_PARALLELISM="false", PYTHONPATH=str(REPO) + os.pathsep + env.get("PYTHONPATH", ""))
    done = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
    (tmp_path / "main_ppo.log").write_text(done.stdout + done.stderr)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-5000:]
    records = [json.loads(line) for line in (tmp_path / "logs" / "metrics.jsonl").read_text().splitlines()]
    steps = {r["step"]: r["data"] for r in records}
    assert sorted(steps) == [1, 2, 3]
    assert all("critic/score/mean" in data and "actor/pg_loss" in data for data in steps.values())
    assert any(key.startswith("reward_extra/acc") for key in steps[1]), sorted(steps[1])
