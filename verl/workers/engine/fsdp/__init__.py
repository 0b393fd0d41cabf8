"""FSDP1/FSDP2 engines (``strategy`` ``fsdp`` / ``fsdp2``); importing this package registers them."""

from verl.workers.engine.fsdp.transformer_impl import FSDPEngine, FSDPEngineWithLMHead, FSDPEngineWithValueHead

__all__ = ["FSDPEngine", "FSDPEngineWithLMHead", "FSDPEngineWithValueHead"]
