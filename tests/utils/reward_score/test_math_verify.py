"""math-verify wrapper: symbolic equality, and it works off the main thread (where math-verify's signal timers
cannot run) — the reward managers call scorers from worker threads."""

import threading

from verl.utils.reward_score import math_verify


def test_equivalence_and_compute_score():
    """0.5 == 1/2 symbolically, 2*sqrt(3) == sqrt(12); unparsable text is simply not equivalent."""
    assert math_verify.is_equivalent("0.5", "\\frac{1}{2}")
    assert math_verify.is_equivalent("2\\sqrt{3}", "\\sqrt{12}")
    assert not math_verify.is_equivalent("3", "4")
    assert not math_verify.is_equivalent("}{", "4")
    assert math_verify.compute_score("so the answer is \\boxed{\\frac{1}{2}}", "0.5") == 1.0
    assert math_verify.compute_score("so the answer is \\boxed{3}", "0.5") == 0.0


def test_works_in_a_worker_thread():
    """Called from a non-main thread the result is the same (no 'signal only works in main thread' error)."""
    results = {}

    def run():
        results["eq"] = math_verify.is_equivalent("0.5", "\\frac{1}{2}")
        results["score"] = math_verify.compute_score("\\boxed{4}", "4")

    thread = threading.Thread(target=run)
    thread.start()
    thread.join(timeout=60)
    assert results == {"eq": True, "score": 1.0}
