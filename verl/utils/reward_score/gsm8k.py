"""GSM8K rule reward: the number after ``####`` in the response, compared as a string with the ground truth.

Same contract as upstream ``verl.utils.reward_score.gsm8k``: only the last 300 characters of the response are
searched (long responses are truncated chain-of-thought; the answer sits at the end), commas and dollar signs
are dropped from the extracted number, and the comparison is an exact string match.
"""

from __future__ import annotations

import re

# Only the tail of the response is searched: the final answer is the last thing a well-formed response says,
# and scanning the whole text would reward numbers quoted mid-reasoning.
SOLUTION_CLIP_CHARS = 300

_STRICT_PATTERN = re.compile(r"#### (\-?[0-9\.\,]+)")
_FLEXIBLE_PATTERN = re.compile(r"(\-?[0-9\.\,]+)")
_NOT_A_NUMBER = ("", ".")


def _clean_number(text: str) -> str:
    """Drop thousands separators and currency signs: "1,000" and "$1000" both mean 1000."""
    return text.replace(",", "").replace("$", "")


def extract_solution(solution_str: str, method: str = "strict") -> str | None:
    """Return the final numeric answer of a response, or None when it has none.

    ``strict`` requires the ``#### <number>`` marker (the format the prompt asks for); ``flexible`` takes the last
    number anywhere in the (clipped) response.
    """
    if method not in ("strict", "flexible"):
        raise ValueError(f"gsm8k extract_solution: method must be 'strict' or 'flexible', got {method!r}")
    tail = solution_str[-SOLUTION_CLIP_CHARS:]
    if method == "strict":
        matches = _STRICT_PATTERN.findall(tail)
        return _clean_number(matches[-1]) if matches else None
    for candidate in reversed(_FLEXIBLE_PATTERN.findall(tail)):
        if candidate not in _NOT_A_NUMBER:
            return _clean_number(candidate)
    return None


def compute_score(
    solution_str: str, ground_truth: str, method: str = "strict", format_score: float = 0.0, score: float = 1.0
) -> float:
    """``score`` for a correct answer, ``format_score`` for a well-formed wrong one, 0 when no answer is found."""
    answer = extract_solution(solution_str, method=method)
    if answer is None:
        return 0.0
    return score if answer == str(ground_truth) else format_score
