"""AIME -> RL parquet scored by the DAPO rule (``Answer: <x>`` or ``\\boxed{}``; data_source ``aime*``).

    python examples/data_preprocess/aime.py --input_jsonl aime_2024.jsonl            # -> test.parquet
    python examples/data_preprocess/aime.py                                          # Maxwell-Jia/AIME_2024 (train split)

Input records have ``problem`` (or ``Problem``/``question``) and ``answer`` (or ``Answer``). AIME is an evaluation
set, so a bare ``--input_jsonl`` path is written as ``test.parquet`` (use it as ``data.val_files``).
"""

from __future__ import annotations

from verl.utils.dataset.preprocess import AIME_SOURCE, aime_row
from verl.utils.dataset.preprocess_cli import load_hf_splits, make_parser, read_input_jsonl, save_dir, write_splits


def main(argv: list[str] | None = None) -> dict[str, str]:
    parser = make_parser("aime", __doc__.split("\n\n")[0], bare_split="test")
    parser.add_argument("--data_source", default=AIME_SOURCE, help="must start with 'aime' for default scoring")
    parser.add_argument("--hub_name", default="Maxwell-Jia/AIME_2024", help="HF dataset to load without inputs")
    args = parser.parse_args(argv)
    if args.input_jsonl:
        records = read_input_jsonl(args)
    else:
        loaded = load_hf_splits(args.hub_name, None, args.local_dataset_path, ["train"])
        records = {"test": loaded["train"]}
    return write_splits(records, save_dir(args), aime_row, data_source=args.data_source)


if __name__ == "__main__":
    main()
