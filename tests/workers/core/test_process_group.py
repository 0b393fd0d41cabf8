"""Process-group start-up of both worker paths (verl/workers/core/process_group.py)."""

import pytest
import torch.distributed as dist

from verl.workers.core.process_group import init_process_group


def test_missing_rendezvous_address_names_the_worker_group(monkeypatch):
    monkeypatch.delenv("MASTER_ADDR", raising=False)
    assert not dist.is_initialized()
    with pytest.raises(RuntimeError, match="MASTER_ADDR/MASTER_PORT are not set"):
        init_process_group(0, 1, 0)


def test_an_initialised_process_group_is_kept(tmp_path, monkeypatch):
    """Invariant: colocated workers share one process group: a second start is a no-op (no address needed)."""
    monkeypatch.delenv("MASTER_ADDR", raising=False)
    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/pg", rank=0, world_size=1)
    try:
        group = dist.group.WORLD
        init_process_group(0, 1, 0)
        assert dist.group.WORLD is group
    finally:
        dist.destroy_process_group()


def test_rank_coordinates_default_to_the_environment(monkeypatch):
    """Invariant: without arguments RANK / WORLD_SIZE / LOCAL_RANK come from the environment the worker group sets
    (here a one-rank group on a free port)."""
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(port))
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "1")
    monkeypatch.setenv("LOCAL_RANK", "0")
    init_process_group(timeout_s=30)
    try:
        assert (dist.get_rank(), dist.get_world_size(), dist.get_backend()) == (0, 1, "gloo")
    finally:
        dist.destroy_process_group()
