"""Rule-based reward functions and the ``default_compute_score`` dispatcher (upstream ``verl.utils.reward_score``).

``default_compute_score(data_source, solution_str, ground_truth, extra_info=None, ...)`` picks a scorer from the
row's ``data_source`` column (the one the preprocessing scripts in ``examples/data_preprocess`` write):

==========================================================  ===============================================
data_source                                                 scorer
==========================================================  ===============================================
``openai/gsm8k``, ``verl_sample/gsm8k_format``               ``gsm8k`` (``#### <number>``, strict)
``lighteval/MATH``, ``DigitalLearningGmbH/MATH-lighteval``,  ``math_reward`` (last ``\\boxed{}``, MATH normalisation)
``HuggingFaceH4/MATH-500``
``math_dapo``, ``math``, ``math_dapo_reasoning``, ``aime*``  ``math_dapo`` (dict with score / acc / pred)
``hiyouga/geometry3k``                                      ``geo3k`` (0.9 accuracy + 0.1 format)
==========================================================  ===============================================

Any other source raises ``NotImplementedError`` that says how to plug in a custom reward function.
Scorers are imported lazily so that importing this package stays cheap.
"""

from __future__ import annotations

from typing import Any

__all__ = ["default_compute_score", "_default_compute_score", "get_default_compute_score", "SUPPORTED_DATA_SOURCES"]

_MATH_SOURCES = ("lighteval/MATH", "DigitalLearningGmbH/MATH-lighteval", "HuggingFaceH4/MATH-500")
_DAPO_SOURCES = ("math_dapo", "math", "math_dapo_reasoning")
_GSM8K_SOURCES = ("openai/gsm8k", "verl_sample/gsm8k_format")  # the dataset, and the shipped sample in its format
SUPPORTED_DATA_SOURCES = (*_GSM8K_SOURCES, *_MATH_SOURCES, *_DAPO_SOURCES, "aime*", "hiyouga/geometry3k")

# Upstream scores these with scorers verl-ascend does not ship (code sandboxes, PRIME, Search-R1); named here so
# the error can say so instead of claiming the source is unknown.
_UPSTREAM_ONLY_SOURCES = {
    "numina_aops_forum": "prime_math",
    "numina_synthetic_math": "prime_math",
    "numina_amc_aime": "prime_math",
    "numina_synthetic_amc": "prime_math",
    "numina_cn_k12": "prime_math",
    "numina_olympiads": "prime_math",
    "codecontests": "sandbox_fusion / prime_code",
    "apps": "sandbox_fusion / prime_code",
    "codeforces": "sandbox_fusion / prime_code",
    "taco": "sandbox_fusion / prime_code",
    "searchR1_nq": "search_r1_like_qa_em",
    "searchR1_triviaqa": "search_r1_like_qa_em",
    "searchR1_popqa": "search_r1_like_qa_em",
    "searchR1_hotpotqa": "search_r1_like_qa_em",
    "searchR1_2wikimultihopqa": "search_r1_like_qa_em",
    "searchR1_musique": "search_r1_like_qa_em",
    "searchR1_bamboogle": "search_r1_like_qa_em",
}

_CUSTOM_FUNCTION_HINT = (
    "To score it, write `def compute_score(data_source, solution_str, ground_truth, extra_info=None)` returning a "
    "float (or a dict with a 'score' key) in a Python file and pass "
    "reward.custom_reward_function.path=/path/to/file.py reward.custom_reward_function.name=compute_score "
    "(legacy key: custom_reward_function.path / .name)."
)


def _unsupported(data_source: str) -> NotImplementedError:
    """The error for a data_source with no built-in scorer, naming the source and the custom-function fix."""
    upstream_scorer = _UPSTREAM_ONLY_SOURCES.get(data_source)
    if upstream_scorer is not None:
        reason = f"upstream verl scores it with `{upstream_scorer}`, which verl-ascend does not ship."
    else:
        reason = f"built-in scorers exist for: {', '.join(SUPPORTED_DATA_SOURCES)}."
    return NotImplementedError(
        f"Reward function is not implemented for data_source={data_source!r}: {reason} {_CUSTOM_FUNCTION_HINT}"
    )


def _normalise_result(result: Any) -> float | dict:
    """Upstream's return contract: dicts unchanged, numbers (incl. bool) as float, sequences by their first item."""
    if isinstance(result, dict):
        return result
    if isinstance(result, (int, float, bool)):
        return float(result)
    return float(result[0])


def _dispatch(data_source: str, solution_str: str, ground_truth: Any) -> Any:
    """Raw scorer result for a supported ``data_source``; raises NotImplementedError otherwise."""
    if data_source in _GSM8K_SOURCES:
        from verl.utils.reward_score import gsm8k

        return gsm8k.compute_score(solution_str, ground_truth)
    if data_source in _MATH_SOURCES:
        from verl.utils.reward_score import math_reward

        return math_reward.compute_score(solution_str, ground_truth)
    if data_source in _DAPO_SOURCES or data_source.startswith("aime"):
        from verl.utils.reward_score import math_dapo

        return math_dapo.compute_score(solution_str, ground_truth)
    if data_source == "hiyouga/geometry3k":
        from verl.utils.reward_score import geo3k

        return geo3k.compute_score(solution_str, ground_truth)
    raise _unsupported(data_source)


def default_compute_score(
    data_source: str,
    solution_str: str,
    ground_truth: Any,
    extra_info: dict | None = None,
    sandbox_fusion_url: str | None = None,
    concurrent_semaphore: Any = None,
    memory_limit_mb: int | None = None,
    **kwargs: Any,
) -> float | dict:
    """Score one decoded response with the built-in rule for its ``data_source``.

    ``extra_info``, the sandbox arguments and ``**kwargs`` are accepted for signature compatibility with upstream;
    the built-in scorers do not use them (no code-execution sandbox is shipped).
    """
    del extra_info, sandbox_fusion_url, concurrent_semaphore, memory_limit_mb, kwargs
    return _normalise_result(_dispatch(str(data_source), solution_str, ground_truth))


def _default_compute_score(*args: Any, **kwargs: Any) -> float | dict:
    """Deprecated upstream alias of :func:`default_compute_score`."""
    return default_compute_score(*args, **kwargs)


def get_default_compute_score(reward_name: str | None = None):
    """Upstream (HEAD) accessor: the built-in scorer; ``reward_name`` other than None/"default" is not supported."""
    if reward_name not in (None, "default"):
        raise ValueError(
            f"get_default_compute_score: unknown reward_name {reward_name!r}; only 'default' exists. "
            + _CUSTOM_FUNCTION_HINT
        )
    return default_compute_score
