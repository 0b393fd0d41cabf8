"""Engine inputs from a prompt batch and the rollout batch from engine outputs (pure torch, no vLLM).

The output has the keys and conventions of the HF rollout (``verl.workers.rollout.hf_rollout``), for a batch of B left-padded prompts of length P
and responses right-padded to R = ``rollout.response_length``:

=====================  ================  ==========================================================================
key                    shape             content
=====================  ================  ==========================================================================
``prompts``            (B, P)            the input ``input_ids``
``responses``          (B, R)            generated ids, right-padded with ``pad_token_id`` (also after an EOS)
``input_ids``          (B, P+R)          prompts ++ responses
``attention_mask``     (B, P+R)          prompt mask ++ response mask (1 up to and including the first EOS and
                                         within the generated length)
``position_ids``       (B, P+R) or       prompt positions continued by 1, 2, ... R from the last prompt position
                       (B, C, P+R)       (every M-RoPE row alike)
``rollout_log_probs``  (B, R) float32    the engine's log-prob of each generated token, 0 where the response mask
                                         is 0 (only when ``calculate_log_probs``)
=====================  ================  ==========================================================================
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from verl.utils.torch_functional import get_response_mask

__all__ = [
    "assemble_rollout_batch",
    "extend_position_ids",
    "pad_responses",
    "prompt_token_ids",
    "response_attention_mask",
    "unpack_request_outputs",
]


def prompt_token_ids(input_ids: torch.Tensor, attention_mask: torch.Tensor) -> list[list[int]]:
    """(B, P) left-padded ids -> B lists of the real prompt tokens (the mask decides, not the pad id, which may
    equal a real token such as EOS)."""
    return [ids[mask.bool()].tolist() for ids, mask in zip(input_ids, attention_mask, strict=True)]


def pad_responses(
    responses: Sequence[Sequence[float]], length: int, pad_value: float, dtype: torch.dtype
) -> torch.Tensor:
    """B ragged rows -> (B, ``length``), right-padded with ``pad_value``; longer rows are cut at ``length``."""
    out = torch.full((len(responses), length), pad_value, dtype=dtype)
    for i, row in enumerate(responses):
        row = list(row)[:length]
        if row:
            out[i, : len(row)] = torch.tensor(row, dtype=dtype)
    return out


def response_attention_mask(
    responses: torch.Tensor, lengths: torch.Tensor, eos_token_id: int | list[int] | None, dtype: torch.dtype
) -> torch.Tensor:
    """(B, R) mask: position j of row i is 1 iff j < lengths[i] and no EOS occurs before j.

    E.g. R=5, row [7, 2, 9, 0, 0] with length 3 and EOS 2 -> [1, 1, 0, 0, 0] (the EOS itself is kept).
    """
    positions = torch.arange(responses.shape[1], device=responses.device).unsqueeze(0)
    within = positions < lengths.unsqueeze(1)
    if eos_token_id is None or (isinstance(eos_token_id, list) and not eos_token_id):
        return within.to(dtype)
    return (within & get_response_mask(responses, eos_token_id, dtype=torch.bool)).to(dtype)


def extend_position_ids(position_ids: torch.Tensor, response_length: int) -> torch.Tensor:
    """(..., P) -> (..., P+R): after the last prompt position p come p+1 ... p+R, in every leading row (text
    positions (B, P) and M-RoPE positions (B, C, P) alike: generated text advances all axes by one)."""
    delta = torch.arange(1, response_length + 1, device=position_ids.device, dtype=position_ids.dtype)
    return torch.cat([position_ids, position_ids[..., -1:] + delta], dim=-1)


def assemble_rollout_batch(
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    position_ids: torch.Tensor,
    response_ids: Sequence[Sequence[int]],
    *,
    response_length: int,
    pad_token_id: int,
    eos_token_id: int | list[int] | None,
    log_probs: Sequence[Sequence[float]] | None = None,
) -> dict[str, torch.Tensor]:
    """The rollout output tensors (module docstring) for prompts ``input_ids`` (B, P) and B generated id lists."""
    if len(response_ids) != input_ids.shape[0]:
        raise RuntimeError(f"the engine returned {len(response_ids)} responses for {input_ids.shape[0]} prompts")
    responses = pad_responses(response_ids, response_length, pad_token_id, torch.long).to(input_ids.device)
    lengths = torch.tensor([min(len(r), response_length) for r in response_ids], device=input_ids.device)
    response_mask = response_attention_mask(responses, lengths, eos_token_id, attention_mask.dtype)
    responses = responses.masked_fill(response_mask == 0, pad_token_id)
    batch = {
        "prompts": input_ids,
        "responses": responses,
        "input_ids": torch.cat([input_ids, responses], dim=-1),
        "attention_mask": torch.cat([attention_mask, response_mask], dim=-1),
        "position_ids": extend_position_ids(position_ids, response_length),
    }
    if log_probs is not None:
        padded = pad_responses(log_probs, response_length, 0.0, torch.float32).to(input_ids.device)
        batch["rollout_log_probs"] = padded.masked_fill(response_mask == 0, 0.0)
    return batch


def unpack_request_outputs(outputs: Sequence, want_log_probs: bool) -> tuple[list[list[int]], list[list[float]] | None]:
    """vLLM ``RequestOutput``s (one completion each) -> generated ids and, if asked, each sampled token's log-prob.

    ``completion.logprobs`` holds one ``{token_id: Logprob}`` dict per generated token (``logprobs=0`` asks for the
    sampled token only; vLLM always includes it).
    """
    response_ids, log_probs = [], []
    for request in outputs:
        completion = request.outputs[0]
        ids = [int(t) for t in completion.token_ids]
        response_ids.append(ids)
        if want_log_probs:
            if completion.logprobs is None:
                raise RuntimeError("the engine returned no log-probs although SamplingParams.logprobs=0 was set")
            log_probs.append([float(step[tok].logprob) for tok, step in zip(ids, completion.logprobs, strict=True)])
    return response_ids, (log_probs if want_log_probs else None)
