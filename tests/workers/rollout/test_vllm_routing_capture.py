"""Groundwork for R3 with the REAL vLLM (its CPU build, `.venv-vllm`): the routing the engine used can be read.

Not R3: nothing here feeds the training batch, and ``rollout.enable_rollout_routing_replay`` with ``rollout.name=vllm``
stays refused. vLLM's own switch (``enable_return_routed_experts``) is refused by its config on this build ("AuxOutput
Connector requires Model Runner V2", and V2 needs Triton). What this checks is the lower layer that switch is built
on: every MoE layer's ``MoERunner`` has a ``BaseRouter`` (``CPURouter`` here) whose ``select_experts`` hands the top-k
ids the experts then run with to ``capture_fn`` (``BaseRouter.set_capture_fn``), in the model runner's flattened
batch order: requests in ``input_batch.req_ids`` order, ``scheduler_output.num_scheduled_tokens[req]`` rows each,
starting at position ``input_batch.num_computed_tokens_cpu[i]``.

Invariants (tiny Qwen3.5-MoE, bf16 engine; the CPU Gated DeltaNet has no fp32 path): in-process
(``VLLM_ENABLE_V1_MULTIPROCESSING=0``) every prompt and generated token but the last sampled one (which no forward
reads) gets exactly one routing row per MoE layer; the HF model in fp32 on the same weights routes the same tokens
to the same expert sets on most (token, layer) pairs (>= 90%; measured 98.3%, 118 of 120: the rest is the bf16 vs
fp32 disagreement R3 exists to remove).
"""

from __future__ import annotations

import collections
import os

import pytest
import torch

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

PROMPTS = [[5, 6, 7, 8, 9, 10, 11], [12, 13, 14], [20, 21, 22, 23, 24]]
NEW_TOKENS = 6


class _EngineRouting:
    """Per request, ``{(position, layer): expert ids}`` of every forward of an in-process ``vllm.LLM``."""

    def __init__(self, llm):
        from vllm.model_executor.layers.fused_moe.layer import MoERunner
        from vllm.model_executor.layers.fused_moe.router.base_router import BaseRouter

        from verl.utils.vllm.utils import get_vllm_model

        self.runner = llm.llm_engine.engine_core.engine_core.model_executor.driver_worker.worker.model_runner
        self.rows: dict[str, dict] = collections.defaultdict(dict)
        self._scheduled = None
        execute = self.runner.execute_model

        def execute_model(scheduler_output, *args, **kwargs):
            self._scheduled = scheduler_output
            return execute(scheduler_output, *args, **kwargs)

        self.runner.execute_model = execute_model
        self.runners = [m for m in get_vllm_model(llm).modules() if isinstance(m, MoERunner)]
        for module in self.runners:
            assert isinstance(module.router, BaseRouter), type(module.router).__name__
            module.router.set_capture_fn(lambda ids, layer=module.layer_id: self._capture(layer, ids))

    def _capture(self, layer: int, ids: torch.Tensor) -> None:
        batch, row = self.runner.input_batch, 0
        for i, req in enumerate(batch.req_ids):
            n = self._scheduled.num_scheduled_tokens.get(req, 0)
            start = int(batch.num_computed_tokens_cpu[i])
            for j in range(n):
                self.rows[req][(start + j, layer)] = sorted(ids[row + j].tolist())
            row += n
        assert row == ids.shape[0], f"layer {layer}: {ids.shape[0]} routed rows for {row} scheduled tokens"

    def of(self, request_id: str) -> dict:
        # the engine core suffixes the user-facing request id ("0" -> "0-<hash>")
        (key,) = [k for k in self.rows if k.split("-")[0] == request_id]
        return self.rows[key]


def test_vllm_cpu_router_hands_its_routing_to_capture_fn(tmp_path, monkeypatch):
    import vllm

    from verl.models.tiny import save_tiny_checkpoint
    from verl.models.transformers.patch_registry import apply_patches
    from verl.models.transformers.router_replay import RoutingStepRecorder
    from verl.trainer.quickstart import build_char_tokenizer

    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    path = str(tmp_path / "qwen3_5_moe")
    os.makedirs(path)
    save_tiny_checkpoint("qwen3_5_moe", build_char_tokenizer(path), path, seed=0, profile="vllm")
    llm = vllm.LLM(model=path, dtype="bfloat16", enforce_eager=True, max_model_len=64, max_num_seqs=4, seed=0,
                   gpu_memory_utilization=0.05, enable_prefix_caching=False)  # fmt: skip
    engine = _EngineRouting(llm)
    params = [
        vllm.SamplingParams(max_tokens=NEW_TOKENS, temperature=1.0, seed=s, ignore_eos=True)
        for s in range(len(PROMPTS))
    ]
    outputs = llm.generate([{"prompt_token_ids": p} for p in PROMPTS], params)

    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    apply_patches(hf, platform="cpu", report=False)
    layers = len(engine.runners)
    agree = total = 0
    for out in outputs:
        ids = list(out.prompt_token_ids) + list(out.outputs[0].token_ids)
        rows = engine.of(out.request_id)
        assert set(rows) == {(p, layer) for p in range(len(ids) - 1) for layer in range(layers)}
        with RoutingStepRecorder(hf) as recorder, torch.no_grad():
            hf(input_ids=torch.tensor([ids]), use_cache=False)
        native = recorder.steps[0]
        for (position, layer), experts in rows.items():
            total += 1
            agree += experts == sorted(native[position, layer].tolist())
    assert total == sum(len(p) + NEW_TOKENS - 1 for p in PROMPTS) * layers
    assert agree / total >= 0.9, f"{agree}/{total}"
