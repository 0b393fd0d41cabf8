"""``python -m verl.model_merger merge|test --backend fsdp --local_dir <.../global_step_N/actor> ...``.

Upstream's command line for a training checkpoint:

* ``merge --target_dir <out>`` writes it as a loadable HF model directory;
* ``test --test_hf_dir <hf>`` merges it in memory and compares every tensor with the HF model in ``<hf>`` (exit 1
  naming the differences): checks an export, or that a checkpoint holds the weights one expects.

The checkpoint may be verl-ascend's (DCP shards, any world size) or upstream verl's FSDP layout
(``model_world_size_W_rank_r.pt``). ``--trust-remote-code`` allows a model class that ships as code with the
checkpoint's config (``auto_map``). Only the FSDP backend exists in verl-ascend.
"""

from __future__ import annotations

import argparse
import sys

_DTYPES = ("float32", "bfloat16", "float16")


def _common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--backend", choices=["fsdp"], default="fsdp")
    parser.add_argument("--local_dir", required=True, help="the actor (or critic) directory of a checkpoint step")
    parser.add_argument(
        "--trust-remote-code",
        "--trust_remote_code",
        dest="trust_remote_code",
        action="store_true",
        help="allow model code shipped with the checkpoint's config (auto_map)",
    )


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m verl.model_merger", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="operation", required=True)
    merge = sub.add_parser("merge", help="write the full model as an HF directory")
    _common(merge)
    merge.add_argument("--target_dir", required=True, help="where the HF model directory is written")
    merge.add_argument("--dtype", choices=_DTYPES, default=None, help="weight dtype (default: as saved)")
    test = sub.add_parser("test", help="compare the merged weights with an HF model directory")
    _common(test)
    test.add_argument("--test_hf_dir", required=True, help="HF model directory to compare with")
    test.add_argument("--atol", type=float, default=0.0, help="allowed absolute difference per element [0: exact]")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    import torch

    from verl.utils.checkpoint.hf_export import compare_with_hf_dir, export_hf_from_checkpoint

    if args.operation == "merge":
        dtype = getattr(torch, args.dtype) if args.dtype else None
        print(export_hf_from_checkpoint(args.local_dir, args.target_dir, dtype, args.trust_remote_code))
        return 0
    problems = compare_with_hf_dir(args.local_dir, args.test_hf_dir, args.trust_remote_code, atol=args.atol)
    if problems:
        print(f"{args.local_dir} differs from {args.test_hf_dir} ({len(problems)} problems):", file=sys.stderr)
        for line in problems[:20]:
            print(f"  {line}", file=sys.stderr)
        return 1
    print(f"ok: {args.local_dir} equals {args.test_hf_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
