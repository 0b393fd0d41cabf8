"""GSM8K rule reward: strict "#### <n>" extraction, flexible last-number extraction, scoring contract."""

import pytest

from verl.utils.reward_score import gsm8k


def test_strict_extracts_last_marked_number_without_commas_or_dollars():
    """Strict mode returns the number after the LAST "#### " marker, with "," and "$" removed."""
    text = "Half of 40 is 20.\n#### 7\nWait, redo: 1,200 + 34 = 1,234.\n#### $1,234"
    # The pattern needs a sign or digit right after "#### ", so "#### $1,234" is not a match and "7" is the answer.
    assert gsm8k.extract_solution(text, method="strict") == "7"
    assert gsm8k.extract_solution("so #### 1,234", method="strict") == "1234"
    assert gsm8k.extract_solution("#### -3.5", method="strict") == "-3.5"


def test_strict_requires_marker_flexible_does_not():
    """Without "####" strict finds nothing; flexible takes the last number that is not a lone "."."""
    text = "She has 3 apples and buys 4 more, so 7 apples. ."
    assert gsm8k.extract_solution(text, method="strict") is None
    assert gsm8k.extract_solution(text, method="flexible") == "7"


def test_only_the_last_300_characters_are_searched():
    """An answer marker further than 300 characters from the end is ignored (SOLUTION_CLIP_CHARS)."""
    text = "#### 5" + "x" * 300
    assert gsm8k.extract_solution(text) is None
    assert gsm8k.extract_solution("x" * 1000 + "#### 5") == "5"


def test_compute_score_contract():
    """Correct -> score (1.0), wrong but well-formed -> format_score (0.0), no answer -> 0.0."""
    assert gsm8k.compute_score("#### 72", "72") == 1.0
    assert gsm8k.compute_score("#### 71", "72") == 0.0
    assert gsm8k.compute_score("#### 71", "72", format_score=0.1) == 0.1
    assert gsm8k.compute_score("seventy-two", "72", format_score=0.1) == 0.0
    assert gsm8k.compute_score("#### 72", "72", score=2.0) == 2.0


def test_unknown_method_raises():
    """A typo in method is a user error with a message, not a silent strict fallback."""
    with pytest.raises(ValueError, match="strict"):
        gsm8k.extract_solution("#### 1", method="lenient")
