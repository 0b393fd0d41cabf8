"""GSM8K -> RL parquet (upstream columns: data_source, prompt, ability, reward_model, extra_info).

    python examples/data_preprocess/gsm8k.py --local_save_dir ~/data/gsm8k              # shipped offline sample
    python examples/data_preprocess/gsm8k.py --input_jsonl train=train.jsonl test=test.jsonl
    python examples/data_preprocess/gsm8k.py --hub                                       # openai/gsm8k (needs `datasets`)

Input records have GSM8K's fields ``question`` and ``answer`` (ending in ``#### <number>``). Without inputs the
64 + 16 problem sample in ``verl/data/gsm8k_sample`` is used, so this runs with no network; those problems are
written in GSM8K's format for this project, not taken from GSM8K, and are labelled
``data_source=verl_sample/gsm8k_format`` (validation reports ``val-core/verl_sample/gsm8k_format/...``, never a
GSM8K score). The real dataset (``--hub``, ``--local_dataset_path``, or its JSON lines) is ``openai/gsm8k``.
"""

from __future__ import annotations

from verl.utils.dataset.preprocess import GSM8K_SAMPLE_SOURCE, GSM8K_SOURCE, gsm8k_row
from verl.utils.dataset.preprocess_cli import load_hf_splits, make_parser, read_input_jsonl, save_dir, write_splits
from verl.utils.dataset.sample_data import GSM8K_SAMPLE_SPLITS, load_gsm8k_sample


def main(argv: list[str] | None = None) -> dict[str, str]:
    parser = make_parser("gsm8k", __doc__.split("\n\n")[0])
    parser.add_argument("--hub", action="store_true", help="download openai/gsm8k (config 'main') with `datasets`")
    args = parser.parse_args(argv)
    source = GSM8K_SOURCE
    if args.input_jsonl:
        records = read_input_jsonl(args)
    elif args.hub or args.local_dataset_path:
        records = load_hf_splits("openai/gsm8k", "main", args.local_dataset_path, ["train", "test"])
    else:
        records = {split: load_gsm8k_sample(split) for split in GSM8K_SAMPLE_SPLITS}
        source = GSM8K_SAMPLE_SOURCE
    return write_splits(records, save_dir(args), gsm8k_row, data_source=source)


if __name__ == "__main__":
    main()
