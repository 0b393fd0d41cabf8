"""Run settings: `trainer` (steps, cluster size, logging, checkpoints) and the misc roots."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional, Union

from verl.base_config import BaseConfig, ConfigError, require_choice, require_positive
from verl.utils.tracking import SUPPORTED_BACKENDS

__all__ = ["LOGGER_BACKENDS", "RAY_RUNTIME_ENV_FIELDS", "GlobalProfilerConfig", "RayKwargsConfig", "TrainerConfig"]

LOGGER_BACKENDS = SUPPORTED_BACKENDS
"""Experiment-tracking backends of verl.utils.tracking.Tracking (one list: what Tracking builds is what validates)."""

DEVICES = ("cpu", "cuda", "npu")
TASK_RUNNER_PLACES = ("auto", "actor", "driver")

RAY_RUNTIME_ENV_FIELDS = (
    "py_executable",
    "env_vars",
    "working_dir",
    "py_modules",
    "excludes",
    "pip",
    "uv",
    "conda",
    "image_uri",
    "container",
    "config",
    "nsight",
    "rocprof_sys",
    "worker_process_setup_hook",
    "java_jars",
)
"""The public fields of Ray's ``runtime_env`` (``ray.runtime_env.RuntimeEnv``), declared (null) under
``ray_kwargs.ray_init.runtime_env`` so a Hydra override can set any of them without ``+`` (upstream recipes set
``runtime_env.py_executable``)."""


@dataclass
class TrainerConfig(BaseConfig):
    """How long to train, on how many devices, where to log and checkpoint."""

    balance_batch: bool = True
    """Reorder each batch so every data-parallel rank gets a similar number of tokens."""

    total_epochs: int = 30
    """Passes over the training set."""

    total_training_steps: Optional[int] = None
    """Stop after this many steps; null = total_epochs * steps per epoch."""

    project_name: str = "verl_examples"
    """Project name in the trackers and the checkpoint path."""

    experiment_name: str = "gsm8k"
    """Run name in the trackers and the checkpoint path."""

    logger: Union[list[str], str] = field(default_factory=lambda: ["console", "wandb"])
    """Tracking backends: console | file | tensorboard | wandb | swanlab | mlflow. The default includes wandb
    (upstream's); without wandb installed use e.g. trainer.logger=[console,file]."""

    log_dir: Optional[str] = None
    """Directory of the file and tensorboard backends (file: <log_dir>/metrics.jsonl, tensorboard:
    <log_dir>/tensorboard); null = default_local_dir, i.e. next to the checkpoints of this run."""

    log_val_generations: int = 0
    """Validation samples (prompt, response, score) logged per validation."""

    rollout_data_dir: Optional[str] = None
    """Dump each step's rollouts as JSONL here; null = off."""

    validation_data_dir: Optional[str] = None
    """Dump validation generations as JSONL here; null = off."""

    nnodes: int = 1
    """Nodes in the Ray cluster used for training."""

    n_gpus_per_node: int = 8
    """Devices per node (GPUs, NPUs, or CPU worker processes with trainer.device=cpu)."""

    save_freq: int = -1
    """Checkpoint every N steps; -1 = only at the end (if at all)."""

    esi_redundant_time: int = 0
    """Seconds of margin before an elastic-instance expiry at which a checkpoint is forced."""

    resume_mode: str = "auto"
    """auto (latest checkpoint in default_local_dir if any) | disable | resume_path (resume_from_path)."""

    resume_from_path: Optional[str] = None
    """Checkpoint directory (global_step_N) for resume_mode=resume_path."""

    val_before_train: bool = True
    """Validate once before the first step."""

    val_only: bool = False
    """Validate and exit."""

    test_freq: int = -1
    """Validate every N steps; -1 = never during training."""

    critic_warmup: int = 0
    """Steps that update only the critic before the actor starts."""

    default_hdfs_dir: Optional[str] = None
    """Copy checkpoints to this HDFS directory."""

    del_local_ckpt_after_load: bool = False
    """Delete the local checkpoint after resuming from it."""

    default_local_dir: str = "checkpoints/verl_examples/gsm8k"
    """Checkpoint directory; the YAML makes it checkpoints/${trainer.project_name}/${trainer.experiment_name}."""

    max_actor_ckpt_to_keep: Optional[int] = None
    """Keep only the newest N actor checkpoints; null = all."""

    max_critic_ckpt_to_keep: Optional[int] = None
    """Keep only the newest N critic checkpoints; null = all."""

    ray_wait_register_center_timeout: int = 300
    """Seconds to wait for workers to register with Ray."""

    device: str = "cuda"
    """cuda | npu | cpu. Upstream's default; on Ascend auto_set_device switches it to npu. The CPU quickstart sets
    trainer.device=cpu explicitly (a CUDA-less driver may still launch CUDA workers, so cpu is never guessed)."""

    use_legacy_worker_impl: str = "auto"
    """auto | enable = FSDP workers (fsdp_workers.py + dp_actor.py); disable = engine workers."""

    def __post_init__(self) -> None:
        if isinstance(self.logger, str):
            self._normalize("logger", [self.logger])
        for backend in self.logger:
            require_choice("logger", backend, LOGGER_BACKENDS)
        require_choice("device", self.device, DEVICES)
        require_choice("use_legacy_worker_impl", self.use_legacy_worker_impl, ("auto", "enable", "disable"))
        require_choice("resume_mode", self.resume_mode, ("auto", "disable", "resume_path"))
        if self.resume_mode == "resume_path" and not self.resume_from_path:
            raise ConfigError("resume_from_path", "resume_mode=resume_path needs the checkpoint directory to load.")
        require_positive("total_epochs", self.total_epochs)
        require_positive("total_training_steps", self.total_training_steps, allow_none=True)
        require_positive("nnodes", self.nnodes)
        require_positive("n_gpus_per_node", self.n_gpus_per_node)
        for key in ("save_freq", "test_freq"):
            if getattr(self, key) == 0 or getattr(self, key) < -1:
                raise ConfigError(key, f"must be -1 (off) or a positive step count, got {getattr(self, key)}.")
        for key in ("max_actor_ckpt_to_keep", "max_critic_ckpt_to_keep"):
            require_positive(key, getattr(self, key), allow_none=True)

    @property
    def n_gpus(self) -> int:
        """Devices used for training: nnodes * n_gpus_per_node."""
        return self.nnodes * self.n_gpus_per_node

    @property
    def resolved_log_dir(self) -> str:
        """Where the file/tensorboard backends write: log_dir, else default_local_dir."""
        return self.log_dir if self.log_dir is not None else self.default_local_dir


@dataclass
class GlobalProfilerConfig(BaseConfig):
    """`global_profiler`: step profiling (nsys | npu | torch | torch_memory)."""

    tool: Optional[str] = None
    """Profiler to use; null = off."""

    steps: Optional[list[int]] = None
    """Steps to profile."""

    profile_continuous_steps: bool = False
    """Profile consecutive steps into one trace."""

    save_path: str = "outputs/profile"
    """Where traces are written."""


@dataclass
class RayKwargsConfig(BaseConfig):
    """`ray_kwargs`: passed through to Ray."""

    ray_init: dict[str, Any] = field(
        default_factory=lambda: {"num_cpus": None, "runtime_env": dict.fromkeys(RAY_RUNTIME_ENV_FIELDS)}
    )
    """Keyword arguments of ray.init (num_cpus, address, runtime_env, ...); null values are dropped, also inside
    runtime_env, whose env_vars are merged over the trainer's worker defaults."""

    timeline_json_file: Optional[str] = None
    """Write a Ray timeline here at the end; null = off."""

    task_runner: str = "auto"
    """Where the TaskRunner (tokenizer, datasets, the trainer's loop) runs: ``actor`` = a Ray actor (upstream's
    layout, needed on a cluster the driver only connects to), ``driver`` = in the driver process, ``auto`` = in the
    driver when this run starts its own one-node Ray (no ``ray_init.address``, no ``$RAY_ADDRESS``,
    ``trainer.nnodes=1``), else an actor. In the driver it saves the actor's process start and imports at launch."""

    def __post_init__(self) -> None:
        require_choice("task_runner", self.task_runner, TASK_RUNNER_PLACES)
