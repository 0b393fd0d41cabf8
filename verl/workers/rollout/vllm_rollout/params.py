"""`actor_rollout_ref.rollout.*` -> keyword arguments of ``vllm.LLM`` and ``vllm.SamplingParams`` (pure, no vLLM)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from verl.base_config import ConfigError
from verl.utils.vllm.loader import canonical_loader_kwargs

__all__ = ["engine_kwargs", "eos_token_ids", "pad_token_id", "sampling_kwargs"]

_NODE = "actor_rollout_ref.rollout"


def _check_lengths(config: Any, max_model_len: int) -> None:
    if config.prompt_length + config.response_length > max_model_len:
        raise ConfigError(
            "max_model_len",
            f"({max_model_len}) is shorter than prompt_length + response_length "
            f"({config.prompt_length} + {config.response_length}); raise it or leave it null.",
            _NODE,
        )
    if not config.enable_chunked_prefill and config.max_num_batched_tokens < max_model_len:
        raise ConfigError(
            "max_num_batched_tokens",
            f"({config.max_num_batched_tokens}) must be >= max_model_len ({max_model_len}) when "
            "enable_chunked_prefill=False: a whole prompt must fit one engine step.",
            _NODE,
        )


def engine_kwargs(
    config: Any,
    model_path: str,
    *,
    trust_remote_code: bool,
    distributed: bool,
    tokenizer_path: str | None = None,
    seed: int = 0,
    sleep_mode: bool = True,
) -> dict:
    """``vllm.LLM(**kwargs)`` for a rollout config (``RolloutConfig``).

    ``distributed``: the trainer runs under torch.distributed, so the engine joins it with the external launcher
    (each trainer rank is one engine rank; ranks of one tensor-parallel group submit the same prompts).
    ``sleep_mode``: whether vLLM's platform has a sleep mode (``free_cache_engine`` needs it).
    ``engine_kwargs.vllm`` entries override everything else.
    """
    if config.pipeline_model_parallel_size != 1:
        raise ConfigError("pipeline_model_parallel_size", "must be 1 for the colocated vLLM rollout.", _NODE)
    max_model_len = config.max_model_len or config.prompt_length + config.response_length
    _check_lengths(config, max_model_len)
    kwargs = dict(
        model=model_path,
        tokenizer=os.path.expanduser(tokenizer_path) if tokenizer_path else model_path,
        skip_tokenizer_init=config.skip_tokenizer_init,
        trust_remote_code=trust_remote_code,
        tensor_parallel_size=config.tensor_model_parallel_size,
        dtype=config.dtype,
        enforce_eager=config.enforce_eager,
        gpu_memory_utilization=config.gpu_memory_utilization,
        max_num_batched_tokens=config.max_num_batched_tokens,
        max_model_len=max_model_len,
        max_num_seqs=config.max_num_seqs,
        enable_chunked_prefill=config.enable_chunked_prefill,
        enable_prefix_caching=config.enable_prefix_caching,
        # "dummy": random weights at start; the trainer pushes the real ones before the first generation
        load_format="dummy" if config.load_format.startswith("dummy") else config.load_format,
        disable_log_stats=config.disable_log_stats,
        enable_sleep_mode=config.free_cache_engine and sleep_mode,
        scheduling_policy=config.scheduling_policy,
        seed=seed,
    )
    if config.calculate_log_probs:
        kwargs["logprobs_mode"] = config.logprobs_mode
    if config.expert_parallel_size > 1:
        kwargs["enable_expert_parallel"] = True
    if config.quantization is not None:
        kwargs["quantization"] = config.quantization
    if config.cudagraph_capture_sizes:
        kwargs["compilation_config"] = {"cudagraph_capture_sizes": list(config.cudagraph_capture_sizes)}
    if distributed:
        kwargs["distributed_executor_backend"] = "external_launcher"
    kwargs.update(config.engine_kwargs.get("vllm") or {})  # a free-form per-engine dict, not a typed key
    # The engine loads through verl's recording loader (in the configured format): it keeps the canonical layout that
    # makes every later weight sync exact (verl.utils.vllm.canonical_reload).
    kwargs.update(canonical_loader_kwargs(kwargs.pop("load_format"), kwargs.pop("model_loader_extra_config", None)))
    return kwargs


def eos_token_ids(meta_info: Mapping[str, Any]) -> list[int]:
    """The batch's EOS id(s) (``meta_info["eos_token_id"]``: an int or a list; the trainer sets it) as a list."""
    eos = meta_info.get("eos_token_id")
    if eos is None:
        raise ValueError("generate_sequences needs meta_info['eos_token_id'] (the tokenizer's eos_token_id)")
    return [int(e) for e in eos] if isinstance(eos, (list, tuple)) else [int(eos)]


def pad_token_id(meta_info: Mapping[str, Any]) -> int:
    """``meta_info["pad_token_id"]``, or the first EOS id when the tokenizer has no pad token."""
    pad = meta_info.get("pad_token_id")
    return int(pad) if pad is not None else eos_token_ids(meta_info)[0]


def sampling_kwargs(config: Any, meta_info: Mapping[str, Any]) -> dict:
    """``vllm.SamplingParams(**kwargs)`` for one ``generate_sequences`` call.

    * training: ``temperature`` / ``top_k`` / ``top_p`` (``meta_info["validate"]``: ``val_kwargs``'s);
    * greedy (temperature 0) unless both ``meta_info["do_sample"]`` (default ``rollout.do_sample``) and the
      source's ``do_sample`` are true — the HF rollout's rule.
    One response per request (``n = 1``): the trainer already repeated each prompt ``rollout.n`` (or
    ``val_kwargs.n``) times; ``meta_info["n"]`` repeats are done on the batch by the rollout. The batch's EOS ids
    stop generation (the engine may run without a tokenizer) and stay in the output; ``logprobs=0`` returns the sampled token's log-prob when ``calculate_log_probs``.
    """
    validate = bool(meta_info.get("validate", False))
    source = config.val_kwargs if validate else config
    do_sample = bool(meta_info.get("do_sample", config.do_sample)) and source.do_sample
    kwargs = dict(
        n=1,
        max_tokens=config.response_length,
        temperature=source.temperature if do_sample else 0.0,
        top_k=source.top_k if do_sample else -1,
        top_p=source.top_p if do_sample else 1.0,
        ignore_eos=config.ignore_eos,
        detokenize=False,
        logprobs=0 if config.calculate_log_probs else None,
    )
    if not config.ignore_eos:
        kwargs["stop_token_ids"] = eos_token_ids(meta_info)
    return kwargs
