"""ProcessCallPool: results in input order, every failure of a call is that call's outcome, a call over its limit is
killed together with what it started, and no worker outlives the pool.

Worker processes are real (fresh interpreters, ~0.5 s each to start on this machine), so the tests keep pools at
two workers and reuse one pool where they can.
"""

import os
import pickle
import subprocess
import sys
import threading
import time

import psutil
import pytest

from verl.utils.process_pool import ProcessCallPool


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def behave(x, mode="ok", pid_file=None):
    """A test function (module level: pickled by reference) whose behaviour the kwargs pick."""
    if pid_file is not None:
        with open(pid_file, "a") as f:
            f.write(f"{os.getpid()}\n")
    if mode == "raise":
        raise ValueError(f"bad {x}")
    if mode == "hang_with_child":
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3600)"])
        with open(pid_file, "a") as f:
            f.write(f"{child.pid}\n")
        time.sleep(3600)
    if mode == "unpicklable":
        return threading.Lock()
    if mode == "die":
        os._exit(3)
    return {"x": x, "pid": os.getpid()}


@pytest.fixture(scope="module")
def pool():
    p = ProcessCallPool(behave, num_workers=2)
    yield p
    p.close()


def test_results_in_order_and_failures_per_call(pool):
    """Six calls on two workers: values in input order; a raise, an unpicklable return value and a worker that dies
    are failures of their own call only, and the next batch runs normally."""
    modes = ["ok", "raise", "ok", "unpicklable", "die", "ok"]
    outcomes = pool.map([{"x": i, "mode": m} for i, m in enumerate(modes)])
    assert [o.value["x"] for i, o in enumerate(outcomes) if modes[i] == "ok"] == [0, 2, 5]
    assert outcomes[1].error == "ValueError: bad 1"
    assert outcomes[3].error.startswith("returned an unpicklable lock")
    assert outcomes[4].error.startswith("WorkerDied") and "code 3" in outcomes[4].error
    assert not any(o.timed_out for o in outcomes)
    assert [o.value["x"] for o in pool.map([{"x": 7}, {"x": 8}])] == [7, 8]


def test_hung_call_is_killed_with_its_children(pool, tmp_path):
    """A call that starts a subprocess and hangs: after call_timeout_s it is a timed-out outcome, its worker and the
    subprocess are gone (process-group kill), the timeout event names the call, and no thread was added."""
    pid_file = tmp_path / "pids"
    threads_before = threading.active_count()
    events = []
    outcomes = pool.map(
        [{"x": 0, "mode": "hang_with_child", "pid_file": str(pid_file)}, {"x": 1}],
        call_timeout_s=1.0,
        on_event=events.append,
    )
    assert outcomes[0].timed_out and outcomes[0].limit == "call" and outcomes[1].value["x"] == 1
    assert [(e.kind, e.index) for e in events] == [("timeout", 0)]
    worker_pid, child_pid = (int(line) for line in pid_file.read_text().split())
    deadline = time.monotonic() + 10
    while (_alive(worker_pid) or _alive(child_pid)) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(worker_pid) and not _alive(child_pid)
    assert threading.active_count() == threads_before
    assert worker_pid not in pool.worker_pids()


def test_batch_limit_ends_every_unfinished_call(pool, monkeypatch):
    """Four hanging calls, two workers, batch_timeout_s=1.5: all four are timed out (two were running, two never
    started), progress is reported while the batch is slow (every 0.4 s here), then one deadline event reports four
    unfinished, and the pool serves the next batch."""
    monkeypatch.setattr(pool, "progress_every_s", 0.4)
    events = []
    start = time.monotonic()
    outcomes = pool.map(
        [{"x": i, "mode": "hang_with_child", "pid_file": os.devnull} for i in range(4)], None, 1.5, events.append
    )
    assert time.monotonic() - start < 10  # the hang is 3600 s: returning at all proves the limit
    assert all(o.timed_out and o.limit == "batch" for o in outcomes)
    kinds = [e.kind for e in events]
    assert kinds[-1] == "deadline" and set(kinds[:-1]) == {"progress"} and len(kinds) >= 2
    assert (events[-1].index, events[-1].unfinished, events[0].done, events[0].total) == (0, 4, 0, 4)
    assert pool.map([{"x": 5}])[0].value["x"] == 5


def test_pickled_pool_starts_its_own_workers_and_close_stops_all():
    """A pool pickles without its workers (a copy in another process starts its own); close() ends every worker."""
    pool = ProcessCallPool(lambda x: x * 2, num_workers=2)  # a lambda travels by value (cloudpickle)
    assert [o.value for o in pool.map([{"x": 1}, {"x": 2}])] == [2, 4]
    pids = pool.worker_pids()
    assert len(pids) == 2 and all(_alive(p) for p in pids)
    copy = pickle.loads(pickle.dumps(pool))
    assert copy.worker_pids() == [] and copy.map([{"x": 5}])[0].value == 10
    pool.close()
    copy.close()
    assert not any(_alive(p) for p in pids) and pool.worker_pids() == []


def test_function_that_cannot_be_loaded_in_a_worker_raises():
    """A function a worker cannot rebuild (its module is not importable there) is a RuntimeError naming the cause;
    one that cannot be pickled at all is a TypeError at construction."""
    import types

    module = types.ModuleType("verl_test_not_importable")
    exec("def f(x):\n    return x\n", module.__dict__)
    sys.modules[module.__name__] = module  # importable here (pickled by reference), not in a fresh worker
    try:
        pool = ProcessCallPool(module.f, num_workers=1)
        with pytest.raises(RuntimeError, match="could not load the function: ModuleNotFoundError"):
            pool.map([{"x": 1}])
        pool.close()
    finally:
        del sys.modules[module.__name__]
    lock = threading.Lock()
    with pytest.raises(TypeError, match="cannot be sent to a worker process"):
        ProcessCallPool(lambda x: (x, lock), num_workers=1)
