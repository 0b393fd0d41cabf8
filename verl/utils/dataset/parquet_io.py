"""Read RL parquet files into one Arrow table, remembering which file and row every record came from.

Errors name the file (and column or row) and say what to change, because a bad dataset path or column is the
most common first-run mistake and would otherwise surface as a pyarrow traceback or a KeyError mid-training.
"""

from __future__ import annotations

import bisect
import os
from collections.abc import Sequence
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.parquet as pq

DATA_FILES_KEYS = "data.train_files / data.val_files"


@dataclass(frozen=True)
class RowOrigin:
    """Where a record lives on disk: ``file`` and its 0-based ``row`` within that file."""

    file: str
    row: int

    def __str__(self) -> str:
        return f"{self.file} row {self.row}"


@dataclass
class ParquetRows:
    """Concatenated rows of several parquet files; ``origin(i)`` maps a global row back to its file."""

    table: pa.Table
    files: list[str]
    file_starts: list[int]
    """Global index of each file's first row (ascending, first 0)."""

    def origin(self, global_row: int) -> RowOrigin:
        index = bisect.bisect_right(self.file_starts, global_row) - 1
        return RowOrigin(self.files[index], global_row - self.file_starts[index])


def normalize_data_files(data_files: str | Sequence[str]) -> list[str]:
    """A path or list of paths (ListConfig too) -> list of absolute paths with ``~`` expanded."""
    if isinstance(data_files, (str, os.PathLike)):
        data_files = [data_files]
    files = [os.path.abspath(os.path.expanduser(str(path))) for path in data_files]
    if not files:
        raise ValueError(f"No data files given: set {DATA_FILES_KEYS} to one or more parquet paths.")
    return files


def _read_one(path: str) -> pa.Table:
    """One parquet file as a table, with errors that name the file."""
    if not os.path.exists(path):
        raise FileNotFoundError(f"Data file {path!r} does not exist; check {DATA_FILES_KEYS}.")
    if os.path.isdir(path):
        raise IsADirectoryError(f"Data file {path!r} is a directory; {DATA_FILES_KEYS} must list parquet files.")
    try:
        return pq.read_table(path)
    except (pa.ArrowException, OSError) as exc:
        raise ValueError(
            f"Cannot read {path!r} as parquet ({type(exc).__name__}: {exc}). RL datasets are parquet files as "
            f"written by examples/data_preprocess/*.py; check {DATA_FILES_KEYS}."
        ) from exc


def check_required_columns(table: pa.Table, path: str, required: dict[str, str]) -> None:
    """Raise ValueError naming the file, the missing column, the config key that names it and the present columns.

    ``required`` maps column name -> the config key that selects it (e.g. ``{"prompt": "data.prompt_key"}``).
    """
    for column, config_key in required.items():
        if column not in table.column_names:
            raise ValueError(
                f"{path}: required column {column!r} (selected by {config_key}) is missing; columns present: "
                f"{table.column_names}. Rename the column in the data or set {config_key}."
            )


def read_parquet_files(files: list[str], required: dict[str, str]) -> ParquetRows:
    """Read and concatenate ``files``; every file must have the ``required`` columns (see check_required_columns)."""
    tables, starts, total = [], [], 0
    for path in files:
        table = _read_one(path)
        check_required_columns(table, path, required)
        tables.append(table)
        starts.append(total)
        total += table.num_rows
    try:
        merged = pa.concat_tables(tables, promote_options="permissive") if len(tables) > 1 else tables[0]
    except pa.ArrowException as exc:
        raise ValueError(f"Files {files} have incompatible column types and cannot be combined: {exc}") from exc
    return ParquetRows(table=merged, files=files, file_starts=starts)
