"""Numerical kernels with per-device backends (pure torch everywhere; fla on CUDA / Ascend when installed)."""

from verl.ops.backends import BACKENDS, fla_available, select_backend
from verl.ops.causal_conv1d import causal_conv1d, torch_causal_conv1d
from verl.ops.gated_delta_rule import chunk_gated_delta_rule, l2norm, torch_chunk_gated_delta_rule

__all__ = [
    "BACKENDS",
    "causal_conv1d",
    "chunk_gated_delta_rule",
    "fla_available",
    "l2norm",
    "select_backend",
    "torch_causal_conv1d",
    "torch_chunk_gated_delta_rule",
]
