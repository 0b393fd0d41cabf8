"""Group-relative outcome estimators (GRPO, Dr.GRPO, GDPO, pass@k, RF++-baseline, RLOO, OPO, GPG) on hand-computed
examples, plus loop/vectorized equivalence and input validation."""

import math
from dataclasses import dataclass

import numpy as np
import pytest
import torch

from verl.trainer.ppo.core_algos import (
    compute_gdpo_outcome_advantage,
    compute_gpg_outcome_advantage,
    compute_grpo_outcome_advantage,
    compute_grpo_passk_outcome_advantage,
    compute_grpo_vectorized_outcome_advantage,
    compute_opo_outcome_advantage,
    compute_reinforce_plus_plus_baseline_outcome_advantage,
    compute_rloo_outcome_advantage,
    compute_rloo_vectorized_outcome_advantage,
)

EPS = 1e-6


def _outcome(scores: list[float], lengths: list[int], width: int = 3) -> tuple[torch.Tensor, torch.Tensor]:
    """Token rewards with each score on the response's last token, and the matching response mask."""
    mask = torch.zeros(len(scores), width)
    rewards = torch.zeros(len(scores), width)
    for row, (score, length) in enumerate(zip(scores, lengths)):
        mask[row, :length] = 1
        rewards[row, length - 1] = score
    return rewards, mask


def _per_response(adv: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """The scalar advantage of each response (after checking it is constant on valid tokens and 0 elsewhere)."""
    first = adv[:, 0]
    assert torch.equal(adv, first.unsqueeze(-1) * mask)
    return first


# Two groups of two, interleaved: a = [1, 0], b = [3, 1].
#   a: mean 0.5, unbiased std √((0.25 + 0.25)/1) = √0.5          -> ±0.5/(√0.5 + ε)
#   b: mean 2,   unbiased std √((1 + 1)/1)      = √2            -> ±1/(√2 + ε)
SCORES, LENGTHS, INDEX = [1.0, 3.0, 0.0, 1.0], [3, 2, 1, 3], ["a", "b", "a", "b"]
GRPO_EXPECTED = [
    0.5 / (math.sqrt(0.5) + EPS),
    1 / (math.sqrt(2) + EPS),
    -0.5 / (math.sqrt(0.5) + EPS),
    -1 / (math.sqrt(2) + EPS),
]
DR_GRPO_EXPECTED = [0.5, 1.0, -0.5, -1.0]


@pytest.mark.parametrize("fn", [compute_grpo_outcome_advantage, compute_grpo_vectorized_outcome_advantage])
def test_grpo_two_groups_of_two(fn):
    """GRPO normalises within each uid group by mean and std; the scalar is broadcast over valid tokens only."""
    rewards, mask = _outcome(SCORES, LENGTHS)
    adv, ret = fn(rewards, mask, np.array(INDEX, dtype=object))
    assert ret is adv
    torch.testing.assert_close(_per_response(adv, mask), torch.tensor(GRPO_EXPECTED), atol=1e-6, rtol=0)


@pytest.mark.parametrize("fn", [compute_grpo_outcome_advantage, compute_grpo_vectorized_outcome_advantage])
def test_dr_grpo_does_not_divide_by_std(fn):
    """norm_adv_by_std_in_grpo=False (Dr.GRPO) gives s − mean: a ±0.5, b ±1."""
    rewards, mask = _outcome(SCORES, LENGTHS)
    adv, _ = fn(rewards, mask, INDEX, norm_adv_by_std_in_grpo=False)
    torch.testing.assert_close(_per_response(adv, mask), torch.tensor(DR_GRPO_EXPECTED), atol=1e-6, rtol=0)


@pytest.mark.parametrize("fn", [compute_grpo_outcome_advantage, compute_grpo_vectorized_outcome_advantage])
def test_grpo_singleton_group_gets_mean_0_std_1(fn):
    """A group of one (uid c, score 5) keeps its raw score: (5 − 0)/(1 + ε)."""
    rewards, mask = _outcome([1.0, 0.0, 5.0], [1, 1, 1])
    adv, _ = fn(rewards, mask, ["a", "a", "c"])
    assert _per_response(adv, mask)[2].item() == pytest.approx(5 / (1 + EPS), abs=1e-6)


@pytest.mark.parametrize("index", [INDEX, np.array(INDEX, dtype=object), torch.tensor([0, 1, 0, 1])])
def test_grpo_accepts_list_numpy_and_tensor_index(index):
    """The group labels may be a list, an object numpy array (the trainer's uid column) or a tensor."""
    rewards, mask = _outcome(SCORES, LENGTHS)
    adv, _ = compute_grpo_outcome_advantage(rewards, mask, index)
    torch.testing.assert_close(_per_response(adv, mask), torch.tensor(GRPO_EXPECTED), atol=1e-6, rtol=0)


def _random_groups(seed: int, sizes: list[int]):
    gen = torch.Generator().manual_seed(seed)
    index = [f"uid{g}" for g, size in enumerate(sizes) for _ in range(size)]
    order = torch.randperm(len(index), generator=gen).tolist()
    index = [index[i] for i in order]
    rewards = torch.randn(len(index), 5, generator=gen)
    mask = (torch.rand(len(index), 5, generator=gen) > 0.3).float()
    mask[:, 0] = 1
    return rewards, mask, np.array(index, dtype=object)


@pytest.mark.parametrize("norm", [True, False])
def test_grpo_vectorized_equals_loop(norm):
    """The scatter implementation equals the per-group loop on random shuffled groups of sizes 1..5 (fp32, 1e-5:
    two reduction orders)."""
    rewards, mask, index = _random_groups(0, [1, 2, 3, 4, 5, 2])
    loop, _ = compute_grpo_outcome_advantage(rewards, mask, index, norm_adv_by_std_in_grpo=norm)
    vec, _ = compute_grpo_vectorized_outcome_advantage(rewards, mask, index, norm_adv_by_std_in_grpo=norm)
    torch.testing.assert_close(vec, loop, atol=1e-5, rtol=0)


def test_rloo_leave_one_out():
    """Group a = [1, 0, 2]: s_i − mean of the others = [1 − 1, 0 − 1.5, 2 − 0.5] = [0, −1.5, 1.5].
    Singleton c = 4: the loop version keeps the raw score 4, the vectorized one gives 0 (upstream behaviour)."""
    rewards, mask = _outcome([1.0, 0.0, 2.0, 4.0], [1, 2, 3, 1])
    index = ["a", "a", "a", "c"]
    loop, _ = compute_rloo_outcome_advantage(rewards, mask, index)
    vec, _ = compute_rloo_vectorized_outcome_advantage(rewards, mask, index)
    torch.testing.assert_close(_per_response(loop, mask), torch.tensor([0.0, -1.5, 1.5, 4.0]), atol=1e-6, rtol=0)
    torch.testing.assert_close(_per_response(vec, mask), torch.tensor([0.0, -1.5, 1.5, 0.0]), atol=1e-6, rtol=0)


def test_rloo_vectorized_equals_loop_for_groups_of_two_or_more():
    """Both RLOO implementations agree on random groups of size ≥ 2."""
    rewards, mask, index = _random_groups(1, [2, 3, 4, 5])
    loop, _ = compute_rloo_outcome_advantage(rewards, mask, index)
    vec, _ = compute_rloo_vectorized_outcome_advantage(rewards, mask, index)
    torch.testing.assert_close(vec, loop, atol=1e-5, rtol=0)


def test_reinforce_plus_plus_baseline():
    """Centred scores a [0.5, −0.5], b [1, −1], broadcast over lengths [2, 2, 1, 1] -> token values
    [0.5, 0.5, −0.5, −0.5, 1, −1]: mean 0, unbiased var (4·0.25 + 2)/5 = 0.6 -> each divided by √0.6."""
    rewards, mask = _outcome([1.0, 0.0, 3.0, 1.0], [2, 2, 1, 1])
    adv, _ = compute_reinforce_plus_plus_baseline_outcome_advantage(rewards, mask, ["a", "a", "b", "b"])
    expected = torch.tensor([0.5, -0.5, 1.0, -1.0]) / math.sqrt(0.6)
    torch.testing.assert_close(_per_response(adv, mask), expected, atol=1e-5, rtol=0)


def test_opo_length_weighted_baseline():
    """Group a: scores [1, 0], lengths [1, 3] -> baseline (1·1 + 3·0)/4 = 0.25 -> [0.75, −0.25]; singleton c keeps 2."""
    rewards, mask = _outcome([1.0, 0.0, 2.0], [1, 3, 2])
    adv, _ = compute_opo_outcome_advantage(rewards, mask, ["a", "a", "c"])
    torch.testing.assert_close(_per_response(adv, mask), torch.tensor([0.75, -0.25, 2.0]), atol=1e-6, rtol=0)


@pytest.mark.parametrize("f_norm, expected", [(1.0, [2.0, -2.0, 0.0, 0.0]), (2.0, [1.0, -1.0, 0.0, 0.0])])
def test_gpg_alpha_rescales_for_zero_score_groups(f_norm, expected):
    """Scores a [1, 0], b [0, 0]: 1 non-zero of 4 -> α = 4; α·(s − mean)/f_norm = 4·[0.5, −0.5, 0, 0]/f_norm."""
    rewards, mask = _outcome([1.0, 0.0, 0.0, 0.0], [1, 1, 2, 2])
    adv, _ = compute_gpg_outcome_advantage(rewards, mask, ["a", "a", "b", "b"], f_norm=f_norm)
    torch.testing.assert_close(_per_response(adv, mask), torch.tensor(expected), atol=1e-6, rtol=0)


@dataclass
class _AlgoCfg:
    norm_adv_by_std_in_grpo: bool = True


def test_grpo_passk_credits_only_the_best_response():
    """Group a = [0, 1, 2]: only the best (row 2) gets s_max − s_second = 1, divided by std (mean 1, devs −1, 0, 1,
    unbiased var 2/2 = 1) + ε. Group b = [3, 3]: tie -> credit 0. With config norm False: credit 1."""
    rewards, mask = _outcome([0.0, 1.0, 2.0, 3.0, 3.0], [1, 2, 3, 1, 1])
    index = ["a", "a", "a", "b", "b"]
    adv, _ = compute_grpo_passk_outcome_advantage(rewards, mask, index)
    torch.testing.assert_close(_per_response(adv, mask), torch.tensor([0, 0, 1 / (1 + EPS), 0, 0]), atol=1e-6, rtol=0)
    adv, _ = compute_grpo_passk_outcome_advantage(rewards, mask, index, config=_AlgoCfg(norm_adv_by_std_in_grpo=False))
    torch.testing.assert_close(_per_response(adv, mask), torch.tensor([0.0, 0.0, 1.0, 0.0, 0.0]), atol=1e-6, rtol=0)


def test_grpo_passk_rejects_singleton_groups():
    """pass@k needs two responses per prompt; a group of one raises ValueError naming rollout.n."""
    rewards, mask = _outcome([0.0, 1.0, 2.0], [1, 1, 1])
    with pytest.raises(ValueError, match="rollout.n"):
        compute_grpo_passk_outcome_advantage(rewards, mask, ["a", "a", "c"])


@dataclass
class _GDPOCfg:
    gdpo_reward_keys: tuple = ("fmt", "acc")
    gdpo_reward_weights: tuple | None = (1.0, 2.0)
    norm_adv_by_std_in_grpo: bool = True


def test_gdpo_normalises_each_component_then_whitens():
    """Groups a (rows 0, 1), b (rows 2, 3); fmt = [1, 0, 1, 1], acc = [1, 1, 1, 0], weights [1, 2].
    GRPO(fmt): a ±g, b 0; GRPO(acc): a 0, b ±g, with g = 0.5/(√0.5 + ε).
    Weighted sum per response [g, −g, 2g, −2g], broadcast over lengths [3, 2, 3, 1], then whitened over all valid
    tokens: values [g,g,g, −g,−g, 2g,2g,2g, −2g]."""
    lengths = [3, 2, 3, 1]
    _, mask = _outcome([0.0] * 4, lengths)
    batch = {"prompts": torch.zeros(4, 2), "attention_mask": torch.cat([torch.ones(4, 2), mask], dim=1)}
    non_tensor = {"fmt": np.array([1, 0, 1, 1]), "acc": np.array([1, 1, 1, 0])}
    adv, _ = compute_gdpo_outcome_advantage(
        torch.zeros(4, 3), mask, ["a", "a", "b", "b"], config=_GDPOCfg(), non_tensor_batch=non_tensor, batch=batch
    )
    g = 0.5 / (math.sqrt(0.5) + EPS)
    per_response = [g, -g, 2 * g, -2 * g]
    tokens = [v for v, n in zip(per_response, lengths) for _ in range(n)]
    mean = sum(tokens) / len(tokens)
    std = math.sqrt(sum((t - mean) ** 2 for t in tokens) / (len(tokens) - 1))
    expected = [(v - mean) / std for v in per_response]
    torch.testing.assert_close(_per_response(adv, mask), torch.tensor(expected), atol=1e-5, rtol=0)


def test_gdpo_without_components_is_whitened_grpo():
    """Without config/batch, GDPO has one component (token_level_rewards): whiten(GRPO)·mask."""
    rewards, mask = _outcome(SCORES, LENGTHS)
    adv, _ = compute_gdpo_outcome_advantage(rewards, mask, INDEX)
    grpo, _ = compute_grpo_outcome_advantage(rewards, mask, INDEX)
    valid = grpo[mask.bool()]
    expected = (valid - valid.mean()) / valid.std()
    torch.testing.assert_close(adv[mask.bool()], expected, atol=1e-5, rtol=0)


def test_gdpo_missing_component_names_the_key():
    """A reward key absent from the batch raises ValueError naming it and the config key."""
    _, mask = _outcome([0.0, 0.0], [1, 1])
    batch = {"prompts": torch.zeros(2, 1), "attention_mask": torch.ones(2, 4)}
    with pytest.raises(ValueError, match="'acc'.*gdpo_reward_keys"):
        compute_gdpo_outcome_advantage(
            torch.zeros(2, 3), mask, ["a", "a"], config=_GDPOCfg(), non_tensor_batch={"fmt": [1, 0]}, batch=batch
        )


ALL_GROUP_FNS = [
    compute_grpo_outcome_advantage,
    compute_grpo_vectorized_outcome_advantage,
    compute_gdpo_outcome_advantage,
    compute_grpo_passk_outcome_advantage,
    compute_reinforce_plus_plus_baseline_outcome_advantage,
    compute_rloo_outcome_advantage,
    compute_rloo_vectorized_outcome_advantage,
    compute_opo_outcome_advantage,
    compute_gpg_outcome_advantage,
]


@pytest.mark.parametrize("fn", ALL_GROUP_FNS)
def test_shape_and_index_validation(fn):
    """Mismatched rewards/mask shapes, and an index whose length is not the batch size, raise ValueError."""
    with pytest.raises(ValueError, match="same shape"):
        fn(torch.zeros(2, 3), torch.ones(2, 4), ["a", "a"])
    with pytest.raises(ValueError, match="index has 3 entries"):
        fn(torch.zeros(2, 3), torch.ones(2, 3), ["a", "a", "b"])
