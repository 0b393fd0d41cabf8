"""The GSM8K-format sample shipped in ``verl/data/gsm8k_sample`` (64 train + 16 test problems written for this
project) and its conversion to upstream-format RL parquet, for the CPU quickstart and tests."""

from __future__ import annotations

import os

import verl
from verl.utils.dataset.preprocess import GSM8K_SAMPLE_SOURCE, build_rows, gsm8k_row, read_jsonl, write_parquet

GSM8K_SAMPLE_DIR = os.path.join(os.path.dirname(verl.__file__), "data", "gsm8k_sample")
GSM8K_SAMPLE_SPLITS = ("train", "test")


def gsm8k_sample_path(split: str) -> str:
    """Path of the shipped ``<split>.jsonl`` (split: train | test)."""
    if split not in GSM8K_SAMPLE_SPLITS:
        raise ValueError(f"gsm8k sample split must be one of {GSM8K_SAMPLE_SPLITS}, got {split!r}")
    return os.path.join(GSM8K_SAMPLE_DIR, f"{split}.jsonl")


def load_gsm8k_sample(split: str) -> list[dict]:
    """The sample's ``{question, answer}`` records of one split."""
    return read_jsonl(gsm8k_sample_path(split))


def write_gsm8k_sample_parquet(save_dir: str) -> dict[str, str]:
    """Write ``train.parquet`` and ``test.parquet`` (upstream gsm8k columns) under ``save_dir``; split -> path."""
    save_dir = os.path.expanduser(save_dir)
    return {
        split: write_parquet(
            build_rows(load_gsm8k_sample(split), split, gsm8k_row, data_source=GSM8K_SAMPLE_SOURCE),
            os.path.join(save_dir, f"{split}.parquet"),
        )
        for split in GSM8K_SAMPLE_SPLITS
    }
