"""The shipped GSM8K-format sample: reproducible from its generator, arithmetically correct, and convertible to
upstream-format parquet from Python."""

import json
import os
import re

import pyarrow.parquet as pq

from verl.utils.dataset.preprocess import extract_gsm8k_answer
from verl.utils.dataset.sample_data import GSM8K_SAMPLE_DIR, load_gsm8k_sample, write_gsm8k_sample_parquet
from verl.utils.import_utils import load_module

CALCULATOR = re.compile(r"<<(\d+)([+\-*/])(\d+)=(\d+)>>")
OPS = {"+": lambda a, b: a + b, "-": lambda a, b: a - b, "*": lambda a, b: a * b, "/": lambda a, b: a / b}


def test_shipped_files_equal_generator_output():
    """train.jsonl / test.jsonl are exactly what make_sample.py produces (64 + 16 rows, disjoint questions)."""
    generated = load_module(os.path.join(GSM8K_SAMPLE_DIR, "make_sample.py")).make_sample()
    for split, size in (("train", 64), ("test", 16)):
        with open(os.path.join(GSM8K_SAMPLE_DIR, f"{split}.jsonl"), encoding="utf-8") as f:
            shipped = [json.loads(line) for line in f]
        assert shipped == generated[split] and len(shipped) == size
    train_questions = {r["question"] for r in generated["train"]}
    assert not train_questions & {r["question"] for r in generated["test"]}


def test_every_calculator_step_and_final_answer_is_correct():
    """Each <<a op b=c>> annotation satisfies a op b == c, and '#### n' repeats the last computed value."""
    for split in ("train", "test"):
        for record in load_gsm8k_sample(split):
            steps = CALCULATOR.findall(record["answer"])
            assert steps, record
            for a, op, b, c in steps:
                assert OPS[op](int(a), int(b)) == int(c), record["answer"]
            assert extract_gsm8k_answer(record["answer"]) == steps[-1][3]
            assert int(steps[-1][3]) >= 0


def test_write_gsm8k_sample_parquet(tmp_path):
    """Python API: both splits written with upstream gsm8k columns and the sample's ground truths."""
    written = write_gsm8k_sample_parquet(str(tmp_path))
    rows = pq.read_table(written["test"]).to_pylist()
    assert len(rows) == 16 and rows[0]["reward_model"]["ground_truth"] == extract_gsm8k_answer(
        rows[0]["extra_info"]["answer"]
    )
    assert rows[3]["extra_info"]["index"] == 3 and rows[3]["extra_info"]["split"] == "test"
    assert {row["data_source"] for row in rows} == {"verl_sample/gsm8k_format"}  # not GSM8K: labelled as the sample
