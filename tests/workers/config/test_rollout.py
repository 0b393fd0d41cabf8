"""Rollout config: temperature, sampling and micro-batch checks."""

import pytest

from verl.workers.config import RolloutConfig, SamplingConfig


def test_name_is_missing_by_default():
    """rollout.name is mandatory ('???', checked by validate_config); anything is accepted at construction."""
    assert RolloutConfig().name == "???"
    assert RolloutConfig(name="hf").name == "hf"


def test_training_temperature_must_be_positive():
    """The rollout temperature divides the training logits, so 0 is rejected with the greedy-validation hint."""
    with pytest.raises(ValueError, match=r"^temperature: \(0\.0\) must be > 0.*val_kwargs\.temperature=0"):
        RolloutConfig(name="hf", temperature=0.0)


def test_validation_sampling_needs_temperature_when_sampling():
    """val_kwargs: greedy (temperature 0) is fine without sampling, not with do_sample=True."""
    assert SamplingConfig().temperature == 0
    with pytest.raises(ValueError, match=r"^temperature: \(0\) must be > 0 when do_sample=True"):
        SamplingConfig(do_sample=True, temperature=0)


def test_log_prob_micro_batch_forms_exclusive():
    """log_prob_micro_batch_size and its per-GPU form are mutually exclusive."""
    with pytest.raises(ValueError, match=r"^log_prob_micro_batch_size: \(4\) and log_prob_micro_batch_size_per_gpu"):
        RolloutConfig(name="hf", log_prob_micro_batch_size=4, log_prob_micro_batch_size_per_gpu=2)


def test_unknown_engine_kwargs_key():
    """engine_kwargs holds one dict per engine; an unknown engine name is rejected."""
    with pytest.raises(ValueError, match=r"^engine_kwargs\.vlm: unknown engine"):
        RolloutConfig(name="vllm", engine_kwargs={"vlm": {}})


def test_mode():
    """async (server mode) and sync are the two modes."""
    with pytest.raises(ValueError, match=r"^mode: 'batch' is not supported"):
        RolloutConfig(name="hf", mode="batch")
