"""AIME -> RL parquet scored by the DAPO rule (``Answer: <x>`` or ``\\boxed{}``; data_source ``aime*``).

    python examples/data_preprocess/aime.py --input_jsonl aime_2024.jsonl            # -> test.parquet
    python examples/data_preprocess/aime.py --input_jsonl aime_2024.jsonl \\
        --train_set dapo_math --train_path dapo_math_17k.jsonl                        # + train.parquet
    python examples/data_preprocess/aime.py                                          # Maxwell-Jia/AIME_2024 (train split)

Input records have ``problem`` (or ``Problem``/``question``) and ``answer`` (or ``Answer``). AIME is an evaluation
set, so a bare ``--input_jsonl`` path is written as ``test.parquet`` (use it as ``data.val_files``).

``--train_set dapo_math`` writes ``train.parquet`` from a named training set (``BytedTsinghua-SIA/DAPO-Math-17k``,
data_source ``math_dapo``, the same scorer): from ``--train_path`` (a local JSON-lines copy, records as published
or plain ``{problem, answer}``), else from the hub (needs the ``datasets`` package).
"""

from __future__ import annotations

import os

from verl.utils.dataset.preprocess import (
    AIME_SOURCE,
    AIME_TRAIN_SETS,
    aime_row,
    build_rows,
    dapo_math_row,
    read_jsonl,
    write_parquet,
)
from verl.utils.dataset.preprocess_cli import load_hf_splits, make_parser, read_input_jsonl, save_dir, write_splits

TRAIN_ROW_FNS = {"dapo_math": dapo_math_row}


def _train_records(args) -> list[dict]:
    if args.train_path:
        return read_jsonl(os.path.expanduser(args.train_path))
    hub_name, split = AIME_TRAIN_SETS[args.train_set]
    return load_hf_splits(hub_name, None, None, [split])[split]


def main(argv: list[str] | None = None) -> dict[str, str]:
    parser = make_parser("aime", __doc__.split("\n\n")[0], bare_split="test")
    parser.add_argument("--data_source", default=AIME_SOURCE, help="must start with 'aime' for default scoring")
    parser.add_argument("--hub_name", default="Maxwell-Jia/AIME_2024", help="HF dataset to load without inputs")
    parser.add_argument("--train_set", choices=sorted(AIME_TRAIN_SETS), default=None, help="named training set")
    parser.add_argument("--train_path", default=None, help="local JSON-lines copy of --train_set")
    args = parser.parse_args(argv)
    if args.train_path and not args.train_set:
        parser.error("--train_path needs --train_set (which set the file holds: " + ", ".join(AIME_TRAIN_SETS) + ")")
    if args.input_jsonl:
        records = read_input_jsonl(args)
        if args.train_set and "train" in records:
            parser.error("give the train split either as --input_jsonl train=PATH or as --train_set, not both")
    else:
        loaded = load_hf_splits(args.hub_name, None, args.local_dataset_path, ["train"])
        records = {"test": loaded["train"]}
    out_dir = save_dir(args)
    written = write_splits(records, out_dir, aime_row, data_source=args.data_source)
    if args.train_set:
        rows = build_rows(_train_records(args), "train", TRAIN_ROW_FNS[args.train_set])
        written["train"] = write_parquet(rows, os.path.join(out_dir, "train.parquet"))
        print(f"wrote {len(rows)} rows of {args.train_set} to {written['train']}")
    return written


if __name__ == "__main__":
    main()
