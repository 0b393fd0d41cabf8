"""Driver watch: a process of the run stops soon after the driver dies, and a commit after the driver died is refused.

A "driver" here is a real child process (sleeping Python), killed with SIGKILL like a user's Ctrl-\\ or an OOM kill;
a "worker" is a real process started with the driver's identity in its environment, as main_ppo starts them.
"""

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from verl.trainer.ppo import trainer_checkpoint as tc
from verl.utils import driver_watch
from verl.utils.driver_watch import DRIVER_ENV, DRIVER_GONE_EXIT_CODE, DriverGoneError, DriverIdentity

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the watch reads /proc (Linux)")

WORKER = textwrap.dedent(
    """
    import sys, time
    from verl.utils.driver_watch import start_driver_watch
    print("watching" if start_driver_watch("the test worker") else "not watching", flush=True)
    time.sleep(120)
    """
)


def _driver() -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])


@pytest.fixture
def watched(monkeypatch):
    """Point this process's watch at a fresh driver process; yields (driver, identity)."""
    driver = _driver()
    identity = DriverIdentity.of_process(driver.pid)
    monkeypatch.setenv(DRIVER_ENV, identity.encode())
    monkeypatch.setattr(driver_watch, "_watched", {})
    yield driver, identity
    driver.kill()
    driver.wait()


def test_identity_tracks_exit_zombies_and_pid_reuse():
    """Alive while running; not alive once killed (also while still a zombie, before it is reaped) or when the pid's
    start time differs (a reused pid); round-trips through the environment string."""
    driver = _driver()
    identity = DriverIdentity.of_process(driver.pid)
    assert identity.alive() and identity.is_local()
    assert DriverIdentity.decode(identity.encode()) == identity
    reused = DriverIdentity(identity.boot_id, identity.pid_namespace, driver.pid, identity.start_ticks + 1)
    assert not reused.alive()
    os.kill(driver.pid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while identity.alive() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not identity.alive()  # a zombie now: killed but not yet reaped
    driver.wait()
    assert not identity.alive()
    other_machine = DriverIdentity("another-boot-id", identity.pid_namespace, os.getpid(), 0)
    assert not other_machine.is_local()
    assert DriverIdentity.decode("garbage") is None


def test_worker_stops_soon_after_the_driver_is_killed():
    """A worker process with the driver's identity in its environment exits with DRIVER_GONE_EXIT_CODE and says
    why, well within its 120 s sleep, once the driver is SIGKILLed (measured bound printed; POLL_INTERVAL_S=0.1)."""
    driver = _driver()
    env = {**os.environ, DRIVER_ENV: DriverIdentity.of_process(driver.pid).encode()}
    worker = subprocess.Popen([sys.executable, "-c", WORKER], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert worker.stdout.readline().decode().strip() == "watching"
    killed_at = time.monotonic()
    os.kill(driver.pid, signal.SIGKILL)
    driver.wait()
    code = worker.wait(timeout=30)
    print(f"worker stopped {time.monotonic() - killed_at:.2f} s after the driver was killed")
    assert code == DRIVER_GONE_EXIT_CODE
    assert (
        f"the driver process (pid {driver.pid}) has exited; stopping the test worker" in worker.stderr.read().decode()
    )


def test_no_watch_without_a_visible_driver(monkeypatch):
    """No identity, a malformed one, one from another machine, or a driver already gone at the first look: nothing
    is watched and check_driver_alive never refuses (Ray's own clean-up applies)."""
    monkeypatch.setattr(driver_watch, "_watched", {})
    monkeypatch.delenv(DRIVER_ENV, raising=False)
    driver_watch.check_driver_alive("x")
    here = DriverIdentity.of_process(os.getpid())
    gone = _driver()
    gone_identity = DriverIdentity.of_process(gone.pid)
    gone.kill()
    gone.wait()
    for value in (
        "garbage",
        DriverIdentity("another-boot-id", here.pid_namespace, 1, 0).encode(),
        gone_identity.encode(),
    ):
        monkeypatch.setenv(DRIVER_ENV, value)
        driver_watch.check_driver_alive("x")
        assert driver_watch._watched_driver() is None


def test_no_checkpoint_is_committed_after_the_driver_died(tmp_path, watched):
    """Step 1 commits while the driver lives; the driver is killed while step 2 is being written: the commit raises
    DriverGoneError and the directory is left as it was (no global_step_2, tracker still 1, the .tmp untouched)."""
    driver, _ = watched

    def write_parts(tmp):
        (tmp / "actor").mkdir()
        (tmp / "actor" / "w.bin").write_bytes(b"x" * 64)
        tc.save_driver_state(tmp, {"step": 1}, {})

    tc.save_step(tmp_path, 1, write_parts, None)

    def write_parts_then_driver_dies(tmp):
        write_parts(tmp)
        driver.kill()
        driver.wait()

    with pytest.raises(DriverGoneError, match=rf"pid {driver.pid}\) has exited: not committing .*global_step_2"):
        tc.save_step(tmp_path, 2, write_parts_then_driver_dies, None)
    assert tc.list_steps(tmp_path) == [1] and (tmp_path / tc.TRACKER_FILE).read_text() == "1"
    assert (tmp_path / "global_step_2.tmp" / "data.pt").is_file()
