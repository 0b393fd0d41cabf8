"""vLLM rollout colocated with training (hybrid engine): CUDA GPUs, and Ascend NPUs through vllm-ascend.

Each trainer rank owns one in-process ``vllm.LLM`` (the external launcher joins it to the trainer's
torch.distributed world when there is one; ``tensor_model_parallel_size`` consecutive ranks form one engine).
One training step:

```
 FSDPVLLMShardingManager.__enter__      wake_up(["weights"]) -> load_weights(actor stream) -> wake_up(["kv_cache"])
 generate_sequences(prompts)            gather the TP group's prompts -> llm.generate -> this rank's rows
 FSDPVLLMShardingManager.__exit__       sleep(): KV cache (and weights at level 2) released for training
```

vLLM is imported when a rollout is built, never at module import; a missing vLLM (or vllm-ascend on ``npu``) is an
ImportError naming the install. Ascend specifics: vllm-ascend registers itself as vLLM's platform plugin; this class
only picks sleep level 1 there (level 2 is unsupported) and sets the platform's rollout environment variables.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterable, Sequence
from typing import Any

import torch
import torch.distributed as dist

from verl.base_config import ConfigError
from verl.protocol import DataProto
from verl.utils.device import get_device_name, get_platform
from verl.utils.vllm.loader import register_canonical_loader
from verl.utils.vllm.utils import get_vllm_model, require_vllm
from verl.workers.rollout.base import BaseRollout
from verl.workers.rollout.vllm_rollout.outputs import assemble_rollout_batch, prompt_token_ids, unpack_request_outputs
from verl.workers.rollout.vllm_rollout.params import engine_kwargs, eos_token_ids, pad_token_id, sampling_kwargs
from verl.workers.rollout.vllm_rollout.routing import EngineRoutingRecorder
from verl.workers.sharding_manager.vllm_weight_sync import WeightSyncReport, load_weights_into_vllm

__all__ = ["check_engine_prompts", "engine_env", "vLLMRollout"]

logger = logging.getLogger(__name__)

_ALL_TAGS = ("weights", "kv_cache")


def engine_env() -> dict[str, str]:
    """Environment the in-process engine needs: V1's engine core in this process (so weight sync can reach the
    model), plus the platform's rollout variables (vllm-ascend switches on ``npu``)."""
    return {"VLLM_ENABLE_V1_MULTIPROCESSING": "0", **get_platform().rollout_env_vars()}


class vLLMRollout(BaseRollout):
    """Generation with vLLM for ``actor_rollout_ref.rollout.name=vllm`` (see module docstring)."""

    def __init__(self, config: Any, model_config: Any, device_mesh: Any = None) -> None:
        super().__init__(config, model_config, device_mesh)
        self.device_name = get_device_name()
        if config.multi_turn.enable:
            raise ConfigError(
                "multi_turn.enable",
                "multi-turn rollouts need the agent-loop server mode, which this vLLM rollout does not provide; "
                "set it to false.",
                "actor_rollout_ref.rollout",
            )
        vllm = require_vllm(self.device_name)
        register_canonical_loader()
        for key, value in engine_env().items():
            os.environ.setdefault(key, value)  # a value the user exported wins
        self._sleeps = config.free_cache_engine and _sleep_mode_available()
        kwargs = engine_kwargs(
            config,
            model_config.local_path,
            trust_remote_code=model_config.trust_remote_code,
            tokenizer_path=model_config.tokenizer_path,
            # a trainer world of several ranks: each rank is one engine rank (external launcher). A world of one (or
            # the one vLLM itself created for an engine built earlier in this process) needs no launcher.
            distributed=dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1,
            sleep_mode=self._sleeps,
        )
        logger.info("building vllm.LLM(%s)", kwargs)
        self.llm = vllm.LLM(**kwargs)
        self._sampling_params_cls = vllm.SamplingParams
        self._sleep_level = get_platform().vllm_sleep_level
        self._asleep: set[str] = set()
        self._reported_image_prompts = False
        self.sleep()  # training runs first; the sharding manager wakes the engine for generation

    # ------------------------------------------------------------------ engine state
    @property
    def vllm_model(self) -> torch.nn.Module:
        """The engine's model in this process (target of the weight sync)."""
        return get_vllm_model(self.llm)

    def sleep(self) -> None:
        """Release the KV cache (and the weights at sleep level 2); no-op without ``free_cache_engine`` or where
        vLLM's platform has no sleep mode."""
        if not self._sleeps or self._asleep:
            return
        self.llm.sleep(level=self._sleep_level)
        self._asleep = set(_ALL_TAGS)

    def wake_up(self, tags: Iterable[str] = _ALL_TAGS) -> None:
        """Re-allocate the sleeping parts named in ``tags`` (``"weights"``, ``"kv_cache"``)."""
        tags = [tag for tag in tags if tag in self._asleep]
        if tags:
            self.llm.wake_up(tags=tags)
            self._asleep -= set(tags)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> WeightSyncReport:
        """Push HF-named weights into the engine (MoE loader repair + vLLM's ``load_weights``).

        Caches of values computed with the old weights are dropped: the prefix cache (KV of cached prefixes) and the
        encoder cache (:func:`_reset_encoder_cache`)."""
        if "weights" in self._asleep:
            raise RuntimeError("vLLMRollout.load_weights: the engine's weights are asleep; call wake_up(['weights'])")
        report = load_weights_into_vllm(self.vllm_model, weights)
        if self.config.enable_prefix_caching:
            self.llm.reset_prefix_cache()
        _reset_encoder_cache(self.llm)
        return report

    # BaseRollout's asynchronous interface (upstream names)
    async def resume(self, tags: list[str]) -> None:
        self.wake_up(tags)

    async def update_weights(self, weights: Iterable[tuple[str, torch.Tensor]], **kwargs: Any) -> None:
        self.load_weights(weights)

    async def release(self) -> None:
        self.sleep()

    # ------------------------------------------------------------------ generation
    def generate_sequences(self, prompts: DataProto) -> DataProto:
        """One response per prompt row (``meta_info["n"] = k``: k per row, rows repeat-interleaved, as the HF
        rollout); keys as in :mod:`verl.workers.rollout.vllm_rollout.outputs`.

        ``prompts.meta_info``: ``eos_token_id`` (required), ``pad_token_id``, ``do_sample``, ``validate``, ``n``.
        """
        if self._asleep:
            raise RuntimeError(
                f"vLLMRollout.generate_sequences: {sorted(self._asleep)} asleep; generate inside "
                "FSDPVLLMShardingManager (it syncs the weights and wakes the engine)"
            )
        repeats = int(prompts.meta_info.get("n", 1))
        if repeats > 1:
            prompts = prompts.repeat(repeats, interleave=True)
        local_size = len(prompts)
        group, tp_size, tp_rank = self._tp_group()
        batch = _gather(prompts, group, tp_size)
        output = self._generate(batch)
        return output.slice(tp_rank * local_size, (tp_rank + 1) * local_size) if tp_size > 1 else output

    def _generate(self, prompts: DataProto) -> DataProto:
        params = self._sampling_params_cls(**sampling_kwargs(self.config, prompts.meta_info))
        recorder = self._routing_recorder(prompts.meta_info)
        with recorder.record() if recorder is not None else contextlib.nullcontext() as steps:
            outputs = self.llm.generate(_requests(prompts), sampling_params=params, use_tqdm=False)
        checked = check_engine_prompts(outputs, prompts)
        if checked and not self._reported_image_prompts:
            self._reported_image_prompts = True
            print(f"[verl] vLLM rollout: {checked}", flush=True)  # once per engine: the check runs on every batch
        response_ids, log_probs = unpack_request_outputs(outputs, self.config.calculate_log_probs)
        tensors = assemble_rollout_batch(
            prompts.batch["input_ids"],
            prompts.batch["attention_mask"],
            prompts.batch["position_ids"],
            response_ids,
            response_length=self.config.response_length,
            pad_token_id=pad_token_id(prompts.meta_info),
            eos_token_id=eos_token_ids(prompts.meta_info),
            log_probs=log_probs,
        )
        if recorder is not None:
            mask = prompts.batch["attention_mask"]
            tensors["routed_experts"] = recorder.assemble(outputs, mask, self.config.response_length, steps)
        return DataProto.from_dict(tensors=tensors)  # tensors only, like the HF rollout

    def _routing_recorder(self, meta_info: dict) -> EngineRoutingRecorder | None:
        """R3 (``rollout.enable_rollout_routing_replay``): the engine's routing of every training generation
        (:mod:`verl.workers.rollout.vllm_rollout.routing`); hooks installed on first use."""
        if not self.config.enable_rollout_routing_replay or meta_info.get("validate", False):
            return None
        if getattr(self, "_routing", None) is None:
            self._routing = EngineRoutingRecorder(self.llm, self.vllm_model)
        return self._routing

    def _tp_group(self) -> tuple[Any, int, int]:
        """(process group, size, rank) of this engine's tensor-parallel ranks (mesh dim ``infer_tp``)."""
        mesh = self.device_mesh
        if mesh is None or not mesh.mesh_dim_names or "infer_tp" not in mesh.mesh_dim_names:
            return None, 1, 0
        tp_mesh = mesh["infer_tp"]
        return tp_mesh.get_group(), tp_mesh.size(), tp_mesh.get_local_rank()


def _reset_encoder_cache(llm: Any) -> None:
    """Forget the vision tower's cached outputs after a weight update.

    vLLM V1 keeps each image's encoder output (keyed by the image's content hash) after its request finishes and
    reuses it for any later request with the same image. An RL run shows the same images again (``rollout.n``
    samples of a prompt, the next epoch), so without this reset the engine keeps generating from image embeddings of
    the old vision tower: measured on the tiny Qwen3.5 VL model, a synced engine's image-prompt log-probs stayed
    exactly those of its previous weights (tests/workers/rollout/test_vllm_vision_sync.py). For a text model the cache
    is empty and the reset costs nothing. A vLLM engine without the call gets a warning for a multimodal model."""
    engine = getattr(llm, "llm_engine", None)
    reset = getattr(engine, "reset_encoder_cache", None)
    if callable(reset):
        reset()
    elif getattr(getattr(engine, "model_config", None), "is_multimodal_model", False):
        logger.warning(
            "this vLLM has no LLMEngine.reset_encoder_cache: after a weight sync it may reuse image embeddings "
            "computed by the previous vision tower; use a vLLM release that has it"
        )


def _sleep_mode_available() -> bool:
    """Whether vLLM's platform can sleep; where it cannot (vLLM's CPU build), ``free_cache_engine`` is reported
    once and the engine keeps its weights and KV cache between rollouts."""
    from vllm.platforms import current_platform

    if current_platform.is_sleep_mode_available():
        return True
    logger.warning(
        "actor_rollout_ref.rollout.free_cache_engine=True has no effect here: vLLM's %s platform has no sleep mode, "
        "so the engine keeps its weights and KV cache between rollouts (size the cache with "
        "actor_rollout_ref.rollout.gpu_memory_utilization or engine_kwargs.vllm.kv_cache_memory_bytes)",
        type(current_platform).__name__,
    )
    return False


def _gather(prompts: DataProto, group: Any, size: int) -> DataProto:
    """All ranks of one tensor-parallel engine must submit the same requests: concatenate their prompt batches in
    rank order (every rank holds the same number of rows: the trainer pads to the worker count)."""
    if size == 1:
        return prompts
    parts: list[Any] = [None] * size
    dist.all_gather_object(parts, prompts, group=group)
    return DataProto.concat(parts)


def check_engine_prompts(outputs: Sequence[Any], prompts: DataProto) -> str | None:
    """For every row with images: the prompt ids vLLM built (``raw_prompt_ids`` with one placeholder per image,
    expanded by vLLM's own processor to the image's grid) must be the actor's prompt ids (the dataset processor's
    expansion), or the engine samples from, and reports log-probs for, another sequence than the one the actor
    trains on. Returns a one-line summary (None without image rows); raises naming the first row that differs."""
    non_tensors = prompts.non_tensor_batch
    if "multi_modal_data" not in non_tensors:
        return None
    actor = prompt_token_ids(prompts.batch["input_ids"], prompts.batch["attention_mask"])
    rows = [i for i, mm in enumerate(non_tensors["multi_modal_data"]) if mm]
    for row in rows:
        engine = list(outputs[row].prompt_token_ids)
        if engine != actor[row]:
            first = next(
                (i for i, (a, b) in enumerate(zip(engine, actor[row])) if a != b), min(len(engine), len(actor[row]))
            )
            raise RuntimeError(
                f"vLLM rollout: prompt row {row} with images: vLLM built {len(engine)} prompt tokens, the actor's "
                f"input_ids have {len(actor[row])} (first difference at position {first}). vLLM's processor expanded "
                "the images into another number of image tokens than the dataset's processor: both must resize "
                "alike (the checkpoint's preprocessor_config.json: patch_size, merge_size, min_pixels/max_pixels; "
                "data.image_key images, not pre-resized ones)"
            )
    return f"prompt ids of {len(rows)} image rows equal the actor's (images expanded by vLLM's processor)"


def _requests(prompts: DataProto) -> list[dict[str, Any]]:
    """vLLM token prompts: the dataset's ``raw_prompt_ids`` when present (multimodal prompts must reach vLLM with
    one placeholder per image, before the processor's expansion), else the unpadded ``input_ids``."""
    non_tensors = prompts.non_tensor_batch
    if "raw_prompt_ids" in non_tensors:
        ids = [[int(t) for t in row] for row in non_tensors["raw_prompt_ids"]]
    else:
        ids = prompt_token_ids(prompts.batch["input_ids"], prompts.batch["attention_mask"])
    requests = [{"prompt_token_ids": row} for row in ids]
    if "multi_modal_data" in non_tensors:
        for request, mm_data in zip(requests, non_tensors["multi_modal_data"], strict=True):
            if mm_data:
                request["multi_modal_data"] = mm_data
    return requests
