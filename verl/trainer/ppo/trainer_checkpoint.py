"""Trainer-level checkpoints: durable step directories, retention, and resume (``trainer.resume_mode``).

Layout (upstream's, plus the manifest)::

    {trainer.default_local_dir}/
        latest_checkpointed_iteration.txt      # "N", replaced atomically after the step directory is committed
        global_step_N/
            actor/   critic/                  # written by the workers
            data.pt                            # dataloader state + driver state (KL controller, ...)
            checkpoint_manifest.json           # every file above with its size, written last

A step directory is written as ``global_step_N.tmp``; when every part is complete its files are fsynced, the
manifest is written, and it is renamed, then the tracker is replaced (``verl.utils.checkpoint.durable`` gives the
order and why). A run killed at any moment, or a host that crashes, leaves the previous checkpoint intact; a run
whose driver died commits nothing more (``verl.utils.driver_watch``).

Resume (``auto``) trusts a checkpoint only if its manifest matches its files. The tracker's step is tried first,
then older steps: an unreadable tracker, a step directory that is missing, empty or damaged (a truncated shard,
an empty ``data.pt``) is skipped with a warning naming the file and why, and the newest complete checkpoint is
used. When none is complete, resume stops with a :class:`CheckpointError` listing every candidate and the fix.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from verl.utils.checkpoint.durable import (
    NO_MANIFEST,
    CheckpointError,
    check_manifest,
    fsync_path,
    fsync_tree,
    write_manifest,
    write_text_atomic,
)
from verl.utils.checkpoint.save_errors import save_error
from verl.utils.driver_watch import DriverGoneError, check_driver_alive

logger = logging.getLogger(__name__)

TRACKER_FILE = "latest_checkpointed_iteration.txt"
DRIVER_STATE_FILE = "data.pt"
_STEP_DIR = re.compile(r"^global_step_(\d+)$")
_FIX = (
    "To start from scratch set trainer.resume_mode=disable (or move the directory away); to pick a checkpoint set "
    "trainer.resume_mode=resume_path and trainer.resume_from_path=<.../global_step_N>."
)


@dataclass(frozen=True)
class ResumePoint:
    global_step: int
    path: Path


def step_dir(root: str | os.PathLike, global_step: int) -> Path:
    return Path(root) / f"global_step_{global_step}"


def begin_step_dir(root: str | os.PathLike, global_step: int) -> Path:
    """A fresh temporary directory for step ``global_step``; finish it with :func:`commit_step_dir`."""
    tmp = Path(root) / f"global_step_{global_step}.tmp"
    if tmp.exists():  # left over from a run killed mid-save
        shutil.rmtree(tmp)
    tmp.mkdir(parents=True)
    return tmp


def commit_step_dir(root: str | os.PathLike, tmp: Path, global_step: int, max_to_keep: int | None) -> Path:
    """Make ``tmp`` the checkpoint of ``global_step``: fsync, manifest, rename, tracker; then drop the oldest
    beyond ``max_to_keep``."""
    root = Path(root)
    final = step_dir(root, global_step)
    fsync_tree(tmp)
    write_manifest(tmp)
    check_driver_alive(f"committing {final}")  # a stopped run changes no checkpoint
    if final.exists():  # a re-save of the same step
        shutil.rmtree(final)
    os.replace(tmp, final)
    fsync_path(root)
    write_text_atomic(root / TRACKER_FILE, str(global_step))
    if max_to_keep is not None and max_to_keep > 0:
        for old_step in list_steps(root)[:-max_to_keep]:
            shutil.rmtree(step_dir(root, old_step), ignore_errors=True)
    return final


def _previous_checkpoint(root: Path) -> str:
    """What a failed save leaves intact, for its error message."""
    latest, _ = read_tracker(root / TRACKER_FILE) if (root / TRACKER_FILE).is_file() else (None, None)
    if latest is None:
        return "No earlier checkpoint of this run is affected (the tracker file was not changed)."
    return (
        f"The previous checkpoint global_step_{latest} ({step_dir(root, latest)}) is intact and "
        "trainer.resume_mode=auto resumes from it."
    )


def save_step(
    root: str | os.PathLike, global_step: int, write_parts: Callable[[Path], None], max_to_keep: int | None
) -> Path:
    """Write step ``global_step``'s checkpoint with ``write_parts(tmp_dir)`` (workers' parts and ``data.pt``), then
    commit it (:func:`commit_step_dir`).

    Raises:
        CheckpointSaveError: anything failed; the message names the checkpoint, the reason (a full disk by name),
            the free space, and the previous checkpoint, which is intact. The partial ``.tmp`` is removed.
    """
    root = Path(root)
    intact = _previous_checkpoint(root)
    tmp = root / f"global_step_{global_step}.tmp"
    try:
        tmp = begin_step_dir(root, global_step)
        write_parts(tmp)
        return commit_step_dir(root, tmp, global_step, max_to_keep)
    except DriverGoneError:
        raise  # the run was stopped: leave the directory exactly as it is
    except BaseException as exc:  # DCP's CheckpointException is a BaseException; save_error passes Ctrl-C on
        shutil.rmtree(tmp, ignore_errors=True)
        hint = f" The partial {tmp} was removed; free disk space or point trainer.default_local_dir at a larger disk."
        raise save_error(exc, step_dir(root, global_step), intact + hint) from exc


def list_steps(root: str | os.PathLike) -> list[int]:
    root = Path(root)
    if not root.is_dir():
        return []
    steps = [int(m.group(1)) for p in root.iterdir() if p.is_dir() and (m := _STEP_DIR.match(p.name))]
    return sorted(steps)


def save_driver_state(step_path: Path, dataloader_state: dict, extra: dict) -> None:
    torch.save({"dataloader": dataloader_state, "extra": extra}, step_path / DRIVER_STATE_FILE)


def load_driver_state(step_path: Path) -> dict:
    path = step_path / DRIVER_STATE_FILE
    try:
        return torch.load(path, weights_only=False)
    except Exception as exc:
        raise CheckpointError(
            f"{path} cannot be read ({type(exc).__name__}: {exc}); the checkpoint {step_path} is damaged. {_FIX}"
        ) from exc


def _has_data(path: Path) -> bool:
    """True when ``path`` is a non-empty file, or a directory with at least one non-empty file."""
    if path.is_file():
        return path.stat().st_size > 0
    return path.is_dir() and any(p.is_file() and p.stat().st_size > 0 for p in path.rglob("*"))


def check_step_dir(path: Path) -> str | None:
    """None when ``path`` is a complete step checkpoint; else why not, naming the file.

    A directory without a manifest (written before manifests existed, or by upstream) is accepted with a warning
    when its ``data.pt`` and ``actor/`` hold data, since nothing more can be checked.
    """
    if not path.is_dir():
        return "does not exist"
    if not any(path.iterdir()):
        return "is an empty directory"
    problem = check_manifest(path)
    if problem != NO_MANIFEST:
        return problem
    for part in (DRIVER_STATE_FILE, "actor"):
        if not _has_data(path / part):
            return f"{NO_MANIFEST} and its {part} is missing or empty"
    logger.warning(
        "%s %s (older format): accepted after checking only that data.pt and actor/ hold data", path, NO_MANIFEST
    )
    return None


def read_tracker(tracker: Path) -> tuple[int | None, str | None]:
    """(step, None) from a tracker file holding a step number, else (None, what is wrong with it)."""
    try:
        text = tracker.read_text().strip()
    except (OSError, UnicodeDecodeError) as exc:
        return None, f"cannot be read ({type(exc).__name__}: {exc})"
    if not text:
        return None, "is empty"
    if not text.isdigit():
        return None, f"holds {text[:40]!r}, not a step number"
    return int(text), None


def _auto_resume_point(root: Path) -> ResumePoint | None:
    """The tracker's step if complete, else the newest complete older one (warned); None without a tracker."""
    tracker = root / TRACKER_FILE
    if not tracker.is_file():
        if list_steps(root):
            logger.warning(
                "%s has step directories %s but no %s: starting from scratch. To resume one, set "
                "trainer.resume_mode=resume_path and trainer.resume_from_path=<.../global_step_N>.",
                root,
                [step_dir(root, s).name for s in list_steps(root)],
                TRACKER_FILE,
            )
        return None
    latest, problem = read_tracker(tracker)
    skipped = [f"{tracker} {problem}"] if problem else []
    steps = sorted(list_steps(root), reverse=True)
    if latest is not None:
        if latest not in steps:
            skipped.append(f"{tracker} names step {latest}, but {step_dir(root, latest)} does not exist")
        steps = [s for s in steps if s <= latest]
    for step in steps:
        reason = check_step_dir(step_dir(root, step))
        if reason is None:
            if skipped:
                logger.warning(
                    "resuming from %s, not from the latest checkpoint: %s", step_dir(root, step), "; ".join(skipped)
                )
            return ResumePoint(step, step_dir(root, step))
        skipped.append(f"{step_dir(root, step)} {reason}")
    raise CheckpointError(f"no complete checkpoint to resume from in {root}: {'; '.join(skipped)}. {_FIX}")


def find_resume_point(resume_mode: str, root: str | os.PathLike, resume_from_path: str | None) -> ResumePoint | None:
    """Where to resume from, per ``trainer.resume_mode`` (auto | disable | resume_path).

    Raises:
        ValueError: unknown mode, or ``resume_path`` without a valid ``trainer.resume_from_path``.
        CheckpointError: ``auto`` with a tracker but no complete checkpoint, or ``resume_path`` to a damaged one.
    """
    if resume_mode == "disable":
        return None
    if resume_mode == "auto":
        return _auto_resume_point(Path(root))
    if resume_mode == "resume_path":
        if not resume_from_path:
            raise ValueError("trainer.resume_mode=resume_path needs trainer.resume_from_path=<.../global_step_N>")
        path = Path(resume_from_path)
        match = _STEP_DIR.match(path.name)
        if match is None or not path.is_dir():
            raise ValueError(
                f"trainer.resume_from_path={resume_from_path!r} must be an existing directory named global_step_<N>"
            )
        reason = check_step_dir(path)
        if reason is not None:
            raise CheckpointError(f"trainer.resume_from_path={resume_from_path!r}: {path} {reason}. {_FIX}")
        return ResumePoint(int(match.group(1)), path)
    raise ValueError(f"trainer.resume_mode={resume_mode!r} is not one of: auto, disable, resume_path")
