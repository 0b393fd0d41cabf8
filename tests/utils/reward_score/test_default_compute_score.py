"""default_compute_score: dispatch by data_source, upstream return normalisation, clear error for unknown sources."""

import pytest

from verl.utils.reward_score import _default_compute_score, default_compute_score


@pytest.mark.parametrize(
    ("data_source", "response", "truth", "expected"),
    [
        ("openai/gsm8k", "so #### 42", "42", 1.0),
        ("lighteval/MATH", "\\boxed{\\dfrac{1}{2}}", "\\frac{1}{2}", 1.0),
        ("DigitalLearningGmbH/MATH-lighteval", "\\boxed{3}", "4", 0.0),
        ("HuggingFaceH4/MATH-500", "\\boxed{4}", "4", 1.0),
        ("hiyouga/geometry3k", "<think>x</think>\\boxed{5}", "5", 1.0),
    ],
)
def test_float_scorers(data_source, response, truth, expected):
    """Float-returning scorers come back as Python floats."""
    score = default_compute_score(data_source, response, truth)
    assert type(score) is float and score == expected


@pytest.mark.parametrize("data_source", ["math_dapo", "math", "aime2024", "aime25"])
def test_dapo_family_returns_dict(data_source):
    """math_dapo, math and every aime* source route to the DAPO scorer, whose dict is returned unchanged."""
    assert default_compute_score(data_source, "Answer: 204", "204") == {"score": 1.0, "acc": True, "pred": "204"}


def test_extra_arguments_are_accepted():
    """Upstream's keyword arguments (extra_info, sandbox url, semaphore, memory limit, extras) do not break a call."""
    score = default_compute_score(
        "openai/gsm8k", "#### 1", "1", extra_info={"split": "train"}, sandbox_fusion_url=None, memory_limit_mb=1, x=1
    )
    assert score == 1.0
    assert _default_compute_score("openai/gsm8k", "#### 1", "2") == 0.0


def test_unknown_source_names_source_and_custom_function_keys():
    """An unknown data_source raises NotImplementedError naming it and the reward.custom_reward_function keys."""
    with pytest.raises(NotImplementedError, match=r"my_dataset.*reward\.custom_reward_function\.path"):
        default_compute_score("my_dataset", "x", "y")


def test_upstream_only_source_says_which_scorer_is_missing():
    """A source upstream scores with an unshipped scorer says so (not 'unknown')."""
    with pytest.raises(NotImplementedError, match="prime_math"):
        default_compute_score("numina_olympiads", "x", "y")
