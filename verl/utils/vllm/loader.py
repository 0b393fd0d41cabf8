"""A vLLM model loader that records each layer's canonical layout before vLLM post-processes the weights.

vLLM builds the model, loads the weights (checkpoint or dummy), then runs every layer's post-load processing (see
:mod:`verl.utils.vllm.canonical_reload` for why the layout before that step is what an exact weight update needs).
The only moment both the loaded model and the unprocessed layout exist is between the two, inside the model loader.
So the rollout builds its engine with ``load_format="verl_canonical"``: a loader registered through vLLM's public
``register_model_loader`` that delegates everything to the loader of the format the user configured
(``auto``, ``dummy``, ``safetensors``, ...) and, after its ``load_weights``, captures the layout onto the model.

Registration happens in the process that builds the engine (the rollout runs vLLM in-process), when the rollout is
built — never at import.
"""

from __future__ import annotations

import copy
from typing import Any

from verl.utils.vllm.canonical_reload import CANONICAL_LAYOUT_ATTR, CanonicalLayout

__all__ = ["CANONICAL_LOAD_FORMAT", "INNER_FORMAT_KEY", "canonical_loader_kwargs", "register_canonical_loader"]

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
            self.inner.load_weights(model, model_config)
            setattr(model, CANONICAL_LAYOUT_ATTR, CanonicalLayout.capture(model, self._vllm_config))

        def __getattr__(self, name: str) -> Any:  # anything else vLLM asks a loader (get_all_weights, ...)
            if name == "inner":
                raise AttributeError(name)
            return getattr(self.inner, name)

    register_model_loader(CANONICAL_LOAD_FORMAT)(CanonicalLayoutLoader)
    _registered = True
