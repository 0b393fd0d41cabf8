"""Geometry3K -> multimodal RL parquet (adds an ``images`` column of ``{"bytes", "path"}`` structs).

    python examples/data_preprocess/geo3k.py --input_jsonl train=train.jsonl test=test.jsonl
    python examples/data_preprocess/geo3k.py                              # hiyouga/geometry3k

Input records have the fields ``problem`` (with ``<image>`` placeholders), ``answer`` and ``images`` (a list of
image file paths, relative to the JSONL file, or raw image structs).
"""

from __future__ import annotations

import os

from verl.utils.dataset.preprocess import GEO3K_SOURCE, build_rows, geo3k_row, write_parquet
from verl.utils.dataset.preprocess_cli import (
    load_hf_splits,
    make_parser,
    parse_input_jsonl,
    read_input_jsonl,
    save_dir,
)


def main(argv: list[str] | None = None) -> dict[str, str]:
    args = make_parser("geo3k", __doc__.split("\n\n")[0]).parse_args(argv)
    if args.input_jsonl:
        records = read_input_jsonl(args)
        base_dirs = {
            s: os.path.dirname(os.path.abspath(p)) for s, p in parse_input_jsonl(args.input_jsonl, "train").items()
        }
    else:
        records = load_hf_splits(GEO3K_SOURCE, None, args.local_dataset_path, ["train", "test"])
        base_dirs = {split: "." for split in records}
    out_dir, written = save_dir(args), {}
    for split, split_records in records.items():
        rows = build_rows(split_records, split, geo3k_row, base_dir=base_dirs[split])
        written[split] = write_parquet(rows, os.path.join(out_dir, f"{split}.parquet"))
        print(f"wrote {len(rows)} rows to {written[split]}")
    return written


if __name__ == "__main__":
    main()
