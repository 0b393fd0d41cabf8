"""Geometry3K reward: 0.9 * accuracy + 0.1 * format, graded by mathruler as upstream.

The reference is upstream's scorer written out from its definition (mathruler's ``extract_boxed_content`` and
``grade_answer``, upstream's format regex, ``(1 - w) * acc + w * format``), compared on a table of 24 cases; a
few cases also carry the value worked out by hand. mathruler (and pylatexenc, which its LaTeX parsing imports)
are dependencies of the package.
"""

import re

import pytest
from mathruler import grader

from verl.utils.reward_score import geo3k

WELL_FORMED_RIGHT = "<think>area = 6</think> The answer is \\boxed{6}."


def upstream_geo3k(predict_str: str, ground_truth: str, use_boxed: bool = True, format_score: float = 0.1) -> float:
    """Upstream's geo3k score, from its definition."""
    well_formed = 1.0 if re.fullmatch(r"<think>.*</think>.*\\boxed\{.*\}.*", predict_str, re.DOTALL) else 0.0
    answer = grader.extract_boxed_content(predict_str) if use_boxed else predict_str
    accuracy = 1.0 if grader.grade_answer(answer, ground_truth) else 0.0
    return (1.0 - format_score) * accuracy + format_score * well_formed


CASES = [
    # (response, ground truth, hand-worked score or None)
    (WELL_FORMED_RIGHT, "6", 1.0),  # 0.9 * 1 + 0.1 * 1
    ("The answer is \\boxed{6}.", "6", 0.9),  # right, no <think>: 0.9 * 1 + 0.1 * 0
    ("<think>guess</think> \\boxed{7}", "6", 0.1),  # wrong but well-formed: 0.9 * 0 + 0.1 * 1
    ("six", "6", 0.0),  # no box, no format
    ("<think>r</think> \\boxed{2\\sqrt{3}}", "2\\sqrt{3}", 1.0),
    ("<think>r</think> \\boxed{\\frac{40}{3}}", "\\frac{40}{3}", 1.0),
    ("<think>r</think> \\boxed{\\frac{40}{3}}", "40/3", None),
    ("<think>r</think> \\boxed{2\\sqrt{3}}", "\\sqrt{12}", None),
    ("<think>r</think> \\boxed{13.5}", "13.5", None),
    ("<think>r</think> \\boxed{27/2}", "13.5", None),
    ("<think>r</think> \\boxed{60^\\circ}", "60", None),
    ("<think>r</think> \\boxed{60}", "60", 1.0),
    ("<think>r</think> \\boxed{x=5}", "5", None),
    ("<think>r</think> \\boxed{5}", "5.0", None),
    ("<think>r</think> \\boxed{\\pi}", "\\pi", None),
    ("<think>r</think> \\boxed{3\\pi}", "3 \\pi", None),
    ("<think>r</think> \\boxed{}", "0", None),
    ("\\boxed{6} then \\boxed{7}", "7", None),  # the last box counts
    ("<think>a</think><think>b</think> \\boxed{4}", "4", None),
    ("<think>no box</think> 6", "6", None),
    ("<think>r</think> \\boxed{\\frac{1}{2}}", "0.5", None),
    ("<think>r</think> \\boxed{2/4}", "1/2", None),
    ("<think>r</think> \\boxed{8\\sqrt{2}}", "8 \\sqrt { 2 }", None),
    ("<think>r</think> \\boxed{None}", "None", None),
]


@pytest.mark.parametrize(("response", "truth", "expected"), CASES)
def test_equals_upstreams_mathruler_scorer(response, truth, expected):
    ours = geo3k.compute_score(response, truth)
    assert ours == upstream_geo3k(response, truth)
    if expected is not None:
        assert ours == pytest.approx(expected, abs=1e-12)


def test_table_is_large_enough_and_covers_every_score():
    assert len(CASES) >= 20
    assert {upstream_geo3k(r, t) for r, t, _ in CASES} >= {0.0, 0.1, 0.9, 1.0}


def test_format_weight_is_configurable():
    """format_score=0.5: a right answer without format scores 0.5 * 1 + 0.5 * 0 = 0.5."""
    assert geo3k.compute_score("\\boxed{6}", "6", format_score=0.5) == pytest.approx(0.5, abs=1e-12)
    assert geo3k.compute_score("6", "6", use_boxed=False) == upstream_geo3k("6", "6", use_boxed=False)
