"""DataConfig is the home of the data.* defaults; the dataset's narrower view must not drift from it."""

import dataclasses

import pytest

from verl.trainer.config import DataConfig, SamplerConfig


def test_dataset_view_defaults_equal_data_config():
    """Every field RLDatasetConfig shares with DataConfig has the same default (one home per default)."""
    dataset_config = pytest.importorskip("verl.utils.dataset.dataset_config")
    data = DataConfig()
    view = dataset_config.RLDatasetConfig()
    shared = [f.name for f in dataclasses.fields(view) if f.name != "_target_"]
    assert all(name in data for name in shared), [n for n in shared if n not in data]
    assert {n: view[n] for n in shared} == {n: data[n] for n in shared}


def test_data_checks_name_the_key():
    """Truncation mode, lengths and the custom-sampler worker rule fail naming their key."""
    with pytest.raises(ValueError, match=r"^truncation: 'cut' is not supported"):
        DataConfig(truncation="cut")
    with pytest.raises(ValueError, match=r"^max_response_length: must be a positive number"):
        DataConfig(max_response_length=0)
    with pytest.raises(ValueError, match=r"^dataloader_num_workers: \(8\) must be 0 with a custom sampler"):
        DataConfig(sampler=SamplerConfig(class_path="my_sampler.py", class_name="Curriculum"))


def test_train_files_accepts_one_or_many():
    """train_files may be one path or a list of paths (upstream scripts use both)."""
    assert DataConfig(train_files=["a.parquet", "b.parquet"]).train_files == ["a.parquet", "b.parquet"]
