"""Time of the varlen Gated DeltaNet core (causal conv + gated delta rule), forward + backward, on packed input.

    python benchmarks/gdn_varlen.py              # 8 sequences, 4096 tokens in total (about a minute on 1 core)
    python benchmarks/gdn_varlen.py --quick      # 4 sequences, 512 tokens (seconds)

Three ways to run the same tokens, all measured in this run with the same kernels (verl.ops, backend "auto": the
pure-torch chunked kernels on CPU, fla on CUDA/NPU when installed):

  (a) single   ONE unpacked sequence of the same total length T (the baseline: what a packed row costs when its
               boundaries are ignored, i.e. the HF/leaky cost)
  (b) packed   the sequences packed into one row, boundaries passed as cu_seqlens
  (c) separate each sequence in its own call, one after the other (the per-segment fix)

Each pass is conv1d (kernel 4, SiLU) over the q|k|v channels, then the chunked gated delta rule with l2-normalised
q/k and grouped value heads, then ``sum(o * probe).backward()``. The modes run round-robin (one of each per round) so that
load from other processes affects them alike; printed are the median and best times of ``--repeats`` rounds and
the median over rounds of the per-round ratio to (a). Target: packed <= 1.1x single.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.nn.functional as F

from verl.ops import causal_conv1d, chunk_gated_delta_rule
from verl.utils.packing import cu_seqlens_from_lengths

MODES = ("single", "packed", "separate")


def _lengths(num_seqs: int, total: int, seed: int) -> list[int]:
    """Random positive lengths summing to ``total`` (uneven, none divisible by the chunk size on purpose)."""
    gen = torch.Generator().manual_seed(seed)
    weights = torch.rand(num_seqs, generator=gen) + 0.2
    lengths = (weights / weights.sum() * total).floor().long().clamp(min=1)
    lengths[-1] += total - int(lengths.sum())
    return lengths.tolist()


def _inputs(total: int, heads: int, v_heads: int, dim: int, device: str, seed: int = 0) -> dict:
    gen = torch.Generator().manual_seed(seed)
    channels = 2 * heads * dim + v_heads * dim
    tensors = dict(
        x=torch.randn(1, total, channels, generator=gen),
        conv_w=torch.randn(channels, 4, generator=gen) * 0.5,
        a=torch.randn(1, total, v_heads, generator=gen),
        b=torch.randn(1, total, v_heads, generator=gen),
        probe=torch.randn(1, total, v_heads, dim, generator=gen),
    )
    out = {k: t.to(device).requires_grad_(k in ("x", "conv_w", "a", "b")) for k, t in tensors.items()}
    out.update(heads=heads, v_heads=v_heads, dim=dim)
    return out


def _gdn_core(inp: dict, start: int, end: int, cu_seqlens: torch.Tensor | None) -> torch.Tensor:
    """conv + gated delta rule on tokens [start, end) -> o (1, end-start, HV, dim)."""
    heads, v_heads, dim = inp["heads"], inp["v_heads"], inp["dim"]
    x = causal_conv1d(inp["x"][:, start:end], inp["conv_w"], activation="silu", cu_seqlens=cu_seqlens)
    q, k, v = x.split([heads * dim, heads * dim, v_heads * dim], dim=-1)
    n = end - start
    g = -F.softplus(inp["a"][:, start:end]) * 0.5
    beta = inp["b"][:, start:end].sigmoid()
    o, _ = chunk_gated_delta_rule(
        q.reshape(1, n, heads, dim),
        k.reshape(1, n, heads, dim),
        v.reshape(1, n, v_heads, dim),
        g,
        beta,
        use_qk_l2norm_in_kernel=True,
        cu_seqlens=cu_seqlens,
    )
    return o


def _step(inp: dict, mode: str, lengths: list[int]) -> None:
    total = sum(lengths)
    if mode == "single":
        outs = [_gdn_core(inp, 0, total, None)]
    elif mode == "packed":
        outs = [_gdn_core(inp, 0, total, cu_seqlens_from_lengths(torch.tensor(lengths)).to(inp["x"].device))]
    else:
        bounds = cu_seqlens_from_lengths(torch.tensor(lengths)).tolist()
        outs = [_gdn_core(inp, s, e, None) for s, e in zip(bounds[:-1], bounds[1:])]
    (torch.cat(outs, dim=1) * inp["probe"]).sum().backward()
    for key in ("x", "conv_w", "a", "b"):
        inp[key].grad = None


def _time_rounds(inp: dict, lengths: list[int], repeats: int, sync) -> dict[str, list[float]]:
    """Round-robin timing: every round times each mode once, so load from other processes hits all modes alike."""
    times = {mode: [] for mode in MODES}
    for mode in MODES:
        _step(inp, mode, lengths)  # warm-up
    for _ in range(repeats):
        for mode in MODES:
            sync()
            start = time.perf_counter()
            _step(inp, mode, lengths)
            sync()
            times[mode].append(time.perf_counter() - start)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()
    num_seqs, total = (4, 512) if args.quick else (8, 4096)
    lengths = _lengths(num_seqs, total, seed=0)
    inp = _inputs(total, heads=2, v_heads=4, dim=64, device=args.device)
    from verl.utils.device import get_torch_device

    sync = getattr(get_torch_device(), "synchronize", lambda: None) if args.device != "cpu" else (lambda: None)
    print(f"device {args.device}, threads {torch.get_num_threads()}, lengths {lengths} (T = {total})")
    print("GDN core: 2 q/k heads, 4 v heads, head dim 64, conv width 4, chunk 64; fwd+bwd")
    results = _time_rounds(inp, lengths, args.repeats, sync)
    labels = {
        "single": "(a) single sequence of length T",
        "packed": "(b) packed, cu_seqlens",
        "separate": "(c) each sequence separately",
    }
    print(f"{'variant':<34}{'median s':>10}{'best s':>10}{'ratio to (a)':>14}")
    for mode in MODES:
        # ratio: median over rounds of (this mode / single) in the same round
        ratio = statistics.median(t / b for t, b in zip(results[mode], results["single"]))
        times = results[mode]
        print(f"{labels[mode]:<34}{statistics.median(times):>10.4f}{min(times):>10.4f}{ratio:>13.2f}x")
    packed_ratio = statistics.median(t / b for t, b in zip(results["packed"], results["single"]))
    verdict = "meets" if packed_ratio <= 1.1 else "MISSES"
    print(f"packed / single = {packed_ratio:.2f}x ({verdict} the <= 1.1x target)")


if __name__ == "__main__":
    main()
