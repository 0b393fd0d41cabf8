"""Scoring helpers: return-value contract, in-process calls, text shortening, extra-info alignment."""

import threading

import pytest

from verl.workers.reward_manager.scorer import SampleScorer, ScoringLimits
from verl.workers.reward_manager.scoring import (
    ScoreResult,
    call_in_process,
    collect_extra_info,
    failure_metrics,
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


def test_call_in_process_propagates_result_and_error():
    """The value or the original exception comes back; an async function is awaited (its thread is joined)."""
    assert call_in_process(lambda x: x + 1, {"x": 1}) == 2
    with pytest.raises(KeyError):
        call_in_process(lambda: {}["k"], {})

    async def double(x):
        return 2 * x

    assert call_in_process(double, {"x": 3}) == 6
    assert not [t for t in threading.enumerate() if t.name == "verl-reward-fn"]


def test_in_process_scoring_never_raises():
    """Without limits (a manager built directly) calls run in this process, one by one: an exception or an unusable
    value becomes ScoreResult(error=...) with score 0.0, the other calls still score."""
    scorer = SampleScorer(lambda x: 1 / x if x else {"no": "score"}, ScoringLimits(), "test")
    assert scorer.pool is None
    zero, bad, ok = scorer.score([{"x": "a"}, {"x": 0}, {"x": 4}], ["s0", "s1", "s2"])
    assert zero.failed and zero.score == 0.0 and zero.error.startswith("TypeError: unsupported operand")
    assert bad.failed and "without a 'score' key" in bad.error
    assert ok == ScoreResult(score=0.25)


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
