"""R3 with the vLLM rollout: record the MoE routing the engine actually used, as the batch's ``routed_experts``.

vLLM's own switch (``enable_return_routed_experts``) needs its Model Runner V2 (Triton), absent from the CPU build,
so this records one layer lower, at the point that switch is built on: each MoE layer's ``MoERunner`` has a
``BaseRouter`` whose ``select_experts`` passes the top-k ids its experts then run with to ``capture_fn``
(``BaseRouter.set_capture_fn``). The rows of one forward are the model runner's flattened batch: requests in
``input_batch.req_ids`` order, ``scheduler_output.num_scheduled_tokens[req]`` rows each, starting at position
``input_batch.num_computed_tokens_cpu[i]`` of that request (chunked prefill and decoding alike). The engine must run
in this process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``, as :mod:`verl.workers.rollout.vllm_rollout` sets it) and
without prefix caching (a cached prompt block is never forwarded, so it would have no routing).

Every prompt and generated token but the last sampled one gets a row per MoE layer (no forward reads the last
token; its routing cannot change a log-prob). Layout (as the HF rollout's): ``(B, P + R, L, k)`` aligned with
``input_ids``; positions the engine never ran (prompt padding, after the response, the last sampled token) hold
experts ``0 .. k-1``, a valid choice no real token's log-prob depends on.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from verl.models.transformers.router_replay import RouterReplayError, routing_dtype

__all__ = ["EngineRoutingRecorder"]

_KEY = "actor_rollout_ref.rollout.enable_rollout_routing_replay"


class EngineRoutingRecorder:
    """Capture hooks on an in-process ``vllm.LLM``'s MoE routers, installed once; :meth:`record` scopes a
    ``generate`` call and :meth:`assemble` turns what it captured into ``routed_experts``."""

    def __init__(self, llm: Any, model: torch.nn.Module):
        from vllm.model_executor.layers.fused_moe.layer import MoERunner
        from vllm.model_executor.layers.fused_moe.router.base_router import BaseRouter

        self.runners = sorted((m for m in model.modules() if isinstance(m, MoERunner)), key=lambda m: m.layer_id)
        if not self.runners:
            raise RouterReplayError(f"{_KEY}: the vLLM model has no MoE layer; set it to False for a dense model")
        unsupported = {type(m.router).__name__ for m in self.runners if not isinstance(m.router, BaseRouter)}
        if unsupported:
            raise RouterReplayError(
                f"{_KEY}: vLLM's router {sorted(unsupported)} has no capture_fn; use rollout.name=hf"
            )
        self.top_k = int(self.runners[0].router.top_k)
        self.dtype = routing_dtype(int(self.runners[0].router.global_num_experts))
        self.model_runner = llm.llm_engine.engine_core.engine_core.model_executor.driver_worker.worker.model_runner
        self._steps: list[dict] | None = None
        self._wrap_execute_model()
        for index, module in enumerate(self.runners):
            module.router.set_capture_fn(lambda ids, layer=index: self._capture(layer, ids))

    @property
    def num_layers(self) -> int:
        return len(self.runners)

    def _wrap_execute_model(self) -> None:
        execute = self.model_runner.execute_model

        def execute_model(scheduler_output, *args, **kwargs):
            if self._steps is not None:
                self._steps.append({"scheduled": scheduler_output.num_scheduled_tokens, "layout": None, "ids": {}})
            return execute(scheduler_output, *args, **kwargs)

        self.model_runner.execute_model = execute_model

    def _capture(self, layer: int, ids: torch.Tensor) -> None:
        if self._steps is None or not self._steps:
            return  # a forward outside record() (weight sync probes, validation)
        step = self._steps[-1]
        if step["layout"] is None:
            batch = self.model_runner.input_batch
            layout, row = [], 0
            for i, req in enumerate(batch.req_ids):
                n = int(step["scheduled"].get(req, 0))
                layout.append((req, int(batch.num_computed_tokens_cpu[i]), row, n))
                row += n
            step["layout"] = layout
        step["ids"][layer] = ids.detach().to("cpu", torch.int64)

    def record(self) -> _Recording:
        return _Recording(self)

    def assemble(
        self, outputs: Sequence[Any], prompt_mask: torch.Tensor, response_length: int, steps: list[dict]
    ) -> torch.Tensor:
        """``(B, P + R, L, k)`` for the engine's ``outputs`` (one per row of the left-padded ``prompt_mask``)."""
        per_request = self._per_request(steps)
        batch, prompt_length = prompt_mask.shape
        filler = torch.arange(self.top_k, dtype=self.dtype).expand(self.num_layers, self.top_k)
        routed = filler.expand(batch, prompt_length + response_length, self.num_layers, self.top_k).clone()
        for row, output in enumerate(outputs):
            real = int(prompt_mask[row].sum())
            plen, generated = len(output.prompt_token_ids), min(len(output.outputs[0].token_ids), response_length)
            if plen != real:
                raise RouterReplayError(
                    f"{_KEY}: row {row}'s engine prompt has {plen} tokens, the batch {real} (multimodal placeholders "
                    "are expanded after the engine); R3 with vLLM needs text prompts, or use rollout.name=hf"
                )
            rows = per_request.get(_engine_request(per_request, output.request_id))
            expected = plen + generated - 1
            if rows is None or rows.shape[0] < expected:
                got = 0 if rows is None else rows.shape[0]
                raise RouterReplayError(
                    f"{_KEY}: the engine routed {got} of request {output.request_id}'s {expected} forwarded tokens "
                    "(prefix caching skips cached prompt blocks: set actor_rollout_ref.rollout.enable_prefix_caching="
                    "False)"
                )
            routed[row, prompt_length - plen : prompt_length] = rows[:plen].to(self.dtype)
            routed[row, prompt_length : prompt_length + generated - 1] = rows[plen:expected].to(self.dtype)
        return routed

    def _per_request(self, steps: list[dict]) -> dict[str, torch.Tensor]:
        """``{engine request id: (forwarded tokens, L, k)}`` from the steps' captured rows."""
        length: dict[str, int] = {}
        for step in steps:
            for req, start, _, n in step["layout"] or []:
                if n:
                    length[req] = max(length.get(req, 0), start + n)
        out = {req: torch.zeros(n, self.num_layers, self.top_k, dtype=torch.int64) for req, n in length.items()}
        for step in steps:
            if step["layout"] is None:
                continue
            if len(step["ids"]) != self.num_layers:
                raise RouterReplayError(f"{_KEY}: a forward routed {len(step['ids'])} of {self.num_layers} MoE layers")
            ids = torch.stack([step["ids"][layer] for layer in range(self.num_layers)], dim=1)
            scheduled = sum(n for *_, n in step["layout"])
            if scheduled != ids.shape[0]:
                raise RouterReplayError(
                    f"{_KEY}: a forward routed {ids.shape[0]} rows for {scheduled} scheduled tokens"
                )
            for req, start, row, n in step["layout"]:
                out[req][start : start + n] = ids[row : row + n]
        return out


def _engine_request(per_request: dict, request_id: str) -> str | None:
    """The engine core's id of a user-facing request id (it appends ``-<suffix>``)."""
    matches = [key for key in per_request if key == request_id or key.rsplit("-", 1)[0] == request_id]
    return matches[0] if len(matches) == 1 else None


class _Recording:
    """``with recorder.record() as steps:`` captures the forwards of the block into ``steps``."""

    def __init__(self, recorder: EngineRoutingRecorder):
        self.recorder = recorder
        self.steps: list[dict] = []

    def __enter__(self) -> list[dict]:
        self.recorder._steps = self.steps
        return self.steps

    def __exit__(self, *exc) -> None:
        self.recorder._steps = None
