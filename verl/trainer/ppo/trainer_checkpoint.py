"""Trainer-level checkpoints: atomic step directories, retention, and resume (``trainer.resume_mode``).

Layout (upstream's)::

    {trainer.default_local_dir}/
        latest_checkpointed_iteration.txt      # "N", written last, atomically
        global_step_N/
            actor/   critic/                  # written by the workers
            data.pt                            # dataloader state + driver state (KL controller, ...)

A step directory is first written as ``global_step_N.tmp`` and renamed when every part is complete, and the
tracker file is replaced atomically after that, so a run killed at any moment leaves the previous checkpoint
intact and resumes from the last complete one.
"""

from __future__ import annotations

import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path

import torch

TRACKER_FILE = "latest_checkpointed_iteration.txt"
_STEP_DIR = re.compile(r"^global_step_(\d+)$")


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
    """Rename ``tmp`` to ``global_step_N``, record N in the tracker file, then drop the oldest beyond ``max_to_keep``."""
    final = step_dir(root, global_step)
    if final.exists():
        shutil.rmtree(final)
    os.replace(tmp, final)
    tracker_tmp = Path(root) / f".{TRACKER_FILE}.tmp"
    tracker_tmp.write_text(str(global_step))
    os.replace(tracker_tmp, Path(root) / TRACKER_FILE)
    if max_to_keep is not None and max_to_keep > 0:
        for old_step in list_steps(root)[:-max_to_keep]:
            shutil.rmtree(step_dir(root, old_step), ignore_errors=True)
    return final


def list_steps(root: str | os.PathLike) -> list[int]:
    root = Path(root)
    if not root.is_dir():
        return []
    steps = [int(m.group(1)) for p in root.iterdir() if p.is_dir() and (m := _STEP_DIR.match(p.name))]
    return sorted(steps)


def save_driver_state(step_path: Path, dataloader_state: dict, extra: dict) -> None:
    torch.save({"dataloader": dataloader_state, "extra": extra}, step_path / "data.pt")


def load_driver_state(step_path: Path) -> dict:
    return torch.load(step_path / "data.pt", weights_only=False)


def find_resume_point(resume_mode: str, root: str | os.PathLike, resume_from_path: str | None) -> ResumePoint | None:
    """Where to resume from, per ``trainer.resume_mode`` (auto | disable | resume_path).

    Raises:
        ValueError: unknown mode, or ``resume_path`` without a valid ``trainer.resume_from_path``.
    """
    if resume_mode == "disable":
        return None
    if resume_mode == "auto":
        tracker = Path(root) / TRACKER_FILE
        if not tracker.is_file():
            return None
        global_step = int(tracker.read_text().strip())
        path = step_dir(root, global_step)
        if not path.is_dir():
            raise ValueError(
                f"{tracker} names step {global_step} but {path} does not exist; delete the tracker file or set "
                "trainer.resume_mode=disable"
            )
        return ResumePoint(global_step, path)
    if resume_mode == "resume_path":
        if not resume_from_path:
            raise ValueError("trainer.resume_mode=resume_path needs trainer.resume_from_path=<.../global_step_N>")
        path = Path(resume_from_path)
        match = _STEP_DIR.match(path.name)
        if match is None or not path.is_dir():
            raise ValueError(
                f"trainer.resume_from_path={resume_from_path!r} must be an existing directory named global_step_<N>"
            )
        return ResumePoint(int(match.group(1)), path)
    raise ValueError(f"trainer.resume_mode={resume_mode!r} is not one of: auto, disable, resume_path")
