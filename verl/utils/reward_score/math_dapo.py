"""DAPO / AIME rule reward: ``Answer: <x>`` (Minerva style) or the last ``\\boxed{}``, scored +1 / -1.

Contract of upstream ``verl.utils.reward_score.math_dapo.compute_score``: the last 300 characters of the response are
searched, the answer is normalised with the Minerva rules (Lewkowycz et al., 2022, appendix: drop units and filler
words, unwrap ``\\text{}``/``\\boxed{}``, brace ``\\frac``/``\\sqrt`` shorthands, drop thousands separators) and the
result is a dict ``{"score": 1.0 | -1.0, "acc": bool, "pred": str}``.

Differences from upstream, on purpose: when no ``Answer:`` line exists the last ``\\boxed{}`` is used (upstream's
non-strict mode gives up), and when the normalised strings differ, ``math-verify`` decides symbolic equality
(``0.5`` == ``\\frac{1}{2}``).
"""

from __future__ import annotations

import re

from verl.utils.reward_score.math_reward import last_boxed_only_string, remove_boxed
from verl.utils.reward_score.math_verify import is_equivalent

SOLUTION_CLIP_CHARS = 300
INVALID_ANSWER = "[INVALID]"
ANSWER_PATTERN = r"(?i)Answer\s*:\s*([^\n]+)"

# Minerva normalisation tables (paper appendix): literal substitutions, then expressions removed outright.
_SUBSTITUTIONS = (
    ("an ", ""),
    ("a ", ""),
    (".$", "$"),
    ("\\$", ""),
    ("\\ ", ""),
    (" ", ""),
    ("mbox", "text"),
    (",\\text{and}", ","),
    ("\\text{and}", ","),
    ("\\text{m}", "\\text{}"),
)
_REMOVED_EXPRESSIONS = (
    "square",
    "ways",
    "integers",
    "dollars",
    "mph",
    "inches",
    "hours",
    "km",
    "units",
    "\\ldots",
    "sue",
    "points",
    "feet",
    "minutes",
    "digits",
    "cents",
    "degrees",
    "cm",
    "gm",
    "pounds",
    "meters",
    "meals",
    "edges",
    "students",
    "childrentickets",
    "multiples",
    "\\text{s}",
    "\\text{.}",
    "\\text{\ns}",
    "\\text{}^2",
    "\\text{}^3",
    "\\text{\n}",
    "\\text{}",
    "\\mathrm{th}",
    "^\\circ",
    "^{\\circ}",
    "\\;",
    ",\\!",
    "{,}",
    '"',
    "\\dots",
)


def normalize_final_answer(final_answer: str) -> str:
    """Minerva normalisation of an extracted answer string (right-hand side of the last ``=`` only)."""
    final_answer = final_answer.split("=")[-1]
    for old, new in _SUBSTITUTIONS:
        final_answer = final_answer.replace(old, new)
    for expression in _REMOVED_EXPRESSIONS:
        final_answer = final_answer.replace(expression, "")
    # Keep only what is inside the first $...$ pair, then unwrap formatting commands.
    final_answer = re.sub(r"(.*?)(\$)(.*?)(\$)(.*)", "$\\3$", final_answer)
    for command in ("text", "textbf", "overline", "boxed"):
        final_answer = re.sub(r"(\\" + command + r"\{)(.*?)(\})", "\\2", final_answer)
    final_answer = re.sub(r"(frac)([^{])(.)", "frac{\\2}{\\3}", final_answer)
    final_answer = re.sub(r"(sqrt)([^{])", "sqrt{\\2}", final_answer)
    final_answer = final_answer.replace("$", "")
    if final_answer.replace(",", "").isdigit():
        final_answer = final_answer.replace(",", "")
    return final_answer.strip()


def extract_answer(solution_str: str) -> str:
    """The raw answer of a response: the last ``Answer:`` line, else the last boxed content, else ``[INVALID]``."""
    matches = re.findall(ANSWER_PATTERN, solution_str)
    if matches:
        return matches[-1]
    boxed = last_boxed_only_string(solution_str)
    if boxed is not None:
        try:
            return remove_boxed(boxed)
        except ValueError:
            pass
    return INVALID_ANSWER


def is_correct_minerva(solution_str: str, gt: str, gt_need_extract: bool = False) -> tuple[bool, str]:
    """(correct, normalised prediction) for one response; ``gt_need_extract`` unboxes a full-solution ground truth."""
    extracted = extract_answer(solution_str)
    if extracted == INVALID_ANSWER:
        return False, INVALID_ANSWER
    pred = normalize_final_answer(extracted)
    if gt_need_extract:
        boxed = last_boxed_only_string(gt)
        gt = remove_boxed(boxed) if boxed is not None else gt
    gt = normalize_final_answer(gt)
    return (pred == gt or is_equivalent(pred, gt)), pred


def is_correct_strict_box(pred: str, gt: str, pause_tokens_index: list[int] | None = None) -> tuple[int, str | None]:
    """(+1 | -1, boxed content) using only the last ``\\boxed{}`` (after the last pause token when given)."""
    if pause_tokens_index is not None and len(pause_tokens_index) > 0:
        pred = pred[pause_tokens_index[-1] :]
    boxed = last_boxed_only_string(pred)
    extracted = None
    if boxed is not None:
        try:
            extracted = remove_boxed(boxed)
        except ValueError:
            extracted = None
    return (1 if extracted == gt else -1), extracted


def compute_score(
    solution_str: str, ground_truth: str, strict_box_verify: bool = False, pause_tokens_index: list[int] | None = None
) -> dict:
    """``{"score": 1.0 | -1.0, "acc": bool, "pred": str}`` for one response."""
    solution_str = solution_str[-SOLUTION_CLIP_CHARS:]
    ground_truth = str(ground_truth)
    if strict_box_verify:
        correct_sign, pred = is_correct_strict_box(solution_str, ground_truth, pause_tokens_index)
        correct = correct_sign == 1
    else:
        correct, pred = is_correct_minerva(solution_str, ground_truth)
    return {"score": 1.0 if correct else -1.0, "acc": correct, "pred": pred}
