"""MATH reward: last-boxed extraction and Hendrycks normalisation (equal answers compare equal as strings)."""

import pytest

from verl.utils.reward_score import math_reward


def test_last_boxed_handles_nesting_fbox_and_unbraced():
    """The LAST box wins; nested braces are matched; \\fbox and "\\boxed 5" forms are recognised."""
    assert math_reward.last_boxed_only_string("a \\boxed{1} b \\boxed{\\frac{1}{2}} c") == "\\boxed{\\frac{1}{2}}"
    assert math_reward.last_boxed_only_string("\\fbox{3}") == "\\fbox{3}"
    assert math_reward.last_boxed_only_string("so $\\boxed 5$.") == "\\boxed 5"
    assert math_reward.last_boxed_only_string("\\boxed{unclosed") is None
    assert math_reward.last_boxed_only_string("no box") is None
    assert math_reward.remove_boxed("\\boxed{\\frac{1}{2}}") == "\\frac{1}{2}"
    with pytest.raises(ValueError):
        math_reward.remove_boxed("\\frac{1}{2}")


@pytest.mark.parametrize(
    ("raw", "normalised"),
    [
        ("\\dfrac{1}{2}", "\\frac{1}{2}"),  # dfrac -> frac
        ("0.5", "\\frac{1}{2}"),  # the one decimal MATH rewrites
        ("1/2", "\\frac{1}{2}"),  # integer a/b -> \frac{a}{b}
        ("\\frac12", "\\frac{1}{2}"),  # shorthand braces
        ("\\sqrt3", "\\sqrt{3}"),
        ("x = 5", "5"),  # short left-hand side dropped
        ("90^\\circ", "90"),
        ("\\left( 1, 2 \\right)", "(1,2)"),
        ("10 \\text{ cm}", "10"),  # trailing unit
        (".25", "0.25"),  # leading zero added
        ("\\$4.50", "4.50"),
    ],
)
def test_strip_string(raw, normalised):
    """Each rewrite of the MATH normalisation, one case each."""
    assert math_reward.strip_string(raw) == normalised


def test_compute_score():
    """1.0 iff the last boxed answer is equivalent after normalisation; no box -> 0.0."""
    assert math_reward.compute_score("so \\boxed{\\dfrac{1}{2}}", "\\frac{1}{2}") == 1.0
    assert math_reward.compute_score("so \\boxed{0.5}", "\\frac12") == 1.0
    assert math_reward.compute_score("so \\boxed{3}", "4") == 0.0
    assert math_reward.compute_score("the answer is 4", "4") == 0.0
    assert math_reward.is_equiv(None, None) and not math_reward.is_equiv("1", None)
