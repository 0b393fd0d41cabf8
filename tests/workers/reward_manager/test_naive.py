"""NaiveRewardManager: scores at the last valid response token, extra info from dict returns, and a run that goes
on when the reward function raises, returns garbage or hangs."""

import logging
import math
import time

import pytest
import torch

from verl.workers.reward_manager import NaiveRewardManager

PROMPT_LEN = 24  # make_batch's default prompt width


def response_lengths(batch):
    return batch.batch["attention_mask"][:, PROMPT_LEN:].sum(-1).tolist()


def test_scores_land_on_last_valid_response_token(tokenizer, make_batch):
    """gsm8k default scoring: right answer 1.0 at index len(response)-1; the wrong one contributes nothing."""
    batch = make_batch(["Q: what is 2 plus 2?", "Q: what is 3 plus 3?"], ["A: 4 #### 4", "#### 7"], ["4", "6"])
    rewards = NaiveRewardManager(tokenizer, num_examine=0)(batch)
    assert rewards.dtype == torch.float32 and rewards.shape == batch.batch["responses"].shape
    assert rewards[0, response_lengths(batch)[0] - 1] == 1.0
    assert rewards.sum() == 1.0  # sample 1 is wrong (7 != 6), so the tensor holds exactly one 1.0


def test_custom_function_receives_decoded_strings(tokenizer, make_batch):
    """compute_score gets data_source, the decoded response (pads and specials removed), ground truth, extra_info."""
    seen = []

    def compute_score(data_source, solution_str, ground_truth, extra_info=None):
        seen.append((data_source, solution_str, ground_truth, extra_info))
        return 0.5

    batch = make_batch(["Q: 1?"], ["A: 1<|im_end|>"], ["1"], data_sources=["my_src"], extra_info=[{"index": 3}])
    rewards = NaiveRewardManager(tokenizer, 0, compute_score=compute_score)(batch)
    assert seen == [("my_src", "A: 1", "1", {"index": 3})]
    # <|im_end|> is a real (unmasked) token, so the reward sits on it: the last valid position.
    assert rewards[0, response_lengths(batch)[0] - 1] == 0.5


def test_dict_scores_fill_extra_info(tokenizer, make_batch):
    """A dict return: 'score' is the reward, every key becomes a per-sample reward_extra_info column."""

    def compute_score(data_source, solution_str, ground_truth, extra_info=None):
        correct = solution_str.strip().endswith(ground_truth)
        return {"score": 1.0 if correct else -1.0, "acc": correct, "pred": solution_str[-1:]}

    batch = make_batch(["Q: a", "Q: b"], ["A: 4", "A: 5"], ["4", "6"])
    out = NaiveRewardManager(tokenizer, 0, compute_score=compute_score)(batch, return_dict=True)
    info = out["reward_extra_info"]
    assert info["score"] == [1.0, -1.0] and info["acc"] == [True, False] and info["pred"] == ["4", "5"]
    assert info["reward_failed"] == [False, False] and info["reward_timed_out"] == [False, False]
    assert out["reward_metrics"] == {"reward/num_failed": 0, "reward/num_timed_out": 0}
    assert out["reward_tensor"].sum() == 0.0  # +1 and -1


def test_raising_function_scores_zero_warns_and_counts(tokenizer, make_batch, caplog):
    """Sample 1 raises: it scores 0.0, the warning shows data_source, prompt, response and the error, run goes on."""

    def compute_score(data_source, solution_str, ground_truth, extra_info=None):
        if "boom" in solution_str:
            raise ZeroDivisionError("bad parse")
        return {"score": 1.0, "acc": True}

    batch = make_batch(["Q: fine", "Q: what is 9 plus 9?"], ["A: 1", "A: boom"], ["1", "18"], data_sources=["s", "t"])
    manager = NaiveRewardManager(tokenizer, 0, compute_score=compute_score)
    with caplog.at_level(logging.WARNING):
        out = manager(batch, return_dict=True)
    assert out["reward_tensor"][0].sum() == 1.0 and out["reward_tensor"][1].abs().sum() == 0.0
    assert out["reward_metrics"]["reward/num_failed"] == 1
    # Failed sample 1 gets neutral fills so every column keeps one entry per sample.
    assert out["reward_extra_info"] == {
        "score": [1.0, 0.0],
        "acc": [True, 0.0],
        "reward_failed": [False, True],
        "reward_timed_out": [False, False],
    }
    for fragment in ("sample 1", "data_source='t'", "ZeroDivisionError: bad parse", "what is 9 plus 9", "A: boom"):
        assert fragment in caplog.text
    assert manager.num_failed_total == 1


@pytest.mark.parametrize("bad", [None, "high", {"acc": True}, math.nan, [], object()])
def test_unusable_return_values_are_failures(tokenizer, make_batch, bad):
    """None, strings, dicts without 'score', NaN, empty lists, objects: 0.0 and counted, never a crash or NaN."""
    batch = make_batch(["Q: x"], ["A: y"], ["y"])
    out = NaiveRewardManager(tokenizer, 0, compute_score=lambda **kw: bad)(batch, return_dict=True)
    assert out["reward_metrics"]["reward/num_failed"] == 1
    assert torch.isfinite(out["reward_tensor"]).all() and out["reward_tensor"].abs().sum() == 0


def test_hanging_function_times_out(tokenizer, make_batch, caplog):
    """A function that sleeps 30 s with compute_score_timeout=0.2: that sample scores 0 and is counted as timed
    out; the other sample keeps its score; the call returns in well under the hang (< 5 s for 0.2 s timeout)."""

    def compute_score(data_source, solution_str, ground_truth, extra_info=None):
        if "hang" in solution_str:
            time.sleep(30)
        return 1.0

    batch = make_batch(["Q: a", "Q: b"], ["A: hang", "A: ok"], ["1", "1"])
    manager = NaiveRewardManager(tokenizer, 0, compute_score=compute_score, compute_score_timeout=0.2)
    start = time.monotonic()
    with caplog.at_level(logging.WARNING):
        out = manager(batch, return_dict=True)
    assert time.monotonic() - start < 5.0
    assert out["reward_metrics"] == {"reward/num_failed": 1, "reward/num_timed_out": 1}
    assert out["reward_tensor"][0].abs().sum() == 0 and out["reward_tensor"][1].sum() == 1.0
    assert "did not return within 0.2 s" in caplog.text


def test_async_reward_function(tokenizer, make_batch):
    """An `async def` reward function is awaited (with and without a timeout)."""

    async def compute_score(data_source, solution_str, ground_truth, extra_info=None):
        return 2.0

    batch = make_batch(["Q: a"], ["A: b"], ["b"])
    for timeout in (None, 5.0):
        rewards = NaiveRewardManager(tokenizer, 0, compute_score=compute_score, compute_score_timeout=timeout)(batch)
        assert rewards.sum() == 2.0


def test_empty_response_and_extra_columns(tokenizer, make_batch):
    """An empty response scores at position 0; __num_turns__ reaches extra_info as num_turns."""
    seen = {}

    def compute_score(data_source, solution_str, ground_truth, extra_info=None):
        seen.update(extra_info)
        return 1.0

    batch = make_batch(["Q: a"], [""], ["x"], __num_turns__=[2])
    rewards = NaiveRewardManager(tokenizer, 0, compute_score=compute_score)(batch)
    assert rewards[0, 0] == 1.0 and seen == {"num_turns": 2}


def test_rm_scores_pass_through(tokenizer, make_batch):
    """When a reward model already wrote rm_scores, they are returned unchanged (with their extra keys)."""
    batch = make_batch(["Q: a"], ["A: b"], ["b"], acc=[True])
    batch.batch["rm_scores"] = torch.full((1, 16), 0.25)
    batch.meta_info["reward_extra_keys"] = ["acc"]
    out = NaiveRewardManager(tokenizer, 0)(batch, return_dict=True)
    assert torch.equal(out["reward_tensor"], torch.full((1, 16), 0.25)) and out["reward_extra_info"] == {"acc": [True]}


def test_missing_columns_are_clear_errors(tokenizer, make_batch):
    """A batch without reward_model is a ValueError naming the column (structural, not per-sample)."""
    batch = make_batch(["Q: a"], ["A: b"], ["b"])
    batch.non_tensor_batch.pop("reward_model")
    with pytest.raises(ValueError, match="no 'reward_model' column"):
        NaiveRewardManager(tokenizer, 0)(batch)
    with pytest.raises(ValueError, match="compute_score_timeout"):
        NaiveRewardManager(tokenizer, 0, compute_score_timeout=0)


def test_num_examine_prints_per_data_source(tokenizer, make_batch, capsys):
    """num_examine=1 prints one sample per data source: 2 sources -> 2 '[response]' lines."""
    batch = make_batch(
        ["Q: a"] * 3, ["#### 1"] * 3, ["1"] * 3, data_sources=["openai/gsm8k", "openai/gsm8k", "lighteval/MATH"]
    )
    NaiveRewardManager(tokenizer, num_examine=1)(batch)
    assert capsys.readouterr().out.count("[response]") == 2
