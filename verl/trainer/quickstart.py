"""The CPU quickstart: GRPO on a tiny random-initialised Qwen3.5-MoE, through the normal entry point.

``python -m verl.trainer.quickstart`` (what ``make quickstart`` runs):

1. builds, offline, a character-level tokenizer with a ChatML chat template and a tiny Qwen3.5-MoE (hybrid
   Gated DeltaNet / gated full-attention layers, a few experts) saved as an ordinary HF checkpoint;
2. writes a small synthetic task as parquet in the upstream format (``prompt`` chat messages, ``data_source``,
   ``reward_model.ground_truth``, ``extra_info``);
3. runs ``python -m verl.trainer.main_ppo --config-name quickstart_cpu`` and prints where the per-step metrics went.

``--task geo3k`` runs the multimodal variant instead (:mod:`verl.trainer.quickstart_geo3k`): images in upstream's
geo3k parquet format, a tiny Qwen3.5 vision-language model, the geo3k scorer; with the HF rollout, or the vLLM one
(the override below, ``make quickstart-geo3k-vllm``).

With ``actor_rollout_ref.rollout.name=vllm`` among the overrides it runs the real vLLM engine as the rollout
(vLLM's CPU build, ``make quickstart-vllm``): the tiny model is built in the widths vLLM's CPU kernels accept
(``verl.models.tiny`` profile ``"vllm"``) and the config is ``quickstart_cpu_vllm``.

The task ("digits"): every prompt asks for a one-digit answer; the reward is 1 when the response starts with a
digit. A random policy over the ~50-character vocabulary earns it about one time in five, so GRPO groups of 8
almost always contain both outcomes and the mean reward climbs within a few dozen steps. It demonstrates the
whole RL machinery on a laptop; ``examples/smollm2_gsm8k`` runs the same pipeline on a real pretrained model.
"""

from __future__ import annotations

import argparse
import os
import random
import string
import subprocess
import sys
from pathlib import Path

DATA_SOURCE = "verl_quickstart/digits"
DEFAULT_DIR = Path(".quickstart")
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<pad>"]
CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
# Characters of the tokenizer: digits, lowercase letters and a little punctuation (~50 tokens with the specials).
CHARACTERS = string.digits + string.ascii_lowercase + " +-=?:.,\n"


def build_char_tokenizer(save_dir: Path):
    """A character-level tokenizer with ChatML specials, built without any download.

    It is a byte-level BPE with no merges over ~45 characters, so that ``AutoTokenizer`` loads it back as the Qwen
    tokenizer class a ``qwen3_5_moe`` checkpoint maps to (that class rebuilds the byte-level pre-tokenizer from the
    vocabulary; a word-level tokenizer would be re-interpreted and lose its spaces).
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    symbols = [byte_level.pre_tokenize_str(char)[0][0] for char in CHARACTERS]
    vocab = {tok: i for i, tok in enumerate(SPECIAL_TOKENS + symbols)}
    backend = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<|endoftext|>"))
    backend.pre_tokenizer = byte_level
    backend.decoder = decoders.ByteLevel()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        eos_token="<|im_end|>",
        pad_token="<pad>",
        unk_token="<|endoftext|>",
        additional_special_tokens=["<|im_start|>", "<|endoftext|>"],
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    tokenizer.padding_side = "left"
    tokenizer.save_pretrained(save_dir)
    return tokenizer


def score(data_source, solution_str, ground_truth, extra_info=None) -> float:
    """Reward of the quickstart task: 1.0 when the response starts with a digit, else 0.0."""
    text = solution_str.strip()
    return 1.0 if text[:1].isdigit() else 0.0


def make_rows(num_rows: int, seed: int, split: str) -> list[dict]:
    rng = random.Random(seed)
    rows = []
    for index in range(num_rows):
        a, b = rng.randint(0, 9), rng.randint(0, 9)
        question = f"what is {a}+{b} mod 10? one digit."
        rows.append(
            {
                "data_source": DATA_SOURCE,
                "prompt": [{"role": "user", "content": question}],
                "ability": "format",
                "reward_model": {"style": "rule", "ground_truth": str((a + b) % 10)},
                "extra_info": {"split": split, "index": index},
            }
        )
    return rows


VLLM_ROLLOUT_OVERRIDE = "actor_rollout_ref.rollout.name=vllm"
TASKS = ("digits", "geo3k")


def prepare(out_dir: Path, seed: int = 0, profile: str = "default") -> dict[str, Path]:
    """Write tokenizer + tiny model (``profile``: ``verl.models.tiny``) + parquet files under ``out_dir``
    (idempotent); returns their paths."""
    import pandas as pd

    from verl.models.tiny import save_tiny_checkpoint

    model_dir, data_dir = out_dir / _model_dir_name(profile), out_dir / "data"
    data_dir.mkdir(parents=True, exist_ok=True)
    if not (model_dir / "config.json").is_file():
        tokenizer = build_char_tokenizer(model_dir)
        save_tiny_checkpoint("qwen3_5_moe", tokenizer, model_dir, seed=seed, profile=profile)
    paths = {"model": model_dir, "train": data_dir / "train.parquet", "val": data_dir / "test.parquet"}
    pd.DataFrame(make_rows(256, seed, "train")).to_parquet(paths["train"])
    pd.DataFrame(make_rows(32, seed + 1, "test")).to_parquet(paths["val"])
    return paths


def _model_dir_name(profile: str) -> str:
    return "model" if profile == "default" else f"model_{profile}"


def uses_vllm(overrides: list[str]) -> bool:
    """Whether the overrides select the vLLM rollout (then the vLLM-compatible model and config are used)."""
    return VLLM_ROLLOUT_OVERRIDE in overrides


def main_ppo_command(out_dir: Path, extra_overrides: list[str], task: str = "digits") -> list[str]:
    vllm = uses_vllm(extra_overrides)
    command = [
        sys.executable,
        "-m",
        "verl.trainer.main_ppo",
        "--config-name",
        "quickstart_cpu_vllm" if vllm else "quickstart_cpu",
        f"actor_rollout_ref.model.path={out_dir / _model_dir_name('vllm' if vllm else 'default')}",
        f"data.train_files={out_dir / 'data' / 'train.parquet'}",
        f"data.val_files={out_dir / 'data' / 'test.parquet'}",
        f"reward.custom_reward_function.path={Path(__file__).resolve()}",
        "reward.custom_reward_function.name=score",
        f"trainer.default_local_dir={out_dir / 'checkpoints'}",
        f"trainer.log_dir={out_dir / 'logs'}",
    ]
    if task == "geo3k":
        from verl.trainer import quickstart_geo3k

        command += quickstart_geo3k.main_ppo_overrides(out_dir, vllm=vllm)  # later overrides win
    return command + list(extra_overrides)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dir", type=Path, default=DEFAULT_DIR, help="where assets, logs and checkpoints go")
    parser.add_argument("--prepare-only", action="store_true", help="write the assets and exit")
    parser.add_argument(
        "--task",
        choices=TASKS,
        default="digits",
        help="digits: text task on the tiny MoE; geo3k: images in upstream's geo3k format on the tiny VL model",
    )
    parser.add_argument("overrides", nargs="*", help="extra Hydra overrides for main_ppo")
    args = parser.parse_args(argv)
    if args.task == "geo3k":
        from verl.trainer import quickstart_geo3k

        quickstart_geo3k.prepare(args.dir, profile="vllm" if uses_vllm(args.overrides) else "default")
    else:
        prepare(args.dir, profile="vllm" if uses_vllm(args.overrides) else "default")
    if args.prepare_only:
        return 0
    command = main_ppo_command(args.dir, args.overrides, args.task)
    print("[quickstart] " + " ".join(command[1:]), flush=True)
    env = dict(os.environ, OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"))
    return subprocess.call(command, env=env)


if __name__ == "__main__":
    raise SystemExit(main())
