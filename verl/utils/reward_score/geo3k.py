"""Geometry3K rule reward: ``0.9 * accuracy + 0.1 * format`` (upstream ``verl.utils.reward_score.geo3k``).

* format: the response is ``<think>...</think>`` followed by text containing ``\\boxed{...}``;
* accuracy: the last boxed content graded against the ground truth.

Upstream grades with the ``mathruler`` package, which is not installed here. Grading is done instead by
MATH-style string normalisation (``math_reward.strip_string``) and, when the strings differ, ``math-verify``
symbolic equality (``2\\sqrt{3}`` == ``\\sqrt{12}``).
"""

from __future__ import annotations

import re

from verl.utils.reward_score.math_reward import last_boxed_only_string, remove_boxed, strip_string
from verl.utils.reward_score.math_verify import is_equivalent

_FORMAT_PATTERN = re.compile(r"<think>.*</think>.*\\boxed\{.*\}.*", re.DOTALL)


def extract_boxed_content(predict_str: str) -> str | None:
    """Contents of the last ``\\boxed{}`` in ``predict_str``; None when there is none."""
    boxed = last_boxed_only_string(predict_str)
    if boxed is None:
        return None
    try:
        return remove_boxed(boxed)
    except ValueError:
        return None


def grade_answer(given_answer: str | None, ground_truth: str) -> bool:
    """True when the answer equals the ground truth after normalisation or symbolically."""
    if given_answer is None:
        return False
    given, truth = strip_string(given_answer.strip()), strip_string(str(ground_truth).strip())
    if not given:
        return False
    return given == truth or is_equivalent(given, truth)


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
