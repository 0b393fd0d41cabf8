"""main_ppo's driver-side checks that need no Ray: the worker environment and the Ray head address."""

import socket

import pytest

from verl.trainer.main_ppo import check_ray_address, get_ppo_ray_runtime_env


def _unused_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_unreachable_ray_head_fails_fast_naming_the_key():
    """A host:port nobody listens on raises at once (ray.init would retry for minutes), naming the key."""
    with pytest.raises(ConnectionError, match=r"ray_kwargs\.ray_init\.address"):
        check_ray_address(f"127.0.0.1:{_unused_port()}", timeout_s=2.0)
    with pytest.raises(ValueError, match=r"ray_kwargs\.ray_init\.address"):
        check_ray_address("no-port-here")


def test_reachable_or_delegated_addresses_pass():
    """A listening head passes; None/auto/local/ray:// are Ray's to resolve."""
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(1)
        check_ray_address(f"127.0.0.1:{server.getsockname()[1]}")
    for address in (None, "auto", "local", "ray://head:10001"):
        check_ray_address(address)


def test_hccl_and_ascend_variables_reach_the_workers(monkeypatch):
    """HCCL_/ASCEND_ variables of the driver are forwarded (workers of a `ray start` cluster do not inherit them),
    except device visibility, which each worker gets from its own assignment."""
    monkeypatch.setenv("HCCL_CONNECT_TIMEOUT", "1800")
    monkeypatch.setenv("ASCEND_HOME_PATH", "/usr/local/Ascend/ascend-toolkit/latest")
    monkeypatch.setenv("ASCEND_RT_VISIBLE_DEVICES", "0,1")
    env = get_ppo_ray_runtime_env()["env_vars"]
    assert env["HCCL_CONNECT_TIMEOUT"] == "1800" and env["ASCEND_HOME_PATH"].endswith("latest")
    assert "ASCEND_RT_VISIBLE_DEVICES" not in env


_SAMPLERS = """
from verl.experimental.dataset.sampler import AbstractCurriculumSampler


class Reversed(AbstractCurriculumSampler):
    def __init__(self, data_source, data_config):
        self.n, self.updates = len(data_source), []

    def __iter__(self):
        return iter(range(self.n - 1, -1, -1))

    def __len__(self):
        return self.n

    def update(self, batch):
        self.updates.append(len(batch))


class NotASampler:
    def __init__(self, data_source, data_config):
        pass
"""


def test_custom_sampler_is_built_from_the_data_config(tmp_path):
    """data.sampler.class_path/class_name builds the user's sampler with (data_source, data_config) (it used to be
    ignored silently); a class that is not an AbstractSampler, or a missing class name, is refused naming the key."""
    from omegaconf import OmegaConf

    from verl.base_config import ConfigError
    from verl.trainer.main_ppo import create_rl_sampler

    path = tmp_path / "samplers.py"
    path.write_text(_SAMPLERS)
    dataset = list(range(5))

    def config(name):
        return OmegaConf.create({"shuffle": True, "seed": 1, "sampler": {"class_path": str(path), "class_name": name}})

    sampler = create_rl_sampler(config("Reversed"), dataset)
    assert type(sampler).__name__ == "Reversed" and list(sampler) == [4, 3, 2, 1, 0]
    with pytest.raises(ConfigError, match=r"data\.sampler\.class_name.*AbstractSampler"):
        create_rl_sampler(config("NotASampler"), dataset)
    with pytest.raises(ConfigError, match=r"data\.sampler\.class_name: is not set"):
        create_rl_sampler(config(None), dataset)


def test_runtime_env_declares_every_field_ray_accepts():
    """ray_kwargs.ray_init.runtime_env declares (null) every public field of the installed Ray's RuntimeEnv, so any
    of them is a plain Hydra override; a field a future Ray adds fails here until it is declared."""
    import inspect

    from ray.runtime_env import RuntimeEnv

    from verl.trainer.config.trainer import RAY_RUNTIME_ENV_FIELDS

    constructor = {p for p in inspect.signature(RuntimeEnv.__init__).parameters if p not in ("self", "kwargs")}
    ray_fields = {f for f in RuntimeEnv.known_fields | constructor if not f.startswith("_")}
    assert ray_fields == set(RAY_RUNTIME_ENV_FIELDS)


def test_runtime_env_overrides_reach_ray_init(monkeypatch):
    """Upstream recipes set ray_kwargs.ray_init.runtime_env.py_executable (Hydra refused it before). Overrides of
    plain and dict-valued fields compose, and ray.init gets them with the unset (null) fields dropped and the
    user's env_vars merged over the trainer's worker defaults (a user value wins)."""
    from verl.trainer.config.legacy_reward import migrate_legacy_reward_impl
    from verl.trainer.config.ppo_trainer import PPOTrainerConfig
    from verl.trainer.main_ppo import ray_init_kwargs
    from verl.utils.config import omega_conf_to_dataclass

    monkeypatch.delenv("NCCL_DEBUG", raising=False)
    monkeypatch.delenv("VLLM_LOGGING_LEVEL", raising=False)
    config = compose_ppo(
        [
            "ray_kwargs.ray_init.runtime_env.py_executable=/opt/venv/bin/python",
            "ray_kwargs.ray_init.runtime_env.working_dir=/srv/job",
            "ray_kwargs.ray_init.runtime_env.env_vars={MY_KEY: v, NCCL_DEBUG: INFO}",
            "+ray_kwargs.ray_init.runtime_env.env_vars.N_THREADS=4",
            "ray_kwargs.ray_init.num_cpus=4",
        ]
    )
    omega_conf_to_dataclass(migrate_legacy_reward_impl(config), PPOTrainerConfig)  # the typed config accepts it
    kwargs = ray_init_kwargs(config.ray_kwargs.ray_init)
    env = kwargs["runtime_env"]
    assert kwargs["num_cpus"] == 4 and env["py_executable"] == "/opt/venv/bin/python"
    assert env["working_dir"] == "/srv/job"
    assert env["env_vars"]["MY_KEY"] == "v" and env["env_vars"]["NCCL_DEBUG"] == "INFO"
    assert env["env_vars"]["N_THREADS"] == "4"  # Hydra parses 4 as an int; Ray needs str values
    assert env["env_vars"]["VLLM_LOGGING_LEVEL"] == "WARN"  # trainer default kept
    assert set(env) == {"py_executable", "working_dir", "env_vars"}  # nulls dropped
    default = ray_init_kwargs(compose_ppo().ray_kwargs.ray_init)
    assert set(default) == {"runtime_env"} and set(default["runtime_env"]) == {"env_vars"}


def compose_ppo(overrides=()):
    """ppo_trainer.yaml composed by Hydra, as main_ppo sees it."""
    from pathlib import Path

    from hydra import compose, initialize_config_dir

    import verl

    with initialize_config_dir(config_dir=str(Path(verl.__file__).parent / "trainer" / "config"), version_base=None):
        return compose(config_name="ppo_trainer", overrides=list(overrides))


def _placement_config(task_runner="auto", address=None, nnodes=1):
    from omegaconf import OmegaConf

    return OmegaConf.create(
        {"ray_kwargs": {"task_runner": task_runner, "ray_init": {"address": address}}, "trainer": {"nnodes": nnodes}}
    )


def test_task_runner_runs_in_the_driver_only_for_a_run_that_starts_its_own_one_node_ray(monkeypatch):
    """auto: in the driver for a local one-node run; a Ray actor (upstream's layout) when the run connects to a
    cluster (ray_init.address or $RAY_ADDRESS) or spans nodes; actor/driver force either."""
    from verl.trainer.main_ppo import task_runner_in_driver

    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    assert task_runner_in_driver(_placement_config())
    assert not task_runner_in_driver(_placement_config(address="127.0.0.1:6379"))
    assert not task_runner_in_driver(_placement_config(nnodes=2))
    assert not task_runner_in_driver(_placement_config(task_runner="actor"))
    assert task_runner_in_driver(_placement_config(task_runner="driver", address="127.0.0.1:6379"))
    monkeypatch.setenv("RAY_ADDRESS", "127.0.0.1:6379")
    assert not task_runner_in_driver(_placement_config())


def test_unknown_task_runner_place_is_refused_naming_the_key():
    from verl.base_config import ConfigError
    from verl.trainer.config import RayKwargsConfig

    with pytest.raises(ConfigError, match=r"task_runner.*auto \| actor \| driver"):
        RayKwargsConfig(task_runner="elsewhere")


def test_driver_config_check_does_not_import_tensordict():
    """prepare_config runs before ray.init, on the start-up's critical path: it must not import tensordict (which
    imports torch._dynamo, ~1.7 s here); the rollout-name check reads verl.workers.rollout.registry, not .base.
    Run in a fresh interpreter, since this test process has imported everything already."""
    import subprocess
    import sys

    code = (
        "import sys\n"
        "from hydra import compose, initialize_config_module\n"
        "from verl.trainer.main_ppo import prepare_config\n"
        "with initialize_config_module('verl.trainer.config', version_base=None):\n"
        "    prepare_config(compose('quickstart_cpu'))\n"
        "print(sorted(m for m in ('tensordict', 'torch._dynamo', 'verl.protocol') if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.strip().splitlines()[-1] == "[]", out.stdout + out.stderr
