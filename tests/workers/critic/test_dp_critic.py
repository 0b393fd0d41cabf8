"""DataParallelPPOCritic (verl/workers/critic/dp_critic.py) with the value head on the causal-LM backbone."""

import copy

import pytest
import torch

from verl.utils.model import attach_value_head
from verl.workers.config.critic import FSDPCriticConfig, FSDPCriticModelCfg
from verl.workers.critic.dp_critic import DataParallelPPOCritic


def _config(rmpad: bool = True, **overrides) -> FSDPCriticConfig:
    base = dict(
        strategy="fsdp2",
        ppo_mini_batch_size=8,
        ppo_micro_batch_size_per_gpu=2,
        ppo_max_token_len_per_gpu=64,
        forward_max_token_len_per_gpu=64,
        grad_clip=1.0,
        model=FSDPCriticModelCfg(use_remove_padding=rmpad),
    )
    base.update(overrides)
    return FSDPCriticConfig(**base)


def _value_model(make_model):
    model = make_model(tie=True)
    model.config.tie_word_embeddings = False
    return attach_value_head(model, seed=1)


def _naive_values(model, batch):
    """Reference: padded forward; values[:, t] read at column S - R - 1 + t, masked by the response mask."""
    td = batch.batch
    r = td["responses"].shape[1]
    out = model(input_ids=td["input_ids"], attention_mask=td["attention_mask"], position_ids=td["position_ids"])
    return out.logits[:, -r - 1 : -1, 0] * td["attention_mask"][:, -r:]


def test_value_head_shape_and_seeded_init(make_model):
    """Invariant: the value head maps hidden (32) to 1 unit without bias and is identical for the same seed."""
    a, b = _value_model(make_model), _value_model(make_model)
    assert tuple(a.get_output_embeddings().weight.shape) == (1, 32)
    assert a.get_output_embeddings().bias is None
    assert torch.equal(a.get_output_embeddings().weight, b.get_output_embeddings().weight)


def test_compute_values_packed_equals_padded(make_model, make_batch):
    """Invariant: values are the same packed or padded, with fixed or token-budget micro-batches (order
    restored), and equal the naive padded forward on the response window (fp32: 1e-5)."""
    model, batch = _value_model(make_model), make_batch()
    with torch.no_grad():
        expected = _naive_values(model, batch)
    for rmpad in (True, False):
        critic = DataParallelPPOCritic(_config(rmpad), model, None)
        batch.meta_info.update(micro_batch_size=3, use_dynamic_bsz=False)
        torch.testing.assert_close(critic.compute_values(batch), expected, rtol=0, atol=1e-5)
        batch.meta_info.update(use_dynamic_bsz=True, max_token_len=30)
        torch.testing.assert_close(critic.compute_values(batch), expected, rtol=0, atol=1e-5)


def _update(model, batch, **overrides):
    trained = copy.deepcopy(model)
    optimizer = torch.optim.SGD(trained.parameters(), lr=1.0)
    metrics = DataParallelPPOCritic(_config(**overrides), trained, optimizer).update_critic(batch)
    return trained, metrics


def test_update_critic_micro_batch_invariance_and_hand_gradient(make_model, make_batch):
    """Invariants: (1) 1, 2, 4 or token-budget micro-batches give the same SGD step (1e-5); (2) the step equals
    autograd of the clipped value loss written by hand, 0.5 * token-mean(max((v - R)^2, (clip(v, v_old +- 0.5)
    - R)^2)), with clipping disabled by a large grad_clip."""
    model, batch = _value_model(make_model), make_batch()
    settings = [dict(ppo_micro_batch_size_per_gpu=m) for m in (8, 4, 2)] + [dict(use_dynamic_bsz=True)]
    runs = [_update(model, batch, grad_clip=1e9, **s) for s in settings]
    for trained, metrics in runs[1:]:
        for p, q in zip(trained.parameters(), runs[0][0].parameters()):
            torch.testing.assert_close(p, q, rtol=0, atol=1e-5)
        assert metrics["critic/vf_loss"] == pytest.approx(runs[0][1]["critic/vf_loss"], abs=1e-6)
    reference = copy.deepcopy(model)
    td = batch.batch
    v = _naive_values(reference, batch)
    clipped = torch.clamp(v, td["values"] - 0.5, td["values"] + 0.5)
    mask = td["response_mask"].float()
    losses = torch.maximum((v - td["returns"]) ** 2, (clipped - td["returns"]) ** 2)
    (0.5 * (losses * mask).sum() / mask.sum()).backward()
    for p_ref, p_new, p_old in zip(reference.parameters(), runs[0][0].parameters(), model.parameters()):
        grad = p_ref.grad if p_ref.grad is not None else torch.zeros_like(p_ref)
        torch.testing.assert_close(p_old - p_new, grad, rtol=0, atol=1e-5)


def test_qwen3_5_moe_value_model_packed_equals_padded(make_batch):
    """Invariant: the value head works on the tiny Qwen3.5-MoE (no token-classification class exists for it):
    packed and padded values agree on the response window (fp32: 1e-5)."""
    from verl.models.tiny import build_tiny_model
    from verl.models.transformers.patch_registry import apply_patches

    model = attach_value_head(build_tiny_model("qwen3_5_moe", vocab_size=128), seed=0)
    apply_patches(model, platform="cpu", report=False)
    batch = make_batch()
    batch.meta_info.update(micro_batch_size=4)
    packed = DataParallelPPOCritic(_config(True), model, None).compute_values(batch)
    padded = DataParallelPPOCritic(_config(False), model, None).compute_values(batch)
    mask = batch.batch["response_mask"].bool()
    torch.testing.assert_close(packed[mask], padded[mask], rtol=0, atol=1e-5)
