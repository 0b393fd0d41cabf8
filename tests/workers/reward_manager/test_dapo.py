"""DAPORewardManager: the overlong penalty ramp, its validation, and DAPO-style dict scores."""

import pytest

from verl.workers.reward_manager import DAPORewardManager
from verl.workers.reward_manager.dapo import OverlongBufferConfig, overlong_penalty

BUFFER = OverlongBufferConfig(enable=True, len=4, penalty_factor=1.0, log=True)


@pytest.mark.parametrize(("length", "expected"), [(10, 0.0), (16, 0.0), (17, -0.25), (18, -0.5), (20, -1.0)])
def test_overlong_penalty_ramp(length, expected):
    """max 20, buffer 4: no penalty up to 16 tokens, then -(L-16)/4: 17 -> -0.25, 18 -> -0.5, 20 -> -1."""
    assert overlong_penalty(length, 20, BUFFER) == expected


def test_penalty_added_to_score_and_logged(tokenizer, make_batch):
    """Reward = score + penalty at the last token; overlong_reward/overlong columns when log=True."""
    batch = make_batch(
        ["Q: a", "Q: b"], ["Answer: 4", "what is 2 plus 2?\nAnswer: 4"], ["4", "4"], data_sources=["aime24"] * 2
    )
    lengths = batch.batch["attention_mask"][:, 24:].sum(-1).tolist()
    max_resp_len = lengths[0] + 4  # sample 0 sits at expected_len = max - buffer: no penalty
    manager = DAPORewardManager(
        tokenizer, 0, max_resp_len=max_resp_len, overlong_buffer_cfg={"enable": True, "len": 4, "log": True}
    )
    out = manager(batch, return_dict=True)
    info = out["reward_extra_info"]
    expected_penalty = min(-(lengths[1] - lengths[0]) / 4, 0.0)
    assert expected_penalty < 0  # sample 1 is longer, so the test exercises a real penalty
    assert info["overlong_reward"] == [0.0, expected_penalty] and info["overlong"] == [False, expected_penalty < 0]
    assert info["acc"] == [True, True]  # math_dapo dict score: +1 each
    assert out["reward_tensor"][0, lengths[0] - 1] == 1.0
    assert out["reward_tensor"][1, lengths[1] - 1] == pytest.approx(1.0 + expected_penalty, abs=1e-6)


def test_validation(tokenizer):
    """An enabled buffer needs max_resp_len, and 0 < len <= max_resp_len."""
    with pytest.raises(ValueError, match="needs max_resp_len"):
        DAPORewardManager(tokenizer, 0, overlong_buffer_cfg={"enable": True, "len": 4})
    with pytest.raises(ValueError, match=r"len=40 must be in \(0, max_resp_len=20\]"):
        DAPORewardManager(tokenizer, 0, max_resp_len=20, overlong_buffer_cfg={"enable": True, "len": 40})
    DAPORewardManager(tokenizer, 0, overlong_buffer_cfg={"enable": False, "len": 4})  # disabled: nothing required
