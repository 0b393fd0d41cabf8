"""Helpers for tests and checks that run the real vLLM engine (its CPU build in CI, a GPU in tests/special_gpu).

* :func:`cpu_engine_rollout_config` — a ``RolloutConfig`` a tiny model's engine starts with on the CPU in seconds:
  eager, bf16 (vLLM's CPU Gated DeltaNet kernel needs it), a small fixed KV cache (no memory probing).
* :func:`build_vllm_rollout` — the rollout exactly as a worker builds it (``vLLMRollout``: verl's recording loader,
  in-process engine), on a model directory.
* :func:`prompt_log_probs` — the engine's log-prob of every prompt token after the first, by teacher forcing
  (``prompt_logprobs=0``): the quantity two engines must agree on to hold the same weights.
* :func:`release_vllm_rollout` — shut an engine down and reset vLLM's per-process parallel state. A training process
  holds one engine for its whole life; a test that builds several in one process (e.g. a dense model's, then an
  MoE's, whose expert-parallel group the first one did not create) must start each from a clean state.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

__all__ = ["build_vllm_rollout", "cpu_engine_rollout_config", "prompt_log_probs", "release_vllm_rollout"]

# KV cache of a test engine: plenty for a few dozen short sequences of the tiny models, small next to 24 GiB.
TEST_KV_CACHE_BYTES = 64 * 2**20


def cpu_engine_rollout_config(**overrides: Any):
    """A ``RolloutConfig`` for a tiny model's engine on vLLM's CPU build (``overrides`` replace any field)."""
    from verl.workers.config import RolloutConfig

    base = dict(
        name="vllm",
        prompt_length=48,
        response_length=16,
        tensor_model_parallel_size=1,
        dtype="bfloat16",
        enforce_eager=True,
        load_format="auto",
        max_num_seqs=64,
        max_num_batched_tokens=4096,
        enable_prefix_caching=False,
        calculate_log_probs=True,
        engine_kwargs={"vllm": {"kv_cache_memory_bytes": TEST_KV_CACHE_BYTES}},
    )
    base.update(overrides)
    return RolloutConfig(**base)


def build_vllm_rollout(model_dir: str, **config_overrides: Any):
    """``vLLMRollout`` on ``model_dir`` (weights loaded per ``load_format``, ``auto`` by default), as workers build it."""
    from verl.workers.config import HFModelConfig
    from verl.workers.rollout.vllm_rollout import vLLMRollout

    config = cpu_engine_rollout_config(**config_overrides)
    return vLLMRollout(config, HFModelConfig(path=str(model_dir)))


def prompt_log_probs(llm: Any, prompts: Sequence[Sequence[int]]) -> torch.Tensor:
    """(B, P-1) float32: ``log p(prompt[i] | prompt[:i])`` for i = 1..P-1 of each of B equal-length prompts."""
    from vllm import SamplingParams

    params = SamplingParams(max_tokens=1, prompt_logprobs=0, temperature=0.0, detokenize=False)
    outputs = llm.generate([{"prompt_token_ids": list(p)} for p in prompts], params, use_tqdm=False)
    rows = []
    for output, prompt in zip(outputs, prompts, strict=True):
        steps = output.prompt_logprobs  # [None, {token: Logprob}, ...]: the first token has no prediction
        rows.append(torch.tensor([steps[i][prompt[i]].logprob for i in range(1, len(prompt))], dtype=torch.float32))
    return torch.stack(rows)


def release_vllm_rollout(rollout: Any = None) -> None:
    """Drop ``rollout``'s engine (if given) and reset vLLM's process-wide distributed/parallel state."""
    import gc

    from vllm.distributed.parallel_state import cleanup_dist_env_and_memory

    if rollout is not None:
        rollout.llm = None
    gc.collect()
    cleanup_dist_env_and_memory()
