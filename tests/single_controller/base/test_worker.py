"""Worker reads its rank from the torchrun-style environment, validates it, and keeps per-mesh dispatch info."""

import pytest

from verl.single_controller.base import Worker

RANK_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


@pytest.fixture
def clean_env(monkeypatch):
    for key in RANK_VARS:
        monkeypatch.delenv(key, raising=False)
    return monkeypatch


def test_worker_reads_env(clean_env):
    """RANK / WORLD_SIZE / LOCAL_* / MASTER_* from the environment become the worker's properties."""
    env = {"RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2"}
    env.update({"MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29500"})
    for key, val in env.items():
        clean_env.setenv(key, val)
    worker = Worker()
    assert (worker.rank, worker.world_size) == (3, 4)
    assert (worker._local_rank, worker._local_world_size) == (1, 2)
    assert worker.get_master_addr_port() == ("10.0.0.1", "29500")
    assert "CUDA_VISIBLE_DEVICES" in Worker.env_keys() or "ASCEND_RT_VISIBLE_DEVICES" in Worker.env_keys()


def test_worker_without_env_is_rank_zero_of_one(clean_env):
    """Outside a worker group (no RANK / WORLD_SIZE) a worker is rank 0 of 1."""
    worker = Worker()
    assert (worker.rank, worker.world_size) == (0, 1)
    assert worker.get_master_addr_port() == (None, None)


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"RANK": "0"}, "set both RANK and WORLD_SIZE"),
        ({"RANK": "2", "WORLD_SIZE": "2"}, "RANK=2 is outside"),
        ({"RANK": "x", "WORLD_SIZE": "2"}, "RANK='x' must be an integer"),
        ({"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "1"}, "LOCAL_RANK=1 is outside"),
    ],
)
def test_worker_rejects_inconsistent_env(clean_env, env, message):
    """Half-set or out-of-range rank variables raise ValueError naming the variable."""
    for key, val in env.items():
        clean_env.setenv(key, val)
    with pytest.raises(ValueError, match=message):
        Worker()


def test_dispatch_collect_info_registration(clean_env):
    """A mesh is registered once; the query methods return it; unknown meshes raise with the fix."""
    worker = Worker()
    worker._register_dispatch_collect_info("actor", dp_rank=0, is_collect=True)
    assert worker._query_dispatch_info("actor") == 0
    assert worker._query_collect_info("actor") is True
    assert worker.get_dispatch_collect() == {"dispatch_dp_rank": {"actor": 0}, "collect_dp_rank": {"actor": True}}
    with pytest.raises(ValueError, match="already registered"):
        worker._register_dispatch_collect_info("actor", 0, True)
    with pytest.raises(ValueError, match="_register_dispatch_collect_info\\('critic'"):
        worker._query_dispatch_info("critic")
    other = Worker()
    other.set_dispatch_collect("actor", **worker.get_dispatch_collect())
    assert other._query_dispatch_info("actor") == 0
