"""MATH (Hendrycks et al., 2021) rule reward: the last ``\\boxed{}`` of the response against the ground truth.

Both sides go through the MATH benchmark's string normalisation (``strip_string``): spacing, ``\\left``/``\\right``,
``dfrac``/``tfrac``, degrees, dollar signs, trailing units, leading ``x =``, ``\\sqrt3`` and ``\\frac12`` shorthands,
``a/b`` fractions and ``0.5``. Equal normalised strings score 1.0, anything else 0.0 — the upstream contract of
``verl.utils.reward_score.math_reward``.
"""

from __future__ import annotations

import re

_BOX_COMMANDS = ("\\boxed", "\\fbox")


def _matching_brace_end(text: str, start: int) -> int | None:
    """Index of the ``}`` that closes the first ``{`` at or after ``start``; None when unbalanced."""
    depth = 0
    for pos in range(start, len(text)):
        if text[pos] == "{":
            depth += 1
        elif text[pos] == "}":
            depth -= 1
            if depth == 0:
                return pos
    return None


def last_boxed_only_string(string: str) -> str | None:
    """The last ``\\boxed{...}`` (or ``\\fbox{...}``, or ``\\boxed x`` without braces) in ``string``, markers included."""
    start = string.rfind("\\boxed")
    if start < 0:
        start = string.rfind("\\fbox")
        if start < 0:
            return None
    if string.startswith("\\boxed ", start):
        # "\boxed 5$": the argument runs to the next "$" (inline-maths end) or the end of the text.
        return "\\boxed " + string[start + len("\\boxed ") :].split("$")[0]
    end = _matching_brace_end(string, start)
    return None if end is None else string[start : end + 1]


def remove_boxed(s: str) -> str:
    """Strip the ``\\boxed{`` ... ``}`` (or ``\\fbox``) wrapper; raise ValueError when ``s`` is not one."""
    if s.startswith("\\boxed "):
        return s[len("\\boxed ") :]
    for command in _BOX_COMMANDS:
        prefix = command + "{"
        if s.startswith(prefix) and s.endswith("}"):
            return s[len(prefix) : -1]
    raise ValueError(f"not a boxed expression: {s[:80]!r}")


def _fix_fracs(string: str) -> str:
    """``\\frac12`` -> ``\\frac{1}{2}``, ``\\frac1{7}`` -> ``\\frac{1}{7}``: give both arguments braces."""
    parts = string.split("\\frac")
    out = parts[0]
    for part in parts[1:]:
        out += "\\frac"
        if part.startswith("{") or len(part) < 2:
            out += part
            continue
        numerator, rest = part[0], part[1:]
        if rest.startswith("{"):
            out += "{" + numerator + "}" + rest
        else:
            out += "{" + numerator + "}{" + rest[0] + "}" + rest[1:]
    return out


def _fix_a_slash_b(string: str) -> str:
    """``3/4`` (two integers) -> ``\\frac{3}{4}``; anything else unchanged."""
    match = re.fullmatch(r"(-?\d+)/(\d+)", string)
    if match is None:
        return string
    return "\\frac{" + match.group(1) + "}{" + match.group(2) + "}"


def _remove_right_units(string: str) -> str:
    """``5 \\text{ cm}`` -> ``5 ``: MATH writes units as a trailing ``\\text{ ...}``."""
    return string.split("\\text{ ")[0] if "\\text{ " in string else string


def _fix_sqrt(string: str) -> str:
    """``\\sqrt3`` -> ``\\sqrt{3}``: give a bare one-character argument braces."""
    return re.sub(r"\\sqrt(?!\{)(\w)", r"\\sqrt{\1}", string)


def _strip_decorations(string: str) -> str:
    """Remove markup that does not change the value: line breaks, spacing commands, delimiters, degrees, dollars."""
    for old, new in (
        ("\n", ""),
        ("\\!", ""),
        ("\\\\", "\\"),
        ("tfrac", "frac"),
        ("dfrac", "frac"),
        ("\\left", ""),
        ("\\right", ""),
        ("^{\\circ}", ""),
        ("^\\circ", ""),
        ("\\$", ""),
    ):
        string = string.replace(old, new)
    return string


def strip_string(string: str) -> str:
    """Normalise a MATH answer string so that equal answers compare equal as strings."""
    string = _remove_right_units(_strip_decorations(string))
    string = string.replace("\\%", "").replace("%", "")
    # " .5" and "{.5" -> " 0.5" and "{0.5"; a leading "." gets a leading 0.
    string = string.replace(" .", " 0.").replace("{.", "{0.")
    if not string:
        return string
    if string[0] == ".":
        string = "0" + string
    # "k = 3" -> "3", but only for short left-hand sides (a variable name), not for equations.
    sides = string.split("=")
    if len(sides) == 2 and len(sides[0]) <= 2:
        string = sides[1]
    string = _fix_sqrt(string).replace(" ", "")
    string = _fix_fracs(string)
    if string == "0.5":
        string = "\\frac{1}{2}"
    return _fix_a_slash_b(string)


def is_equiv(str1: str | None, str2: str | None) -> bool:
    """True when both answers normalise to the same string (two missing answers count as equal)."""
    if str1 is None or str2 is None:
        return str1 is None and str2 is None
    return strip_string(str1) == strip_string(str2)


def compute_score(solution_str: str, ground_truth: str) -> float:
    """1.0 when the last boxed answer of ``solution_str`` is equivalent to ``ground_truth``, else 0.0."""
    boxed = last_boxed_only_string(solution_str)
    if boxed is None:
        return 0.0
    try:
        answer = remove_boxed(boxed)
    except ValueError:
        return 0.0
    return 1.0 if is_equiv(answer, str(ground_truth)) else 0.0
