"""Fixtures for the vLLM tests: the fake vLLM Qwen3.5-MoE module and tiny HF Qwen3.5-MoE source models."""

import importlib.util
import sys
from pathlib import Path

import pytest
import torch

from verl.models.tiny import build_tiny_model

FAKE_PATH = Path(__file__).with_name("fake_vllm_qwen3_5.py")


def load_fake_vllm_module():
    """Import tests/utils/vllm/fake_vllm_qwen3_5.py by path (tests are not a package)."""
    name = "fake_vllm_qwen3_5"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, FAKE_PATH)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


@pytest.fixture(scope="session")
def fake_vllm():
    return load_fake_vllm_module()


def _hf(kind: str, **overrides) -> torch.nn.Module:
    return build_tiny_model(kind, vocab_size=96, seed=0, **overrides)


@pytest.fixture(scope="session")
def hf_text_square():
    """Tiny Qwen3_5MoeForCausalLM, hidden 64 = 2 * moe_intermediate 32: every w13 expert slot is square."""
    return _hf("qwen3_5_moe")


@pytest.fixture(scope="session")
def hf_text_rect():
    """Tiny Qwen3_5MoeForCausalLM with moe_intermediate 16: w13 slots [32, 64] vs transposed [64, 32]."""
    return _hf("qwen3_5_moe", moe_intermediate_size=16)


@pytest.fixture(scope="session")
def hf_vl():
    """Tiny Qwen3_5MoeForConditionalGeneration (vision tower + language model)."""
    return _hf("qwen3_5_moe_vl")
