"""Entry point: ``python -m verl.trainer.main_ppo [hydra overrides]``.

Everything a user can get wrong in the config is checked here, on the driver, before Ray starts: the device
(``trainer.device=npu`` without torch_npu/CANN), unknown keys, and the batch-size arithmetic. Then a
``TaskRunner`` Ray actor builds the tokenizer, datasets, reward functions and the :class:`RayPPOTrainer`.
"""

from __future__ import annotations

import os
import socket

import hydra
import ray
from omegaconf import DictConfig, OmegaConf

from verl.trainer.ppo.utils import Role, need_critic, need_reference_policy

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
    run_ppo(prepare_config(config))


def prepare_config(config: DictConfig) -> DictConfig:
    """Resolve the device and validate the whole config on the driver (raises ``ValueError`` naming the key)."""
    from verl.trainer.config.legacy_reward import migrate_legacy_reward_impl
    from verl.utils.config import validate_config
    from verl.utils.device import auto_set_device, validate_device

    config = migrate_legacy_reward_impl(config)
    auto_set_device(config)
    validate_device(config.trainer.device)
    validate_config(config, use_reference_policy=need_reference_policy(config), use_critic=need_critic(config))
    return config


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


def run_ppo(config: DictConfig) -> None:
    """Start (or attach to) Ray, run the TaskRunner actor to completion."""
    if not ray.is_initialized():
        ray_init = OmegaConf.to_container(config.ray_kwargs.ray_init, resolve=True)
        runtime_env = OmegaConf.merge(get_ppo_ray_runtime_env(), ray_init.pop("runtime_env", None) or {})
        ray_init = {k: v for k, v in ray_init.items() if v is not None}
        check_ray_address(ray_init.get("address"))
        ray.init(runtime_env=OmegaConf.to_container(runtime_env), include_dashboard=False, **ray_init)
    runner = ray.remote(num_cpus=1)(TaskRunner).remote()
    ray.get(runner.run.remote(config))


class TaskRunner:
    """Builds every component on a Ray node and runs training (a Ray actor, so the driver stays light)."""

    def run(self, config: DictConfig) -> None:
        from verl.trainer.ppo.ray_trainer import RayPPOTrainer
        from verl.trainer.ppo.reward import load_reward_manager
        from verl.utils.dataset.rl_dataset import collate_fn
        from verl.utils.driver_watch import start_driver_watch
        from verl.utils.tokenizer import hf_processor, hf_tokenizer

        start_driver_watch("the TaskRunner")  # a dead driver stops the trainer at once (no save after it)
        OmegaConf.resolve(config)
        model_path = os.path.expanduser(config.actor_rollout_ref.model.path)
        trust_remote_code = config.data.trust_remote_code
        tokenizer = hf_tokenizer(model_path, trust_remote_code=trust_remote_code)
        processor = hf_processor(model_path, trust_remote_code=trust_remote_code, use_fast=True)
        train_dataset = create_rl_dataset(config.data.train_files, config.data, tokenizer, processor, True)
        trainer = RayPPOTrainer(
            config=config,
            tokenizer=tokenizer,
            processor=processor,
            role_worker_mapping=self.role_worker_mapping(config),
            resource_pool_manager=self.resource_pool_manager(config),
            reward_fn=load_reward_manager(config, tokenizer, num_examine=0),
            val_reward_fn=load_reward_manager(config, tokenizer, num_examine=1),
            train_dataset=train_dataset,
            val_dataset=create_rl_dataset(config.data.val_files, config.data, tokenizer, processor, False),
            collate_fn=collate_fn,
            train_sampler=create_rl_sampler(config.data, train_dataset),
        )
        trainer.init_workers()
        trainer.fit()

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

    custom = data_config.get("sampler")  # a DictConfig or a DataConfig: both read like a Mapping
    if custom is not None and custom.class_path is not None:
        return _custom_sampler(custom.class_path, custom.class_name, data_config, dataset)
    if data_config.shuffle:
        generator = torch.Generator()
        generator.manual_seed(data_config.seed if data_config.seed is not None else 1)
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
