"""``BaseRollout`` (the interface every rollout engine implements) and the rollout registry (upstream names).

A rollout turns prompts into responses: ``generate_sequences(prompts: DataProto) -> DataProto``. Engines that
keep their own copy of the weights (vLLM) also implement ``update_weights``/``resume``/``release``; the HF rollout
runs on the actor module itself, so for it these are no-ops.

Registry: ``get_rollout_class(name, mode)`` resolves ``actor_rollout_ref.rollout.name`` lazily, so importing this
module never imports an engine: ``"hf"`` (transformers ``generate``; CPU, tests, small models) and ``"vllm"``
(GPU, and Ascend through vllm-ascend). A missing engine package raises an ImportError that says what to install
or which rollout to use instead.
"""

from __future__ import annotations

import importlib
import importlib.util
from abc import ABC, abstractmethod
from collections.abc import Iterable
from typing import Any

import numpy as np
import torch

from verl.protocol import DataProto
from verl.workers.rollout.registry import _MODES, _ROLLOUT_REGISTRY, register_rollout, registered_rollouts

__all__ = ["BaseRollout", "generation_seed", "get_rollout_class", "register_rollout", "registered_rollouts"]


def generation_seed(base_seed: int, meta_info: dict, dp_rank: int) -> int:
    """Seed of one ``generate_sequences`` call's sampling: a function of the worker's seed
    (``fsdp_config.seed``), the trainer step (``meta_info["global_steps"]``), validation or not, and the dp rank
    only. A resumed run, a run on another device and a run whose model building drew a different amount of
    randomness therefore sample the same tokens; the SP ranks of one dp rank (same prompts) draw alike.
    ``numpy.random.SeedSequence`` mixes the four numbers, so neighbouring steps/ranks get unrelated streams."""
    step, validate = int(meta_info.get("global_steps", 0)), int(bool(meta_info.get("validate", False)))
    state = np.random.SeedSequence([base_seed, step, validate, dp_rank]).generate_state(1, dtype=np.uint64)
    return int(state[0] >> np.uint64(1))  # < 2**63: a valid torch seed


class BaseRollout(ABC):
    """A generation engine. ``config`` is the ``actor_rollout_ref.rollout`` config (``RolloutConfig``)."""

    def __init__(self, config: Any, model_config: Any = None, device_mesh: Any = None):
        self.config = config
        self.model_config = model_config
        self.device_mesh = device_mesh

    @abstractmethod
    def generate_sequences(self, prompts: DataProto) -> DataProto:
        """Responses for ``prompts`` (``input_ids``/``attention_mask``/``position_ids``, left-padded ``(B, P)``).

        Returns a DataProto with ``prompts (B, P)``, ``responses (B, R)``, ``input_ids``, ``attention_mask``,
        ``position_ids`` ``(B, P + R)`` and, when available, ``rollout_log_probs (B, R)``.
        """

    async def resume(self, tags: list[str]) -> None:
        """Bring ``"weights"`` / ``"kv_cache"`` back to the device (engines that release them between rollouts).

        Default: nothing to do (an engine that shares the actor's module, like HF)."""
        return None

    async def update_weights(self, weights: Iterable[tuple[str, torch.Tensor]], **kwargs: Any) -> None:
        """Load the trained weights, streamed as ``(name, tensor)`` pairs, into the engine (default: shared)."""
        return None

    async def release(self) -> None:
        """Free the engine's device memory (weights and KV cache) for the training phase (default: none held)."""
        return None


def get_rollout_class(rollout_name: str, mode: str = "async") -> type[BaseRollout]:
    """The rollout class for ``actor_rollout_ref.rollout.name`` (and ``.mode``).

    Raises:
        ValueError: unknown name or mode.
        ImportError: the engine package is not installed (e.g. ``vllm`` on a CPU machine).
    """
    if mode not in _MODES:
        raise ValueError(f"actor_rollout_ref.rollout.mode={mode!r} is not one of {_MODES}")
    if rollout_name not in _ROLLOUT_REGISTRY:
        raise ValueError(
            f"actor_rollout_ref.rollout.name={rollout_name!r} is not a registered rollout; valid: "
            f"{sorted(_ROLLOUT_REGISTRY)}"
        )
    module_name, attribute, requires = _ROLLOUT_REGISTRY[rollout_name]
    if requires is not None and importlib.util.find_spec(requires) is None:
        raise ImportError(
            f"actor_rollout_ref.rollout.name={rollout_name} needs the {requires!r} package, which is not installed. "
            f"Install it on GPU/NPU machines (vllm, or vllm-ascend on Ascend), or use "
            f"actor_rollout_ref.rollout.name=hf (transformers generate; CPU and small models)"
        )
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as err:
        if err.name != module_name:
            raise
        raise ImportError(
            f"actor_rollout_ref.rollout.name={rollout_name}: this installation has no {module_name} module; use "
            "actor_rollout_ref.rollout.name=hf"
        ) from err
    return getattr(module, attribute)
