"""Geometry3K rule reward: ``0.9 * accuracy + 0.1 * format`` (upstream ``verl.utils.reward_score.geo3k``).

* format: the response is ``<think>...</think>`` followed by text containing ``\\boxed{...}``;
* accuracy: the last boxed content graded against the ground truth by the ``mathruler`` package's grader, as
  upstream does, so geo3k rewards are comparable with upstream runs (mathruler normalises MATH-style, then
  checks sympy equality; its LaTeX parsing needs ``pylatexenc``; both are dependencies).
"""

from __future__ import annotations

import re

_FORMAT_PATTERN = re.compile(r"<think>.*</think>.*\\boxed\{.*\}.*", re.DOTALL)


def _grader():
    try:
        from mathruler import grader
    except ImportError as exc:  # a dependency; a broken install should say what to install
        raise ImportError(
            "the geo3k reward grades with mathruler (as upstream): pip install mathruler pylatexenc"
        ) from exc
    return grader


def extract_boxed_content(predict_str: str) -> str:
    """Contents of the last ``\\boxed{}`` in ``predict_str``; mathruler's string ``"None"`` when there is none
    (kept as upstream has it: it is graded like any other answer)."""
    return _grader().extract_boxed_content(predict_str)


def grade_answer(given_answer: str | None, ground_truth: str) -> bool:
    """mathruler's verdict on ``given_answer`` against ``ground_truth``."""
    if given_answer is None:
        return False
    return bool(_grader().grade_answer(given_answer, str(ground_truth)))


def format_reward(predict_str: str) -> float:
    """1.0 when the response has the ``<think>...</think> ... \\boxed{...}`` shape, else 0.0."""
    return 1.0 if _FORMAT_PATTERN.fullmatch(predict_str) else 0.0


def acc_reward(predict_str: str, ground_truth: str, use_boxed: bool = True) -> float:
    """1.0 when the (boxed, if ``use_boxed``) answer grades equal to ``ground_truth``, else 0.0."""
    answer = extract_boxed_content(predict_str) if use_boxed else predict_str
    return 1.0 if grade_answer(answer, ground_truth) else 0.0


def compute_score(predict_str: str, ground_truth: str, use_boxed: bool = True, format_score: float = 0.1) -> float:
    """``(1 - format_score) * acc + format_score * format``: 1.0, 0.9, 0.1 or 0.0 with the default weight."""
    accuracy = acc_reward(predict_str, ground_truth, use_boxed)
    well_formed = format_reward(predict_str)
    return (1.0 - format_score) * accuracy + format_score * well_formed
