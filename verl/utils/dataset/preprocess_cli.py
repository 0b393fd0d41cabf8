"""Command-line plumbing shared by ``examples/data_preprocess/*.py`` (upstream-compatible flags).

Flags: ``--local_save_dir`` (default ``~/data/<name>``), deprecated ``--local_dir``, ``--local_dataset_path``
(a local copy of the HF dataset, needs the ``datasets`` package), ``--hdfs_dir`` (not supported here) and, for
machines without hub access, ``--input_jsonl PATH | SPLIT=PATH ...`` (local JSON-lines files).
"""

from __future__ import annotations

import argparse
import logging
import os
from collections.abc import Callable

from verl.utils.dataset.preprocess import build_rows, read_jsonl, write_parquet

logger = logging.getLogger(__name__)


def make_parser(name: str, description: str, bare_split: str = "train") -> argparse.ArgumentParser:
    """The common flags; ``bare_split`` is the split a ``--input_jsonl`` path without ``SPLIT=`` belongs to."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--local_save_dir", default=f"~/data/{name}", help="where <split>.parquet files are written")
    parser.add_argument("--local_dir", default=None, help="deprecated alias of --local_save_dir")
    parser.add_argument("--local_dataset_path", default=None, help="local copy of the HF dataset (needs `datasets`)")
    parser.add_argument("--hdfs_dir", default=None, help="not supported in verl-ascend (copy the files yourself)")
    parser.add_argument(
        "--input_jsonl",
        nargs="+",
        default=None,
        metavar="[SPLIT=]PATH",
        help=f"local JSON-lines input(s); a bare PATH is the {bare_split!r} split, e.g. train=a.jsonl test=b.jsonl",
    )
    parser.set_defaults(bare_split=bare_split)
    return parser


def save_dir(args: argparse.Namespace) -> str:
    """The output directory (``--local_dir`` wins, with a deprecation warning); ``~`` expanded."""
    if args.hdfs_dir is not None:
        raise NotImplementedError("--hdfs_dir is not supported in verl-ascend; write locally and copy the files.")
    if args.local_dir is not None:
        logger.warning("--local_dir is deprecated; use --local_save_dir")
        return os.path.expanduser(args.local_dir)
    return os.path.expanduser(args.local_save_dir)


def parse_input_jsonl(values: list[str], bare_split: str) -> dict[str, str]:
    """``["train=a.jsonl", "b.jsonl"]`` -> ``{"train": "a.jsonl", bare_split: "b.jsonl"}``; duplicates are errors."""
    splits: dict[str, str] = {}
    for value in values:
        split, sep, path = value.partition("=")
        if not sep:
            split, path = bare_split, value
        if split in splits:
            raise ValueError(f"--input_jsonl: split {split!r} given twice ({splits[split]!r} and {path!r})")
        splits[split] = path
    return splits


def load_hf_splits(hub_name: str, config_name: str | None, local_path: str | None, splits: list[str]) -> dict:
    """Records of ``splits`` from the HF hub (or ``local_path``) through ``datasets``; clear error without it."""
    try:
        import datasets
    except ImportError as exc:
        raise RuntimeError(
            f"Loading {hub_name} needs the `datasets` package (pip install datasets) and hub access; without them "
            "pass local files with --input_jsonl train=PATH test=PATH."
        ) from exc
    source = local_path if local_path is not None else hub_name
    loaded = datasets.load_dataset(source, config_name) if config_name else datasets.load_dataset(source)
    return {split: list(loaded[split]) for split in splits if split in loaded}


def write_splits(
    records_by_split: dict[str, list[dict]], out_dir: str, row_fn: Callable[..., dict], **row_kwargs
) -> dict[str, str]:
    """Build rows for each split and write ``<out_dir>/<split>.parquet``; returns split -> path."""
    written = {}
    for split, records in records_by_split.items():
        rows = build_rows(records, split, row_fn, **row_kwargs)
        written[split] = write_parquet(rows, os.path.join(out_dir, f"{split}.parquet"))
        print(f"wrote {len(rows)} rows to {written[split]}")
    return written


def read_input_jsonl(args: argparse.Namespace) -> dict[str, list[dict]]:
    """Records per split from ``--input_jsonl``."""
    return {split: read_jsonl(path) for split, path in parse_input_jsonl(args.input_jsonl, args.bare_split).items()}
