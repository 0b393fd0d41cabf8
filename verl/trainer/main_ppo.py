"""Entry point: ``python -m verl.trainer.main_ppo [hydra overrides]``.

Everything a user can get wrong in the config is checked here, on the driver, before Ray starts: the device
(``trainer.device=npu`` without torch_npu/CANN), a logger whose package is missing, unknown keys, and the
batch-size arithmetic. Then the ``TaskRunner`` builds the tokenizer, datasets, reward functions and the
:class:`RayPPOTrainer` and runs it: in the driver process when this run starts its own one-node Ray (it then builds
the data while Ray starts), else as a Ray actor as upstream does (``ray_kwargs.task_runner``).
"""

from __future__ import annotations

import copy
import os
import socket
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

import hydra
import ray
from omegaconf import DictConfig, OmegaConf

from verl.trainer.ppo.utils import Role, need_critic, need_reference_policy

if TYPE_CHECKING:
    from verl.trainer.config.ppo_trainer import PPOTrainerConfig

# Environment every worker process gets (values already set in the driver's environment win).
_WORKER_ENV = {
    "TOKENIZERS_PARALLELISM": "true",
    "NCCL_DEBUG": "WARN",
    "VLLM_LOGGING_LEVEL": "WARN",
    "HCCL_HOST_SOCKET_PORT_RANGE": "auto",
    "HCCL_NPU_SOCKET_PORT_RANGE": "auto",
}


@hydra.main(config_path="config", config_name="ppo_trainer", version_base=None)
def main(config: DictConfig) -> None:
    config, typed_config = prepare_config(config)
    run_ppo(config, typed_config=typed_config)


def prepare_config(config: DictConfig) -> tuple[DictConfig, PPOTrainerConfig]:
    """Resolve the device and validate the whole config on the driver (raises ``ValueError`` naming the key).

    Returns ``(config, typed_config)``: the DictConfig (what upstream's ``RayPPOTrainer`` and workers take) and the
    ``PPOTrainerConfig`` dataclass tree ``validate_config`` built from it, which the TaskRunner reads its data and
    reward settings from, so each default is the dataclass's and nothing is converted twice."""
    from verl.trainer.config.legacy_reward import migrate_legacy_reward_impl
    from verl.utils.device import auto_set_device, validate_device
    from verl.utils.tracking import check_logger_packages

    config = migrate_legacy_reward_impl(config)
    auto_set_device(config)
    validate_device(config.trainer.device)
    typed_config = validate_typed(config)
    # after the keys are known good (a misspelt key is the first thing to report); still before Ray and the models
    check_logger_packages(config.trainer.logger)
    return config, typed_config


def validate_typed(config: DictConfig) -> PPOTrainerConfig:
    """``validate_config`` with the roles this config needs: the typed ``PPOTrainerConfig``."""
    from verl.utils.config import validate_config

    return validate_config(config, use_reference_policy=need_reference_policy(config), use_critic=need_critic(config))


# Driver variables forwarded to every worker: on a cluster started with `ray start`, workers inherit the
# environment of `ray start`, not of the shell that launched the job, so HCCL/CANN settings must travel explicitly.
_FORWARDED_ENV_PREFIXES = ("HCCL_", "ASCEND_", "RAY_EXPERIMENTAL_NOSET_")


def get_ppo_ray_runtime_env() -> dict:
    """Worker environment: defaults, the platform's collective settings (HCCL timeouts), forwarded driver vars, and
    this driver's identity, so that the run's processes stop when it dies (``verl.utils.driver_watch``)."""
    from verl.utils.driver_watch import driver_env
    from verl.utils.platform import get_platform

    env_vars = {k: v for k, v in _WORKER_ENV.items() if k not in os.environ}
    env_vars.update(get_platform().comm_env_vars())
    # Device visibility is per worker (set by Ray / the worker group), never copied from the driver.
    forwarded = {k: v for k, v in os.environ.items() if k.startswith(_FORWARDED_ENV_PREFIXES)}
    forwarded.pop("ASCEND_RT_VISIBLE_DEVICES", None)
    env_vars.update(forwarded)
    env_vars.update(driver_env())
    return {"env_vars": env_vars}


def check_ray_address(address: str | None, timeout_s: float = 5.0) -> None:
    """Fail fast, naming the key, when ``ray_kwargs.ray_init.address`` points at a head nobody serves.

    ``ray.init`` would otherwise retry for minutes before giving up. ``None`` (start a local cluster), ``"auto"``,
    ``"local"`` and ``ray://`` client addresses are left to Ray.
    """
    if not address or address in ("auto", "local") or address.startswith("ray://"):
        return
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit():
        raise ValueError(f"ray_kwargs.ray_init.address={address!r} is not host:port, 'auto' or a ray:// address")
    try:
        socket.create_connection((host, int(port)), timeout=timeout_s).close()
    except OSError as exc:
        raise ConnectionError(
            f"ray_kwargs.ray_init.address={address!r}: no Ray head answers there ({exc}). Start one with "
            "`ray start --head` on that node, fix the address, or drop the key to start a local cluster."
        ) from exc


def ray_init_kwargs(ray_init: Any) -> dict[str, Any]:
    """Keyword arguments of ``ray.init`` from ``ray_kwargs.ray_init``: null values dropped (also inside
    ``runtime_env``, where they mean "unset"), the user's ``runtime_env`` merged over the trainer's worker
    environment (a user env var wins over a default; values become strings, as Ray requires: a Hydra override
    ``env_vars.N=1`` parses as an int), the head address checked."""
    kwargs = OmegaConf.to_container(ray_init, resolve=True) if isinstance(ray_init, DictConfig) else dict(ray_init)
    user_env = {k: v for k, v in (kwargs.pop("runtime_env", None) or {}).items() if v is not None}
    runtime_env = OmegaConf.to_container(OmegaConf.merge(get_ppo_ray_runtime_env(), user_env))
    runtime_env["env_vars"] = {k: str(v) for k, v in runtime_env["env_vars"].items()}
    kwargs = {k: v for k, v in kwargs.items() if v is not None}
    check_ray_address(kwargs.get("address"))
    return {**kwargs, "runtime_env": runtime_env}


def init_ray(config: DictConfig) -> None:
    """``ray.init`` with :func:`ray_init_kwargs` of ``ray_kwargs.ray_init``: a local Ray instance, or the cluster at
    ``ray_kwargs.ray_init.address`` / ``$RAY_ADDRESS``."""
    ray.init(include_dashboard=False, **ray_init_kwargs(config.ray_kwargs.ray_init))


def task_runner_in_driver(config: DictConfig) -> bool:
    """Whether the TaskRunner runs in this process (``ray_kwargs.task_runner``; ``auto``: when this run starts its
    own one-node Ray, where an actor would only add a process start and a second import of the trainer)."""
    place = config.ray_kwargs.get("task_runner", "auto")
    if place != "auto":
        return place == "driver"
    address = config.ray_kwargs.ray_init.get("address") or os.environ.get("RAY_ADDRESS")
    return not address and config.trainer.nnodes == 1 and not ray.is_initialized()


def run_ppo(config: DictConfig, typed_config: PPOTrainerConfig | None = None) -> None:
    """Start (or attach to) Ray, run the TaskRunner to completion (in this process or as a Ray actor, see
    :func:`task_runner_in_driver`).

    ``typed_config``: the ``PPOTrainerConfig`` of :func:`prepare_config`; None validates ``config`` in the
    TaskRunner (a caller that builds its own DictConfig, as upstream's ``run_ppo(config)``).

    A lost worker (its process or its node) ends the run with :class:`WorkerLostError`, raised here on the driver,
    naming the node and the last complete checkpoint to resume from.
    """
    from verl.single_controller.ray.worker_loss import WorkerLostError

    if task_runner_in_driver(config):
        TaskRunner().run_in_driver(copy.deepcopy(config), typed_config)  # a copy, as the actor gets one
        return
    if not ray.is_initialized():
        init_ray(config)
    runner = ray.remote(num_cpus=1)(TaskRunner).options(**_on_driver_node()).remote()
    try:
        ray.get(runner.run.remote(config, typed_config))
    except ray.exceptions.RayTaskError as exc:
        if isinstance(exc.cause, WorkerLostError):
            raise exc.cause from None  # the message says it all; the remote traceback adds nothing
        raise


def _on_driver_node() -> dict:
    """Schedule the TaskRunner on the driver's node when it has a CPU free (soft affinity): the driver's node is
    the one whose loss ends the job anyway, so the controller there outlives the loss of any worker node and can
    report it, and the worker slots of the other nodes stay free for the workers."""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    try:
        node_id = ray.get_runtime_context().get_node_id()
    except Exception:  # a Ray client driver has no node of its own
        return {}
    return {"scheduling_strategy": NodeAffinitySchedulingStrategy(node_id=node_id, soft=True)}


def resume_hint(trainer_config) -> str:
    """What to do after the run stopped: the last complete checkpoint under ``trainer.default_local_dir`` and the
    rerun that continues from it."""
    from verl.trainer.ppo.trainer_checkpoint import find_resume_point

    root = trainer_config.default_local_dir
    try:
        point = find_resume_point("auto", root, None)
    except ValueError as exc:
        return f"The checkpoint directory is inconsistent: {exc}"
    if point is None:
        return (
            f"No complete checkpoint exists under {root} (trainer.save_freq={trainer_config.save_freq}): a rerun "
            "starts from step 0."
        )
    return (
        f"The last complete checkpoint is {point.path} (global step {point.global_step}). Once every node is back "
        "(check with `python -m verl.utils.ray_cluster wait --nodes N --resource NPU=M`), rerun the same command "
        "with trainer.resume_mode=auto to continue from it."
    )


class TaskRunner:
    """Builds every component and runs training: as a Ray actor (upstream's layout, so the driver stays light) or
    in the driver process (:meth:`run_in_driver`)."""

    def run(self, config: DictConfig, typed_config: PPOTrainerConfig | None = None) -> None:
        """The Ray actor's entry point (Ray is up). ``typed_config`` (the validated ``PPOTrainerConfig``) supplies
        the data and reward settings; None validates ``config`` here."""
        from verl.utils.driver_watch import start_driver_watch

        start_driver_watch("the TaskRunner")  # a dead driver stops the trainer at once (no save after it)
        self.train(config, self.build_components(config, typed_config))

    def run_in_driver(self, config: DictConfig, typed_config: PPOTrainerConfig | None = None) -> None:
        """Build the data (tokenizer, datasets, reward functions: no Ray needed) in a thread while this thread
        starts Ray, then train here. The driver is the trainer, so nothing has to watch it."""
        with ThreadPoolExecutor(max_workers=1, thread_name_prefix="verl-data") as pool:
            components = pool.submit(self.build_components, config, typed_config)
            if not ray.is_initialized():
                init_ray(config)
            built = components.result()
        self.train(config, built)

    @staticmethod
    def build_components(config: DictConfig, typed_config: PPOTrainerConfig | None = None) -> dict[str, Any]:
        """The trainer's inputs that need no Ray: tokenizer, processor, datasets, sampler, reward functions
        (``typed_config``: see :meth:`run`)."""
        from verl.trainer.ppo.reward import load_reward_manager
        from verl.utils.dataset.rl_dataset import collate_fn
        from verl.utils.tokenizer import hf_processor, hf_tokenizer

        OmegaConf.resolve(config)
        typed_config = validate_typed(config) if typed_config is None else typed_config
        model_path = os.path.expanduser(config.actor_rollout_ref.model.path)
        trust_remote_code = config.data.trust_remote_code
        tokenizer = hf_tokenizer(model_path, trust_remote_code=trust_remote_code)
        processor = hf_processor(model_path, trust_remote_code=trust_remote_code, use_fast=True)
        train_dataset = create_rl_dataset(config.data.train_files, config.data, tokenizer, processor, True)
        return dict(
            tokenizer=tokenizer,
            processor=processor,
            reward_fn=load_reward_manager(typed_config, tokenizer, num_examine=0),
            val_reward_fn=load_reward_manager(typed_config, tokenizer, num_examine=1),
            train_dataset=train_dataset,
            val_dataset=create_rl_dataset(config.data.val_files, config.data, tokenizer, processor, False),
            collate_fn=collate_fn,
            train_sampler=create_rl_sampler(typed_config.data, train_dataset),
        )

    def train(self, config: DictConfig, components: dict[str, Any]) -> None:
        """Build the :class:`RayPPOTrainer` from ``components``, start its workers and fit."""
        from verl.single_controller.ray.worker_loss import WorkerLostError, describe_placement
        from verl.trainer.ppo.ray_trainer import RayPPOTrainer

        trainer = RayPPOTrainer(
            config=config,
            role_worker_mapping=self.role_worker_mapping(config),
            resource_pool_manager=self.resource_pool_manager(config),
            **components,
        )
        try:
            trainer.init_workers()
            placement = describe_placement(trainer.actor_rollout_wg.worker_group.worker_node_ids)
            print(f"[verl] worker placement: {placement}", flush=True)
            trainer.fit()
        except WorkerLostError as exc:
            hint = resume_hint(config.trainer)
            raise WorkerLostError(f"{exc}. {hint}", rank=exc.rank, node=exc.node, node_dead=exc.node_dead) from None

    @staticmethod
    def role_worker_mapping(config: DictConfig) -> dict:
        """Worker classes per role: the FSDP workers (legacy path) or the engine workers
        (``trainer.use_legacy_worker_impl=disable``, or ``auto`` with ``strategy=veomni``, which only the engine
        workers run); both drive the same shared core."""
        strategy = config.actor_rollout_ref.actor.strategy
        legacy = config.trainer.use_legacy_worker_impl
        if legacy == "disable" or (legacy == "auto" and strategy == "veomni"):
            from verl.workers.engine import EngineRegistry

            # Fails here, on the driver, with the key named when no engine serves this strategy/device.
            EngineRegistry.get_engine_cls("language_model", strategy, device=config.trainer.device)
            from verl.workers.engine_workers import ActorRolloutRefWorker, CriticWorker
        else:
            if strategy not in ("fsdp", "fsdp2"):
                raise ValueError(
                    f"actor_rollout_ref.actor.strategy={strategy!r} is not supported by the FSDP workers; use fsdp or "
                    "fsdp2, or trainer.use_legacy_worker_impl=disable for the engine workers"
                )
            from verl.workers.fsdp_workers import ActorRolloutRefWorker, CriticWorker

        mapping = {Role.ActorRollout: ray.remote(ActorRolloutRefWorker)}
        if need_critic(config):
            mapping[Role.Critic] = ray.remote(CriticWorker)
        if need_reference_policy(config):
            mapping[Role.RefPolicy] = ray.remote(ActorRolloutRefWorker)
        return mapping

    @staticmethod
    def resource_pool_manager(config: DictConfig):
        from verl.single_controller.ray import ResourcePoolManager

        pool = "global_pool"
        spec = {pool: [config.trainer.n_gpus_per_node] * config.trainer.nnodes}
        mapping = {Role.ActorRollout: pool, Role.Critic: pool, Role.RefPolicy: pool}
        return ResourcePoolManager(resource_pool_spec=spec, mapping=mapping)


def create_rl_dataset(data_paths, data_config, tokenizer, processor, is_train: bool = True):
    """The dataset of ``data.custom_cls`` if configured, else :class:`RLHFDataset`."""
    from verl.utils.dataset.rl_dataset import RLHFDataset

    dataset_cls = RLHFDataset
    custom = data_config.custom_cls
    if custom is not None and custom.path is not None:
        from verl.utils.import_utils import load_extern_type

        dataset_cls = load_extern_type(custom.path, custom.name)
    max_samples = data_config.train_max_samples if is_train else data_config.val_max_samples
    return dataset_cls(
        data_files=data_paths, tokenizer=tokenizer, processor=processor, config=data_config, max_samples=max_samples
    )


def create_rl_sampler(data_config, dataset):
    """The user sampler of ``data.sampler.class_path``/``class_name`` (a subclass of
    :class:`verl.experimental.dataset.sampler.AbstractSampler`, built as ``cls(data_source=dataset,
    data_config=data_config)``); else a seeded, checkpointable random sampler (``data.shuffle``); else sequential.
    Resume keeps the data order of the built-in samplers."""
    import torch
    from torch.utils.data import SequentialSampler
    from torchdata.stateful_dataloader.sampler import RandomSampler

    from verl.trainer.config.data import shuffle_seed

    custom = data_config.get("sampler")  # a DictConfig or a DataConfig: both read like a Mapping
    if custom is not None and custom.class_path is not None:
        return _custom_sampler(custom.class_path, custom.class_name, data_config, dataset)
    if data_config.shuffle:
        generator = torch.Generator()
        generator.manual_seed(shuffle_seed(data_config.get("seed")))
        return RandomSampler(data_source=dataset, generator=generator)
    return SequentialSampler(data_source=dataset)


def _custom_sampler(class_path: str, class_name: str | None, data_config, dataset):
    from verl.base_config import ConfigError
    from verl.experimental.dataset.sampler import AbstractSampler
    from verl.utils.import_utils import load_extern_type

    if not class_name:
        raise ConfigError("data.sampler.class_name", f"is not set: name the sampler class defined in {class_path}.")
    cls = load_extern_type(class_path, class_name)
    if not (isinstance(cls, type) and issubclass(cls, AbstractSampler)):
        raise ConfigError(
            "data.sampler.class_name",
            f"({class_name} in {class_path}) must subclass verl.experimental.dataset.sampler.AbstractSampler "
            "(or AbstractCurriculumSampler) and take (data_source, data_config).",
        )
    return cls(data_source=dataset, data_config=data_config)


if __name__ == "__main__":
    main()
