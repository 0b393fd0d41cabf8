"""Scoring helpers: return-value contract, timeouts, text shortening, extra-info alignment."""

import time

import pytest

from verl.workers.reward_manager.scoring import (
    ScoreResult,
    call_with_timeout,
    collect_extra_info,
    failure_metrics,
    score_one,
    shorten,
    to_score,
)


def test_to_score_contract():
    """Numbers and bools -> float; dict -> its 'score' plus all keys; sequences -> first item (upstream)."""
    assert to_score(1) == (1.0, {})
    assert to_score(True) == (1.0, {})
    assert to_score({"score": 0.5, "acc": True}) == (0.5, {"score": 0.5, "acc": True})
    assert to_score([0.25, 9]) == (0.25, {})
    with pytest.raises(TypeError, match="without a 'score' key"):
        to_score({"acc": 1})
    with pytest.raises(ValueError, match="non-finite"):
        to_score(float("inf"))


def test_call_with_timeout_propagates_result_and_error():
    """The value or the original exception comes back; a hang past the limit is a TimeoutError."""
    assert call_with_timeout(lambda x: x + 1, {"x": 1}, 1.0) == 2
    with pytest.raises(KeyError):
        call_with_timeout(lambda: {}["k"], {}, 1.0)
    start = time.monotonic()
    with pytest.raises(TimeoutError):
        call_with_timeout(lambda: time.sleep(30), {}, 0.1)
    assert time.monotonic() - start < 5.0


def test_score_one_never_raises():
    """score_one turns exceptions into ScoreResult(error=...) with score 0.0."""
    result = score_one(lambda: 1 / 0, {}, None)
    assert result.failed and result.score == 0.0 and "ZeroDivisionError" in result.error
    assert score_one(lambda: 3, {}, None) == ScoreResult(score=3.0)


def test_shorten_keeps_head_and_tail():
    """Long text keeps 100 chars at each end (the final answer is at the end)."""
    text = "a" * 150 + "b" * 150
    assert shorten(text) == "a" * 100 + " ... " + "b" * 100
    assert shorten("short") == "short"


def test_extra_info_alignment_and_metrics():
    """Columns stay one entry per sample: missing numeric -> 0.0, string -> '', other -> None."""
    results = [
        ScoreResult(score=1.0, extra={"acc": True, "pred": "4", "obj": [1]}),
        ScoreResult(error="boom"),
        ScoreResult(error="TimeoutError", timed_out=True),
    ]
    info = collect_extra_info(results)
    assert info == {
        "acc": [True, 0.0, 0.0],
        "pred": ["4", "", ""],
        "obj": [[1], None, None],
        "reward_failed": [False, True, True],
        "reward_timed_out": [False, False, True],
    }
    assert failure_metrics(results) == {"reward/num_failed": 2, "reward/num_timed_out": 1}
