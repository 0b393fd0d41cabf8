"""Shared fixtures: an offline ChatML tokenizer and a parquet writer for RL rows."""

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from verl.utils.tokenizer import build_offline_tokenizer

VISION_TOKENS = ["<|vision_start|>", "<|image_pad|>", "<|vision_end|>", "<|video_pad|>"]


@pytest.fixture(scope="session")
def tokenizer():
    corpus = [f"Q{i}: Tom has {i} apples and buys {i + 2} more. How many apples? #### {2 * i + 2}" for i in range(300)]
    return build_offline_tokenizer(corpus, vocab_size=400, extra_special_tokens=VISION_TOKENS)


def _rl_row(question: str, answer: str = "1", index: int = 0, **extra) -> dict:
    """One row in the upstream RL parquet format."""
    row = {
        "data_source": "openai/gsm8k",
        "prompt": [{"role": "user", "content": question}],
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": answer},
        "extra_info": {"split": "train", "index": index},
    }
    row.update(extra)
    return row


@pytest.fixture(scope="session")
def rl_row():
    """rl_row(question, answer="1", index=0, **extra_columns) -> one upstream-format row."""
    return _rl_row


@pytest.fixture
def write_parquet(tmp_path):
    """write_parquet(rows, name="train.parquet") -> path of a parquet file holding ``rows``."""

    def _write(rows, name="train.parquet"):
        path = tmp_path / name
        pq.write_table(pa.Table.from_pylist(rows), path)
        return str(path)

    return _write
