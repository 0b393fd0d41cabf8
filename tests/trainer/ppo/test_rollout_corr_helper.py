"""Rollout correction (IS weights, rejection masks, off-policy metrics, bypass loss) against upstream's formulas.

Every expected value is worked out by hand in the test's docstring or comment from the formulas of upstream's
``docs/algo/rollout_corr_math.md`` / ``rollout_corr_helper``: ρ = π_train / π_rollout per token; TIS w = min(ρ, u);
IcePop w = ρ·[l ≤ ρ ≤ u]; sequence w = Πρ; k1 = −log ρ, k2 = ½(log ρ)², k3 = ρ − 1 − log ρ.
"""

import math

import pytest
import torch

from verl.base_config import ConfigError
from verl.protocol import DataProto
from verl.trainer.config import RolloutCorrectionConfig
from verl.trainer.ppo.core_algos import compute_policy_loss_bypass_mode, compute_policy_loss_vanilla
from verl.trainer.ppo.rollout_corr_helper import (
    apply_bypass_mode,
    compute_offpolicy_metrics,
    compute_rollout_correction_and_add_to_batch,
    compute_rollout_correction_and_rejection_mask,
    compute_rollout_correction_weights,
    compute_rollout_rejection_mask,
)


def _log(values):
    return torch.tensor(values, dtype=torch.float64).log()


# one sequence of 3 tokens: ρ = [0.5/0.2, 0.1/0.4, 0.3/0.1] = [2.5, 0.25, 3.0]
TRAIN_3, ROLLOUT_3 = [[0.5, 0.1, 0.3]], [[0.2, 0.4, 0.1]]


def _log_ratio(train, rollout):
    return _log(train) - _log(rollout)


# ------------------------------------------------------------------------------------------------------ IS weights
def test_token_tis_truncates_at_the_upper_bound():
    """u = 2: w = [min(2.5, 2), 0.25, min(3, 2)] = [2, 0.25, 2]; mean 4.25/3 = 1.41667; raw above 2: 2 of 3; raw
    below 1/u = 0.5: 1 of 3; max 2, min 0.25."""
    mask = torch.ones(1, 3)
    weights, metrics = compute_rollout_correction_weights(_log_ratio(TRAIN_3, ROLLOUT_3), mask, "token", 2.0)
    torch.testing.assert_close(weights, torch.tensor([[2.0, 0.25, 2.0]], dtype=torch.float64))
    assert not weights.requires_grad
    assert metrics["rollout_is_mean"] == pytest.approx(4.25 / 3)
    assert metrics["rollout_is_ratio_fraction_high"] == pytest.approx(2 / 3)
    assert metrics["rollout_is_ratio_fraction_low"] == pytest.approx(1 / 3)
    assert metrics["rollout_is_max"] == pytest.approx(2.0)
    assert metrics["rollout_is_min"] == pytest.approx(0.25)
    # ESS = 1 / mean((w / mean w)²) = mean(w)² / mean(w²) = (4.25/3)² / ((4 + 0.0625 + 4)/3) = 0.82988
    assert metrics["rollout_is_eff_sample_size"] == pytest.approx((4.25 / 3) ** 2 / (8.0625 / 3), rel=1e-6)


def test_token_icepop_zeroes_weights_outside_the_window():
    """threshold "0.5_2.8": ρ = [2.5, 0.25, 3.0] -> [2.5, 0, 0] (0.25 < 0.5 and 3.0 > 2.8 drop out); 2/3 out of
    bounds."""
    mask = torch.ones(1, 3)
    weights, metrics = compute_rollout_correction_weights(_log_ratio(TRAIN_3, ROLLOUT_3), mask, "token", "0.5_2.8")
    torch.testing.assert_close(weights, torch.tensor([[2.5, 0.0, 0.0]], dtype=torch.float64))
    assert metrics["rollout_is_oob_ratio"] == pytest.approx(2 / 3)


def test_sequence_is_is_the_product_over_valid_tokens_truncated():
    """Row 0: ρ = [2.5, 0.25] -> Π = 0.625 on both tokens; row 1: ρ = [3.0, (padding: 0.5/0.1 = 5)] -> Π over the
    valid token only = 3 -> min(3, 2) = 2, padding weight 0."""
    log_ratio = _log_ratio([[0.5, 0.1], [0.3, 0.5]], [[0.2, 0.4], [0.1, 0.1]])
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0]])
    weights, metrics = compute_rollout_correction_weights(log_ratio, mask, "sequence", 2.0)
    torch.testing.assert_close(weights, torch.tensor([[0.625, 0.625], [2.0, 0.0]], dtype=torch.float64))
    # sequence level: max/min of the untruncated Πρ over sequences = 3 and 0.625; above u: 1 of 2
    assert metrics["rollout_is_max"] == pytest.approx(3.0)
    assert metrics["rollout_is_min"] == pytest.approx(0.625)
    assert metrics["rollout_is_ratio_fraction_high"] == pytest.approx(0.5)


@pytest.mark.parametrize(
    ("level", "factor"),
    [
        ("token", 4.25 / 3),  # mean over the 3 valid tokens of [2, 0.25, 2]
        ("sequence", (0.625 + 2.0) / 2),  # mean over the 2 sequences of their weights [0.625, 2]
    ],
)
def test_batch_normalize_divides_by_the_batch_mean(level, factor):
    if level == "token":
        log_ratio, mask = _log_ratio(TRAIN_3, ROLLOUT_3), torch.ones(1, 3)
        raw = torch.tensor([[2.0, 0.25, 2.0]], dtype=torch.float64)
    else:
        log_ratio = _log_ratio([[0.5, 0.1], [0.3, 0.5]], [[0.2, 0.4], [0.1, 0.1]])
        mask = torch.tensor([[1.0, 1.0], [1.0, 0.0]])
        raw = torch.tensor([[0.625, 0.625], [2.0, 0.0]], dtype=torch.float64)
    weights, metrics = compute_rollout_correction_weights(log_ratio, mask, level, 2.0, rollout_is_batch_normalize=True)
    torch.testing.assert_close(weights, raw / factor)
    assert metrics["rollout_is_batch_norm_factor"] == pytest.approx(factor)


# ------------------------------------------------------------------------------------------------------ rejection
# ρ = [1.5, 0.25 | 3.0, pad]: row 0 = tokens (0.3/0.2, 0.1/0.4), row 1 = (0.3/0.1, padding)
RS_TRAIN, RS_ROLLOUT = [[0.3, 0.1], [0.3, 0.5]], [[0.2, 0.4], [0.1, 0.1]]
RS_MASK = torch.tensor([[1.0, 1.0], [1.0, 0.0]])


def _reject(option, threshold):
    log_ratio = _log_ratio(RS_TRAIN, RS_ROLLOUT)
    return compute_rollout_rejection_mask(log_ratio, RS_MASK, option, threshold, _log(RS_TRAIN), _log(RS_ROLLOUT))


@pytest.mark.parametrize(
    ("option", "threshold", "kept"),
    [
        # token_k1, u = 2 (l = 1/2): keep log(1/2) <= -log ρ <= log 2, i.e. 0.5 <= ρ <= 2: ρ = 1.5 only
        ("token_k1", 2.0, [[1, 0], [0, 0]]),
        # "0.2_5": 0.2 <= 1/ρ <= 5, i.e. 0.2 <= ρ <= 5: all three valid tokens
        ("token_k1", "0.2_5", [[1, 1], [1, 0]]),
        # asymmetric "0.2_1.6": log 0.2 <= -log ρ <= log 1.6, i.e. 0.625 <= ρ <= 5: ρ = 1.5 and 3.0 (k1 is the
        # rollout-over-train log ratio; with the sign flipped it would keep 1.5 and 0.25 instead)
        ("token_k1", "0.2_1.6", [[1, 0], [1, 0]]),
        # "0.9_2.5" -> [-0.1054, 0.9163] on seq_mean_k1 = [0.4904 | -1.0986]: row 0 only
        ("seq_mean_k1", "0.9_2.5", [[1, 1], [0, 0]]),
        # token_k2 = ½(log ρ)² = [0.0822, 0.9609 | 0.6035]; <= 0.7 keeps tokens 1 and 3
        ("token_k2", 0.7, [[1, 0], [1, 0]]),
        # token_k3 = ρ - 1 - log ρ = [0.0945, 0.6363 | 0.9014]; <= 0.7 keeps tokens 1 and 2
        ("token_k3", 0.7, [[1, 1], [0, 0]]),
        # seq_mean_k3 = [(0.0945 + 0.6363)/2 = 0.3654 | 0.9014]; <= 0.5 keeps row 0 entirely
        ("seq_mean_k3", 0.5, [[1, 1], [0, 0]]),
        # seq_sum_k2 = [0.0822 + 0.9609 = 1.0431 | 0.6035]; <= 1.0 keeps row 1
        ("seq_sum_k2", 1.0, [[0, 0], [1, 0]]),
        # seq_max_k2 = [0.9609 | 0.6035]; <= 0.9 keeps row 1
        ("seq_max_k2", 0.9, [[0, 0], [1, 0]]),
        # seq_mean_k1 = mean(-log ρ) = [(-0.4055 + 1.3863)/2 = 0.4904 | -1.0986]; "0.5_2" -> [log 0.5, log 2] =
        # [-0.6931, 0.6931]: keeps row 0
        ("seq_mean_k1", "0.5_2", [[1, 1], [0, 0]]),
        # seq_sum_k1 = sum(-log ρ) = [0.9808 | -1.0986]; u = 3.1 -> [log(1/3.1), log 3.1] = [-1.1314, 1.1314]:
        # both rows kept; u = 2.5 -> [-0.9163, 0.9163]: both rejected
        ("seq_sum_k1", 3.1, [[1, 1], [1, 0]]),
        ("seq_sum_k1", 2.5, [[0, 0], [0, 0]]),
        # binary_kl: max(KL(Bern(p)||Bern(q)), KL(Bern(q)||Bern(p))) per token:
        #   p=0.3,q=0.2: fwd 0.3 ln 1.5 + 0.7 ln(0.7/0.8) = 0.02817, rev 0.02573 -> 0.02817
        #   p=0.1,q=0.4: fwd 0.1 ln 0.25 + 0.9 ln 1.5 = 0.22629, rev 0.4 ln 4 + 0.6 ln(2/3) = 0.31124 -> 0.31124
        #   p=0.3,q=0.1: fwd 0.3 ln 3 + 0.7 ln(7/9) = 0.15366, rev 0.1 ln(1/3) + 0.9 ln(9/7) = 0.11632 -> 0.15366
        # <= 0.2 keeps tokens 1 and 3
        ("binary_kl", 0.2, [[1, 0], [1, 0]]),
        # all options must pass: token_k3 <= 0.7 keeps (1, 2), seq_mean_k3 <= 0.5 keeps row 0 -> (1, 2)
        ("token_k3,seq_mean_k3", "0.7,0.5", [[1, 1], [0, 0]]),
    ],
)
def test_rejection_options(option, threshold, kept):
    mask, metrics = _reject(option, threshold)
    assert mask.tolist() == kept
    rejected_valid = 3 - sum(map(sum, kept))
    assert metrics["rollout_rs_masked_fraction"] == pytest.approx(rejected_valid / 3)


def test_rejection_metrics_per_option():
    """seq_mean_k3 = [0.3654, 0.9014]; threshold 0.5: mean over sequences 0.6334, max 0.9014, 1 of 2 above."""
    _, metrics = _reject("seq_mean_k3", 0.5)
    k3 = [(1.5 - 1 - math.log(1.5) + 0.25 - 1 - math.log(0.25)) / 2, 3.0 - 1 - math.log(3.0)]
    assert metrics["rollout_rs_seq_mean_k3_mean"] == pytest.approx(sum(k3) / 2)
    assert metrics["rollout_rs_seq_mean_k3_max"] == pytest.approx(k3[1])
    assert metrics["rollout_rs_seq_mean_k3_fraction_high"] == pytest.approx(0.5)
    assert metrics["rollout_rs_seq_mean_k3_seq_masked_fraction"] == pytest.approx(0.5)


def test_rejection_threshold_errors_name_the_key():
    with pytest.raises(ValueError, match="rollout_rs_threshold must be set"):
        _reject("token_k2", None)
    with pytest.raises(ValueError, match="token_k2 takes one upper bound"):
        _reject("token_k2", "0.1_1")
    with pytest.raises(ValueError, match="one threshold for all rollout_rs options or one per option"):
        _reject("token_k2,token_k3", "0.1,0.2,0.3")


# ------------------------------------------------------------------------------------------------------ diagnostics
def test_offpolicy_metrics():
    """One sequence, train [0.3, 0.1], rollout [0.2, 0.4]: log ρ = [0.405465, -1.386294], ρ = [1.5, 0.25].
    kl = mean(-log ρ) = 0.490415; k3_kl = mean(ρ - log ρ - 1) = (0.094535 + 0.636294)/2 = 0.365415;
    chi2_token = mean(ρ²) - 1 = (2.25 + 0.0625)/2 - 1 = 0.15625; chi2_seq = (1.5·0.25)² - 1 = -0.859375;
    training_ppl = exp(-mean log π_t) = 1/sqrt(0.03) = 5.773503; rollout_ppl = 1/sqrt(0.08) = 3.535534;
    log_ppl_diff = mean log π_r - mean log π_t = ½ ln(0.08/0.03) = 0.490415; ppl_ratio = exp(0.490415) = 1.632993."""
    metrics = compute_offpolicy_metrics(_log([[0.3, 0.1]]), _log([[0.2, 0.4]]), torch.ones(1, 2))
    expected = {
        "kl": 0.490415,
        "k3_kl": 0.365415,
        "chi2_token": 0.15625,
        "chi2_seq": -0.859375,
        "training_ppl": 5.773503,
        "rollout_ppl": 3.535534,
        "log_ppl_diff": 0.490415,
        "log_ppl_abs_diff": 0.490415,
        "ppl_ratio": 1.632993,
        "training_log_ppl": -0.5 * math.log(0.03),
        "rollout_log_ppl": -0.5 * math.log(0.08),
    }
    for key, value in expected.items():
        assert metrics[key] == pytest.approx(value, abs=1e-6), key


def test_unified_entry_prefixes_metrics_and_keeps_the_mask_without_rs():
    weights, mask, metrics = compute_rollout_correction_and_rejection_mask(
        _log(TRAIN_3), _log(ROLLOUT_3), torch.ones(1, 3), rollout_is="token", rollout_is_threshold=2.0
    )
    torch.testing.assert_close(weights, torch.tensor([[2.0, 0.25, 2.0]], dtype=torch.float64))
    assert mask.tolist() == [[1.0, 1.0, 1.0]]
    assert metrics and all(key.startswith("rollout_corr/") for key in metrics)
    assert {"rollout_corr/rollout_is_mean", "rollout_corr/kl", "rollout_corr/chi2_token"} <= metrics.keys()
    with pytest.raises(ValueError, match="must have one shape"):
        compute_rollout_correction_and_rejection_mask(_log(TRAIN_3), _log([[0.2, 0.4]]), torch.ones(1, 3))


def _batch():
    return DataProto.from_dict(
        tensors={
            "old_log_probs": _log(RS_TRAIN).float(),
            "rollout_log_probs": _log(RS_ROLLOUT).float(),
            "response_mask": RS_MASK.clone(),
        }
    )


def test_decoupled_mode_updates_the_batch():
    """token IS (u = 2) + token_k1 RS (u = 2): ρ = [1.5, 0.25 | 3] -> w = [1.5, 0.25 | 2], mask keeps ρ in
    [0.5, 2]: [[1, 0], [0, 0]]."""
    batch, metrics = compute_rollout_correction_and_add_to_batch(
        _batch(),
        {"rollout_is": "token", "rollout_is_threshold": 2.0, "rollout_rs": "token_k1", "rollout_rs_threshold": 2.0},
    )
    torch.testing.assert_close(batch.batch["rollout_is_weights"], torch.tensor([[1.5, 0.25], [2.0, 0.0]]))
    assert batch.batch["response_mask"].tolist() == [[1.0, 0.0], [0.0, 0.0]]
    assert metrics["rollout_corr/rollout_rs_masked_fraction"] == pytest.approx(2 / 3)


def test_metrics_only_by_default():
    """The YAML default (no IS, no RS) leaves the batch as it is and still logs the diagnostics."""
    batch, metrics = compute_rollout_correction_and_add_to_batch(_batch(), RolloutCorrectionConfig())
    assert "rollout_is_weights" not in batch.batch.keys()
    assert batch.batch["response_mask"].tolist() == RS_MASK.tolist()
    assert "rollout_corr/kl" in metrics and "rollout_corr/rollout_is_mean" not in metrics


def test_apply_bypass_mode_uses_the_rollout_log_probs():
    batch = _batch()
    apply_bypass_mode(batch)
    assert torch.equal(batch.batch["old_log_probs"], batch.batch["rollout_log_probs"])
    batch = DataProto.from_dict(tensors={"old_log_probs": torch.zeros(1, 2)})
    with pytest.raises(ValueError, match="calculate_log_probs=True"):
        apply_bypass_mode(batch)


# ------------------------------------------------------------------------------------------------------ bypass loss
class _Cfg:
    clip_ratio = clip_ratio_low = clip_ratio_high = 0.2
    clip_ratio_c = 3.0
    loss_scale_factor = None
    global_batch_info: dict = {}

    def __init__(self, **corr):
        self.policy_loss = type("P", (), {"rollout_correction": corr})()


def test_bypass_ppo_clip_is_vanilla_on_the_rollout_ratio_and_logs_rollout_corr():
    """ppo_clip: L = vanilla PPO with π_old = π_rollout (no weights even with rollout_is set: the ratio is the
    correction); the rollout_corr/* metrics are computed from the current π_θ."""
    rollout, current = _log([[0.2, 0.4]]).float(), _log([[0.3, 0.1]]).float()
    adv, mask = torch.tensor([[1.0, -1.0]]), torch.ones(1, 2)
    cfg = _Cfg(loss_type="ppo_clip", rollout_is="token", rollout_is_threshold=2.0)
    loss, metrics = compute_policy_loss_bypass_mode(rollout, current, adv, mask, "token-mean", cfg)
    vanilla, _ = compute_policy_loss_vanilla(rollout, current, adv, mask, "token-mean", cfg)
    assert loss.item() == vanilla.item()
    assert metrics["rollout_corr/rollout_is_mean"] == pytest.approx((1.5 + 0.25) / 2, rel=1e-6)


def test_bypass_reinforce_with_sequence_is():
    """reinforce, sequence IS u = 2: w = min(1.5·0.25, 2) = 0.375 on both tokens; A = [1, 1], seq-mean-token-sum:
    L = -0.375·(ln 0.3 + ln 0.1) = 1.31497; the gradient w.r.t. log π is -w·A = -0.375 per token (w is a constant)."""
    rollout = _log([[0.2, 0.4]]).float()
    current = _log([[0.3, 0.1]]).float().requires_grad_(True)
    cfg = _Cfg(loss_type="reinforce", rollout_is="sequence", rollout_is_threshold=2.0)
    loss, _ = compute_policy_loss_bypass_mode(
        rollout, current, torch.ones(1, 2), torch.ones(1, 2), "seq-mean-token-sum", cfg
    )
    assert loss.item() == pytest.approx(-0.375 * (math.log(0.3) + math.log(0.1)), rel=1e-6)
    loss.backward()
    torch.testing.assert_close(current.grad, torch.full((1, 2), -0.375))


# ------------------------------------------------------------------------------------------------------ config
def test_presets_are_upstreams():
    assert RolloutCorrectionConfig.decoupled_token_is().rollout_is == "token"
    seq_rs = RolloutCorrectionConfig.decoupled_seq_is_rs()
    assert (seq_rs.rollout_is, seq_rs.rollout_rs, seq_rs.rollout_rs_threshold) == ("sequence", "seq_sum_k1", "0.5_2.0")
    geo = RolloutCorrectionConfig.decoupled_geo_rs()
    assert (geo.rollout_is, geo.rollout_rs, geo.rollout_rs_threshold) == (None, "seq_mean_k1", "0.999_1.001")
    k3 = RolloutCorrectionConfig.bypass_ppo_clip_k3_rs()
    assert (k3.bypass_mode, k3.loss_type, k3.rollout_rs, k3.rollout_rs_threshold) == (
        True,
        "ppo_clip",
        "seq_mean_k3",
        0.01,
    )
    pg = RolloutCorrectionConfig.bypass_pg_is()
    assert (pg.bypass_mode, pg.loss_type, pg.rollout_is) == (True, "reinforce", "sequence")
    assert RolloutCorrectionConfig.decoupled_token_icepop().rollout_is_threshold == "0.5_5.0"
    assert not RolloutCorrectionConfig.disabled().enabled


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"rollout_is": "geometric"}, "rollout_is"),
        ({"rollout_is_threshold": "3_2"}, "rollout_is_threshold"),
        ({"rollout_is_threshold": "x"}, "rollout_is_threshold"),
        ({"rollout_rs": "token_k9", "rollout_rs_threshold": 1.0}, "rollout_rs"),
        ({"rollout_rs": "token_k2"}, "rollout_rs_threshold must be set"),
        ({"loss_type": "a2c"}, "loss_type"),
    ],
)
def test_config_errors_name_the_key(kwargs, match):
    with pytest.raises(ConfigError, match=match):
        RolloutCorrectionConfig(**kwargs)


def _trainer_config(corr: RolloutCorrectionConfig, calculate_log_probs: bool = True, loss_mode: str = "vanilla"):
    from verl.trainer.config import AlgoConfig
    from verl.trainer.config.ppo_trainer import ActorRolloutRefConfig, PPOTrainerConfig
    from verl.workers.config import FSDPActorConfig, PolicyLossConfig, RolloutConfig

    actor = FSDPActorConfig(policy_loss=PolicyLossConfig(loss_mode=loss_mode))
    arr = ActorRolloutRefConfig(actor=actor, rollout=RolloutConfig(calculate_log_probs=calculate_log_probs))
    return PPOTrainerConfig(actor_rollout_ref=arr, algorithm=AlgoConfig(rollout_correction=corr))


def test_trainer_config_cross_checks():
    """Correction needs the rollout's log-probs; bypass mode owns the policy loss; bypass_mode by hand is refused."""
    _trainer_config(RolloutCorrectionConfig.decoupled_token_is())
    _trainer_config(RolloutCorrectionConfig(), calculate_log_probs=False)  # metrics-only default: nothing needed
    with pytest.raises(ConfigError, match="rollout.calculate_log_probs"):
        _trainer_config(RolloutCorrectionConfig.decoupled_token_is(), calculate_log_probs=False)
    with pytest.raises(ConfigError, match="cannot be combined with algorithm.rollout_correction.bypass_mode"):
        _trainer_config(RolloutCorrectionConfig.bypass_ppo_clip(), loss_mode="gspo")
    with pytest.raises(ConfigError, match="needs algorithm.rollout_correction.bypass_mode=True"):
        _trainer_config(RolloutCorrectionConfig(), loss_mode="bypass_mode")
