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
