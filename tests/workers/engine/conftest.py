"""Shared fixtures of the engine tests: a one-rank gloo process group and tiny HF checkpoints on disk."""

import pytest
import torch.distributed as dist

from verl.models.tiny import build_tiny_model


@pytest.fixture
def single_rank_group(tmp_path):
    """torch.distributed with world size 1 (gloo, file store) for one test; the engines shard over it."""
    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/pg_store", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


@pytest.fixture
def tiny_qwen2_dir(tmp_path, make_model):
    """The tiny Qwen2 of tests/workers/conftest.py (hidden 32, 2 layers, vocab 128, seed 0) saved as a checkpoint."""
    path = tmp_path / "tiny_qwen2"
    make_model().save_pretrained(path)
    return str(path)


@pytest.fixture(scope="session")
def tiny_qwen3_5_moe_dir(tmp_path_factory):
    """A saved tiny Qwen3.5-MoE text model (verl.models.tiny, vocab 128) as an HF checkpoint directory."""
    path = tmp_path_factory.mktemp("tiny_qwen3_5_moe")
    build_tiny_model("qwen3_5_moe", vocab_size=128).save_pretrained(path)
    return str(path)
