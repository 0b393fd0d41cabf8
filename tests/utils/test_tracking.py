"""Tracking backends: the file logger's JSON-lines format, console lines, log-dir resolution, optional backends."""

import json
import sys
import types

import numpy as np
import pytest
import torch

from verl.trainer.config import PPOTrainerConfig, TrainerConfig
from verl.utils import tracking
from verl.utils.tracking import (
    LoggerPackageMissingError,
    Tracking,
    ValidationGenerationsLogger,
    check_logger_packages,
    resolve_log_dir,
)


def _read_jsonl(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_file_backend_writes_one_json_object_per_log_call(tmp_path):
    """Each log() appends {"step": N, "data": {...}} as one line; numpy/torch scalars become plain numbers."""
    tracker = Tracking("proj", "exp", default_backend=["file"], log_dir=str(tmp_path))
    tracker.log(
        {"actor/pg_loss": 0.25, "critic/vf_loss": np.float32(1.5), "response_length/mean": torch.tensor(7)}, step=1
    )
    tracker.log({"actor/pg_loss": 0.125}, step=2)
    tracker.finish()
    assert _read_jsonl(tmp_path / "metrics.jsonl") == [
        {"step": 1, "data": {"actor/pg_loss": 0.25, "critic/vf_loss": 1.5, "response_length/mean": 7}},
        {"step": 2, "data": {"actor/pg_loss": 0.125}},
    ]


def test_file_backend_appends_across_runs_and_flushes(tmp_path):
    """A resumed run appends to the same file, and every line is on disk before finish() (crash safety)."""
    first = Tracking("p", "e", default_backend="file", log_dir=str(tmp_path))
    first.log({"x": 1.0}, step=1)
    assert _read_jsonl(tmp_path / "metrics.jsonl") == [{"step": 1, "data": {"x": 1.0}}]  # flushed already
    first.finish()
    with Tracking("p", "e", default_backend="file", log_dir=str(tmp_path)) as second:
        second.log({"x": 2.0}, step=2)
    assert [r["step"] for r in _read_jsonl(tmp_path / "metrics.jsonl")] == [1, 2]


def test_non_finite_values_stay_valid_json(tmp_path):
    """NaN/inf metrics are written as strings so every line stays strict JSON."""
    with Tracking("p", "e", default_backend="file", log_dir=str(tmp_path)) as tracker:
        tracker.log({"loss": float("nan"), "grad_norm": float("inf")}, step=3)
    line = (tmp_path / "metrics.jsonl").read_text()
    assert json.loads(line, parse_constant=lambda c: pytest.fail(f"non-strict JSON {c}")) == {
        "step": 3,
        "data": {"loss": "nan", "grad_norm": "inf"},
    }


def test_log_dir_from_trainer_config(tmp_path):
    """The file backend writes to trainer.log_dir, else trainer.default_local_dir (dict or typed config)."""
    assert resolve_log_dir({"trainer": {"log_dir": None, "default_local_dir": "/ckpt/p/e"}}) == "/ckpt/p/e"
    assert resolve_log_dir({"trainer": {"log_dir": "/logs", "default_local_dir": "/ckpt"}}) == "/logs"
    typed = PPOTrainerConfig(trainer=TrainerConfig(default_local_dir=str(tmp_path)))
    with Tracking("p", "e", default_backend=["file"], config=typed) as tracker:
        tracker.log({"a": 1}, step=0)
    assert (tmp_path / "metrics.jsonl").exists()


def test_file_backend_without_directory_names_the_key():
    """No log_dir anywhere: the error names trainer.log_dir."""
    with pytest.raises(ValueError, match=r"trainer\.log_dir"):
        Tracking("p", "e", default_backend=["file"], config={"trainer": {}})


def test_console_backend_format(capsys):
    """console prints `step:N - key:value` with floats at 3 decimals."""
    Tracking("p", "e", default_backend="console").log({"a": 0.5, "b": 3}, step=4)
    assert capsys.readouterr().out == "step:4 - a:0.500 - b:3\n"


def test_unknown_backend_names_trainer_logger():
    """An unsupported backend fails at construction, naming trainer.logger and the choices."""
    with pytest.raises(ValueError, match=r"^trainer\.logger: 'clearml' is not a supported tracking backend"):
        Tracking("p", "e", default_backend=["console", "clearml"])


def test_log_to_selected_backends_only(tmp_path, capsys):
    """log(..., backend=[...]) writes only to the named backends."""
    with Tracking("p", "e", default_backend=["console", "file"], log_dir=str(tmp_path)) as tracker:
        tracker.log({"a": 1.0}, step=1, backend=["file"])
    assert capsys.readouterr().out == ""
    assert _read_jsonl(tmp_path / "metrics.jsonl") == [{"step": 1, "data": {"a": 1.0}}]


def test_wandb_missing_gives_actionable_error(monkeypatch):
    """Without wandb installed the error says how to install it (package or extra) or drop it from trainer.logger."""
    monkeypatch.setitem(sys.modules, "wandb", None)  # makes `import wandb` raise ImportError
    with pytest.raises(LoggerPackageMissingError, match=r"pip install wandb .*\.\[tracking\].*remove 'wandb'"):
        Tracking("p", "e", default_backend=["wandb"])


def test_wandb_backend_calls(monkeypatch, tmp_path):
    """wandb is initialised with project/name/config/dir, receives plain numbers per step, and is finished."""
    calls = []
    fake = types.SimpleNamespace(
        init=lambda **kw: calls.append(("init", kw)),
        log=lambda data, step: calls.append(("log", data, step)),
        finish=lambda: calls.append(("finish",)),
    )
    monkeypatch.setitem(sys.modules, "wandb", fake)
    with Tracking("proj", "exp", default_backend=["wandb"], config={"trainer": {"log_dir": str(tmp_path)}}) as t:
        t.log({"loss": np.float64(0.5)}, step=7)
    assert calls == [
        (
            "init",
            {"project": "proj", "name": "exp", "config": {"trainer": {"log_dir": str(tmp_path)}}, "dir": str(tmp_path)},
        ),
        ("log", {"loss": 0.5}, 7),
        ("finish",),
    ]


def test_tensorboard_backend_writes_event_file(tmp_path):
    """tensorboard writes an event file under <log_dir>/tensorboard."""
    pytest.importorskip("tensorboard")
    with Tracking("p", "e", default_backend=["tensorboard"], log_dir=str(tmp_path)) as tracker:
        tracker.log({"loss": 0.5, "note": "text is skipped"}, step=1)
    assert any(p.name.startswith("events.out.tfevents") for p in (tmp_path / "tensorboard").iterdir())


def test_validation_generations_file(tmp_path):
    """Validation samples (input, output, score) are appended as one JSON line per step."""
    ValidationGenerationsLogger("p", "e", log_dir=str(tmp_path)).log(["file"], [("q", "a", np.float32(1.0))], step=5)
    assert _read_jsonl(tmp_path / "val_generations.jsonl") == [
        {"step": 5, "samples": [{"input": "q", "output": "a", "score": 1.0}]}
    ]


def test_tensorboard_dir_env_var_wins(tmp_path, monkeypatch):
    """$TENSORBOARD_DIR (upstream's variable) is where the event files go, also with no log_dir at all."""
    pytest.importorskip("tensorboard")
    monkeypatch.setenv("TENSORBOARD_DIR", str(tmp_path / "tb"))
    with Tracking("p", "e", default_backend=["tensorboard"]) as tracker:
        tracker.log({"loss": 0.5}, step=1)
    assert any(p.name.startswith("events.out.tfevents") for p in (tmp_path / "tb").iterdir())


def test_check_logger_packages_names_the_package_and_the_extra(monkeypatch):
    """A backend whose module cannot be found fails the check with the pip package and the `tracking` extra.
    (The module name is pointed at one that does not exist, so the test does not depend on what is installed.)"""
    monkeypatch.setitem(tracking.BACKEND_PACKAGES, "swanlab", ("verl_no_such_module_for_test", "swanlab"))
    with pytest.raises(LoggerPackageMissingError, match=r"'swanlab'.*pip install swanlab .*'\.\[tracking\]'"):
        check_logger_packages(["console", "file", "swanlab"])
    check_logger_packages(["console", "file"])  # no package needed
    with pytest.raises(ValueError, match="not a supported tracking backend"):
        check_logger_packages(["console", "clearml"])


class _Recorder:
    """A stand-in for a tracker module (swanlab / mlflow are not installed in the test venv): records the calls
    the backend makes, by the names those packages document, so the arguments can be checked."""

    def __init__(self, *names):
        self.calls = []
        for name in names:
            setattr(self, name, self._recording(name))

    def _recording(self, name):
        def call(*args, **kwargs):
            self.calls.append((name, args, kwargs))

        return call


def test_swanlab_backend_offline(monkeypatch, tmp_path):
    """swanlab: project/experiment/config, SWANLAB_MODE and the log dir under <log_dir>/swanlog; numbers only."""
    fake = _Recorder("login", "init", "log", "finish")
    monkeypatch.setitem(sys.modules, "swanlab", fake)
    monkeypatch.setenv("SWANLAB_MODE", "offline")
    monkeypatch.delenv("SWANLAB_API_KEY", raising=False)
    monkeypatch.delenv("SWANLAB_LOG_DIR", raising=False)
    with Tracking("proj", "exp", default_backend=["swanlab"], config={"a": 1}, log_dir=str(tmp_path)) as t:
        t.log({"loss": np.float32(0.5), "note": "text"}, step=3)
    init = {
        "project": "proj",
        "experiment_name": "exp",
        "config": {"FRAMEWORK": "verl", "a": 1},
        "logdir": str(tmp_path / "swanlog"),
        "mode": "offline",
    }
    assert fake.calls == [("init", (), init), ("log", (), {"data": {"loss": 0.5}, "step": 3}), ("finish", (), {})]


def test_mlflow_backend_local_store_and_metric_names(monkeypatch, tmp_path):
    """mlflow: a local SQLite store under log_dir without MLFLOW_TRACKING_URI, flattened params, `@` -> `_at_`."""
    fake = _Recorder("set_tracking_uri", "set_experiment", "start_run", "log_params", "log_metrics", "end_run")
    monkeypatch.setitem(sys.modules, "mlflow", fake)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    config = {"trainer": {"n_gpus_per_node": 8}, "seed": 1}
    with Tracking("proj", "exp", default_backend=["mlflow"], config=config, log_dir=str(tmp_path)) as t:
        t.log({"val-core/gsm8k/reward/mean@4": 0.25}, step=2)
    assert fake.calls == [
        ("set_tracking_uri", ("sqlite:///" + str(tmp_path / "mlruns.db"),), {}),
        ("set_experiment", ("proj",), {}),
        ("start_run", (), {"run_name": "exp"}),
        ("log_params", ({"trainer.n_gpus_per_node": "8", "seed": "1"},), {}),
        ("log_metrics", (), {"metrics": {"val-core/gsm8k/reward/mean_at_4": 0.25}, "step": 2}),
        ("end_run", (), {}),
    ]
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "file:///elsewhere")
    fake.calls.clear()
    Tracking("proj", "exp", default_backend=["mlflow"]).finish()
    assert fake.calls[0] == ("set_tracking_uri", ("file:///elsewhere",), {})
