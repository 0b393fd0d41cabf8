"""Optional-import and engine-introspection helpers for vLLM (and vllm-ascend on Ascend).

Nothing here imports vLLM at import time: it is an optional dependency, absent from the main environment; its CPU
build has an environment of its own (docs/cpu_notes.md "vLLM on the CPU").
"""

from __future__ import annotations

import importlib
import importlib.util
from types import ModuleType
from typing import Any

import torch.nn as nn

from verl.utils.platform.registry import PlatformRegistry

__all__ = ["VLLM_INSTALL_HINT", "get_vllm_model", "is_vllm_available", "require_vllm"]

VLLM_INSTALL_HINT = (
    "install it with `pip install verl[vllm]` on CUDA GPUs; on Ascend NPUs use the verl Ascend image "
    "(docker/ascend: CANN + torch_npu + vllm + vllm-ascend), or install vllm then vllm-ascend matching your CANN. "
    "Without vLLM, set actor_rollout_ref.rollout.name=hf"
)

# Where vLLM keeps the model of an in-process engine, newest first: V1 LLMEngine with multiprocessing off (or the
# external launcher) exposes the executor directly; older layouts nest it in the engine core.
_MODEL_PATHS = (
    "llm_engine.model_executor.driver_worker.worker.model_runner.model",
    "llm_engine.model_executor.driver_worker.model_runner.model",
    "llm_engine.engine_core.engine_core.model_executor.driver_worker.worker.model_runner.model",
)


def is_vllm_available() -> bool:
    """True when the ``vllm`` package can be found (it is not imported)."""
    return importlib.util.find_spec("vllm") is not None


def require_vllm(device_name: str = "cuda") -> ModuleType:
    """Import and return ``vllm``, and the device's vLLM platform plugin (``Platform.vllm_platform_plugin``, e.g.
    vllm-ascend on NPU) where it needs one.

    Raises ImportError naming the install command / image when either is missing.
    """
    try:
        vllm = importlib.import_module("vllm")
    except ImportError as exc:
        raise ImportError(f"actor_rollout_ref.rollout.name=vllm needs the `vllm` package: {VLLM_INSTALL_HINT}") from exc
    plugin = PlatformRegistry.platform_class(device_name).vllm_platform_plugin
    if plugin is not None and importlib.util.find_spec(plugin) is None:
        raise ImportError(
            f"actor_rollout_ref.rollout.name=vllm on trainer.device={device_name} needs the "
            f"{plugin.replace('_', '-')} platform plugin (module `{plugin}`), which is not installed: {VLLM_INSTALL_HINT}"
        )
    return vllm


def _resolve(obj: Any, dotted: str) -> Any:
    for attr in dotted.split("."):
        obj = getattr(obj, attr)
    return obj


def get_vllm_model(llm: Any) -> nn.Module:
    """The ``nn.Module`` of an in-process ``vllm.LLM`` (for weight sync). Raises RuntimeError if it lives elsewhere."""
    for path in _MODEL_PATHS:
        try:
            model = _resolve(llm, path)
        except AttributeError:
            continue
        if model is not None:
            return model
    raise RuntimeError(
        "cannot reach the vLLM model in this process (tried llm." + ", llm.".join(_MODEL_PATHS) + "). The engine must "
        "run in-process: build it through verl's vLLMRollout (it sets VLLM_ENABLE_V1_MULTIPROCESSING=0 and the "
        "external launcher), or report the vLLM version."
    )
