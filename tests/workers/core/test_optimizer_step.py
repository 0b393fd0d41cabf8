"""The clipped optimizer step, optimizer and lr-schedule construction (verl/workers/core/optimizer_step.py)."""

import math

import pytest
import torch

from verl.workers.config import FSDPOptimizerConfig
from verl.workers.core.optimizer_step import build_lr_scheduler, build_optimizer, clip_grad_and_step, warmup_steps


def _model_with_grad(grad: list[float]) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    model = torch.nn.Linear(2, 1, bias=False)
    with torch.no_grad():
        model.weight.zero_()
    model.weight.grad = torch.tensor([grad])
    return model, torch.optim.SGD(model.parameters(), lr=1.0)


def test_clip_then_step_by_hand():
    """Gradient (3, 4): norm 5, clipped to norm 1 -> (0.6, 0.8); SGD lr 1 from w = 0 gives w = (-0.6, -0.8)."""
    model, optimizer = _model_with_grad([3.0, 4.0])
    result = clip_grad_and_step(model, optimizer, max_norm=1.0)
    assert result.stepped and result.grad_norm == pytest.approx(5.0)
    torch.testing.assert_close(model.weight.detach(), torch.tensor([[-0.6, -0.8]]))


def test_non_finite_gradient_skips_the_step(caplog):
    """Invariant: an inf norm never reaches the weights; the gradients are dropped and the warning names the key."""
    model, optimizer = _model_with_grad([math.inf, 1.0])
    result = clip_grad_and_step(model, optimizer, max_norm=1.0, config_key="critic.grad_clip")
    assert not result.stepped and math.isinf(result.grad_norm)
    assert model.weight.detach().eq(0).all() and model.weight.grad is None
    assert "critic.grad_clip" in caplog.text


def test_optimizer_and_schedules():
    """lr 0.1, warmup ratio 0.2 of 10 steps = 2 warmup steps: the constant schedule gives lr 0, 0.05, 0.1, 0.1;
    override_optimizer_config reaches the optimizer; an unknown optimizer names both keys."""
    cfg = FSDPOptimizerConfig(
        lr=0.1, lr_warmup_steps_ratio=0.2, total_training_steps=10, override_optimizer_config={"eps": 1e-3}
    )
    assert warmup_steps(cfg) == 2
    optimizer = build_optimizer([torch.nn.Parameter(torch.zeros(1))], cfg)
    assert optimizer.defaults["eps"] == 1e-3
    scheduler = build_lr_scheduler(optimizer, cfg)
    rates = []
    for _ in range(4):
        rates.append(scheduler.get_last_lr()[0])
        optimizer.step()
        scheduler.step()
    assert rates == pytest.approx([0.0, 0.05, 0.1, 0.1])
    with pytest.raises(ValueError, match="optim.optimizer='Nope' is not found in optim.optimizer_impl"):
        build_optimizer([torch.nn.Parameter(torch.zeros(1))], FSDPOptimizerConfig(optimizer="Nope"))


def test_cosine_needs_the_total_steps():
    cfg = FSDPOptimizerConfig(lr_scheduler_type="cosine", total_training_steps=-1)
    optimizer = build_optimizer([torch.nn.Parameter(torch.zeros(1))], FSDPOptimizerConfig())
    with pytest.raises(ValueError, match="needs optim.total_training_steps"):
        build_lr_scheduler(optimizer, cfg)
