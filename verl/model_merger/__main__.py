"""``python -m verl.model_merger merge --backend fsdp --local_dir <.../global_step_N/actor> --target_dir <out>``.

Upstream's command line for turning a training checkpoint into a loadable HF model directory; the checkpoint may
have been written at any world size (DCP shards). Only the FSDP backend exists in verl-ascend.
"""

from __future__ import annotations

import argparse
import sys

_DTYPES = ("float32", "bfloat16", "float16")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m verl.model_merger", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="operation", required=True)
    merge = sub.add_parser("merge", help="write the full model as an HF directory")
    merge.add_argument("--backend", choices=["fsdp"], default="fsdp")
    merge.add_argument("--local_dir", required=True, help="the actor (or critic) directory of a checkpoint step")
    merge.add_argument("--target_dir", required=True, help="where the HF model directory is written")
    merge.add_argument("--dtype", choices=_DTYPES, default=None, help="weight dtype (default: as saved)")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    import torch

    from verl.utils.checkpoint.hf_export import export_hf_from_checkpoint

    dtype = getattr(torch, args.dtype) if args.dtype else None
    print(export_hf_from_checkpoint(args.local_dir, args.target_dir, dtype=dtype))
    return 0


if __name__ == "__main__":
    sys.exit(main())
