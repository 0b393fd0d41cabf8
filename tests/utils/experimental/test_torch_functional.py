"""Upstream API FusedLinearForPPO / FusedLinearForPPOFunction (verl.utils.experimental.torch_functional)."""

import pytest
import torch

from verl.utils.experimental.torch_functional import FusedLinearForPPO, FusedLinearForPPOFunction

V, H = 29, 6


def reference(hidden, weight, input_ids, temperature):
    """Upstream semantics: logits = hidden @ W^T / T in fp32; (log p(input_ids), entropy)."""
    logp = torch.log_softmax((hidden @ weight.t()).float() / temperature, dim=-1)
    return logp.gather(-1, input_ids.unsqueeze(-1)).squeeze(-1), -(logp.exp() * logp).sum(-1)


@pytest.mark.parametrize("lead_shape", [(11,), (2, 5)], ids=["2d", "3d"])
def test_module_matches_reference_with_gradients(lead_shape):
    """FusedLinearForPPO(chunk_size=4) equals the full-logits formulas for (T, H) and (B, S, H) hidden states:
    outputs (1e-5) and gradients of hidden_states and vocab_weights from log_probs + entropy (1e-5)."""
    torch.manual_seed(0)
    hidden = torch.randn(*lead_shape, H, requires_grad=True)
    weight = torch.randn(V, H, requires_grad=True)
    input_ids = torch.randint(0, V, lead_shape)
    w_lp, w_ent = torch.randn(lead_shape), torch.randn(lead_shape)
    lp, ent = FusedLinearForPPO(chunk_size=4)(hidden, weight, input_ids, 0.8)
    grads = torch.autograd.grad((lp * w_lp).sum() + (ent * w_ent).sum(), (hidden, weight))
    lp_ref, ent_ref = reference(hidden, weight, input_ids, 0.8)
    grads_ref = torch.autograd.grad((lp_ref * w_lp).sum() + (ent_ref * w_ent).sum(), (hidden, weight))
    assert lp.shape == ent.shape == lead_shape
    for actual, expected in zip((lp, ent, *grads), (lp_ref, ent_ref, *grads_ref)):
        torch.testing.assert_close(actual, expected, atol=1e-5, rtol=0)


def test_function_apply_defaults_and_dtypes():
    """FusedLinearForPPOFunction.apply(h, w, ids) uses temperature 1 and chunk 512; log_probs are fp32 and the
    entropy comes back in the hidden dtype, as upstream."""
    torch.manual_seed(1)
    hidden, weight = torch.randn(5, H).bfloat16(), torch.randn(V, H).bfloat16()
    input_ids = torch.randint(0, V, (5,))
    lp, ent = FusedLinearForPPOFunction.apply(hidden, weight, input_ids)
    assert lp.dtype == torch.float32 and ent.dtype == torch.bfloat16
    lp_ref, ent_ref = reference(hidden, weight, input_ids, 1.0)
    # the bf16 GEMM may round differently per chunk; bf16 logits of size ~3 carry ~1e-2 absolute error
    torch.testing.assert_close(lp, lp_ref, atol=3e-2, rtol=0)
    torch.testing.assert_close(ent.float(), ent_ref, atol=3e-2, rtol=0)


def test_per_token_temperature_tensor():
    """A (T,) temperature tensor scales each token's logits by its own temperature."""
    torch.manual_seed(2)
    hidden, weight = torch.randn(7, H), torch.randn(V, H)
    input_ids = torch.randint(0, V, (7,))
    temperature = torch.rand(7) + 0.5
    lp, ent = FusedLinearForPPO(chunk_size=3)(hidden, weight, input_ids, temperature)
    lp_ref, ent_ref = reference(hidden, weight, input_ids, temperature.unsqueeze(-1))
    torch.testing.assert_close(lp, lp_ref, atol=1e-5, rtol=0)
    torch.testing.assert_close(ent, ent_ref, atol=1e-5, rtol=0)
