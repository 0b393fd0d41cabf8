"""Model families verl has model-specific code for, and the transformers versions that code supports."""

from __future__ import annotations

__all__ = ["QWEN3_5_MODEL_TYPES", "QWEN3_5_TRANSFORMERS", "is_qwen3_5"]

# HF `config.model_type` of the Qwen3.5 family (text sub-configs `*_text` belong to their parent type).
QWEN3_5_MODEL_TYPES = ("qwen3_5", "qwen3_5_moe")
# Versions our Qwen3.5 patches were written and tested for: 5.4.0 (the field report's) to the newest 5.x.
# Qwen3.5 first appears in 5.2; 5.2/5.3 differ in get_rope_index and are not tested.
QWEN3_5_TRANSFORMERS = ">=5.4.0,<6"


def is_qwen3_5(model_type: str) -> bool:
    """True for ``qwen3_5``, ``qwen3_5_moe`` and their ``_text`` / ``_vision`` sub-config types."""
    for suffix in ("_text", "_vision"):
        if model_type.endswith(suffix):
            model_type = model_type[: -len(suffix)]
    return model_type in QWEN3_5_MODEL_TYPES
