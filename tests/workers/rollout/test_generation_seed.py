"""generation_seed: the sampling seed of one generate call depends only on (seed, step, validate, dp rank)."""

from verl.workers.rollout.base import generation_seed


def test_same_inputs_same_seed_and_each_input_matters():
    """Deterministic (resume and device independent), and each of the four inputs changes the stream."""
    base = generation_seed(42, {"global_steps": 3, "validate": False}, dp_rank=0)
    assert base == generation_seed(42, {"global_steps": 3, "validate": False}, dp_rank=0)
    variants = [
        generation_seed(43, {"global_steps": 3, "validate": False}, dp_rank=0),
        generation_seed(42, {"global_steps": 4, "validate": False}, dp_rank=0),
        generation_seed(42, {"global_steps": 3, "validate": True}, dp_rank=0),
        generation_seed(42, {"global_steps": 3, "validate": False}, dp_rank=1),
    ]
    assert base not in variants and len(set(variants)) == 4


def test_seed_is_a_valid_torch_seed():
    """Seeds stay below 2**63 (torch.manual_seed accepts them) for any step."""
    import torch

    for step in range(50):
        seed = generation_seed(7, {"global_steps": step}, dp_rank=step % 3)
        assert 0 <= seed < 2**63
        torch.Generator().manual_seed(seed)
