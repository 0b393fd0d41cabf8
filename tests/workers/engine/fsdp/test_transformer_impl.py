"""FSDPEngine (verl/workers/engine/fsdp/transformer_impl.py), one gloo rank: what the engine owns beyond the core
(weight stream, output order, value window, forward-only guard, strategies). The maths is compared with the legacy
path in tests/workers/test_legacy_vs_engine.py."""

import pytest
import torch
from transformers import AutoModelForCausalLM

from verl.workers.config import FSDPEngineConfig, FSDPOptimizerConfig, HFModelConfig
from verl.workers.engine import EngineRegistry

_FP32 = {"param_dtype": "fp32", "reduce_dtype": "fp32", "buffer_dtype": "fp32"}


def _engine(path: str, model_type: str = "language_model", strategy: str = "fsdp2", **engine_overrides):
    engine_config = FSDPEngineConfig(strategy=strategy, mixed_precision=_FP32, **engine_overrides)
    optim = None if engine_config.forward_only else FSDPOptimizerConfig(lr=1e-2)
    model_config = HFModelConfig(path=path, enable_gradient_checkpointing=False)
    engine = EngineRegistry.new(model_type, strategy, model_config, engine_config, optim)
    engine.initialize()
    return engine


@pytest.mark.usefixtures("single_rank_group")
def test_weight_stream_is_the_checkpoint(tiny_qwen2_dir):
    """Invariant: get_per_tensor_param streams every weight under its HF name (no wrapper prefixes) with the
    checkpoint's values, so a rollout can load it as a checkpoint; no LoRA config."""
    engine = _engine(tiny_qwen2_dir)
    stream, peft_config = engine.get_per_tensor_param()
    streamed = dict(stream)
    reference = AutoModelForCausalLM.from_pretrained(tiny_qwen2_dir, dtype=torch.float32).state_dict()
    assert peft_config is None and streamed.keys() == reference.keys()
    for name, value in reference.items():
        torch.testing.assert_close(streamed[name], value, rtol=0, atol=0, msg=name)


@pytest.mark.usefixtures("single_rank_group")
def test_dynamic_micro_batches_return_rows_in_input_order(tiny_qwen2_dir, make_batch):
    """Invariant: token-budget micro-batches (rows regrouped by length) give the same (B, R) outputs, in the input
    row order, as fixed micro-batches of 3 (fp32: 1e-6)."""
    engine = _engine(tiny_qwen2_dir)
    batch = make_batch(batch_size=8)
    outputs = []
    for meta in ({"micro_batch_size": 3}, {"use_dynamic_bsz": True, "max_token_len": 30}):
        batch.meta_info = {"temperature": 0.7, "calculate_entropy": True, **meta}
        with engine.eval_mode():
            outputs.append(engine.infer_batch(batch)["model_output"])
    assert outputs[0].keys() == {"log_probs", "entropys"}
    for key in outputs[0]:
        torch.testing.assert_close(outputs[1][key], outputs[0][key], rtol=0, atol=1e-6)


@pytest.mark.usefixtures("single_rank_group")
def test_fsdp1_and_fsdp2_engines_agree(tiny_qwen2_dir, make_batch):
    """Invariant: the strategy key only changes the wrapper: FSDP1 and FSDP2 engines give the same log-probs."""
    batch = make_batch(batch_size=4)
    batch.meta_info.update(micro_batch_size=2)
    results = []
    for strategy in ("fsdp", "fsdp2"):
        engine = _engine(tiny_qwen2_dir, strategy=strategy)
        with engine.eval_mode():
            results.append(engine.infer_batch(batch)["model_output"]["log_probs"])
    torch.testing.assert_close(results[0], results[1], rtol=0, atol=1e-6)


@pytest.mark.usefixtures("single_rank_group")
def test_value_engine_is_zero_outside_the_response(tiny_qwen2_dir, make_batch):
    """Invariant: the value engine returns (B, R) fp32 values that are 0 exactly where the response is padding
    (the legacy critic's convention) and nonzero on real response tokens."""
    engine = _engine(tiny_qwen2_dir, model_type="value_model")
    batch = make_batch(batch_size=8)
    batch.meta_info.update(micro_batch_size=4)
    with engine.eval_mode():
        values = engine.infer_batch(batch)["model_output"]["values"]
    mask = batch.batch["response_mask"].bool()
    assert values.shape == (8, 7) and values.dtype == torch.float32
    assert torch.all(values[~mask] == 0) and (~mask).any() and torch.all(values[mask] != 0)


@pytest.mark.usefixtures("single_rank_group")
def test_forward_only_engine_cannot_train_and_bad_device_is_refused(tiny_qwen2_dir):
    """Invariants: a forward-only engine (reference policy) has no optimizer and says so when asked to step; a
    trainable engine without an optimizer config is refused at construction; to() rejects an unknown device."""
    engine = _engine(tiny_qwen2_dir, forward_only=True)
    assert engine.optimizer is None
    with pytest.raises(RuntimeError, match="forward-only"):
        engine.optimizer_step()
    with pytest.raises(ValueError, match="optim"):
        EngineRegistry.new(
            "language_model", "fsdp2", HFModelConfig(path=tiny_qwen2_dir), FSDPEngineConfig(strategy="fsdp2"), None
        )
    with pytest.raises(ValueError, match="use 'cpu' or the device name"):
        engine.to("tpu")
