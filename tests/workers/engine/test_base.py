"""BaseEngine / BaseEngineCtx / EngineRegistry (verl/workers/engine/base.py): upstream names and semantics."""

import contextlib
import subprocess
import sys

import pytest
import torch

from verl.protocol import DataProto
from verl.workers.engine import BaseEngine, BaseEngineCtx, EngineRegistry


class _RecordingEngine(BaseEngine):
    """Records the order of lifecycle calls; no model."""

    def __init__(self, *args, **kwargs):
        self.args, self.kwargs, self.calls = args, kwargs, []

    def initialize(self):
        self.calls.append("initialize")

    @property
    def is_param_offload_enabled(self):
        return True

    @property
    def is_optimizer_offload_enabled(self):
        return False

    def enter_mode(self, mode):
        self.calls.append(f"enter_{mode}")

    def exit_mode(self, mode):
        self.calls.append(f"exit_{mode}")

    def to(self, device, model=True, optimizer=True, grad=True):
        self.calls.append(f"to_{device}")

    def forward_backward_batch(self, data, loss_function=None, forward_only=False):
        self.calls.append(f"forward_backward(forward_only={forward_only}, grad={torch.is_grad_enabled()})")
        return {"model_output": {}, "metrics": {"loss": 1.5}}

    def optimizer_zero_grad(self):
        self.calls.append("zero_grad")

    def optimizer_step(self):
        self.calls.append("step")
        return 0.25

    def lr_scheduler_step(self):
        return 0.1

    def get_per_tensor_param(self, **kwargs):
        return iter(()), None

    def save_checkpoint(self, local_path, hdfs_path=None, global_step=0, max_ckpt_to_keep=None):
        pass

    def load_checkpoint(self, local_path, hdfs_path=None, del_local_after_load=True):
        pass

    def get_data_parallel_size(self):
        return 1

    def get_data_parallel_rank(self):
        return 0

    def get_data_parallel_group(self):
        return None


@pytest.fixture
def clean_registry(monkeypatch):
    """An empty registry for one test (built-ins not loaded), restored afterwards."""
    monkeypatch.setattr(EngineRegistry, "_engines", {})
    monkeypatch.setattr(EngineRegistry, "_builtins_loaded", True)
    return EngineRegistry


def test_register_every_backend_device_pair_and_new_passes_arguments(clean_registry):
    """Invariant: register(model_type, [b1, b2], [d1, d2]) makes the class reachable under all four keys, lookups
    default to the current device (cpu here), and new() forwards positional and keyword arguments."""
    clean_registry.register("language_model", ["fsdp", "fsdp2"], device=["cpu", "npu"])(_RecordingEngine)
    assert sorted(clean_registry.registered()) == [
        ("language_model", "fsdp", "cpu"),
        ("language_model", "fsdp", "npu"),
        ("language_model", "fsdp2", "cpu"),
        ("language_model", "fsdp2", "npu"),
    ]
    assert clean_registry.get_engine_cls("language_model", "fsdp", device="npu") is _RecordingEngine
    engine = clean_registry.new("language_model", "fsdp2", "model_cfg", engine_config="engine_cfg")
    assert isinstance(engine, _RecordingEngine)
    assert engine.args == ("model_cfg",) and engine.kwargs == {"engine_config": "engine_cfg"}


def test_unknown_strategy_error_names_the_key_and_the_registered_engines(clean_registry):
    """Invariant: a lookup miss raises ValueError naming the strategy key to change and listing what exists."""
    clean_registry.register("language_model", "fsdp2", device="cpu")(_RecordingEngine)
    with pytest.raises(ValueError, match=r"strategy='megatron'.*language_model/fsdp2/cpu.*actor.strategy"):
        clean_registry.get_engine_cls("language_model", "megatron")


def test_importing_the_package_has_no_side_effects():
    """Invariant: `import verl.workers.engine` neither registers engines nor imports the backends (FSDP, VeOmni);
    the first lookup does."""
    code = (
        "import sys; from verl.workers.engine import EngineRegistry as R; "
        "assert not R._engines and 'verl.workers.engine.fsdp' not in sys.modules; "
        "R.get_engine_cls('language_model', 'fsdp2'); assert R._engines; "
        "assert 'veomni' not in sys.modules"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


def test_builtin_engines_registered():
    """Invariant: the FSDP engines (LM and value head) exist for cpu/cuda/npu; VeOmni (LM only, as upstream v0.7.1)
    for cuda/npu only (VeOmni has no CPU collective backend)."""
    keys = set(EngineRegistry.registered())
    for model_type in ("language_model", "value_model"):
        for backend in ("fsdp", "fsdp2"):
            assert {(model_type, backend, d) for d in ("cpu", "cuda", "npu")} <= keys
    assert ("language_model", "veomni", "npu") in keys and ("language_model", "veomni", "cpu") not in keys
    assert ("value_model", "veomni", "npu") not in keys


def test_mode_context_enters_and_exits_unless_auto_offload_disabled():
    """Invariant: train_mode/eval_mode call enter_mode on entry and exit_mode on exit (even on error);
    disable_auto_offload=True keeps everything loaded on exit."""
    engine = _RecordingEngine()
    with engine.train_mode():
        pass
    with contextlib.suppress(KeyError), engine.eval_mode():
        raise KeyError("boom")
    with engine.eval_mode(disable_auto_offload=True):
        pass
    assert engine.calls == ["enter_train", "exit_train", "enter_eval", "exit_eval", "enter_eval"]
    with pytest.raises(ValueError, match="'train' or 'eval'"):
        BaseEngineCtx(engine, "predict")


def test_train_batch_is_zero_grad_forward_backward_step_and_infer_has_no_grad():
    """Invariant: train_batch runs zero_grad → forward_backward(forward_only=False) → optimizer_step and reports
    the step's grad norm and whether it was skipped (``last_step_skipped``, False for an engine that never skips);
    infer_batch runs forward_only with gradients disabled."""
    engine = _RecordingEngine()
    data = DataProto.from_single_dict({"x": torch.zeros(2, 1)})
    out = engine.train_batch(data, loss_function=lambda *a: None)
    assert out["metrics"] == {"loss": 1.5, "grad_norm": 0.25, "skipped_steps": 0.0}
    engine.infer_batch(data)
    assert engine.calls == [
        "zero_grad",
        "forward_backward(forward_only=False, grad=True)",
        "step",
        "forward_backward(forward_only=True, grad=False)",
    ]
