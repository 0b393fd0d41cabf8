"""The model forward of both worker paths (verl/workers/core/model_forward.py) against HF's own forward.

Reference: the unpatched HF model on the padded batch, ``log_softmax(logits / T)`` at the positions that predict
the response tokens (``[S - R - 1, S - 1)``), gathered at those tokens, zero where the response is padding; the
entropy ``-sum(p * log p)`` of the same distribution. fp32 on the CPU: agreement to 1e-5 (observed ~1e-6), far
below a wrong window (a shifted token changes log-probs by ~1) or a missed temperature (~0.1 at T = 0.7).
"""

import copy

import pytest
import torch

from verl.models.transformers.patch_registry import apply_patches
from verl.utils.model import attach_value_head
from verl.workers.core.model_forward import LogProbOptions, forward_log_probs, forward_values, multi_modal_kwargs

T = 0.7


def _reference(model, batch, response_length):
    with torch.no_grad():
        logits = model(
            input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], position_ids=batch["position_ids"]
        ).logits
    seqlen = batch["input_ids"].shape[1]
    window = logits[:, seqlen - response_length - 1 : seqlen - 1].float() / T
    logp = torch.log_softmax(window, -1)
    mask = batch["attention_mask"][:, -response_length:].float()
    token_logp = logp.gather(-1, batch["responses"].unsqueeze(-1)).squeeze(-1)
    entropy = -(logp.exp() * logp).sum(-1)
    return token_logp * mask, entropy * mask


@pytest.mark.parametrize(
    "options",
    [
        LogProbOptions(use_remove_padding=True),  # packed, fused LM head (the default)
        LogProbOptions(use_remove_padding=False, entropy_from_logits_with_chunking=True, chunk_size=3),
    ],
    ids=["packed-fused", "padded-chunked-logits"],
)
def test_log_probs_and_entropy_match_hf(make_model, make_batch, options):
    model = make_model()
    reference = copy.deepcopy(model)
    apply_patches(model, platform="cpu", report=False)
    batch = make_batch(batch_size=4).batch
    response_length = batch["responses"].shape[-1]
    with torch.no_grad():
        out = forward_log_probs(
            model, batch, response_length=response_length, temperature=T, calculate_entropy=True, options=options
        )
    expected_logp, expected_entropy = _reference(reference, batch, response_length)
    mask = batch["attention_mask"][:, -response_length:].float()
    torch.testing.assert_close(out["log_probs"] * mask, expected_logp, rtol=0, atol=1e-5)
    torch.testing.assert_close(out["entropys"] * mask, expected_entropy, rtol=0, atol=1e-5)


def test_entropy_only_when_asked(make_model, make_batch):
    """Invariant: no entropy is computed (or faked) unless the caller asks for it."""
    model = make_model()
    apply_patches(model, platform="cpu", report=False)
    batch = make_batch(batch_size=2).batch
    with torch.no_grad():
        out = forward_log_probs(
            model, batch, response_length=7, temperature=1.0, calculate_entropy=False, options=LogProbOptions()
        )
    assert set(out) == {"log_probs"}


@pytest.mark.parametrize("use_remove_padding", [True, False])
def test_values_are_the_one_unit_head_on_the_window(make_model, make_batch, use_remove_padding):
    """Reference: the value model's own forward, unit 0 at positions [S - R - 1, S - 1) (the state before each
    response token), compared where the response is real."""
    model = attach_value_head(make_model(), seed=0)
    reference = copy.deepcopy(model)
    apply_patches(model, platform="cpu", report=False)
    batch = make_batch(batch_size=4).batch
    response_length, seqlen = batch["responses"].shape[-1], batch["input_ids"].shape[1]
    with torch.no_grad():
        values = forward_values(model, batch, response_length=response_length, use_remove_padding=use_remove_padding)
        full = reference(
            input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], position_ids=batch["position_ids"]
        ).logits[..., 0]
    expected = full[:, seqlen - response_length - 1 : seqlen - 1]
    mask = batch["attention_mask"][:, -response_length:].bool()
    torch.testing.assert_close(values[mask], expected[mask], rtol=0, atol=1e-5)


def test_multi_modal_kwargs_concatenate_per_sample_inputs():
    """Two samples with 2 and 3 image patches give pixel_values of 5 rows; text-only samples are skipped."""
    samples = [{"pixel_values": torch.zeros(2, 4)}, {}, {"pixel_values": torch.ones(3, 4)}]
    import numpy as np

    merged = multi_modal_kwargs({"multi_modal_inputs": np.array(samples, dtype=object)})
    assert merged["pixel_values"].shape == (5, 4) and merged["pixel_values"][2:].eq(1).all()
    assert multi_modal_kwargs({}) == {}
