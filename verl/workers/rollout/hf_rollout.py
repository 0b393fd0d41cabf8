"""``HFRollout``: sampling with transformers ``generate`` on the actor module itself (upstream name).

For the CPU, tests and small models. It runs on the (FSDP-wrapped) training module, so there is no weight copy:
the sharding manager only makes the parameters available for inference (see ``verl.workers.sharding_manager``).

Batch contract (upstream keys)::

    in:  input_ids, attention_mask, position_ids (B, P) or (B, 4, P) (M-RoPE), prompts left-padded;
         non_tensor multi_modal_inputs (per-row processor outputs: pixel_values, image_grid_thw) for image rows
         meta_info: eos_token_id, pad_token_id, do_sample, validate (use rollout.val_kwargs), n (optional)
    out: prompts (B*n, P), responses (B*n, R), input_ids / attention_mask / position_ids (B*n, P + R),
         rollout_log_probs (B*n, R) when rollout.calculate_log_probs,
         routed_experts (B*n, P + R, L, k) when rollout.enable_rollout_routing_replay (router replay R3)

``n``: the trainer repeats every prompt ``rollout.n`` times itself before calling (upstream v0.7 layout), so each
input row gets ONE response by default; ``meta_info["n"] = k`` asks this rollout to repeat-interleave the prompts
``k`` times instead (standalone use). Responses stop at the first EOS: everything after it is ``pad_token_id`` and
masked out, and the response is right-padded to ``rollout.response_length``.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
import torch.nn as nn
from tensordict import TensorDict

from verl.models.transformers.router_replay import RoutingStepRecorder
from verl.protocol import DataProto
from verl.utils.fsdp_utils import adapter_for
from verl.utils.torch_functional import get_response_mask, pad_sequence_to_length
from verl.workers.core.model_forward import multi_modal_kwargs
from verl.workers.rollout.base import BaseRollout

__all__ = ["HFRollout", "SamplingParams"]


@dataclass(frozen=True)
class SamplingParams:
    do_sample: bool
    temperature: float
    top_k: int
    top_p: float
    n: int

    def generate_kwargs(self) -> dict[str, Any]:
        if not self.do_sample:
            return {"do_sample": False}
        kwargs: dict[str, Any] = {"do_sample": True, "temperature": self.temperature, "top_p": self.top_p}
        # HF's top_k=0 means "off"; upstream configs say -1
        kwargs["top_k"] = self.top_k if self.top_k > 0 else 0
        return kwargs


def sampling_params(config: Any, meta_info: dict) -> SamplingParams:
    """``rollout`` sampling settings, or ``rollout.val_kwargs`` when ``meta_info["validate"]``; greedy when
    ``meta_info["do_sample"]`` is False. ``meta_info["n"]`` repeats prompts inside the rollout (default 1)."""
    source = config.val_kwargs if meta_info.get("validate", False) else config
    do_sample = bool(meta_info.get("do_sample", config.do_sample)) and source.do_sample
    n = int(meta_info.get("n", 1))
    if n < 1:
        raise ValueError(f"meta_info['n'] must be >= 1, got {n}")
    return SamplingParams(do_sample, source.temperature, source.top_k, source.top_p, n)


class HFRollout(BaseRollout):
    """Generate with ``module.generate``.

    Args:
        module: the actor model (plain, FSDP1- or FSDP2-wrapped).
        config: ``actor_rollout_ref.rollout`` (``response_length``, sampling keys, ``val_kwargs``,
            ``max_num_seqs`` = rows per ``generate`` call, ``ignore_eos``, ``calculate_log_probs``).
    """

    def __init__(self, module: nn.Module, config: Any, model_config: Any = None, device_mesh: Any = None):
        super().__init__(config, model_config, device_mesh)
        self.module = module

    @torch.no_grad()
    def generate_sequences(self, prompts: DataProto) -> DataProto:
        params = sampling_params(self.config, prompts.meta_info)
        if params.n > 1:
            prompts = prompts.repeat(params.n, interleave=True)
        rows = max(1, self.config.max_num_seqs)
        outputs = [self._generate(chunk, params) for chunk in prompts.split(rows)]
        return DataProto.concat(outputs)

    def _token_ids(self, meta_info: dict) -> tuple[Any, int]:
        generation_config = getattr(self._hf_model(), "generation_config", None)
        eos = meta_info.get("eos_token_id", getattr(generation_config, "eos_token_id", None))
        pad = meta_info.get("pad_token_id", getattr(generation_config, "pad_token_id", None))
        if eos is None:
            raise ValueError("generate_sequences needs meta_info['eos_token_id'] (the tokenizer's eos_token_id)")
        if pad is None:
            pad = eos[0] if isinstance(eos, (list, tuple)) else eos
        return eos, int(pad)

    def _hf_model(self) -> nn.Module:
        module = self.module
        while isinstance(getattr(module, "_fsdp_wrapped_module", None), nn.Module):
            module = module._fsdp_wrapped_module
        return module

    def _generate(self, prompts: DataProto, params: SamplingParams) -> DataProto:
        td = prompts.batch
        idx, attention_mask, position_ids = td["input_ids"], td["attention_mask"], td["position_ids"]
        eos, pad = self._token_ids(prompts.meta_info)
        response_length = self.config.response_length
        kwargs = params.generate_kwargs()
        if self.config.ignore_eos:
            kwargs["min_new_tokens"] = response_length
        suppressed = self._placeholder_token_ids()
        if suppressed:
            kwargs["suppress_tokens"] = suppressed
        recorder = self._routing_recorder(prompts.meta_info)
        routing = None
        was_training = self.module.training
        self.module.eval()
        try:
            with _inference_params(self.module), recorder or contextlib.nullcontext():
                out = self._generate_fn()(
                    input_ids=idx,
                    attention_mask=attention_mask,
                    max_new_tokens=response_length,
                    eos_token_id=eos,
                    pad_token_id=pad,
                    use_cache=True,
                    return_dict_in_generate=True,
                    output_scores=bool(self.config.calculate_log_probs),
                    synced_gpus=self._synced(),
                    **self._vision_inputs(prompts, idx),
                    **kwargs,
                )
                if recorder is not None:
                    routing = self._rollout_routing(recorder, out, attention_mask)
        finally:
            self.module.train(was_training)
        data = self._assemble(idx, attention_mask, position_ids, out, eos, pad)
        if routing is not None:
            data.batch["routed_experts"] = routing
        return data

    def _routing_recorder(self, meta_info: dict) -> RoutingStepRecorder | None:
        """R3 (``rollout.enable_rollout_routing_replay``): record the MoE routing of every ``generate`` forward;
        not for validation, whose responses are never trained on."""
        if not getattr(self.config, "enable_rollout_routing_replay", False) or meta_info.get("validate", False):
            return None
        return RoutingStepRecorder(self._hf_model())

    def _rollout_routing(self, recorder: RoutingStepRecorder, out, attention_mask: torch.Tensor) -> torch.Tensor:
        """``routed_experts`` ``(B, P + R, L, k)`` aligned with ``input_ids``: the prefill forward gives the prompt
        tokens' routing, decoding step ``j`` the routing of response token ``j``; padding positions (prompt pads, pads after
        an EOS: masked) hold the pad tokens' routing, columns never generated 0.

        The last sampled token is never fed to the model inside ``generate`` (nothing is sampled after it), so one
        more decoding step on generate's own cache records it; under ``synced_gpus`` every rank runs that step
        (a forward gathers sharded parameters, so all ranks must), and a rank that already has it discards it."""
        batch_size, prompt_length = attention_mask.shape
        generated = out.sequences.shape[1] - prompt_length
        if recorder.num_forwards < generated + 1 or self._synced():
            self._decode_last_token(out, attention_mask)
        return assemble_rollout_routing(
            recorder.steps, batch_size, prompt_length, generated, self.config.response_length
        )

    def _decode_last_token(self, out, attention_mask: torch.Tensor) -> None:
        """One decoding step of ``out.sequences[:, -1]`` on ``generate``'s returned cache, built by the model's own
        ``prepare_inputs_for_generation`` (the forward ``generate``'s next step would run)."""
        model = self._hf_model()
        cache_key = "cache" if getattr(out, "cache", None) is not None else "past_key_values"
        cache = getattr(out, cache_key, None)
        if cache is None:
            raise RuntimeError("rollout routing: generate returned no KV cache to decode the last token with")
        new = cache.get_seq_length() + 1 - attention_mask.shape[1]
        mask = torch.cat([attention_mask, attention_mask.new_ones(attention_mask.shape[0], new)], dim=-1)
        inputs = model.prepare_inputs_for_generation(
            out.sequences, next_sequence_length=1, attention_mask=mask, use_cache=True, **{cache_key: cache}
        )
        model(**inputs, return_dict=True)

    def _placeholder_token_ids(self) -> list[int]:
        """Image/video placeholder ids of a multimodal model: a response must never contain one, since the next
        forward (old log-probs, the update) would count it as an image slot and fail ("image features and image
        tokens do not match"), so ``generate`` never samples them."""
        config = self._hf_model().config
        return [t for t in (getattr(config, n, None) for n in ("image_token_id", "video_token_id")) if t is not None]

    def _vision_inputs(self, prompts: DataProto, idx: torch.Tensor) -> dict[str, torch.Tensor]:
        """The rows' images for ``generate`` (``pixel_values``, ``image_grid_thw``: the dataset's processor outputs,
        concatenated in row order) and ``mm_token_type_ids`` (1 at image tokens, 2 at video tokens) from which HF
        computes the M-RoPE ids of the left-padded prompts itself. Empty for text-only batches."""
        inputs = multi_modal_kwargs(prompts.non_tensor_batch)
        if not inputs:
            return {}
        config = self._hf_model().config
        types = torch.zeros_like(idx)
        for value, name in ((1, "image_token_id"), (2, "video_token_id")):
            token = getattr(config, name, None)
            if token is not None:
                types = types.masked_fill(idx == token, value)
        return {**{k: v.to(idx.device) for k, v in inputs.items()}, "mm_token_type_ids": types}

    def _synced(self) -> bool:
        # Every decoding step of a sharded model all-gathers parameters on every rank: a rank whose sequences all
        # finished must keep stepping until every rank has, or the collectives stop matching (a hang).
        return adapter_for(self.module) is not None and dist.is_initialized() and dist.get_world_size() > 1

    def _generate_fn(self):
        # FSDP2 modules are the HF model itself. An FSDP1 wrapper forwards `generate` to the inner HF model, whose
        # steps then bypass the wrapper's forward: `_inference_params` unshards the wrapper's own (root) parameters
        # for the duration, while the nested FSDP units still gather theirs in their forward.
        return self._hf_model().generate

    def _assemble(self, idx, attention_mask, position_ids, out, eos, pad) -> DataProto:
        batch_size, prompt_length = idx.shape
        response_length = self.config.response_length
        response = pad_sequence_to_length(out.sequences[:, prompt_length:], response_length, pad)
        response_mask = get_response_mask(response, eos_token=eos, dtype=attention_mask.dtype)
        response = response.masked_fill(response_mask == 0, pad)  # nothing after the first EOS
        # (B, R), or (B, 4, R) for M-RoPE ids: every row counts on from the last prompt position (text tokens)
        delta = torch.arange(1, response_length + 1, device=position_ids.device)
        response_position_ids = position_ids[..., -1:] + delta
        tensors = {
            "prompts": idx,
            "responses": response,
            "input_ids": torch.cat([idx, response], dim=-1),
            "attention_mask": torch.cat([attention_mask, response_mask], dim=-1),
            "position_ids": torch.cat([position_ids, response_position_ids], dim=-1),
        }
        if out.scores is not None:
            tensors["rollout_log_probs"] = _sampled_log_probs(out.scores, response, response_mask)
        return DataProto(batch=TensorDict(tensors, batch_size=[batch_size]))


def _sampled_log_probs(scores: tuple[torch.Tensor, ...], response: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Log-probs ``(B, R)`` of the sampled tokens under the processed distribution (after temperature/top-k/top-p:
    upstream's ``processed_logprobs``), 0 where masked."""
    out = torch.zeros(response.shape, dtype=torch.float32, device=response.device)
    for step, step_scores in enumerate(scores):  # one (B, V) step at a time: no (B, R, V) tensor
        logp = torch.log_softmax(step_scores.float(), dim=-1)
        out[:, step] = logp.gather(-1, response[:, step : step + 1]).squeeze(-1)
    return out.masked_fill(mask == 0, 0.0)


def assemble_rollout_routing(
    steps: list[torch.Tensor], batch_size: int, prompt_length: int, generated: int, response_length: int
) -> torch.Tensor:
    """``(B, P + R, L, k)`` from the per-forward routing of ``generate``: ``steps[0]`` ``(B * P, L, k)`` (prefill,
    row-major), ``steps[1 + j]`` ``(B, L, k)`` (the forward that fed response token ``j``); later forwards (a
    finished rank stepping on under ``synced_gpus``) are dropped, columns past ``generated`` are 0."""
    prefill, decode = steps[0], steps[1 : generated + 1]
    if prefill.shape[0] != batch_size * prompt_length or len(decode) != generated:
        raise RuntimeError(
            f"rollout routing: expected a prefill of {batch_size}x{prompt_length} tokens and {generated} decoding "
            f"forwards, got {prefill.shape[0]} tokens and {len(decode)} forwards"
        )
    layers_topk = tuple(prefill.shape[1:])
    routing = prefill.new_zeros((batch_size, prompt_length + response_length, *layers_topk))
    routing[:, :prompt_length] = prefill.reshape(batch_size, prompt_length, *layers_topk)
    if generated:
        routing[:, prompt_length : prompt_length + generated] = torch.stack(decode, dim=1)
    return routing


def _inference_params(module: nn.Module):
    adapter = adapter_for(module)
    return adapter.inference_params(module) if adapter is not None else contextlib.nullcontext()
