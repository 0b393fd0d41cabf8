"""Validation metrics as upstream names them: mean/std/best/worst/maj@n per data source, val-core vs val-aux.

Expected values are worked out in the comments from the definition (best@n = E[max of n draws with replacement
from a prompt's N scores], averaged over prompts); the bootstrap estimates them from 1000 resamples, so the
tolerances are ~4 standard errors of that estimate (stated per case).
"""

import math

import numpy as np
import pytest

from verl.trainer.ppo.metric_utils import (
    bootstrap_metric,
    calc_maj_val,
    process_validation_metrics,
    validation_metric_dict,
)


def _two_prompts():
    # prompt a: 4 responses scored [1, 0, 1, 1]; prompt b: 4 responses all 0
    sources = ["s"] * 8
    uids = ["a"] * 4 + ["b"] * 4
    rewards = [1.0, 0.0, 1.0, 1.0, 0.0, 0.0, 0.0, 0.0]
    return sources, uids, rewards


def test_mean_std_and_bootstrap_best_worst_per_prompt_then_averaged():
    sources, uids, rewards = _two_prompts()
    metrics = process_validation_metrics(sources, uids, {"reward": rewards})["s"]["reward"]
    # mean@4: (0.75 + 0) / 2
    assert metrics["mean@4"] == pytest.approx(0.375)
    # std@4: population std of [1,0,1,1] = sqrt(0.75 * 0.25) = 0.4330, of [0]*4 = 0 -> mean 0.2165
    assert metrics["std@4"] == pytest.approx(math.sqrt(0.75 * 0.25) / 2)
    # best@2 of prompt a: 1 - P(both draws 0) = 1 - 0.25^2 = 0.9375; prompt b: 0 -> 0.46875 (s.e. ~0.004)
    assert metrics["best@2/mean"] == pytest.approx(0.46875, abs=0.02)
    # best@4: 1 - 0.25^4 = 0.99609 -> 0.49805 (s.e. ~0.001)
    assert metrics["best@4/mean"] == pytest.approx(0.498046875, abs=0.005)
    # worst@2: P(both 1) = 0.75^2 = 0.5625 -> 0.28125; worst@4: 0.75^4 = 0.31641 -> 0.15820 (s.e. ~0.008)
    assert metrics["worst@2/mean"] == pytest.approx(0.28125, abs=0.035)
    assert metrics["worst@4/mean"] == pytest.approx(0.158203125, abs=0.035)
    # n runs over 2, 4, ... below N, then N: here {2, 4}
    assert {k for k in metrics if k.startswith("best@")} == {"best@2/mean", "best@2/std", "best@4/mean", "best@4/std"}
    assert "maj@4/mean" not in metrics  # no `pred`: no vote


def test_majority_vote_with_predictions():
    # one prompt, preds x, y, x, x and score 1 exactly when the answer is x: maj@4 = P(x wins a 4-draw vote)
    # x wins with >= 3 of 4 draws: 0.75^4 + 4 * 0.75^3 * 0.25 = 0.73828; a 2-2 tie (6 * 0.75^2 * 0.25^2 = 0.21094)
    # goes to the answer drawn first, x half the time: + 0.10547 -> 0.84375 (s.e. ~0.011)
    infos = {"reward": [1.0, 0.0, 1.0, 1.0], "pred": ["x", "y", "x", "x"]}
    metrics = process_validation_metrics(["s"] * 4, ["a"] * 4, infos)["s"]
    assert metrics["reward"]["maj@4/mean"] == pytest.approx(0.84375, abs=0.045)
    assert "pred" not in metrics  # strings are only votes


def test_calc_maj_val_takes_the_most_common_answer_and_the_first_on_a_tie():
    votes = [{"p": "3", "v": 0.0}, {"p": "7", "v": 1.0}, {"p": "7", "v": 1.0}]
    assert calc_maj_val(votes, vote_key="p", val_key="v") == 1.0
    assert calc_maj_val(votes[:2], vote_key="p", val_key="v") == 0.0  # 1-1: "3" was seen first


def test_bootstrap_is_seeded_and_leaves_numpy_global_state_alone():
    np.random.seed(123)
    expected_next = np.random.rand()
    np.random.seed(123)
    first = bootstrap_metric([0.0, 1.0, 1.0], 2, [np.max], seed=7)
    assert np.random.rand() == expected_next
    assert bootstrap_metric([0.0, 1.0, 1.0], 2, [np.max], seed=7) == first


def test_n_comes_from_the_data_not_a_hard_coded_one():
    single = process_validation_metrics(["s", "s"], ["a", "b"], {"reward": [1.0, 0.0]})
    assert single == {"s": {"reward": {"mean@1": 0.5}}}
    flat = validation_metric_dict(process_validation_metrics(*_two_prompts()[:2], {"reward": _two_prompts()[2]}))
    assert "val-core/s/reward/mean@4" in flat and not any("@1" in k for k in flat)


def test_core_and_aux_sections():
    sources, uids, rewards = _two_prompts()
    infos = {"reward": rewards, "acc": [r > 0 for r in rewards], "format": [1.0] * 8}
    flat = validation_metric_dict(process_validation_metrics(sources, uids, infos))
    core = sorted(k for k in flat if k.startswith("val-core/"))
    # `acc` present: it is the core variable; its mean and best (mean and spread, as upstream) at the largest n
    # are core, nothing else
    assert core == ["val-core/s/acc/best@4/mean", "val-core/s/acc/best@4/std", "val-core/s/acc/mean@4"]
    assert "val-aux/s/reward/mean@4" in flat and "val-aux/s/format/mean@4" in flat
    assert (
        "val-aux/s/acc/best@2/mean" in flat and "val-aux/s/acc/worst@4/mean" in flat and "val-aux/s/acc/std@4" in flat
    )
    assert flat["val-core/s/acc/mean@4"] == pytest.approx(0.375)


def test_sources_are_reported_separately():
    flat = validation_metric_dict(process_validation_metrics(["gsm8k", "math"], ["a", "b"], {"reward": [1.0, 0.0]}))
    assert flat == {"val-core/gsm8k/reward/mean@1": 1.0, "val-core/math/reward/mean@1": 0.0}
