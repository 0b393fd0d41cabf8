"""collate_fn: tensors stacked on dim 0, everything else a 1-D numpy object array of length B."""

import numpy as np
import pytest
import torch

from verl.utils.dataset.rl_dataset import collate_fn


def test_stacks_tensors_and_keeps_lists_as_objects():
    """Equal-length lists stay per-item objects (shape (B,)), dicts and strings too; tensors become (B, L)."""
    items = [
        {"input_ids": torch.tensor([1, 2, 3]), "raw_prompt_ids": [1, 2], "reward_model": {"ground_truth": "1"}},
        {"input_ids": torch.tensor([4, 5, 6]), "raw_prompt_ids": [3, 4], "reward_model": {"ground_truth": "2"}},
    ]
    batch = collate_fn(items)
    assert torch.equal(batch["input_ids"], torch.tensor([[1, 2, 3], [4, 5, 6]]))
    assert batch["raw_prompt_ids"].dtype == object and batch["raw_prompt_ids"].shape == (2,)
    assert batch["raw_prompt_ids"][1] == [3, 4]
    assert isinstance(batch["reward_model"], np.ndarray) and batch["reward_model"][0] == {"ground_truth": "1"}


def test_missing_non_tensor_key_is_none_and_mixed_tensor_key_raises():
    """A key absent from one item is None there; a key that is a tensor only sometimes is an error."""
    batch = collate_fn([{"a": "x", "t": torch.zeros(1)}, {"t": torch.ones(1)}])
    assert list(batch["a"]) == ["x", None]
    with pytest.raises(ValueError, match="'t'"):
        collate_fn([{"t": torch.zeros(1)}, {"t": [1.0]}])
