"""Training engines of the engine worker path (``trainer.use_legacy_worker_impl=disable``).

``EngineRegistry.new(model_type, backend, ...)`` builds the engine for a strategy on the current device; the
built-in engines (``fsdp``/``fsdp2`` and the optional ``veomni``) are registered on the first lookup, so importing
this package has no side effects.
"""

from verl.workers.engine.base import BaseEngine, BaseEngineCtx, EngineRegistry

__all__ = ["BaseEngine", "BaseEngineCtx", "EngineRegistry"]
