"""Helpers for tests and checks that run the real vLLM engine (its CPU build in CI, a GPU in tests/special_gpu).

* :func:`cpu_engine_rollout_config` — a ``RolloutConfig`` a tiny model's engine starts with on the CPU in seconds:
  eager, bf16 (vLLM's CPU Gated DeltaNet kernel needs it), a small fixed KV cache (no memory probing).
* :func:`build_vllm_rollout` — the rollout exactly as a worker builds it (``vLLMRollout``: verl's recording loader,
  in-process engine), on a model directory.
* :func:`prompt_log_probs` — the engine's log-prob of every prompt token after the first, by teacher forcing
  (``prompt_logprobs=0``): the quantity two engines must agree on to hold the same weights.
* :func:`request_log_probs` — the same for any vLLM request (e.g. an image prompt: ``multi_modal_data``), over the
  prompt token ids the engine built (image placeholders expanded).
* :func:`engine_weights` — every parameter of the engine's model under a prefix, in the values its kernels compute
  with (weights the CPU GEMM dispatch repacked into an opaque handle are read back through that kernel).
* :func:`release_vllm_rollout` — shut an engine down and reset vLLM's per-process parallel state. A training process
  holds one engine for its whole life; a test that builds several in one process (e.g. a dense model's, then an
  MoE's, whose expert-parallel group the first one did not create) must start each from a clean state.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

__all__ = [
    "build_vllm_rollout",
    "cpu_engine_rollout_config",
    "engine_weights",
    "prompt_log_probs",
    "release_vllm_rollout",
    "request_log_probs",
]

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


def request_log_probs(llm: Any, requests: Sequence[dict]) -> list[torch.Tensor]:
    """Per request, (P-1,) float32 ``log p(ids[i] | ids[:i])`` over the engine's prompt token ids ``ids`` (for an
    image prompt: after vLLM expanded each image placeholder to the image's tokens)."""
    from vllm import SamplingParams

    params = SamplingParams(max_tokens=1, prompt_logprobs=0, temperature=0.0, detokenize=False)
    rows = []
    for output in llm.generate(list(requests), params, use_tqdm=False):
        ids, steps = output.prompt_token_ids, output.prompt_logprobs
        rows.append(torch.tensor([steps[i][ids[i]].logprob for i in range(1, len(ids))], dtype=torch.float32))
    return rows


def engine_weights(model: torch.nn.Module, prefix: str = "", *, buffers: bool = True) -> dict[str, torch.Tensor]:
    """``{name: tensor}`` for every parameter (and, with ``buffers``, persistent buffer: e.g. the image normalisation
    constants of vLLM's Qwen-VL models) of ``model`` whose name starts with ``prefix``, as the engine computes with it.

    vLLM's CPU build hands most linear weights to a GEMM backend (oneDNN, the SGL kernels, zentorch) after loading
    and leaves an empty placeholder parameter. Such a weight ``W [N, K]`` is read back through the layer's own
    ``quant_method.apply`` on the identity ``I_K`` (no bias): ``I_K W^T = W^T``, and every output element is one
    product ``w * 1`` plus exact zeros, so the read-back is bitwise the weight the kernel holds (in the activation
    dtype, which is the weight's here). Other parameters are copied as they are."""
    modules = dict(model.named_modules())
    out = {}
    for name, param in model.named_parameters():
        if not name.startswith(prefix):
            continue
        module_name, _, leaf = name.rpartition(".")
        module = modules[module_name]
        method = getattr(module, "quant_method", None)
        if leaf == "weight" and param.numel() == 0 and method is not None:
            width = getattr(module, "input_size_per_partition", None) or module.input_size
            eye = torch.eye(width, dtype=param.dtype, device=param.device)
            with torch.no_grad():
                out[name] = method.apply(module, eye).t().contiguous()
        else:
            out[name] = param.detach().clone()
    if buffers:
        from verl.utils.vllm.loader import persistent_buffers

        out.update({name: b for name, b in persistent_buffers(model).items() if name.startswith(prefix)})
    return out


def release_vllm_rollout(rollout: Any = None) -> None:
    """Drop ``rollout``'s engine (if given) and reset vLLM's process-wide distributed/parallel state."""
    import gc

    from vllm.distributed.parallel_state import cleanup_dist_env_and_memory

    if rollout is not None:
        rollout.llm = None
    gc.collect()
    cleanup_dist_env_and_memory()
