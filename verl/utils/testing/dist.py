"""Run a function on N spawned ranks joined in one process group and collect what each rank returns.

``run_on_ranks(fn, world_size=2, args=(...))`` starts ``world_size`` fresh processes (``spawn``: no state leaks from
the caller, exactly like a torchrun launch), sets the environment a launcher sets (``MASTER_ADDR``,
``MASTER_PORT``, ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``) plus any extra variables, joins
the ranks in a ``gloo`` group, calls ``fn(*args, **kwargs)`` and returns ``[result_rank_0, result_rank_1, ...]``.

* ``fn`` and its arguments must be picklable: a module-level function (a test module's function works: the
  children import the module by name).
* Results travel through ``torch.save`` files, so tensors (not DTensors: call ``full_tensor()`` first), dicts and
  other picklable values come back; a rank with nothing to report returns None.
* A rank that raises makes ``run_on_ranks`` raise ``RankFailedError`` carrying that rank's traceback; a run that
  outlives ``timeout_s`` (a deadlocked collective) is killed and raises ``TimeoutError``. No process is left
  behind either way.

Process start plus ``import torch, transformers`` costs ~10-20 s per spawn on a small CPU machine, so a test
should run all of its distributed variants inside ONE call.
"""

from __future__ import annotations

import datetime
import os
import shutil
import socket
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

__all__ = ["RankFailedError", "end_rank_process", "free_port", "run_on_ranks", "spawn"]


class RankFailedError(RuntimeError):
    """A rank raised (or died); the message holds the first failing rank's traceback."""


def free_port() -> int:
    """A TCP port on 127.0.0.1 that is free now (the OS picks it)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launcher_env(rank: int, world_size: int, port: int) -> dict[str, str]:
    """The variables torchrun sets for ``rank`` of a single-node ``world_size`` job."""
    return {
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(port),
        "RANK": str(rank),
        "WORLD_SIZE": str(world_size),
        "LOCAL_RANK": str(rank),
        "LOCAL_WORLD_SIZE": str(world_size),
    }


def _rank_main(
    rank: int,
    world_size: int,
    port: int,
    fn: Callable[..., Any],
    args: Sequence[Any],
    kwargs: Mapping[str, Any],
    env: Mapping[str, str],
    backend: str,
    timeout_s: float,
    threads: int,
    out_dir: str,
) -> None:
    os.environ.update(launcher_env(rank, world_size, port))
    os.environ.update(env)
    torch.set_num_threads(threads)
    out_file = os.path.join(out_dir, f"rank_{rank}.pt")
    try:
        dist.init_process_group(
            backend, rank=rank, world_size=world_size, timeout=datetime.timedelta(seconds=timeout_s)
        )
        result = fn(*args, **kwargs)
        torch.save({"result": result}, out_file)
    except BaseException:
        torch.save({"error": traceback.format_exc()}, out_file)
        # exit at once: tearing the group down would wait for peers that are blocked in a collective
        os._exit(1)
    end_rank_process()


def end_rank_process(exit_code: int = 0) -> None:
    """End a spawned rank: destroy its process groups, flush its output, and leave with ``os._exit``.

    A spawned child that simply returns runs interpreter finalization, and a gloo group object still referenced
    from Python (a ``new_group`` captured by a hook or a module global) is then torn down while its worker
    threads may still hold work objects with tensors: the process aborts with SIGABRT ("terminate called
    without an active exception"), about one run in ten of the SP test on this machine, although every result
    was already written. Skipping finalization after the explicit teardown removes that race.
    """
    if dist.is_initialized():
        dist.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(exit_code)


def _run_then_exit(rank: int, fn: Callable[..., Any], args: Sequence[Any]) -> None:
    fn(rank, *args)
    end_rank_process()


def spawn(fn: Callable[..., Any], args: Sequence[Any] = (), nprocs: int = 2) -> None:
    """``torch.multiprocessing.spawn(fn, args, nprocs, join=True)`` whose children end through
    :func:`end_rank_process` once ``fn(rank, *args)`` returns (a raising rank is reported by ``mp.spawn`` as
    usual, with its traceback)."""
    mp.spawn(_run_then_exit, args=(fn, tuple(args)), nprocs=nprocs, join=True)


def _wait(procs: list[Any], timeout_s: float) -> None:
    """Join every process within ``timeout_s``. Returns early once a rank failed: its peers may then block in a
    collective until the group timeout, so they get a moment to fail on the broken connection and are killed."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if all(p.exitcode is not None for p in procs):
            return
        if any(p.exitcode not in (None, 0) for p in procs):
            time.sleep(0.5)
            return
        time.sleep(0.05)


def _kill(procs: list[Any]) -> None:
    for p in procs:
        if p.pid is not None and p.is_alive():
            p.kill()
    for p in procs:
        if p.pid is not None:
            p.join()


def _collect(out_dir: str, procs: list[Any]) -> list[Any]:
    results, failures = [], []
    for rank, proc in enumerate(procs):
        path = os.path.join(out_dir, f"rank_{rank}.pt")
        payload = torch.load(path, weights_only=False) if os.path.exists(path) else None
        if payload is None or "error" in payload:
            detail = payload["error"] if payload else f"no result (exit code {proc.exitcode})"
            failures.append(f"--- rank {rank} ---\n{detail}")
        else:
            results.append(payload["result"])
    if failures:
        raise RankFailedError("distributed run failed:\n" + "\n".join(failures))
    return results


def run_on_ranks(
    fn: Callable[..., Any],
    world_size: int = 2,
    *,
    args: Sequence[Any] = (),
    kwargs: Mapping[str, Any] | None = None,
    env: Mapping[str, str] | None = None,
    backend: str = "gloo",
    timeout_s: float = 300.0,
    threads: int = 1,
) -> list[Any]:
    """Run ``fn(*args, **kwargs)`` on ``world_size`` spawned ranks of one process group; per-rank results.

    Args:
        fn: module-level (picklable) function; it runs after ``init_process_group`` and may use collectives.
        env: extra environment variables for every rank (set before ``fn`` runs).
        backend: process-group backend; ``gloo`` runs anywhere.
        timeout_s: wall-clock limit of the whole run and of each collective.
        threads: ``torch.set_num_threads`` per rank (1 keeps CPU kernels deterministic and the machine usable).

    Raises:
        RankFailedError: a rank raised or died (the message has each failing rank's traceback).
        TimeoutError: the run did not finish within ``timeout_s``; every rank was killed.
    """
    if world_size < 1:
        raise ValueError(f"world_size must be >= 1, got {world_size}")
    ctx = mp.get_context("spawn")
    out_dir = tempfile.mkdtemp(prefix="verl_ranks_")
    port = free_port()
    procs = [
        ctx.Process(
            target=_rank_main,
            args=(
                rank,
                world_size,
                port,
                fn,
                tuple(args),
                dict(kwargs or {}),
                dict(env or {}),
                backend,
                timeout_s,
                threads,
                out_dir,
            ),
            daemon=False,
        )
        for rank in range(world_size)
    ]
    try:
        for p in procs:
            p.start()
        _wait(procs, timeout_s)
        failed = any(p.exitcode not in (None, 0) for p in procs)
        if not failed and any(p.exitcode is None for p in procs):
            _kill(procs)
            raise TimeoutError(f"{getattr(fn, '__name__', fn)} on {world_size} ranks did not finish in {timeout_s} s")
        _kill(procs)  # reap; after a failure this also ends peers stuck in a collective
        return _collect(out_dir, procs)
    finally:
        _kill(procs)
        shutil.rmtree(out_dir, ignore_errors=True)
