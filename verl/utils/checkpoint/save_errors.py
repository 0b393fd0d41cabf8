"""Save failures that say what happened: which checkpoint, why (a full disk, by name), how much space is left on
that filesystem, and that the previous checkpoint is intact.

A full disk reaches the user in three disguises: ``OSError: [Errno 28] No space left on device`` from a plain
write, torch's ``RuntimeError: [enforce fail at inline_container.cc:672] . unexpected pos 704 vs 598`` from
``torch.save`` (a short write, reported as a zip-stream position mismatch), and DCP's ``CheckpointException``
(a ``BaseException``, not an ``Exception``) wrapping the per-rank OSErrors; from a worker, each arrives wrapped in a
``RayTaskError``. :func:`save_error` looks through all of them and builds one :class:`CheckpointSaveError`.
"""

from __future__ import annotations

import errno
import shutil
from collections.abc import Iterator
from pathlib import Path

__all__ = ["CheckpointSaveError", "describe_free_space", "save_error"]

_DISK_FULL_ERRNOS = (errno.ENOSPC, getattr(errno, "EDQUOT", errno.ENOSPC))
_TORCH_SHORT_WRITE = ("unexpected pos", "PytorchStreamWriter failed")
_PASS_THROUGH = (KeyboardInterrupt, SystemExit, GeneratorExit)


class CheckpointSaveError(OSError):
    """Saving a checkpoint failed; ``str()`` says where, why, the free space and what is intact.

    ``path``: the checkpoint that was being written; ``reason``: why, in one line; ``errno``: the OS error number
    when known (``ENOSPC`` for a full disk).
    """

    def __init__(self, message: str, path: str | None = None, reason: str | None = None, error_number=None):
        super().__init__(message)
        self.message, self.path, self.reason = message, path, reason
        self.errno = error_number

    def __str__(self) -> str:
        return self.message

    def __reduce__(self) -> tuple:  # keep the fields across pickling (Ray ships it from the worker)
        return type(self), (self.message, self.path, self.reason, self.errno)


def _chain(exc: BaseException) -> Iterator[BaseException]:
    """``exc`` and everything it wraps: causes, contexts, a RayTaskError's cause, DCP's per-rank failures."""
    seen: set[int] = set()
    todo = [exc]
    while todo:
        current = todo.pop(0)
        if current is None or id(current) in seen:
            continue
        seen.add(id(current))
        ray_cause = getattr(current, "cause", None)
        if isinstance(ray_cause, BaseException):  # a RayTaskError: only a copy of its cause, look at the original
            todo.insert(0, ray_cause)
            continue
        yield current
        todo += [current.__cause__, current.__context__]
        for failure in (getattr(current, "failures", None) or {}).values():
            todo.append(failure[0] if isinstance(failure, tuple) else failure)


def _reason(exc: BaseException) -> tuple[str, int | None]:
    """One line saying why the save failed, and the OS error number when there is one."""
    chain = [e for e in _chain(exc) if isinstance(e, BaseException)]
    for e in chain:
        if isinstance(e, CheckpointSaveError) and e.reason:
            return e.reason, e.errno
    for e in chain:
        if isinstance(e, OSError) and e.errno in _DISK_FULL_ERRNOS:
            where = f" writing {e.filename}" if e.filename else ""
            return f"the disk is full ({type(e).__name__}: [Errno {e.errno}] {e.strerror}{where})", e.errno
    for e in chain:
        if any(marker in str(e) for marker in _TORCH_SHORT_WRITE):
            first_line = str(e).strip().splitlines()[0]
            return f"a write came up short, which means the disk is full or over quota (torch: {first_line})", None
    for e in chain:
        if isinstance(e, OSError):
            return f"{type(e).__name__}: {e}", e.errno
    first_line = (str(exc).strip().splitlines() or [""])[0]
    return f"{type(exc).__name__}: {first_line}", None


def describe_free_space(path: str | Path) -> str:
    """``"<dir> has N bytes (x.x GiB) free of M"`` for the filesystem holding ``path`` (its nearest existing
    ancestor)."""
    probe = Path(path).absolute()
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    try:
        usage = shutil.disk_usage(probe)
    except OSError as exc:
        return f"the free space on the filesystem of {probe} is unknown ({exc})"
    return f"the filesystem of {probe} has {usage.free} bytes ({usage.free / 2**30:.1f} GiB) free of {usage.total}"


def save_error(exc: BaseException, target: str | Path, intact: str) -> BaseException:
    """The error to raise for ``exc``, which ended the save of the checkpoint ``target``.

    ``intact`` states what was not touched (e.g. "The previous checkpoint global_step_2 (...) is intact ...").
    KeyboardInterrupt, SystemExit and DriverGoneError (the run was stopped) are returned unchanged.
    """
    from verl.utils.driver_watch import DriverGoneError

    if isinstance(exc, (*_PASS_THROUGH, DriverGoneError)):
        return exc
    reason, error_number = _reason(exc)
    message = f"Saving the checkpoint {target} failed: {reason}. Now {describe_free_space(target)}. {intact}"
    return CheckpointSaveError(message, path=str(target), reason=reason, error_number=error_number)
