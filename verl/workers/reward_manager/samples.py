"""Decode the rows of a rollout batch into the strings and metadata a reward function is called with.

Layout of the batch (``DataProto``): ``prompts (B, P)`` left-padded, ``responses (B, R)`` right-padded,
``attention_mask (B, P + R)``; non-tensor columns ``reward_model`` (``{"ground_truth": ...}``), the
``reward_fn_key`` column (``data_source``) and optionally ``extra_info``, ``__num_turns__``,
``rollout_reward_scores``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

REQUIRED_TENSORS = ("prompts", "responses", "attention_mask")


@dataclass
class RewardSample:
    """One decoded rollout: what ``compute_score`` receives plus where its reward goes."""

    data_source: str
    prompt_str: str
    response_str: str
    ground_truth: Any
    extra_info: dict
    valid_response_length: int
    """Number of real response tokens; the reward is written at position ``max(valid_response_length - 1, 0)``."""


def _check_columns(data: Any, reward_fn_key: str) -> None:
    """Raise ValueError naming any column the reward manager needs but the batch lacks."""
    missing = [key for key in REQUIRED_TENSORS if key not in data.batch.keys()]
    if missing:
        raise ValueError(f"reward manager: batch lacks tensors {missing}; it needs the rollout's {REQUIRED_TENSORS}.")
    for column, origin in ((reward_fn_key, "data.reward_fn_key"), ("reward_model", "the dataset")):
        if column not in data.non_tensor_batch:
            raise ValueError(
                f"reward manager: batch has no {column!r} column (from {origin}); columns present: "
                f"{sorted(data.non_tensor_batch)}. Rule-based rewards need the parquet columns written by "
                "examples/data_preprocess (data_source, reward_model.ground_truth)."
            )


def _ground_truth(reward_model: Any) -> Any:
    """``reward_model["ground_truth"]`` of one row (None when the row has no ground truth)."""
    return reward_model.get("ground_truth") if isinstance(reward_model, dict) else None


def _extra_info(data: Any, i: int) -> dict:
    """A fresh copy of row ``i``'s extra_info plus the rollout fields upstream adds (turn count, rollout scores)."""
    extra = data.non_tensor_batch.get("extra_info")
    info = dict(extra[i]) if extra is not None and isinstance(extra[i], dict) else {}
    if "__num_turns__" in data.non_tensor_batch:
        info["num_turns"] = data.non_tensor_batch["__num_turns__"][i]
    if "rollout_reward_scores" in data.non_tensor_batch:
        info["rollout_reward_scores"] = data.non_tensor_batch["rollout_reward_scores"][i]
    return info


def extract_samples(data: Any, tokenizer: Any, reward_fn_key: str) -> list[RewardSample]:
    """Decode every row of ``data`` (special tokens skipped), keeping only the valid prompt / response tokens."""
    _check_columns(data, reward_fn_key)
    prompts, responses = data.batch["prompts"], data.batch["responses"]
    prompt_len = prompts.shape[-1]
    mask = data.batch["attention_mask"]
    valid_prompt = mask[:, :prompt_len].sum(dim=-1).tolist()
    valid_response = mask[:, prompt_len:].sum(dim=-1).tolist()
    prompt_ids = [prompts[i, prompt_len - n :].tolist() for i, n in enumerate(valid_prompt)]
    response_ids = [responses[i, :n].tolist() for i, n in enumerate(valid_response)]
    prompt_strs = tokenizer.batch_decode(prompt_ids, skip_special_tokens=True)
    response_strs = tokenizer.batch_decode(response_ids, skip_special_tokens=True)
    sources, reward_models = data.non_tensor_batch[reward_fn_key], data.non_tensor_batch["reward_model"]
    return [
        RewardSample(
            data_source=str(sources[i]),
            prompt_str=prompt_strs[i],
            response_str=response_strs[i],
            ground_truth=_ground_truth(reward_models[i]),
            extra_info=_extra_info(data, i),
            valid_response_length=int(valid_response[i]),
        )
        for i in range(len(prompt_strs))
    ]


def place_scores(responses: torch.Tensor, samples: list[RewardSample], scores: list[float]) -> torch.Tensor:
    """``(B, R)`` float32 zeros with each sample's score at its last valid response token.

    An empty response (0 valid tokens) gets its score at position 0 (masked out for token-level losses, but still
    counted by outcome estimators that sum the row).
    """
    rewards = torch.zeros(responses.shape, dtype=torch.float32)
    for i, (sample, score) in enumerate(zip(samples, scores, strict=True)):
        rewards[i, max(sample.valid_response_length - 1, 0)] = score
    return rewards
