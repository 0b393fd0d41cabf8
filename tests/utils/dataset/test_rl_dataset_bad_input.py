"""Bad dataset input fails early with an exception naming the file, the row or column, and the fix."""

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from verl.utils.dataset.rl_dataset import RLHFDataset


def test_missing_file_names_path_and_config_keys(tokenizer, tmp_path):
    """A path that does not exist -> FileNotFoundError with the path and data.train_files / data.val_files."""
    missing = tmp_path / "nope.parquet"
    with pytest.raises(FileNotFoundError, match=r"nope\.parquet.*data\.train_files"):
        RLHFDataset(str(missing), tokenizer, {})


def test_unreadable_file_names_path(tokenizer, tmp_path):
    """A file that is not parquet -> ValueError naming it; a directory -> IsADirectoryError."""
    bogus = tmp_path / "train.parquet"
    bogus.write_text("question,answer\n1,2\n")
    with pytest.raises(ValueError, match=r"Cannot read .*train\.parquet.* as parquet"):
        RLHFDataset(str(bogus), tokenizer, {})
    with pytest.raises(IsADirectoryError, match="directory"):
        RLHFDataset(str(tmp_path), tokenizer, {})


def test_missing_prompt_column_lists_present_columns(tokenizer, write_parquet):
    """A file without the data.prompt_key column names the file, the column, the key and what is there."""
    path = write_parquet([{"question": "hi", "answer": "1"}])
    with pytest.raises(ValueError) as info:
        RLHFDataset(path, tokenizer, {})
    message = str(info.value)
    for fragment in (path, "'prompt'", "data.prompt_key", "['question', 'answer']"):
        assert fragment in message
    # The same file works once data.prompt_key points at a chat column.
    chat = write_parquet([{"msgs": [{"role": "user", "content": "hi"}]}], "chat.parquet")
    assert len(RLHFDataset(chat, tokenizer, {"prompt_key": "msgs"})) == 1


def test_empty_prompt_names_file_and_row(tokenizer, write_parquet, rl_row):
    """Row 2 with an empty prompt is reported as '<file> row 2' when the dataset is built, not mid-training."""
    rows = [rl_row("ok"), rl_row("fine"), rl_row("  ")]
    path = write_parquet(rows)
    with pytest.raises(ValueError, match=rf"{path} row 2: .*empty"):
        RLHFDataset(path, tokenizer, {})


def test_row_numbers_are_per_file(tokenizer, write_parquet, rl_row):
    """With two files, a bad row is reported by its own file and its row within that file."""
    good = write_parquet([rl_row("a"), rl_row("b")], "good.parquet")
    bad = write_parquet([rl_row("c"), {**rl_row("d"), "prompt": []}], "bad.parquet")
    with pytest.raises(ValueError, match=rf"{bad} row 1:"):
        RLHFDataset([good, bad], tokenizer, {})


def test_overlong_prompt_with_truncation_error(tokenizer, write_parquet, rl_row):
    """truncation=error + an overlong row -> ValueError naming the row and the three config fixes."""
    path = write_parquet([rl_row("short"), rl_row("apples " * 50)])
    dataset = RLHFDataset(path, tokenizer, {"max_prompt_length": 30, "truncation": "error"})
    assert dataset[0]["input_ids"].shape == (30,)
    with pytest.raises(ValueError) as info:
        dataset[1]
    message = str(info.value)
    for fragment in (f"{path} row 1", "data.max_prompt_length=30", "data.truncation", "data.filter_overlong_prompts"):
        assert fragment in message


def test_bad_config_values_name_the_key(tokenizer, write_parquet, rl_row):
    """An unknown truncation mode is a ConfigError naming data.truncation and the allowed values."""
    path = write_parquet([rl_row("hi")])
    with pytest.raises(ValueError, match=r"data\.truncation: must be one of .*'middle'"):
        RLHFDataset(path, tokenizer, {"truncation": "both"})


def test_missing_reward_columns_warn(tokenizer, tmp_path, caplog):
    """A prompt-only file loads (reward-model training needs no ground truth) but warns about reward columns."""
    path = tmp_path / "p.parquet"
    pq.write_table(pa.Table.from_pylist([{"prompt": [{"role": "user", "content": "hi"}]}]), path)
    with caplog.at_level("WARNING"):
        assert len(RLHFDataset(str(path), tokenizer, {})) == 1
    assert "'reward_model'" in caplog.text and "'data_source'" in caplog.text
