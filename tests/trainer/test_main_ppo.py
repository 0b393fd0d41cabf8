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
