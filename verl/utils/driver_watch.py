"""The processes of a run stop when its driver dies, and commit no checkpoint after it.

The driver is the ``python -m verl.trainer.main_ppo`` process; the TaskRunner (which runs the trainer and commits
checkpoints) and every worker are Ray actors in other processes. When the driver dies (SIGKILL of its process
group, an OOM kill, a closed terminal), Ray ends those actors only once it notices: with the local cluster that
``ray.init()`` starts in the driver, the raylet dies with the driver and each worker process exits at its next
raylet liveness check, which runs about once a second (measured here: actors kept running for up to 2.3 s). Until
then the trainer keeps going, and it can finish a save and commit a checkpoint after the user stopped the run.

So ``main_ppo`` exports :data:`DRIVER_ENV` with the driver's identity to every process of the job, and

* each TaskRunner and every :class:`~verl.single_controller.base.Worker` starts a watchdog thread
  (:func:`start_driver_watch`) that looks at the driver every :data:`POLL_INTERVAL_S` seconds and ends its
  process (``os._exit``) as soon as the driver is gone. Bound: on the driver's machine, a process of the run stops
  within ``POLL_INTERVAL_S`` (0.1 s) plus its own exit time after the driver died;
* every checkpoint commit calls :func:`check_driver_alive` immediately before its rename, so no commit starts
  after the driver is gone (the check and the rename are microseconds apart).

Identity: boot id, PID namespace, pid and the process's start time. The start time guards against a reused pid;
boot id and namespace say whether the pid means anything here. A process on another node (or in another
container) cannot see the driver and leaves it to Ray, which ends the actors of a dead driver's job from its
control store. A process that cannot see a live driver when it first looks does not watch, rather than stop a
healthy run. Linux only (``/proc``); elsewhere nothing is watched.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
from dataclasses import dataclass

logger = logging.getLogger(__name__)

__all__ = [
    "DRIVER_ENV",
    "DRIVER_GONE_EXIT_CODE",
    "DriverGoneError",
    "DriverIdentity",
    "check_driver_alive",
    "driver_env",
    "start_driver_watch",
]

DRIVER_ENV = "VERL_DRIVER_PROCESS"
POLL_INTERVAL_S = 0.1
DRIVER_GONE_EXIT_CODE = 75
"""Exit code of a process the watchdog stopped."""


class DriverGoneError(RuntimeError):
    """The run's driver process has exited; the action (a checkpoint commit) was not done."""


def _read(path: str) -> str | None:
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return None


def _stat(pid: int) -> tuple[str, int] | None:
    """(state, start time in clock ticks since boot) of process ``pid`` from ``/proc/<pid>/stat``, or None."""
    text = _read(f"/proc/{pid}/stat")
    if text is None:
        return None
    fields = text[text.rfind(")") + 2 :].split()  # after "pid (comm) ": field 3 (state) onwards
    return fields[0], int(fields[19])  # field 22 is the start time


def _here() -> tuple[str, str] | None:
    """(boot id, PID namespace) of this process, or None off Linux."""
    boot_id = _read("/proc/sys/kernel/random/boot_id")
    try:
        namespace = os.readlink("/proc/self/ns/pid")
    except OSError:
        return None
    return (boot_id, namespace) if boot_id else None


@dataclass(frozen=True)
class DriverIdentity:
    """Which process the driver is, in a form any process of the run can check (see the module docstring)."""

    boot_id: str
    pid_namespace: str
    pid: int
    start_ticks: int

    @classmethod
    def of_process(cls, pid: int) -> DriverIdentity | None:
        here, stat = _here(), _stat(pid)
        if here is None or stat is None:
            return None
        return cls(here[0], here[1], pid, stat[1])

    def encode(self) -> str:
        return f"{self.boot_id}|{self.pid_namespace}|{self.pid}|{self.start_ticks}"

    @classmethod
    def decode(cls, text: str) -> DriverIdentity | None:
        parts = text.split("|")
        if len(parts) != 4 or not parts[2].isdigit() or not parts[3].isdigit():
            return None
        return cls(parts[0], parts[1], int(parts[2]), int(parts[3]))

    def is_local(self) -> bool:
        """True when this process shares the driver's machine and PID namespace (the pid means the driver)."""
        return _here() == (self.boot_id, self.pid_namespace)

    def alive(self) -> bool:
        """False once the driver exited (a zombie counts as exited) or its pid belongs to another process."""
        stat = _stat(self.pid)
        return stat is not None and stat[1] == self.start_ticks and stat[0] not in ("Z", "X")


def driver_env() -> dict[str, str]:
    """``{DRIVER_ENV: identity of this process}`` for the workers' environment (empty off Linux)."""
    identity = DriverIdentity.of_process(os.getpid())
    return {DRIVER_ENV: identity.encode()} if identity is not None else {}


_lock = threading.Lock()
_watched: dict[str, DriverIdentity | None] = {}  # DRIVER_ENV value -> identity this process trusts, or None
_watch_started = False


def _watched_driver() -> DriverIdentity | None:
    """The driver this process watches: named by the environment, on this machine, and alive when first seen."""
    text = os.environ.get(DRIVER_ENV)
    if not text:
        return None
    with _lock:
        if text not in _watched:
            identity = DriverIdentity.decode(text)
            usable = identity is not None and identity.is_local() and identity.alive()
            if identity is None:
                logger.warning("%s=%r is not a driver identity; the driver is not watched", DRIVER_ENV, text)
            _watched[text] = identity if usable else None
        return _watched[text]


def check_driver_alive(action: str) -> None:
    """Raise :class:`DriverGoneError` when the watched driver has exited; call it right before ``action``."""
    identity = _watched_driver()
    if identity is not None and not identity.alive():
        raise DriverGoneError(f"the driver process (pid {identity.pid}) has exited: not {action}")


def _watch(identity: DriverIdentity, what: str) -> None:
    while identity.alive():
        time.sleep(POLL_INTERVAL_S)
    message = f"[verl] the driver process (pid {identity.pid}) has exited; stopping {what} (pid {os.getpid()})\n"
    try:
        sys.stderr.write(message)
        sys.stderr.flush()
        sys.stdout.flush()
    finally:
        os._exit(DRIVER_GONE_EXIT_CODE)


def start_driver_watch(what: str) -> bool:
    """Start this process's watchdog (once per process); ``what`` names the process in the exit message.

    Returns True when a watchdog runs (the driver is named by the environment and visible from here).
    """
    global _watch_started
    identity = _watched_driver()
    if identity is None:
        return False
    with _lock:
        if not _watch_started:
            _watch_started = True
            threading.Thread(target=_watch, args=(identity, what), name="verl-driver-watch", daemon=True).start()
    return True
