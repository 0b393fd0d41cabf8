"""Symbolic answer checking with the ``math-verify`` package (HF), usable from any thread.

``math_verify`` enforces its own time limits with ``signal.alarm``, which only works in the main thread; the reward
managers run scorers in worker threads (for the per-sample timeout), so off the main thread the package's timers
are switched off and the caller's timeout applies instead.
"""

from __future__ import annotations

import threading


def _timeout_seconds(seconds: int) -> int | None:
    """``seconds`` in the main thread (signal-based timers work there), None elsewhere."""
    return seconds if threading.current_thread() is threading.main_thread() else None


def is_equivalent(prediction: str, ground_truth: str, timeout_seconds: int = 5) -> bool:
    """True when math-verify parses both strings and finds them mathematically equal (e.g. ``0.5`` vs ``\\frac12``).

    Both strings are parsed as bare answers (a ``$...$`` wrapper is added so LaTeX is recognised); any parse failure
    counts as "not equivalent", never as an error.
    """
    from math_verify import parse, verify

    timeout = _timeout_seconds(timeout_seconds)
    gold = parse(f"${ground_truth}$", parsing_timeout=timeout)
    pred = parse(f"${prediction}$", parsing_timeout=timeout)
    if not gold or not pred:
        return False
    return bool(verify(gold, pred, timeout_seconds=timeout))


def compute_score(model_output: str, ground_truth: str, timeout_score: float = 0.0) -> float:
    """1.0 when math-verify extracts an answer from ``model_output`` equal to ``ground_truth``, else 0.0.

    ``timeout_score`` is returned when math-verify gives up (parse or comparison time limit).
    """
    from math_verify import parse, verify

    timeout = _timeout_seconds(5)
    try:
        gold = parse(f"\\boxed{{{ground_truth}}}", parsing_timeout=timeout)
        pred = parse(model_output, parsing_timeout=timeout)
        if not gold or not pred:
            return 0.0
        return 1.0 if verify(gold, pred, timeout_seconds=timeout) else 0.0
    except TimeoutError:
        return timeout_score
