"""``compute_advantage`` on a batch without ``response_mask``: derived from ``attention_mask`` (as upstream), or a
clear error when the batch cannot give it."""

import pytest
import torch
from tensordict import TensorDict

from verl.protocol import DataProto
from verl.trainer.ppo.core_algos import ADV_ESTIMATOR_REGISTRY, register_adv_est
from verl.trainer.ppo.ray_trainer import compute_advantage


@pytest.fixture
def echo_estimator():
    """An estimator whose advantages are the mask it was given (so the test sees exactly which mask it got)."""

    @register_adv_est("test_echo_mask")
    def echo(token_level_rewards, response_mask, config=None):
        return response_mask.float(), response_mask.float()

    yield "test_echo_mask"
    ADV_ESTIMATOR_REGISTRY.pop("test_echo_mask", None)


def _batch(**tensors):
    return DataProto(batch=TensorDict(tensors, batch_size=(2,)))


def test_missing_response_mask_is_the_response_part_of_attention_mask(echo_estimator):
    """prompt length 2, response length 3: attention_mask [[1,1,1,1,0],[0,1,1,1,1]] -> the last 3 columns,
    [[1,1,0],[1,1,1]], are the response mask; it is written into the batch and handed to the estimator."""
    attention_mask = torch.tensor([[1, 1, 1, 1, 0], [0, 1, 1, 1, 1]])
    data = _batch(
        responses=torch.zeros(2, 3, dtype=torch.long),
        attention_mask=attention_mask,
        token_level_rewards=torch.zeros(2, 3),
    )
    out = compute_advantage(data, echo_estimator)
    expected = torch.tensor([[1, 1, 0], [1, 1, 1]])
    assert torch.equal(out.batch["response_mask"], expected)
    assert torch.equal(out.batch["advantages"], expected.float())


def test_given_response_mask_is_used_as_is(echo_estimator):
    """A batch that has response_mask keeps it (no re-derivation from attention_mask)."""
    mask = torch.tensor([[1, 0, 0], [1, 1, 0]])
    data = _batch(response_mask=mask, token_level_rewards=torch.zeros(2, 3))
    assert torch.equal(compute_advantage(data, echo_estimator).batch["advantages"], mask.float())


def test_no_mask_and_nothing_to_derive_it_from_raises(echo_estimator):
    """Neither response_mask nor attention_mask: a ValueError naming the missing keys, not a KeyError."""
    data = _batch(responses=torch.zeros(2, 3, dtype=torch.long), token_level_rewards=torch.zeros(2, 3))
    with pytest.raises(ValueError, match=r"no 'response_mask' and no \['attention_mask'\]"):
        compute_advantage(data, echo_estimator)
