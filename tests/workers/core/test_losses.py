"""Loss assembly of one micro-batch (verl/workers/core/losses.py), values worked out by hand."""

import pytest
import torch

from verl.workers.config import FSDPActorConfig, FSDPCriticConfig
from verl.workers.core.losses import MetricAccumulator, actor_loss, critic_loss, value_loss
from verl.workers.core.micro_batching import GlobalBatchInfo

MASK = torch.tensor([[1.0, 1.0], [1.0, 0.0]])  # 3 valid tokens


def _actor_batch():
    log_probs = torch.tensor([[-1.0, -2.0], [-0.5, -3.0]])
    batch = {
        "old_log_probs": log_probs.clone(),  # ratio 1: the clipped PPO objective is -A per token
        "advantages": torch.tensor([[1.0, 2.0], [3.0, 9.0]]),  # 9 is padding
        "response_mask": MASK,
        "ref_log_prob": log_probs - 0.5,  # k1 estimate log pi - log pi_ref = 0.5 per token
    }
    return {"log_probs": log_probs, "entropys": torch.full((2, 2), 0.5)}, batch


def test_actor_loss_by_hand():
    """token-mean over the mini-batch's N = 6 tokens (this micro-batch holds 3 of them), dp 1:
    pg_loss = -(1 + 2 + 3) / 6 = -1; entropy = 0.5 * 3 / 6 = 0.25; kl_loss (k1) = 0.5 * 3 / 6 = 0.25;
    loss = pg - 0.1 * entropy + 0.2 * kl = -1 - 0.025 + 0.05 = -0.975."""
    cfg = FSDPActorConfig(entropy_coeff=0.1, use_kl_loss=True, kl_loss_coef=0.2, kl_loss_type="k1")
    outputs, batch = _actor_batch()
    loss, metrics = actor_loss(cfg, outputs, batch, GlobalBatchInfo(1, 6, 2))
    assert loss.item() == pytest.approx(-0.975, abs=1e-6)
    assert metrics["actor/pg_loss"] == pytest.approx(-1.0, abs=1e-6)
    assert metrics["actor/entropy"] == pytest.approx(0.25, abs=1e-6)
    assert metrics["actor/kl_loss"] == pytest.approx(0.25, abs=1e-6)
    assert metrics["actor/kl_coef"] == 0.2


def test_no_entropy_metric_without_entropy_and_kl_needs_the_reference():
    """Invariant: actor/entropy exists only when the entropy was computed; use_kl_loss without ref_log_prob names
    the missing phase."""
    outputs, batch = _actor_batch()
    del outputs["entropys"]
    _, metrics = actor_loss(FSDPActorConfig(), outputs, batch, GlobalBatchInfo(1, 3, 2))
    assert "actor/entropy" not in metrics
    del batch["ref_log_prob"]
    with pytest.raises(ValueError, match="compute_ref_log_prob"):
        actor_loss(FSDPActorConfig(use_kl_loss=True), outputs, batch, GlobalBatchInfo(1, 3, 2))


def test_value_loss_by_hand():
    """v_old = 0, vpred = 1, return = 2, cliprange 0.5: unclipped (1 - 2)^2 = 1, clipped (0.5 - 2)^2 = 2.25, the max
    is 2.25 on every token, so vf_loss = 0.5 * 2.25 = 1.125 (token-mean over 3 valid tokens) and clipfrac = 1."""
    cfg = FSDPCriticConfig(cliprange_value=0.5)
    batch = {"values": torch.zeros(2, 2), "returns": torch.full((2, 2), 2.0), "response_mask": MASK}
    vpreds = torch.ones(2, 2)
    loss, metrics = critic_loss(cfg, vpreds, batch, GlobalBatchInfo(1, 3, 2))
    assert loss.item() == pytest.approx(1.125, abs=1e-6)
    assert metrics == pytest.approx({"critic/vf_loss": 1.125, "critic/vf_clipfrac": 1.0, "critic/vpred_mean": 1.0})
    same, _ = value_loss(cfg, {"values": vpreds}, batch, GlobalBatchInfo(1, 3, 2))
    assert same.item() == loss.item()  # the loss-function form of the update loop


def test_metric_accumulator_sums_loss_terms_and_averages_ratios():
    """Two micro-batches: pg_loss 0.25 + 0.5 = 0.75 (globally normalised partial sums), clipfrac (0.2 + 0.4) / 2."""
    acc = MetricAccumulator()
    acc.add({"actor/pg_loss": 0.25, "actor/pg_clipfrac": 0.2})
    acc.add({"actor/pg_loss": 0.5, "actor/pg_clipfrac": 0.4})
    assert acc.result() == pytest.approx({"actor/pg_loss": 0.75, "actor/pg_clipfrac": 0.3})
