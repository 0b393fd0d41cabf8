"""Durable checkpoint commits: fsync, atomically replaced small files, and a manifest that proves completeness.

A rename (``os.replace``) is atomic for the directory entry, but the files it makes visible may still be in the
page cache only. After a host crash (power loss, kernel panic; not a killed process, whose written data the kernel
keeps) a renamed directory can hold empty or short files and still look committed. So a commit runs in this order:

1. every file of the checkpoint is written;
2. every file and directory under it is fsynced (:func:`fsync_tree`);
3. the manifest is written last and fsynced: every file's path and size (:func:`write_manifest`);
4. the directory is renamed to its final name and its parent directory fsynced;
5. the tracker file is replaced atomically (temp file, fsync, rename, fsync of the directory:
   :func:`write_text_atomic`).

On load, :func:`check_manifest` compares the directory with its manifest: a missing or truncated file (a damaged
disk, a copy that stopped half-way, a crash on a filesystem that ignores fsync) is reported by name and size
instead of failing later inside ``torch.load`` or, worse, loading damaged state. Sizes, not checksums: hashing a
checkpoint of a 35B model would read hundreds of GB at every save and load.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

__all__ = [
    "MANIFEST_FILE",
    "NO_MANIFEST",
    "CheckpointError",
    "check_manifest",
    "fsync_path",
    "fsync_tree",
    "write_manifest",
    "write_text_atomic",
]

MANIFEST_FILE = "checkpoint_manifest.json"
_MANIFEST_FORMAT = 1
NO_MANIFEST = "has no checkpoint_manifest.json"
"""What :func:`check_manifest` says about a directory written without a manifest (older versions, upstream)."""


class CheckpointError(RuntimeError):
    """A checkpoint that cannot be used (incomplete, damaged, unreadable); the message names the file and the fix."""


def fsync_path(path: str | os.PathLike) -> None:
    """Flush one file's or directory's data and metadata to the disk."""
    flags = (os.O_RDONLY | getattr(os, "O_DIRECTORY", 0)) if os.path.isdir(path) else os.O_RDONLY
    fd = os.open(path, flags)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_tree(root: str | os.PathLike) -> None:
    """fsync every file under ``root``, then every directory bottom-up (so each new entry is on disk too)."""
    for dirpath, _, filenames in os.walk(root, topdown=False):
        for name in filenames:
            fsync_path(os.path.join(dirpath, name))
        fsync_path(dirpath)


def write_text_atomic(path: str | os.PathLike, text: str) -> None:
    """Replace ``path`` with ``text`` so that a reader (or a crash) sees the old or the new content, never a part."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fsync_path(path.parent)


def _file_sizes(root: Path) -> dict[str, int]:
    sizes = {}
    for dirpath, _, filenames in os.walk(root):
        for name in filenames:
            full = Path(dirpath) / name
            rel = full.relative_to(root).as_posix()
            if rel != MANIFEST_FILE:
                sizes[rel] = full.stat().st_size
    return dict(sorted(sizes.items()))


def write_manifest(root: str | os.PathLike) -> dict[str, int]:
    """Record every file under ``root`` with its size in ``root/checkpoint_manifest.json`` (fsynced); returns it.

    Call it after everything else of the checkpoint is written and fsynced: the manifest's presence says "complete".
    """
    root = Path(root)
    files = _file_sizes(root)
    with open(root / MANIFEST_FILE, "w") as f:
        json.dump({"format": _MANIFEST_FORMAT, "files": files}, f, indent=0)
        f.flush()
        os.fsync(f.fileno())
    fsync_path(root)
    return files


def check_manifest(root: str | os.PathLike) -> str | None:
    """None when every file the manifest of ``root`` lists is there with its size; else what is wrong, naming the
    file (:data:`NO_MANIFEST` when there is no manifest at all). Extra files are allowed (e.g. a later HF export)."""
    root = Path(root)
    manifest = root / MANIFEST_FILE
    if not manifest.is_file():
        return NO_MANIFEST
    try:
        files = json.loads(manifest.read_text())["files"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        return f"has an unreadable {MANIFEST_FILE} ({type(exc).__name__}: {exc})"
    for rel, size in files.items():
        path = root / rel
        if not path.is_file():
            return f"lacks {rel}, which its manifest lists ({size} bytes)"
        actual = path.stat().st_size
        if actual != size:
            return f"has {rel} of {actual} bytes, but its manifest says {size} (truncated or damaged)"
    return None
