"""Shared utilities (device contract, torch functional, datasets, reward scores, checkpoints, tracking).

Upstream verl re-exports a few helpers at the package level (``from verl.utils import omega_conf_to_dataclass``,
``hf_tokenizer``, ``group_mean_std``, ...). They are resolved here on first access rather than imported with the
package: ``verl.utils`` is imported by almost every module (``verl.utils.device``), and importing the tokenizer
helpers eagerly would pull in transformers for all of them.
"""

from __future__ import annotations

import importlib
from typing import Any

# name -> module that defines it (upstream's package-level names of verl.utils).
_EXPORTS = {
    "omega_conf_to_dataclass": "verl.utils.config",
    "validate_config": "verl.utils.config",
    "hf_tokenizer": "verl.utils.tokenizer",
    "hf_processor": "verl.utils.tokenizer",
    "set_pad_token_id": "verl.utils.tokenizer",
    "as_torch_index": "verl.utils.groupwise",
    "group_mean_std": "verl.utils.groupwise",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'verl.utils' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # resolved once
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))
