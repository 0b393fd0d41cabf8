"""agg_loss: every aggregation mode on a hand-computed example, data-parallel / micro-batch invariance, masking."""

import pytest
import torch

from verl.trainer.ppo.core_algos import LOSS_AGG_MODES, agg_loss

# Shared example. loss_mat rows [1, 2, 3] and [4, 5, 6]; mask keeps tokens (0,0), (0,1), (1,0):
#   valid tokens 1, 2, 4 -> token sum 7, 3 tokens
#   per-sequence sums  [1+2, 4] = [3, 4];  per-sequence means [1.5, 4]
LOSS = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
MASK = torch.tensor([[1, 1, 0], [1, 0, 0]])


@pytest.mark.parametrize(
    "mode, expected",
    [
        ("token-mean", 7.0 / 3.0),  # 7 / 3 tokens
        ("token-sum", 7.0),  # 1 + 2 + 4
        ("seq-mean-token-sum", 3.5),  # (3 + 4) / 2
        ("seq-mean-token-sum-norm", 3.5 / 3.0),  # 3.5 / response_length (3)
        ("seq-mean-token-mean", 2.75),  # (1.5 + 4) / 2
    ],
)
def test_each_mode_matches_hand_computation(mode, expected):
    """Each mode reduces the shared example to its hand-computed value (fp32, tol 1e-6)."""
    assert agg_loss(LOSS, MASK, mode).item() == pytest.approx(expected, abs=1e-6)


def test_every_listed_mode_is_accepted_and_unknown_mode_lists_choices():
    """LOSS_AGG_MODES are the accepted modes; an unknown mode raises ValueError naming the key and the choices."""
    for mode in LOSS_AGG_MODES:
        agg_loss(LOSS, MASK, mode)
    with pytest.raises(ValueError, match=r"^Invalid loss_agg_mode: token-average .*loss_agg_mode.*token-mean"):
        agg_loss(LOSS, MASK, "token-average")


def test_seq_mean_token_sum_norm_uses_loss_scale_factor():
    """seq-mean-token-sum-norm divides by loss_scale_factor when given: 3.5 / 7 = 0.5."""
    assert agg_loss(LOSS, MASK, "seq-mean-token-sum-norm", loss_scale_factor=7).item() == pytest.approx(0.5)


@pytest.mark.parametrize("mode", ["seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm"])
def test_fully_masked_sequence_is_excluded_from_seq_means(mode):
    """Appending a sequence with no valid token does not change any sequence mean (it is not counted)."""
    loss = torch.cat([LOSS, torch.tensor([[9.0, 9.0, 9.0]])])
    mask = torch.cat([MASK, torch.zeros(1, 3, dtype=MASK.dtype)])
    assert agg_loss(loss, mask, mode).item() == pytest.approx(agg_loss(LOSS, MASK, mode).item(), abs=1e-6)


@pytest.mark.parametrize("mode", LOSS_AGG_MODES)
def test_nan_outside_the_mask_does_not_leak(mode):
    """A NaN/inf at a masked position leaves the loss and its gradient finite and unchanged."""
    loss = LOSS.clone().requires_grad_(True)
    poisoned = torch.where(MASK.bool(), loss, torch.tensor(float("nan")))
    poisoned = poisoned + torch.where(MASK.bool(), 0.0, float("inf"))
    out = agg_loss(poisoned, MASK, mode)
    out.backward()
    assert out.item() == pytest.approx(agg_loss(LOSS, MASK, mode).item(), abs=1e-6)
    assert torch.isfinite(loss.grad).all()
    assert (loss.grad[~MASK.bool()] == 0).all()


def test_all_masked_micro_batch_gives_zero_not_nan():
    """A micro-batch without any valid token contributes 0 (not NaN) in every mode."""
    for mode in LOSS_AGG_MODES:
        assert agg_loss(LOSS, torch.zeros_like(MASK), mode).item() == 0.0


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-sum", "seq-mean-token-mean"])
def test_data_parallel_average_equals_global_loss(mode):
    """Two dp ranks, each normalising by the global count and multiplied by dp_size=2, average to the loss of the
    concatenated batch (what DDP/FSDP gradient averaging sees). Rank 0 holds row 0, rank 1 holds row 1."""
    global_tokens, global_seqs = MASK.sum(), 2
    ranks = [
        agg_loss(
            LOSS[i : i + 1],
            MASK[i : i + 1],
            mode,
            dp_size=2,
            batch_num_tokens=global_tokens,
            global_batch_size=global_seqs,
        )
        for i in range(2)
    ]
    assert (sum(ranks) / 2).item() == pytest.approx(agg_loss(LOSS, MASK, mode).item(), abs=1e-6)


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-mean"])
def test_micro_batch_sum_equals_mini_batch_loss(mode):
    """Gradient accumulation: micro-batch losses normalised by the mini-batch count sum to the mini-batch loss
    (token-mean: 7/3 = 3/3 + 4/3; seq-mean-token-mean: 2.75 = 1.5/2 + 4/2)."""
    micro = [
        agg_loss(LOSS[i : i + 1], MASK[i : i + 1], mode, batch_num_tokens=MASK.sum(), global_batch_size=2)
        for i in range(2)
    ]
    assert sum(micro).item() == pytest.approx(agg_loss(LOSS, MASK, mode).item(), abs=1e-6)


def test_token_sum_scales_with_dp_size():
    """token-sum multiplies the local sum by dp_size (so the dp average is the global sum): 7 * 4 = 28."""
    assert agg_loss(LOSS, MASK, "token-sum", dp_size=4).item() == pytest.approx(28.0)


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-sum", "seq-mean-token-mean"])
def test_dp_without_global_count_raises(mode):
    """dp_size > 1 without the global token/sequence count is an error, not a silently biased loss."""
    with pytest.raises(ValueError, match="required when dp_size=2"):
        agg_loss(LOSS, MASK, mode, dp_size=2)


def test_shape_mismatch_raises():
    """loss_mat and loss_mask of different shapes raise ValueError naming both."""
    with pytest.raises(ValueError, match=r"loss_mat \(2, 3\).*loss_mask \(2, 2\)"):
        agg_loss(LOSS, MASK[:, :2], "token-mean")
