"""PF-PPO reweighting: the weight rules by hand, and row-consistent resampling of a DataProto."""

import numpy as np
import pytest
import torch

from verl import DataProto
from verl.trainer.ppo.core_algos import compute_pf_ppo_reweight_data
from verl.trainer.ppo.pf_ppo import pf_ppo_weights

SCORES = torch.tensor([-2.0, 0.0, 1.0, 3.0])


@pytest.mark.parametrize(
    "method, expected",
    [
        ("pow", [4.0, 0.0, 1.0, 9.0]),  # |s|^2
        ("max_min", [1.0, 0.0, 0.0, 1.0]),  # best (3) and worst (−2)
        ("max_random", [0.1, 0.1, 0.1, 0.4]),  # 0.4 for the best, 0.1 otherwise
    ],
)
def test_weight_rules(method, expected):
    """Each reweight_method gives the hand-computed weights."""
    torch.testing.assert_close(pf_ppo_weights(SCORES, method, 2.0), torch.tensor(expected), atol=1e-7, rtol=0)


def test_unknown_method_names_the_key():
    """An unknown reweight_method raises ValueError naming algorithm.pf_ppo.reweight_method."""
    with pytest.raises(ValueError, match="pf_ppo.reweight_method"):
        pf_ppo_weights(SCORES, "softmax", 2.0)


def test_resampling_is_row_consistent_and_leaves_input_alone():
    """With pow weights only row 2 (score 3, weight 9 vs 1e-8) is ever drawn (P(other) ≈ 2e-9 per draw): every
    tensor, non-tensor column and per-row meta_info list of the result is row 2's, and the input is unchanged."""
    torch.manual_seed(0)
    scores = torch.tensor([[0.0, 0.0], [0.0, 0.0], [1.0, 2.0]])
    data = DataProto.from_dict(
        tensors={"token_level_scores": scores, "responses": torch.tensor([[1, 1], [2, 2], [3, 3]])},
        non_tensors={"uid": np.array(["a", "b", "c"], dtype=object)},
        meta_info={"per_row": ["x", "y", "z"], "temperature": 1.0},
    )
    out = compute_pf_ppo_reweight_data(data, reweight_method="pow", weight_pow=2.0)
    assert out.batch["responses"].tolist() == [[3, 3]] * 3
    assert out.batch["token_level_scores"].tolist() == [[1.0, 2.0]] * 3
    assert out.non_tensor_batch["uid"].tolist() == ["c"] * 3
    assert out.meta_info == {"per_row": ["z"] * 3, "temperature": 1.0}
    assert data.batch["responses"].tolist() == [[1, 1], [2, 2], [3, 3]]
    assert data.non_tensor_batch["uid"].tolist() == ["a", "b", "c"]
