"""Warmup learning-rate schedules (verl.utils.lr_schedules): factors worked out by hand."""

import math

import pytest
import torch

from verl.utils.lr_schedules import (
    get_constant_schedule_with_warmup,
    get_cosine_schedule_with_warmup,
    get_wsd_schedule_with_warmup,
)


def _factors(scheduler, steps):
    """lr / initial lr (initial lr 1.0) for the first `steps` scheduler steps."""
    out = []
    for _ in range(steps):
        out.append(scheduler.optimizer.param_groups[0]["lr"])
        scheduler.optimizer.step()
        scheduler.step()
    return out


def _optimizer():
    return torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)


def test_cosine_with_warmup():
    """warmup 2, total 6, min 0.1: steps 0,1 -> 0, 0.5; then 0.1 + 0.9 * 0.5 * (1 + cos(pi * p)) with
    p = 0, 1/4, 2/4, 3/4 -> 1.0, 0.868198, 0.55, 0.231802."""
    factors = _factors(get_cosine_schedule_with_warmup(_optimizer(), 2, 6, min_lr_ratio=0.1), 6)
    cosine = [0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * p)) for p in (0, 0.25, 0.5, 0.75)]
    assert factors == pytest.approx([0.0, 0.5, *cosine], abs=1e-12)
    assert cosine[1] == pytest.approx(0.868198, abs=1e-6)


def test_cosine_init_ratio_and_one_indexed_steps():
    """init_lr_ratio 0.2, warmup 4: step s -> 0.2 + 0.8 * s/4; zero_indexed_step=False shifts s by one."""
    zero = _factors(get_cosine_schedule_with_warmup(_optimizer(), 4, 10, init_lr_ratio=0.2), 3)
    one = _factors(get_cosine_schedule_with_warmup(_optimizer(), 4, 10, init_lr_ratio=0.2, zero_indexed_step=False), 3)
    assert zero == pytest.approx([0.2, 0.4, 0.6], abs=1e-12)
    assert one == pytest.approx([0.4, 0.6, 0.8], abs=1e-12)


def test_constant_with_warmup():
    """warmup 4: 0, 0.25, 0.5, 0.75, then 1 forever."""
    assert _factors(get_constant_schedule_with_warmup(_optimizer(), 4), 6) == pytest.approx([0, 0.25, 0.5, 0.75, 1, 1])


def test_wsd():
    """warmup 2, total 12, stable 0.5: 10 remaining -> 5 stable (steps 2-6) and 5 decay steps (7-11) going
    0.1 + 0.9 * 0.5 * (1 + cos(pi * k/5)); at/after total -> min 0.1."""
    factors = _factors(get_wsd_schedule_with_warmup(_optimizer(), 2, 12, min_lr_ratio=0.1, stable_ratio=0.5), 13)
    decay = [0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * k / 5)) for k in range(5)]
    assert factors == pytest.approx([0.0, 0.5, 1, 1, 1, 1, 1, *decay, 0.1], abs=1e-12)


@pytest.mark.parametrize(
    "make",
    [
        lambda o: get_cosine_schedule_with_warmup(o, 1, 5, min_lr_ratio=1.5),
        lambda o: get_cosine_schedule_with_warmup(o, 1, 5, init_lr_ratio=-0.1),
        lambda o: get_wsd_schedule_with_warmup(o, 1, 5, stable_ratio=2.0),
    ],
)
def test_ratio_out_of_range_raises(make):
    """Ratios outside [0, 1] raise ValueError naming the optim config key."""
    with pytest.raises(ValueError, match="actor_rollout_ref.actor.optim"):
        make(_optimizer())
