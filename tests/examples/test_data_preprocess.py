"""examples/data_preprocess/*.py: each script writes upstream-format parquet from local JSONL (no network), and
the result loads through RLHFDataset and scores through default_compute_score."""

import io
import json
import os
import subprocess
import sys

import pyarrow.parquet as pq
import pytest
from PIL import Image

from verl.utils.dataset.rl_dataset import RLHFDataset
from verl.utils.import_utils import load_module
from verl.utils.reward_score import default_compute_score
from verl.utils.tokenizer import build_offline_tokenizer

EXAMPLES = os.path.join(os.path.dirname(__file__), "..", "..", "examples", "data_preprocess")
UPSTREAM_COLUMNS = ["data_source", "prompt", "ability", "reward_model", "extra_info"]


def script(name):
    """The example script as a module (its main(argv) is called in-process: no interpreter start-up per test)."""
    return load_module(os.path.join(EXAMPLES, f"{name}.py"))


@pytest.fixture(scope="module")
def tokenizer():
    return build_offline_tokenizer(["Solve the problem. Answer: 42 #### 7 \\boxed{3} <think>"] * 20, vocab_size=300)


def write_jsonl(path, records):
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return str(path)


def load_rows(path):
    return pq.read_table(path).to_pylist()


def test_gsm8k_defaults_to_shipped_sample(tmp_path, tokenizer):
    """No inputs: 64 train / 16 test rows from the sample, labelled as the sample (not openai/gsm8k); columns as
    upstream; each reference answer scores 1.0 under the gsm8k rule."""
    written = script("gsm8k").main(["--local_save_dir", str(tmp_path)])
    train, test = load_rows(written["train"]), load_rows(written["test"])
    assert (len(train), len(test)) == (64, 16)
    assert list(train[0]) == UPSTREAM_COLUMNS
    for row in train + test:
        assert row["data_source"] == "verl_sample/gsm8k_format"
        assert row["prompt"][0]["content"].endswith('after "####".')
        truth = row["reward_model"]["ground_truth"]
        assert default_compute_score(row["data_source"], row["extra_info"]["answer"], truth) == 1.0
    dataset = RLHFDataset(written["train"], tokenizer, {"max_prompt_length": 256})
    assert len(dataset) == 64 and dataset[5]["reward_model"]["ground_truth"] == train[5]["reward_model"]["ground_truth"]


def test_gsm8k_from_jsonl_and_deprecated_local_dir(tmp_path):
    """--input_jsonl SPLIT=PATH; --local_dir still works; commas are removed from the ground truth."""
    source = write_jsonl(tmp_path / "in.jsonl", [{"question": "Big?", "answer": "so\n#### 1,234"}])
    out = tmp_path / "out"
    written = script("gsm8k").main(["--input_jsonl", f"test={source}", "--local_dir", str(out)])
    assert list(written) == ["test"] and written["test"] == str(out / "test.parquet")
    assert load_rows(written["test"])[0]["reward_model"] == {"style": "rule", "ground_truth": "1234"}


def test_math_dataset(tmp_path, tokenizer):
    """Ground truth = last boxed of the solution; data_source routes to the MATH scorer."""
    source = write_jsonl(
        tmp_path / "m.jsonl",
        [
            {"problem": "What is 1/2 + 1/2?", "solution": "We get \\boxed{1}."},
            {"problem": "Simplify 2/4.", "solution": "It is \\boxed{\\frac{1}{2}}."},
        ],
    )
    written = script("math_dataset").main(["--input_jsonl", source, "--local_save_dir", str(tmp_path / "o")])
    rows = load_rows(written["train"])
    assert [r["reward_model"]["ground_truth"] for r in rows] == ["1", "\\frac{1}{2}"]
    assert default_compute_score(rows[1]["data_source"], "\\boxed{0.5}", rows[1]["reward_model"]["ground_truth"]) == 1.0
    assert len(RLHFDataset(written["train"], tokenizer, {"max_prompt_length": 128})) == 2


def test_geo3k_with_image_files(tmp_path, tokenizer):
    """Image paths relative to the JSONL become {bytes, path} structs that RLHFDataset's image decoder reads."""
    Image.new("RGB", (4, 4), (200, 10, 10)).save(tmp_path / "fig.png")
    source = write_jsonl(tmp_path / "g.jsonl", [{"problem": "<image>Find x.", "answer": "3", "images": ["fig.png"]}])
    written = script("geo3k").main(["--input_jsonl", source, "--local_save_dir", str(tmp_path / "o")])
    row = load_rows(written["train"])[0]
    assert row["data_source"] == "hiyouga/geometry3k" and row["prompt"][0]["content"].startswith("<image>Find x.")
    assert Image.open(io.BytesIO(row["images"][0]["bytes"])).getpixel((0, 0)) == (200, 10, 10)
    assert (
        default_compute_score(row["data_source"], "<think>r</think> \\boxed{3}", row["reward_model"]["ground_truth"])
        == 1.0
    )
    item = RLHFDataset(written["train"], tokenizer, {"max_prompt_length": 128})[0]  # text-only model: no processor
    assert item["reward_model"]["ground_truth"] == "3"


def test_aime_bare_path_is_test_split(tmp_path, tokenizer):
    """A bare --input_jsonl is the test split; Problem/Answer field names work; the DAPO scorer accepts it."""
    source = write_jsonl(tmp_path / "a.jsonl", [{"Problem": "Find n.", "Answer": 204}])
    written = script("aime").main(["--input_jsonl", source, "--local_save_dir", str(tmp_path / "o")])
    row = load_rows(written["test"])[0]
    assert row["data_source"] == "aime2024" and row["reward_model"]["ground_truth"] == "204"
    assert default_compute_score(row["data_source"], "so\nAnswer: 204", "204")["acc"] is True
    assert len(RLHFDataset(written["test"], tokenizer, {"max_prompt_length": 128})) == 1


def test_bad_inputs_are_clear(tmp_path):
    """Missing fields, a gsm8k answer without '####', a missing file and bad JSON each name the problem."""
    gsm8k = script("gsm8k")
    no_marker = write_jsonl(tmp_path / "x.jsonl", [{"question": "q", "answer": "42"}])
    with pytest.raises(ValueError, match=r"train record 0: GSM8K answer has no '#### <number>'"):
        gsm8k.main(["--input_jsonl", no_marker, "--local_save_dir", str(tmp_path)])
    wrong_fields = write_jsonl(tmp_path / "y.jsonl", [{"q": "q", "a": "#### 1"}])
    with pytest.raises(KeyError, match=r"\['question'\].*\['a', 'q'\]"):
        gsm8k.main(["--input_jsonl", wrong_fields, "--local_save_dir", str(tmp_path)])
    with pytest.raises(FileNotFoundError, match="nope.jsonl"):
        gsm8k.main(["--input_jsonl", str(tmp_path / "nope.jsonl"), "--local_save_dir", str(tmp_path)])
    (tmp_path / "bad.jsonl").write_text('{"question": "q"\n')
    with pytest.raises(ValueError, match=r"bad\.jsonl line 1: not valid JSON"):
        gsm8k.main(["--input_jsonl", str(tmp_path / "bad.jsonl"), "--local_save_dir", str(tmp_path)])
    with pytest.raises(NotImplementedError, match="--hdfs_dir"):
        gsm8k.main(["--local_save_dir", str(tmp_path), "--hdfs_dir", "hdfs://x"])


def test_hub_without_datasets_package_says_what_to_do(tmp_path):
    """Without the `datasets` package, hub loading fails with a message pointing at --input_jsonl."""
    try:
        import datasets  # noqa: F401
    except ImportError:
        with pytest.raises(RuntimeError, match="--input_jsonl"):
            script("math_dataset").main(["--local_save_dir", str(tmp_path)])
    else:
        pytest.skip("`datasets` is installed; the hub path would try the network")


def test_runs_as_a_script(tmp_path):
    """`python examples/data_preprocess/gsm8k.py --local_save_dir DIR` works from the command line."""
    result = subprocess.run(
        [sys.executable, os.path.join(EXAMPLES, "gsm8k.py"), "--local_save_dir", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "train.parquet").is_file() and "wrote 64 rows" in result.stdout
