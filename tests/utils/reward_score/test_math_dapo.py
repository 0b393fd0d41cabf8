"""DAPO/AIME reward: Minerva "Answer:" extraction, boxed fallback, +1/-1 dict contract."""

from verl.utils.reward_score import math_dapo


def test_answer_line_is_extracted_and_normalised():
    """The last "Answer:" line wins (case-insensitive); units, $ and thousands separators are normalised away."""
    result = math_dapo.compute_score("Step 1 ... Answer: 12\nrecheck\nanswer: $1,000$ dollars", "1000")
    assert result == {"score": 1.0, "acc": True, "pred": "1000"}


def test_wrong_answer_scores_minus_one():
    """A wrong answer is -1.0 with acc False and the normalised prediction reported."""
    assert math_dapo.compute_score("Answer: 17", "18") == {"score": -1.0, "acc": False, "pred": "17"}


def test_boxed_fallback_and_symbolic_equivalence():
    """Without "Answer:", the last \\boxed{} is used; math-verify accepts 0.5 == \\frac{1}{2}."""
    assert math_dapo.compute_score("thus \\boxed{0.5}", "\\frac{1}{2}")["acc"] is True
    assert math_dapo.compute_score("no answer here", "3") == {"score": -1.0, "acc": False, "pred": "[INVALID]"}


def test_strict_box_mode_compares_raw_boxed_content():
    """strict_box_verify uses only the last box and compares strings exactly."""
    assert math_dapo.compute_score("Answer: 5 but \\boxed{6}", "6", strict_box_verify=True)["score"] == 1.0
    assert math_dapo.compute_score("Answer: 6 and \\boxed{5}", "6", strict_box_verify=True)["score"] == -1.0


def test_normalize_final_answer_rules():
    """Minerva rules: right of the last '=', \\text unwrapped, \\frac/\\sqrt shorthands braced."""
    assert math_dapo.normalize_final_answer("x = \\frac12") == "\\frac{1}{2}"
    assert math_dapo.normalize_final_answer("\\text{(B)}") == "(B)"
    assert math_dapo.normalize_final_answer("\\sqrt2") == "\\sqrt{2}"
    assert math_dapo.normalize_final_answer("5 inches") == "5"
