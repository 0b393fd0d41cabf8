"""A pool of worker processes that call one function, with a time limit per call and one for the whole batch.

Why processes and not threads: Python cannot stop a thread. A call that hangs (a verifier in an endless loop, a
network request without a timeout) keeps its thread, its memory and often a lock until the trainer exits. A
process can be killed: a call that exceeds its limit is ended by killing its worker's process group (the worker
and anything the call started, e.g. a sandbox subprocess), and a fresh worker takes its place. Nothing of the
hung call is left behind, and the caller never blocks on it: it waits on the workers' sockets with a timeout.

How workers start: each is a fresh interpreter (``python -m verl.utils.process_pool <fd>``, i.e. "spawn"),
never a fork of the caller. The caller is usually a Ray actor with gRPC threads; a forked child of a
multi-threaded process can inherit a lock that another thread held at fork time and deadlock (CPython warns about
it since 3.12). ``multiprocessing``'s spawn and forkserver methods are not used either: they re-import the
caller's ``__main__`` in every worker, which inside a Ray worker is Ray's own entry script. A worker imports only
this module and what the function needs (no torch unless the function imports it); starting one costs about half
a second of one core, paid once per worker since workers stay for later batches, and again only to replace a
killed one (``benchmarks/reward_scoring.py`` measures start-up and per-call overhead).

What the function can rely on, since it runs in a worker and not in the caller:

* it is rebuilt from its pickle in every worker: importable functions by reference, closures and lambdas by value
  (cloudpickle); a function loaded from a file (:class:`verl.utils.import_utils.ExternFunction`) re-executes the
  file's source there. Module top-level code therefore runs once per worker, and module globals are per worker
  (a cache is not shared between workers or with the caller);
* its keyword arguments and its return value travel by pickle; an unpicklable return value is an error of that
  call;
* it sees the caller's environment variables, working directory and ``sys.path``; its prints go to the caller's
  stdout / stderr;
* a worker that timed out is replaced by a fresh one, which runs the module top level again.

Unix only (the worker's socket is inherited as a file descriptor). On Linux a worker dies with the process that
started it (``PR_SET_PDEATHSIG``), even mid-call; a subprocess that the call itself started is killed with its
worker on a timeout or :meth:`ProcessCallPool.close`, but not when the caller is SIGKILLed mid-call: nothing of
the pool is left to kill the worker's process group then, so such a subprocess runs on until it ends.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import os
import pickle
import signal
import socket
import subprocess
import sys
import time
import weakref
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait
from typing import Any

logger = logging.getLogger(__name__)

__all__ = ["CallOutcome", "PoolEvent", "ProcessCallPool"]

# Seconds a killed worker gets to be reaped before the pool stops waiting for it (SIGKILL cannot be ignored).
_REAP_TIMEOUT_S = 5.0
# Seconds a new worker may take to start and load the function. Not part of any call's time limit: a call's
# clock starts when its worker is ready, so a limit shorter than a worker's start-up still works.
_START_TIMEOUT_S = 120.0
# What a worker sends once it has loaded the function (a result carries the call's index instead).
_READY = -1


@dataclass
class CallOutcome:
    """What one call produced: its return value, or why it has none."""

    value: Any = None
    error: str | None = None
    """``"TypeName: message"`` when the call raised, timed out or its worker died; None on success."""
    timed_out: bool = False
    limit: str | None = None
    """Which limit ended the call: ``"call"`` (per-call) or ``"batch"``; None when none did."""
    elapsed_s: float = 0.0


@dataclass(frozen=True)
class PoolEvent:
    """Reported to ``on_event`` while a batch runs.

    ``kind``: ``"timeout"`` (call ``index`` exceeded the per-call limit and its worker was killed),
    ``"deadline"`` (the batch limit was reached; ``index`` is the first unfinished call, ``unfinished`` how many),
    ``"progress"`` (periodic, while a batch is slow).
    """

    kind: str
    index: int | None
    done: int
    total: int
    failed: int
    elapsed_s: float
    unfinished: int = 0


def _die_with_parent(parent_pid: int) -> None:
    """Linux: SIGKILL this worker when the process that started it exits (even if a call hangs).

    PR_SET_PDEATHSIG fires when the *thread* that started the worker exits; a pool used from a short-lived thread
    finds such workers dead and starts new ones (``_take_worker``).
    """
    if sys.platform.startswith("linux"):
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    if os.getppid() != parent_pid:  # the parent died before prctl took effect
        os._exit(1)


def _describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


def _call(fn: Callable[..., Any], kwargs: dict) -> Any:
    """``fn(**kwargs)``, awaited when it returns an awaitable (an ``async def`` function)."""
    result = fn(**kwargs)
    if not inspect.isawaitable(result):
        return result

    async def _wait() -> Any:
        return await result

    return asyncio.run(_wait())


def _serve(conn: Connection) -> None:
    """Worker loop: rebuild the function, then answer ``(index, kwargs)`` with ``(index, ok, value_or_error)``."""
    try:
        sys_path, payload = conn.recv()
        sys.path[:] = sys_path
        fn = pickle.loads(payload)
    except BaseException as exc:  # noqa: BLE001 - reported to the caller, which raises
        conn.send((None, False, _describe(exc)))
        return
    conn.send((_READY, True, None))
    while True:
        try:
            index, kwargs = conn.recv()
        except (EOFError, OSError):
            return
        try:
            value = _call(fn, kwargs)
        except BaseException as exc:  # noqa: BLE001 - the caller scores the call as failed
            conn.send((index, False, _describe(exc)))
            continue
        try:
            conn.send((index, True, value))
        except Exception as exc:  # noqa: BLE001 - pickling the value failed before anything was written
            conn.send((index, False, f"returned an unpicklable {type(value).__name__}: {_describe(exc)}"))


def _worker_entry(argv: list[str]) -> None:
    """``python -m verl.utils.process_pool <fd> <parent pid>``."""
    fd, parent_pid = int(argv[0]), int(argv[1])
    _die_with_parent(parent_pid)
    _serve(Connection(fd))


def _dumps(fn: Callable[..., Any]) -> bytes:
    """The function as bytes a worker can rebuild (cloudpickle: closures and lambdas by value)."""
    import cloudpickle

    try:
        return cloudpickle.dumps(fn)
    except Exception as exc:
        raise TypeError(
            f"{getattr(fn, '__qualname__', fn)!r} cannot be sent to a worker process ({_describe(exc)}); define it "
            "at module level of a Python file, or make the objects it references picklable"
        ) from exc


class _Worker:
    """One worker process (its own session and process group) and the caller's end of its socket."""

    def __init__(self, payload: bytes):
        parent_sock, child_sock = socket.socketpair()
        fd = child_sock.fileno()
        self.process = subprocess.Popen(
            [sys.executable, "-m", __name__, str(fd), str(os.getpid())],
            pass_fds=(fd,),
            stdin=subprocess.DEVNULL,
            start_new_session=True,  # own process group: a kill reaches what the call started; Ctrl-C does not
        )
        child_sock.close()
        self.conn = Connection(parent_sock.detach())
        self.conn.send((list(sys.path), payload))
        self.spawned_at = time.monotonic()
        self.ready = False
        self.index: int | None = None
        self.started_at: float | None = None
        """When the current call started running (None while the worker is still starting)."""

    @property
    def pid(self) -> int:
        return self.process.pid

    def alive(self) -> bool:
        return self.process.poll() is None

    def submit(self, index: int, kwargs: dict) -> None:
        """Queue call ``index``; its clock starts now, or when the worker reports ready if it is still starting."""
        self.index, self.started_at = index, time.monotonic() if self.ready else None
        self.conn.send((index, kwargs))

    def mark_ready(self) -> None:
        self.ready = True
        if self.index is not None:
            self.started_at = time.monotonic()

    def kill(self) -> None:
        """SIGKILL the worker's process group (the worker and what its call started), then reap the worker."""
        try:
            os.killpg(self.process.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            self.process.kill()
        try:
            self.process.wait(_REAP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            logger.warning("worker process %d did not exit %.0f s after SIGKILL", self.process.pid, _REAP_TIMEOUT_S)
        self.conn.close()

    def exit_code(self) -> int | None:
        try:
            return self.process.wait(_REAP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            return None


def _close_workers(workers: list[_Worker]) -> None:
    for worker in workers:
        worker.kill()
    workers.clear()


_SHARED: weakref.WeakValueDictionary[tuple[bytes, int], ProcessCallPool] = weakref.WeakValueDictionary()


class ProcessCallPool:
    """Calls ``fn(**kwargs)`` for a batch of kwargs on up to ``num_workers`` worker processes.

    Workers start on first use and stay for later batches (stopped by :meth:`close`, when the pool is garbage
    collected, or at interpreter exit; on Linux they also die with the caller). Results come back in input order,
    so parallel results equal serial ones. The pool pickles as its function and size only; a copy in another
    process starts its own workers.
    """

    progress_every_s = 30.0
    """While a batch is slow, ``on_event`` gets a ``progress`` event this often."""

    def __init__(self, fn: Callable[..., Any], num_workers: int):
        if num_workers < 1:
            raise ValueError(f"ProcessCallPool: num_workers must be >= 1, got {num_workers}")
        self.num_workers = num_workers
        self._payload = _dumps(fn)
        self._idle: list[_Worker] = []
        self._finalizer = weakref.finalize(self, _close_workers, self._idle)

    @classmethod
    def shared(cls, fn: Callable[..., Any], num_workers: int) -> ProcessCallPool:
        """The pool of this process for the same function and size, made on first use.

        Callers never score at the same time (the trainer's training and validation reward managers), so they can
        share workers instead of starting ``num_workers`` each.
        """
        pool = cls(fn, num_workers)
        key = (pool._payload, num_workers)
        existing = _SHARED.get(key)
        if existing is not None:
            return existing
        _SHARED[key] = pool
        return pool

    def __getstate__(self) -> dict:
        return {"num_workers": self.num_workers, "_payload": self._payload}

    def __setstate__(self, state: dict) -> None:
        self.num_workers, self._payload = state["num_workers"], state["_payload"]
        self._idle = []
        self._finalizer = weakref.finalize(self, _close_workers, self._idle)

    def worker_pids(self) -> list[int]:
        """PIDs of the idle workers kept for the next batch."""
        return [w.pid for w in self._idle]

    def close(self) -> None:
        """Stop every worker (idempotent)."""
        _close_workers(self._idle)

    def _take_worker(self) -> _Worker:
        """An idle worker that is still alive, else a new one."""
        while self._idle:
            worker = self._idle.pop()
            if worker.alive():
                return worker
            worker.kill()  # died while idle (e.g. killed from outside): reap it
        return _Worker(self._payload)

    def map(
        self,
        kwargs_list: Sequence[dict],
        call_timeout_s: float | None = None,
        batch_timeout_s: float | None = None,
        on_event: Callable[[PoolEvent], None] | None = None,
    ) -> list[CallOutcome]:
        """One :class:`CallOutcome` per kwargs, in order. Never raises for what a call does; raises RuntimeError
        when a worker cannot rebuild the function (nothing could be scored)."""
        run = _BatchRun(self, kwargs_list, call_timeout_s, batch_timeout_s, on_event)
        try:
            return run.execute()
        finally:
            run.release()


class _BatchRun:
    """The state of one :meth:`ProcessCallPool.map` call: pending calls, busy workers, outcomes."""

    def __init__(self, pool, kwargs_list, call_timeout_s, batch_timeout_s, on_event):
        self.pool, self.kwargs_list = pool, list(kwargs_list)
        self.call_timeout_s, self.batch_timeout_s, self.on_event = call_timeout_s, batch_timeout_s, on_event
        self.start = time.monotonic()
        self.deadline = None if batch_timeout_s is None else self.start + batch_timeout_s
        self.next_progress = self.start + pool.progress_every_s
        self.pending = deque(range(len(self.kwargs_list)))
        self.busy: dict[Any, _Worker] = {}  # connection -> worker
        self.outcomes: list[CallOutcome | None] = [None] * len(self.kwargs_list)

    def execute(self) -> list[CallOutcome]:
        while self.pending or self.busy:
            self._fill()
            for conn in wait(list(self.busy), self._wait_s()):
                if self._receive(self.busy[conn]):
                    del self.busy[conn]
            now = time.monotonic()
            self._kill_overdue(now)
            if self.deadline is not None and now >= self.deadline and (self.pending or self.busy):
                self._abandon(now)
                break
            if now >= self.next_progress and (self.pending or self.busy):
                self.next_progress = now + self.pool.progress_every_s
                self._report("progress", None, now)
        return [o if o is not None else CallOutcome(error="RuntimeError: not run") for o in self.outcomes]

    def release(self) -> None:
        """Workers still busy (only after an exception) are killed; the idle ones stay in the pool."""
        _close_workers(list(self.busy.values()))
        self.busy.clear()

    def _fill(self) -> None:
        while self.pending and len(self.busy) < self.pool.num_workers:
            index = self.pending.popleft()
            worker = self.pool._take_worker()
            try:
                worker.submit(index, self.kwargs_list[index])
            except OSError:  # the worker died between the liveness check and the send: use a fresh one
                worker.kill()
                worker = _Worker(self.pool._payload)
                worker.submit(index, self.kwargs_list[index])
            self.busy[worker.conn] = worker

    def _wait_s(self) -> float:
        limits = [self.next_progress]
        if self.deadline is not None:
            limits.append(self.deadline)
        if self.call_timeout_s is not None:
            limits.extend(w.started_at + self.call_timeout_s for w in self.busy.values() if w.started_at is not None)
        limits.extend(w.spawned_at + _START_TIMEOUT_S for w in self.busy.values() if not w.ready)
        return max(0.0, min(limits) - time.monotonic())

    def _receive(self, worker: _Worker) -> bool:
        """Handle one message of a busy worker; True when its call is finished (it is then idle or gone)."""
        elapsed = time.monotonic() - (worker.started_at or worker.spawned_at)
        try:
            index, ok, value = worker.conn.recv()
        except (EOFError, OSError):
            code = worker.exit_code()
            worker.kill()
            self.outcomes[worker.index] = CallOutcome(
                error=f"WorkerDied: the worker process exited (code {code}) during the call", elapsed_s=elapsed
            )
            return True
        if index is None:  # the worker could not rebuild the function: nothing can be scored
            raise RuntimeError(f"a worker process could not load the function: {value}")
        if index == _READY:
            worker.mark_ready()
            return False
        self.outcomes[index] = (
            CallOutcome(value=value, elapsed_s=elapsed) if ok else CallOutcome(error=value, elapsed_s=elapsed)
        )
        worker.index = worker.started_at = None
        self.pool._idle.append(worker)
        return True

    def _kill_overdue(self, now: float) -> None:
        for conn, worker in list(self.busy.items()):
            if not worker.ready and now - worker.spawned_at >= _START_TIMEOUT_S:
                raise RuntimeError(
                    f"a worker process did not start within {_START_TIMEOUT_S:g} s (loading the function hangs?)"
                )
            if self.call_timeout_s is None or worker.started_at is None:
                continue
            elapsed = now - worker.started_at
            if elapsed >= self.call_timeout_s:
                del self.busy[conn]
                worker.kill()
                self.outcomes[worker.index] = CallOutcome(
                    error=f"TimeoutError: no result within {self.call_timeout_s:g} s; its worker process was killed",
                    timed_out=True,
                    limit="call",
                    elapsed_s=elapsed,
                )
                self._report("timeout", worker.index, now)

    def _abandon(self, now: float) -> None:
        """Batch limit reached: kill the busy workers; every unfinished call times out."""
        unfinished = sorted([w.index for w in self.busy.values()] + list(self.pending))
        _close_workers(list(self.busy.values()))
        self.busy.clear()
        self.pending.clear()
        elapsed = now - self.start
        for index in unfinished:
            self.outcomes[index] = CallOutcome(
                error=f"TimeoutError: the batch limit of {self.batch_timeout_s:g} s was reached before this call finished",
                timed_out=True,
                limit="batch",
                elapsed_s=elapsed,
            )
        self._report("deadline", unfinished[0] if unfinished else None, now, unfinished=len(unfinished))

    def _report(self, kind: str, index: int | None, now: float, unfinished: int = 0) -> None:
        if self.on_event is None:
            return
        finished = [o for o in self.outcomes if o is not None]
        event = PoolEvent(
            kind=kind,
            index=index,
            done=len(finished),
            total=len(self.outcomes),
            failed=sum(o.error is not None for o in finished),
            elapsed_s=now - self.start,
            unfinished=unfinished,
        )
        self.on_event(event)


if __name__ == "__main__":
    _worker_entry(sys.argv[1:])
