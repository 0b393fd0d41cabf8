"""MATH (lighteval) -> RL parquet; ground truth = the last ``\\boxed{}`` of each solution.

    python examples/data_preprocess/math_dataset.py --input_jsonl train=train.jsonl test=test.jsonl
    python examples/data_preprocess/math_dataset.py                     # DigitalLearningGmbH/MATH-lighteval

Input records have MATH's fields ``problem`` and ``solution``.
"""

from __future__ import annotations

from verl.utils.dataset.preprocess import MATH_SOURCE, math_row
from verl.utils.dataset.preprocess_cli import load_hf_splits, make_parser, read_input_jsonl, save_dir, write_splits


def main(argv: list[str] | None = None) -> dict[str, str]:
    args = make_parser("math", __doc__.split("\n\n")[0]).parse_args(argv)
    if args.input_jsonl:
        records = read_input_jsonl(args)
    else:
        records = load_hf_splits(MATH_SOURCE, "default", args.local_dataset_path, ["train", "test"])
    return write_splits(records, save_dir(args), math_row)


if __name__ == "__main__":
    main()
