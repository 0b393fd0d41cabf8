"""The per-micro-batch forward both worker paths call (verl/workers/core/micro_forward.py)."""

import pytest
import torch

from verl.models.transformers.patch_registry import apply_patches
from verl.utils.model import attach_value_head
from verl.workers.core.micro_forward import MODEL_INPUT_KEYS, policy_forward, select_inputs, value_forward
from verl.workers.core.model_forward import LogProbOptions, forward_log_probs


def test_policy_forward_is_the_core_forward_of_the_micro_batch(make_model, make_batch):
    """Invariant: unpacking a DataProto micro-batch changes nothing: the same log-probs and entropy as calling
    forward_log_probs on its tensors with the response length of its ``responses`` (bitwise: same kernels)."""
    model = make_model()
    apply_patches(model, platform="cpu", report=False)
    data = make_batch(batch_size=3)
    options = LogProbOptions()
    with torch.no_grad():
        out = policy_forward(model, data, temperature=0.7, calculate_entropy=True, options=options)
        expected = forward_log_probs(
            model, data.batch, response_length=7, temperature=0.7, calculate_entropy=True, options=options
        )
    assert out.keys() == expected.keys() == {"log_probs", "entropys"}
    for key in out:
        assert torch.equal(out[key], expected[key])


def test_value_forward_is_zero_on_response_padding(make_model, make_batch):
    """Row i of the batch has i % 4 response pads: those positions are exactly 0, the others are the head's."""
    model = attach_value_head(make_model(), seed=0)
    apply_patches(model, platform="cpu", report=False)
    data = make_batch(batch_size=4)
    with torch.no_grad():
        values = value_forward(model, data, use_remove_padding=True)
    mask = data.batch["attention_mask"][:, -7:].bool()
    assert values.shape == (4, 7) and values[~mask].eq(0).all() and values[mask].ne(0).all()


def test_select_inputs_names_the_missing_key_and_the_caller(make_batch):
    data = make_batch(batch_size=2)
    kept = select_inputs(data, MODEL_INPUT_KEYS, "compute_values")
    assert set(kept.batch.keys()) == set(MODEL_INPUT_KEYS) and kept.meta_info == data.meta_info
    with pytest.raises(ValueError, match=r"update_critic: the batch lacks \['nope'\]"):
        select_inputs(data, [*MODEL_INPUT_KEYS, "nope"], "update_critic")
