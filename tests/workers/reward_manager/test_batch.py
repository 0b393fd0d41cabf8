"""BatchRewardManager: one call with lists; a raising, hanging or malformed batch function zeroes the batch."""

import time

import pytest

from verl.workers.reward_manager import BatchRewardManager


def batch_fn(data_sources, solution_strs, ground_truths, extra_infos, bonus=0.0):
    return [{"score": float(s.endswith(g)) + bonus, "len": len(s)} for s, g in zip(solution_strs, ground_truths)]


def test_one_call_with_lists_and_reward_kwargs(tokenizer, make_batch):
    """Lists arrive in batch order; reward_kwargs (bonus=0.5) are passed; dict keys become extra info."""
    batch = make_batch(["Q: a", "Q: b"], ["A: 4", "A: 5"], ["4", "6"])
    out = BatchRewardManager(tokenizer, 0, compute_score=batch_fn, bonus=0.5)(batch, return_dict=True)
    assert out["reward_extra_info"]["score"] == [1.5, 0.5]
    assert out["reward_extra_info"]["len"] == [4, 4]
    assert out["reward_tensor"].sum() == 2.0


@pytest.mark.parametrize(
    ("fn", "timeout", "error"),
    [
        (lambda **kw: 1 / 0, None, "ZeroDivisionError"),
        (lambda **kw: [1.0], None, "list of 2 scores"),
        (lambda **kw: time.sleep(30), 0.2, "TimeoutError"),
    ],
)
def test_failing_batch_function_zeroes_the_batch(tokenizer, make_batch, caplog, fn, timeout, error):
    """Raise / wrong length / hang: all samples score 0, all are counted, the warning names the error."""
    batch = make_batch(["Q: a", "Q: b"], ["A: 4", "A: 5"], ["4", "6"])
    out = BatchRewardManager(tokenizer, 0, compute_score=fn, compute_score_timeout=timeout)(batch, return_dict=True)
    assert out["reward_tensor"].abs().sum() == 0
    assert out["reward_metrics"]["reward/num_failed"] == 2
    assert error in caplog.text


def test_requires_a_function(tokenizer):
    """There is no default batch function: the error names the config keys."""
    with pytest.raises(ValueError, match="reward.custom_reward_function.path"):
        BatchRewardManager(tokenizer, 0, compute_score=None)
