"""Time of packed causal attention (forward + backward) on a GRPO-shaped row: the mask path vs the segment kernel.

    python benchmarks/packed_attention_speed.py            # 64 x ~53 tokens and 8 x ~425 tokens, 4 heads / 2 KV
    python benchmarks/packed_attention_speed.py --quick    # fewer repeats

Row: ``--sequences`` sequences of ``--mean-tokens`` +- 20 % tokens packed into one row (a GRPO step of 64 rollouts
of ~53 tokens is ~3,400 tokens). Variants, each in this process, best of ``--repeats``:

* ``mask``: HF's ``sdpa_attention_forward`` on the whole row with the (1, 1, T, T) block-diagonal causal mask
  (what packed sdpa ran before ``verl.models.transformers.varlen_attention``);
* ``loop``: one ``scaled_dot_product_attention(is_causal=True)`` per sequence (a Python loop over segments);
* ``batched``: :func:`verl.ops.varlen_attention.varlen_causal_attention`, equal lengths batched into one call.

Prints milliseconds per forward + backward and the ratio to ``mask``. fp32, CPU, the threads torch is given.
"""

from __future__ import annotations

import argparse
import time

import torch
import torch.nn.functional as F


def _row(sequences: int, mean_tokens: int, seed: int = 0) -> list[int]:
    generator = torch.Generator().manual_seed(seed)
    low, high = int(mean_tokens * 0.8), int(mean_tokens * 1.2) + 1
    return torch.randint(low, high, (sequences,), generator=generator).tolist()


def _mask_path(q, k, v, cu):
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    class _Module:
        is_causal, training = True, False
        num_key_value_groups = q.shape[0] // k.shape[0]

    total = q.shape[1]
    segment = torch.repeat_interleave(torch.arange(len(cu) - 1), torch.diff(cu).long())
    mask = (segment[:, None] == segment[None, :]) & torch.ones(total, total, dtype=torch.bool).tril()
    return sdpa_attention_forward(_Module(), q[None], k[None], v[None], mask[None, None])[0]


def _loop(q, k, v, cu):
    groups = q.shape[0] // k.shape[0]
    k, v = k.repeat_interleave(groups, 0), v.repeat_interleave(groups, 0)
    bounds = cu.tolist()
    outs = [
        F.scaled_dot_product_attention(q[None, :, a:b], k[None, :, a:b], v[None, :, a:b], is_causal=True)[0]
        for a, b in zip(bounds[:-1], bounds[1:])
    ]
    return torch.cat(outs, dim=1)


def _batched(q, k, v, cu):
    from verl.ops.varlen_attention import varlen_causal_attention

    return varlen_causal_attention(q, k, v, cu, long_segments="sdpa")


def _time_ms(fn, lengths: list[int], heads: int, kv_heads: int, head_dim: int, repeats: int) -> float:
    total = sum(lengths)
    cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32)
    q = torch.randn(heads, total, head_dim, requires_grad=True)
    k, v = (torch.randn(kv_heads, total, head_dim, requires_grad=True) for _ in range(2))
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        fn(q, k, v, cu).sum().backward()
        best = min(best, time.perf_counter() - start)
    return best * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--kv-heads", type=int, default=2)
    parser.add_argument("--head-dim", type=int, default=64)
    args = parser.parse_args()
    repeats = 2 if args.quick else 5
    variants = {"mask": _mask_path, "loop": _loop, "batched": _batched}
    print(f"{'row':>22} {'tokens':>7} " + " ".join(f"{name + ' ms':>11} {'x mask':>7}" for name in variants))
    for sequences, mean_tokens in ((64, 53), (8, 425)):
        lengths = _row(sequences, mean_tokens)
        times = {
            name: _time_ms(fn, lengths, args.heads, args.kv_heads, args.head_dim, repeats)
            for name, fn in variants.items()
        }
        cells = " ".join(f"{t:>11.1f} {t / times['mask']:>7.3f}" for t in times.values())
        print(f"{f'{sequences} x ~{mean_tokens}':>22} {sum(lengths):>7} {cells}")


if __name__ == "__main__":
    main()
