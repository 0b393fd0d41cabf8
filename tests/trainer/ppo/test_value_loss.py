"""Clipped value loss and the entropy loss on hand-computed examples."""

import math

import pytest
import torch

from verl.trainer.ppo.core_algos import compute_entropy_loss, compute_value_loss

# v_old = 0.5, c = 0.2 -> clip range [0.3, 0.7]
#   vpred 1.0, R 1.5: unclipped 0.25, clipped (0.7 − 1.5)² = 0.64 -> 0.64 (clipped term active, gradient 0)
#   vpred 0.0, R 1.0: unclipped 1.00, clipped (0.3 − 1.0)² = 0.49 -> 1.00
#   vpred 2.0, R 0.0: unclipped 4.00, clipped (0.7 − 0.0)² = 0.49 -> 4.00
# loss = 0.5·(0.64 + 1 + 4)/3 = 0.94; clipfrac 1/3; ∂/∂vpred = 0.5·2(v − R)/3 on unclipped tokens = [0, −1/3, 2/3]
VPREDS = [[1.0, 0.0, 2.0]]
VALUES = torch.tensor([[0.5, 0.5, 0.5]])
RETURNS = torch.tensor([[1.5, 1.0, 0.0]])


def test_clipped_value_loss():
    """Value, clip fraction and gradient of the clipped value loss on the three cases above."""
    vpreds = torch.tensor(VPREDS, requires_grad=True)
    loss, clipfrac = compute_value_loss(vpreds, RETURNS, VALUES, torch.ones(1, 3), cliprange_value=0.2)
    assert loss.item() == pytest.approx(0.94, abs=1e-6)
    assert clipfrac.item() == pytest.approx(1 / 3, abs=1e-6)
    loss.backward()
    torch.testing.assert_close(vpreds.grad, torch.tensor([[0.0, -1 / 3, 2 / 3]]), atol=1e-6, rtol=0)


def test_value_loss_forwards_aggregation_arguments():
    """loss_agg_mode and the global-batch arguments reach agg_loss: token-sum -> 0.5·5.64 = 2.82;
    dp 2 with 6 global tokens -> 0.5·5.64/6·2 = 0.94."""
    vpreds = torch.tensor(VPREDS)
    loss, _ = compute_value_loss(vpreds, RETURNS, VALUES, torch.ones(1, 3), 0.2, loss_agg_mode="token-sum")
    assert loss.item() == pytest.approx(2.82, abs=1e-5)
    loss, _ = compute_value_loss(vpreds, RETURNS, VALUES, torch.ones(1, 3), 0.2, dp_size=2, batch_num_tokens=6)
    assert loss.item() == pytest.approx(0.94, abs=1e-6)


def test_value_loss_shape_mismatch():
    """vpreds/returns/values/mask of different shapes raise ValueError."""
    with pytest.raises(ValueError, match="same shape"):
        compute_value_loss(torch.zeros(1, 3), RETURNS, VALUES[:, :2], torch.ones(1, 3), 0.2)


def test_entropy_loss():
    """Token 0: uniform over 4 -> ln 4; token 1: logits [0, 0, −inf-ish] ~ uniform over 2 -> ln 2 (−1e4 gives
    e^{−1e4} = 0 in fp32). token-mean = (ln 4 + ln 2)/2 = 1.5·ln 2; masking token 1 leaves ln 4."""
    logits = torch.tensor([[[0.0, 0.0, 0.0, 0.0], [0.0, 0.0, -1e4, -1e4]]])
    assert compute_entropy_loss(logits, torch.ones(1, 2)).item() == pytest.approx(1.5 * math.log(2), abs=1e-6)
    assert compute_entropy_loss(logits, torch.tensor([[1.0, 0.0]])).item() == pytest.approx(math.log(4), abs=1e-6)
    with pytest.raises(ValueError, match="response_mask"):
        compute_entropy_loss(logits, torch.ones(1, 3))
