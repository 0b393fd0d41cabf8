"""Geometry3K reward: 0.9 * accuracy + 0.1 * format, boxed grading without mathruler."""

import pytest

from verl.utils.reward_score import geo3k

WELL_FORMED_RIGHT = "<think>area = 6</think> The answer is \\boxed{6}."


@pytest.mark.parametrize(
    ("response", "truth", "expected"),
    [
        (WELL_FORMED_RIGHT, "6", 1.0),  # 0.9 * 1 + 0.1 * 1
        ("The answer is \\boxed{6}.", "6", 0.9),  # right, no <think>: 0.9 * 1 + 0.1 * 0
        ("<think>guess</think> \\boxed{7}", "6", 0.1),  # wrong but well-formed: 0.9 * 0 + 0.1 * 1
        ("six", "6", 0.0),
        ("<think>r</think> \\boxed{2\\sqrt{3}}", "\\sqrt{12}", 1.0),  # symbolic equality via math-verify
        ("<think>r</think> \\boxed{\\frac{40}{3}}", "40/3", 1.0),  # normalised a/b
    ],
)
def test_compute_score(response, truth, expected):
    """Score table for the four accuracy/format combinations plus two equivalence cases."""
    assert geo3k.compute_score(response, truth) == pytest.approx(expected, abs=1e-12)


def test_format_weight_is_configurable():
    """format_score=0.5: a right answer without format scores 0.5 * 1 + 0.5 * 0 = 0.5."""
    assert geo3k.compute_score("\\boxed{6}", "6", format_score=0.5) == pytest.approx(0.5, abs=1e-12)


def test_empty_box_is_not_correct():
    """An empty \\boxed{} never grades as correct, even against an empty-looking truth."""
    assert geo3k.acc_reward("\\boxed{}", "0") == 0.0
