"""A vLLM model loader that records each layer's canonical layout before vLLM post-processes the weights.

vLLM builds the model, loads the weights (checkpoint or dummy), then runs every layer's post-load processing (see
:mod:`verl.utils.vllm.canonical_reload` for why the layout before that step is what an exact weight update needs).
The only moment both the loaded model and the unprocessed layout exist is between the two, inside the model loader.
So the rollout builds its engine with ``load_format="verl_canonical"``: a loader registered through vLLM's public
``register_model_loader`` that delegates everything to the loader of the format the user configured
(``auto``, ``dummy``, ``safetensors``, ...) and, after its ``load_weights``, captures the layout onto the model.

A ``dummy`` load (random weights, replaced by the actor's at the first sync) randomises every persistent buffer
too, and some are not weights: vLLM's Qwen-VL models keep the image normalisation (``visual.input_norm``: scale
``rescale_factor / std`` and shift ``-mean / std`` per channel, from the processor config) in buffers. No checkpoint
and no weight sync writes them, so the engine would normalise every image with random constants for the whole run
(measured on the tiny Qwen3.5 VL model: image-prompt log-probs 0.5 nats off a fresh engine after an exact sync of
every weight). The loader therefore gives persistent buffers back the values the model was constructed with after a
``dummy`` load, which is what a checkpoint load leaves in buffers the checkpoint does not hold.

Registration happens in the process that builds the engine (the rollout runs vLLM in-process), when the rollout is
built — never at import.
"""

from __future__ import annotations

import copy
from typing import Any

from verl.utils.vllm.canonical_reload import CANONICAL_LAYOUT_ATTR, CanonicalLayout

__all__ = [
    "CANONICAL_LOAD_FORMAT",
    "INNER_FORMAT_KEY",
    "canonical_loader_kwargs",
    "persistent_buffers",
    "register_canonical_loader",
    "restore_buffers",
]

CANONICAL_LOAD_FORMAT = "verl_canonical"
# Key of ``model_loader_extra_config`` that carries the user's load format to the inner loader.
INNER_FORMAT_KEY = "verl_inner_load_format"

_registered = False


def canonical_loader_kwargs(load_format: str, extra_config: dict | None = None) -> dict[str, Any]:
    """``vllm.LLM`` keyword arguments that load with ``load_format`` through the recording loader."""
    extra = dict(extra_config or {})
    if INNER_FORMAT_KEY in extra:
        raise ValueError(f"model_loader_extra_config must not set {INNER_FORMAT_KEY!r} (used by verl's loader)")
    extra[INNER_FORMAT_KEY] = load_format
    return {"load_format": CANONICAL_LOAD_FORMAT, "model_loader_extra_config": extra}


def persistent_buffers(model: Any) -> dict[str, Any]:
    """Copies of ``model``'s persistent buffers (those ``state_dict`` holds), by qualified name."""
    out = {}
    for module_name, module in model.named_modules():
        for name, buffer in module._buffers.items():
            if buffer is not None and name not in module._non_persistent_buffers_set:
                out[f"{module_name}.{name}" if module_name else name] = buffer.detach().clone()
    return out


def restore_buffers(model: Any, values: dict[str, Any]) -> None:
    """Copy ``values`` (from :func:`persistent_buffers`) back into the model's buffers, in place."""
    import torch

    with torch.no_grad():
        for name, value in values.items():
            model.get_buffer(name).copy_(value)


def register_canonical_loader() -> None:
    """Register the ``verl_canonical`` load format with vLLM (idempotent, per process)."""
    global _registered
    if _registered:
        return
    from vllm.model_executor.model_loader import get_model_loader, register_model_loader
    from vllm.model_executor.model_loader.base_loader import BaseModelLoader

    class CanonicalLayoutLoader(BaseModelLoader):
        """Delegates to the configured format's loader; records the canonical layout after its load_weights."""

        def __init__(self, load_config: Any) -> None:
            super().__init__(load_config)
            extra = dict(load_config.model_loader_extra_config or {})
            inner_format = extra.pop(INNER_FORMAT_KEY, "auto")
            inner_config = copy.copy(load_config)
            inner_config.load_format = inner_format
            inner_config.model_loader_extra_config = extra
            self.inner = get_model_loader(inner_config)
            self._keeps_buffers = inner_format == "dummy"
            if type(self.inner).load_model is not BaseModelLoader.load_model:
                raise ValueError(
                    f"actor_rollout_ref.rollout.load_format={inner_format!r}: its vLLM loader "
                    f"({type(self.inner).__name__}) builds the model itself, so verl cannot record the layout that "
                    "exact weight sync needs; use auto, safetensors, pt or dummy"
                )
            self._vllm_config = None

        def download_model(self, model_config: Any) -> None:
            self.inner.download_model(model_config)

        def load_model(self, vllm_config: Any, model_config: Any, *args: Any, **kwargs: Any) -> Any:
            self._vllm_config = vllm_config
            return super().load_model(vllm_config, model_config, *args, **kwargs)

        def load_weights(self, model: Any, model_config: Any) -> None:
            constructed = persistent_buffers(model) if self._keeps_buffers else {}
            self.inner.load_weights(model, model_config)
            restore_buffers(model, constructed)
            setattr(model, CANONICAL_LAYOUT_ATTR, CanonicalLayout.capture(model, self._vllm_config))

        def __getattr__(self, name: str) -> Any:  # anything else vLLM asks a loader (get_all_weights, ...)
            if name == "inner":
                raise AttributeError(name)
            return getattr(self.inner, name)

    register_model_loader(CANONICAL_LOAD_FORMAT)(CanonicalLayoutLoader)
    _registered = True
