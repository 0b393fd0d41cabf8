"""Experiment tracking: `Tracking(project_name, experiment_name, default_backend, config)` (upstream names).

Backends, chosen by `trainer.logger` (a list):
* `console`     one line per step on stdout: `step:3 - actor/pg_loss:0.123 - ...`.
* `file`        JSON lines appended to `<log_dir>/metrics.jsonl`, one object per `log` call:
                `{"step": 3, "data": {"actor/pg_loss": 0.123, ...}}`. Appending (not truncating) keeps the history
                of a resumed run; readers keep the last record of a repeated step.
* `tensorboard` scalars under `$TENSORBOARD_DIR` when set (upstream's variable), else `<log_dir>/tensorboard`
                (needs the `tensorboard` package).
* `wandb`       Weights & Biases; imported only when selected. `WANDB_MODE=offline` (read by wandb itself) runs
                it without network; the run directory is `<log_dir>`.
* `swanlab`     SwanLab. `SWANLAB_API_KEY` (login), `SWANLAB_MODE` (`cloud` [default] | `local` | `offline` |
                `disabled`) and `SWANLAB_LOG_DIR` [`<log_dir>/swanlog`, else `swanlog`] as upstream.
* `mlflow`      MLflow. `MLFLOW_TRACKING_URI` when set, else a local SQLite store `<log_dir>/mlruns.db` (no server).
                MLflow refuses `@` in metric names, so `val-core/x/reward/mean@4` is logged as `.../mean_at_4`.

Every backend but console and file needs a package: :func:`check_logger_packages` (called by main_ppo before Ray
starts) names the missing one and the extra that installs it, instead of failing after the models are built.

`log_dir` is `trainer.log_dir` when set, else `trainer.default_local_dir` (the run's checkpoint directory), taken
from `config`; an explicit `log_dir=` argument wins.
"""

from __future__ import annotations

import json
import logging
import math
import numbers
import os
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Optional, Protocol, Union

__all__ = [
    "SUPPORTED_BACKENDS",
    "LoggerPackageMissingError",
    "Tracking",
    "ValidationGenerationsLogger",
    "check_logger_packages",
    "resolve_log_dir",
]

logger = logging.getLogger(__name__)

SUPPORTED_BACKENDS = ("console", "file", "tensorboard", "wandb", "swanlab", "mlflow")
# backend -> (importable module, pip package); all of them are in the `tracking` extra.
BACKEND_PACKAGES = {
    "tensorboard": ("tensorboard", "tensorboard"),
    "wandb": ("wandb", "wandb"),
    "swanlab": ("swanlab", "swanlab"),
    "mlflow": ("mlflow", "mlflow"),
}
METRICS_FILE = "metrics.jsonl"
VAL_GENERATIONS_FILE = "val_generations.jsonl"


class LoggerPackageMissingError(ImportError):
    """A backend in `trainer.logger` whose package is not installed."""


def _missing_package_message(name: str) -> str:
    package = BACKEND_PACKAGES[name][1]
    return (
        f"trainer.logger includes {name!r} but the {package} package is not installed: pip install {package} "
        f"(or pip install -e '.[tracking]', which installs every logger), or remove {name!r} from trainer.logger."
    )


def check_logger_packages(default_backend: Union[str, Sequence[str]]) -> None:
    """Raise :class:`LoggerPackageMissingError` for the first backend whose package cannot be imported (names
    checked as well). Cheap (``find_spec``, nothing imported): the driver runs it before starting Ray."""
    import importlib.util

    for name in _backend_names(default_backend):
        if name in BACKEND_PACKAGES and importlib.util.find_spec(BACKEND_PACKAGES[name][0]) is None:
            raise LoggerPackageMissingError(_missing_package_message(name))


class _Backend(Protocol):
    def log(self, data: Mapping[str, Any], step: int) -> None: ...

    def finish(self) -> None: ...


def resolve_log_dir(config: Any) -> Optional[str]:
    """`trainer.log_dir`, else `trainer.default_local_dir`, from a config dict/DictConfig/PPOTrainerConfig."""
    if config is None or not (isinstance(config, Mapping) or hasattr(config, "keys")):
        return None
    if "trainer" not in config or config["trainer"] is None:
        return None
    trainer = config["trainer"]
    for key in ("log_dir", "default_local_dir"):
        if key in trainer and trainer[key] is not None:
            return os.path.expanduser(str(trainer[key]))
    return None


def _to_json_value(value: Any) -> Any:
    """Plain JSON value of a metric: Python/numpy/torch scalars -> float or int; NaN/inf as strings."""
    if hasattr(value, "item") and callable(value.item) and getattr(value, "ndim", 0) == 0:
        value = value.item()
    if isinstance(value, bool):
        return value
    if isinstance(value, numbers.Integral):
        return int(value)
    if isinstance(value, numbers.Real):
        value = float(value)
        return value if math.isfinite(value) else str(value)
    if isinstance(value, str) or value is None:
        return value
    if isinstance(value, Mapping):
        return {str(k): _to_json_value(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_to_json_value(v) for v in value]
    return str(value)


def _format_console(data: Mapping[str, Any], step: int) -> str:
    parts = [f"step:{step}"]
    for key, value in data.items():
        value = _to_json_value(value)
        parts.append(f"{key}:{value:.3f}" if isinstance(value, float) else f"{key}:{value}")
    return " - ".join(parts)


class ConsoleBackend:
    """One line per step on stdout."""

    def log(self, data: Mapping[str, Any], step: int) -> None:
        print(_format_console(data, step), flush=True)

    def finish(self) -> None:
        pass


class FileBackend:
    """JSON lines `{"step": N, "data": {...}}` appended to `<log_dir>/<file_name>`, flushed at every write."""

    def __init__(self, log_dir: str, file_name: str = METRICS_FILE):
        os.makedirs(log_dir, exist_ok=True)
        self.path = os.path.join(log_dir, file_name)
        self._fp = open(self.path, "a", encoding="utf-8")  # noqa: SIM115 - closed in finish()

    def log(self, data: Mapping[str, Any], step: int) -> None:
        record = {"step": int(step), "data": {str(k): _to_json_value(v) for k, v in data.items()}}
        # flush per line: a run killed mid-training keeps every metric logged so far
        self._fp.write(json.dumps(record) + "\n")
        self._fp.flush()

    def finish(self) -> None:
        if not self._fp.closed:
            self._fp.close()


class TensorboardBackend:
    """Numeric metrics as tensorboard scalars under `<log_dir>/tensorboard`."""

    def __init__(self, log_dir: str):
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError as exc:
            raise LoggerPackageMissingError(_missing_package_message("tensorboard")) from exc
        self.path = os.environ.get("TENSORBOARD_DIR") or os.path.join(log_dir, "tensorboard")
        self.writer = SummaryWriter(log_dir=self.path)

    def log(self, data: Mapping[str, Any], step: int) -> None:
        for key, value in data.items():
            value = _to_json_value(value)
            if isinstance(value, int | float) and not isinstance(value, bool):
                self.writer.add_scalar(key, value, step)

    def finish(self) -> None:
        self.writer.close()


class WandbBackend:
    """Weights & Biases run (offline with WANDB_MODE=offline)."""

    def __init__(self, project_name: str, experiment_name: str, config: Any, log_dir: Optional[str]):
        try:
            import wandb
        except ImportError as exc:
            raise LoggerPackageMissingError(
                _missing_package_message("wandb") + " (upstream's default is [console, wandb]; WANDB_MODE=offline "
                "needs no account)"
            ) from exc
        self._wandb = wandb
        if log_dir is not None:
            os.makedirs(log_dir, exist_ok=True)
        self.run = wandb.init(project=project_name, name=experiment_name, config=_plain_config(config), dir=log_dir)

    def log(self, data: Mapping[str, Any], step: int) -> None:
        self._wandb.log({k: _to_json_value(v) for k, v in data.items()}, step=step)

    def finish(self) -> None:
        self._wandb.finish()


class SwanlabBackend:
    """SwanLab run; `SWANLAB_MODE=offline` (or `local`) needs no account or network."""

    def __init__(self, project_name: str, experiment_name: str, config: Any, log_dir: Optional[str]):
        try:
            import swanlab
        except ImportError as exc:
            raise LoggerPackageMissingError(_missing_package_message("swanlab")) from exc
        self._swanlab = swanlab
        api_key = os.environ.get("SWANLAB_API_KEY")
        if api_key:
            swanlab.login(api_key)
        run_dir = os.environ.get("SWANLAB_LOG_DIR") or (os.path.join(log_dir, "swanlog") if log_dir else "swanlog")
        swanlab.init(
            project=project_name,
            experiment_name=experiment_name,
            config={"FRAMEWORK": "verl", **(_plain_config(config) or {})},
            logdir=run_dir,
            mode=os.environ.get("SWANLAB_MODE", "cloud"),
        )

    def log(self, data: Mapping[str, Any], step: int) -> None:
        self._swanlab.log(data=_numeric_metrics(data), step=step)

    def finish(self) -> None:
        self._swanlab.finish()


class MlflowBackend:
    """MLflow run: parameters are the flattened config, metrics keyed with `@` spelled `_at_`."""

    _PARAMS_PER_CALL = 100  # MLflow's batch limit for log_params

    def __init__(self, project_name: str, experiment_name: str, config: Any, log_dir: Optional[str]):
        try:
            import mlflow
        except ImportError as exc:
            raise LoggerPackageMissingError(_missing_package_message("mlflow")) from exc
        self._mlflow = mlflow
        uri = os.environ.get("MLFLOW_TRACKING_URI")
        if not uri:
            store_dir = log_dir or "."
            os.makedirs(store_dir, exist_ok=True)
            uri = "sqlite:///" + os.path.abspath(os.path.join(store_dir, "mlruns.db"))
        self.tracking_uri = uri
        mlflow.set_tracking_uri(uri)
        mlflow.set_experiment(project_name)
        self.run = mlflow.start_run(run_name=experiment_name)
        params = _flatten(_plain_config(config) or {})
        items = [(k, str(v)[:500]) for k, v in params.items()]
        for start in range(0, len(items), self._PARAMS_PER_CALL):
            mlflow.log_params(dict(items[start : start + self._PARAMS_PER_CALL]))

    def log(self, data: Mapping[str, Any], step: int) -> None:
        metrics = {key.replace("@", "_at_"): value for key, value in _numeric_metrics(data).items()}
        self._mlflow.log_metrics(metrics=metrics, step=step)

    def finish(self) -> None:
        self._mlflow.end_run()


def _numeric_metrics(data: Mapping[str, Any]) -> dict[str, float]:
    """Only the numeric values (trackers that plot series reject strings)."""
    out = {}
    for key, value in data.items():
        value = _to_json_value(value)
        if isinstance(value, int | float) and not isinstance(value, bool):
            out[str(key)] = value
    return out


def _flatten(tree: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """`{"a": {"b": 1}}` -> `{"a.b": 1}` (MLflow parameters are flat)."""
    flat: dict[str, Any] = {}
    for key, value in tree.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            flat.update(_flatten(value, prefix=f"{name}."))
        else:
            flat[name] = value
    return flat


def _plain_config(config: Any) -> Optional[dict]:
    """The run config as a plain dict for trackers (DictConfig, dataclass config or dict)."""
    if config is None:
        return None
    if hasattr(config, "to_dict"):
        return config.to_dict()
    try:
        from omegaconf import DictConfig, OmegaConf

        if isinstance(config, DictConfig):
            return OmegaConf.to_container(config, resolve=True)
    except ImportError:  # omegaconf is a dependency; keep tracking importable without it anyway
        pass
    return dict(config)


def _backend_names(default_backend: Union[str, Sequence[str]]) -> list[str]:
    names = [default_backend] if isinstance(default_backend, str) else list(default_backend)
    for name in names:
        if name not in SUPPORTED_BACKENDS:
            raise ValueError(
                f"trainer.logger: {name!r} is not a supported tracking backend; choose from {', '.join(SUPPORTED_BACKENDS)}."
            )
    return names


class Tracking:
    """Log metrics to every backend named in `default_backend` (see the module docstring)."""

    supported_backend = list(SUPPORTED_BACKENDS)

    def __init__(
        self,
        project_name: str,
        experiment_name: str,
        default_backend: Union[str, Sequence[str]] = "console",
        config: Any = None,
        log_dir: Optional[str] = None,
    ):
        names = _backend_names(default_backend)
        self.log_dir = log_dir if log_dir is not None else resolve_log_dir(config)
        self.logger: dict[str, _Backend] = {}
        for name in names:
            self.logger[name] = self._make_backend(name, project_name, experiment_name, config)

    def _make_backend(self, name: str, project_name: str, experiment_name: str, config: Any) -> _Backend:
        if name == "console":
            return ConsoleBackend()
        if name == "wandb":
            return WandbBackend(project_name, experiment_name, config, self.log_dir)
        if name == "swanlab":
            return SwanlabBackend(project_name, experiment_name, config, self.log_dir)
        if name == "mlflow":
            return MlflowBackend(project_name, experiment_name, config, self.log_dir)
        if self.log_dir is None and not (name == "tensorboard" and os.environ.get("TENSORBOARD_DIR")):
            raise ValueError(
                f"trainer.logger includes {name!r}, which writes files, but no directory is known: set trainer.log_dir "
                f"(or trainer.default_local_dir), or pass log_dir= to Tracking."
            )
        return FileBackend(self.log_dir) if name == "file" else TensorboardBackend(self.log_dir)

    def log(self, data: Mapping[str, Any], step: int, backend: Optional[Iterable[str]] = None) -> None:
        """Log `data` (metric name -> scalar) at `step` to all backends, or only those named in `backend`."""
        selected = set(backend) if backend is not None else None
        for name, backend_logger in self.logger.items():
            if selected is None or name in selected:
                backend_logger.log(data=data, step=step)

    def finish(self) -> None:
        """Flush and close every backend (idempotent)."""
        for backend_logger in self.logger.values():
            backend_logger.finish()

    def __enter__(self) -> Tracking:
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.finish()


class ValidationGenerationsLogger:
    """Log validation samples `(input, output, score)` to the selected backends (upstream name and `log` signature)."""

    def __init__(
        self, project_name: Optional[str] = None, experiment_name: Optional[str] = None, log_dir: Optional[str] = None
    ):
        self.project_name = project_name
        self.experiment_name = experiment_name
        self.log_dir = log_dir

    def log(self, loggers: Sequence[str], samples: Sequence[Sequence[Any]], step: int) -> None:
        """Write `samples` (each `(input, output, score)`) for every backend in `loggers` that supports text."""
        rows = [{"input": str(s[0]), "output": str(s[1]), "score": _to_json_value(s[2])} for s in samples]
        if "console" in loggers:
            for row in rows:
                print(f"[val step {step}] score={row['score']}\n  input: {row['input']}\n  output: {row['output']}")
        if "file" in loggers and self.log_dir is not None:
            os.makedirs(self.log_dir, exist_ok=True)
            with open(os.path.join(self.log_dir, VAL_GENERATIONS_FILE), "a", encoding="utf-8") as fp:
                fp.write(json.dumps({"step": int(step), "samples": rows}) + "\n")
        if "wandb" in loggers:
            import wandb

            table = wandb.Table(
                columns=["step", "input", "output", "score"],
                data=[[step, r["input"], r["output"], r["score"]] for r in rows],
            )
            wandb.log({"val/generations": table}, step=step)
