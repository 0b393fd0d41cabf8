"""Optimizer config: schedule choices, the deprecated warmup_style alias and range checks."""

import pytest

from verl.workers.config import FSDPOptimizerConfig


def test_warmup_style_is_an_alias_of_lr_scheduler_type():
    """warmup_style=cosine (deprecated) sets lr_scheduler_type=cosine; contradicting both raises."""
    assert FSDPOptimizerConfig(warmup_style="cosine").lr_scheduler_type == "cosine"
    with pytest.raises(ValueError, match=r"^warmup_style: \('constant'\) contradicts lr_scheduler_type \('cosine'\)"):
        FSDPOptimizerConfig(warmup_style="constant", lr_scheduler_type="cosine")


def test_unknown_scheduler():
    """Only constant and cosine schedules exist."""
    with pytest.raises(ValueError, match=r"^lr_scheduler_type: 'linear' is not supported"):
        FSDPOptimizerConfig(lr_scheduler_type="linear")


@pytest.mark.parametrize(
    "kwargs, key",
    [
        ({"lr": -1.0}, "lr"),
        ({"betas": [0.9]}, "betas"),
        ({"min_lr_ratio": 1.5}, "min_lr_ratio"),
        ({"lr_warmup_steps_ratio": 2.0}, "lr_warmup_steps_ratio"),
        ({"clip_grad": 0.0}, "clip_grad"),
    ],
)
def test_out_of_range_values_name_the_key(kwargs, key):
    """Each range check names its key."""
    with pytest.raises(ValueError, match=rf"^{key}:"):
        FSDPOptimizerConfig(**kwargs)


def test_total_training_steps_is_set_by_the_trainer():
    """total_training_steps is the one mutable field (known only once the dataloader exists)."""
    cfg = FSDPOptimizerConfig()
    cfg.total_training_steps = 100
    assert cfg.total_training_steps == 100
