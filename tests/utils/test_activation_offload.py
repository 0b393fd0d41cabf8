"""Activation offload (verl/utils/activation_offload.py): same gradients, and the in-place failure mode."""

import pytest
import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from verl.utils.activation_offload import enable_activation_offloading


def _tiny() -> Qwen2ForCausalLM:
    torch.manual_seed(0)
    cfg = Qwen2Config(
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=128,
        max_position_embeddings=64,
        attn_implementation="eager",
        use_cache=False,
    )
    return Qwen2ForCausalLM(cfg).float()


def _grads(model, ids):
    model.zero_grad()
    logits = model(input_ids=ids).logits
    (logits / 0.7).log_softmax(-1)[..., 3].sum().backward()
    return {n: p.grad.clone() for n, p in model.named_parameters()}


@pytest.mark.parametrize("checkpointing", [False, True])
def test_offload_keeps_gradients_identical(checkpointing):
    """Invariant: moving saved activations to the host and back changes no gradient (exact equality, the
    values are copied, not recomputed), with and without gradient checkpointing; tensors really were offloaded."""
    ids = torch.randint(0, 128, (2, 9), generator=torch.Generator().manual_seed(3))
    model = _tiny()
    if checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.train()
    expected = _grads(model, ids)
    handle = enable_activation_offloading(model, "fsdp2", enable_ckpt=checkpointing)
    assert handle.num_groups == 3  # two decoder layers + the LM head
    got = _grads(model, ids)
    assert handle.offloader.num_offloaded > 0
    for name, grad in expected.items():
        assert torch.equal(got[name], grad), name


def test_in_place_temperature_division_fails_under_offload():
    """Invariant (field-report item 3): under activation offload the logits come out of a custom autograd
    Function that returns its input, so `logits.div_(temperature)` — also on a `squeeze` view — raises; without
    offload the same in-place call is accepted. Out-of-place `logits / temperature` works in both cases."""
    ids = torch.randint(0, 128, (1, 9), generator=torch.Generator().manual_seed(4))
    model = _tiny()
    model(input_ids=ids).logits.div_(0.7)  # accepted without offload
    enable_activation_offloading(model)
    with pytest.raises(RuntimeError, match="modified inplace"):
        model(input_ids=ids).logits.div_(0.7)
    with pytest.raises(RuntimeError, match="modified inplace"):
        model(input_ids=ids).logits.squeeze(0).div_(0.7)
    (model(input_ids=ids).logits.squeeze(0) / 0.7).sum().backward()


def test_no_offload_without_grad_and_remove_uninstalls():
    """Invariant: inference (no_grad) offloads nothing; `remove()` restores the plain model."""
    ids = torch.randint(0, 128, (1, 9), generator=torch.Generator().manual_seed(5))
    model = _tiny()
    handle = enable_activation_offloading(model)
    with torch.no_grad():
        model(input_ids=ids)
    assert handle.offloader.num_offloaded == 0
    handle.remove()
    model(input_ids=ids).logits.div_(0.7)
    assert handle.offloader.num_offloaded == 0
