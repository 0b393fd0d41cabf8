"""Peak memory per rank of one packed fwd+bwd at long lengths: Ulysses SP 1 vs SP 2 (CPU, gloo).

    python benchmarks/long_sequence_memory.py            # 2,048 and 8,192 packed tokens: about a minute, ~3 GiB
    python benchmarks/long_sequence_memory.py --quick    # 512 and 2,048 tokens: seconds (smoke test)

Model: a tiny Qwen3.5-MoE widened to hidden 256 ([GDN, GDN, GDN, full attention], 4 attention heads / 2 KV heads,
4 GDN key / 8 value heads), fp32, sdpa attention. Batch: four sequences of uneven lengths packed into one row.
Step: ``forward_packed(return_hidden=True)`` then the fused LM-head log-probs (``fused_linear_log_probs_and_entropy``)
and ``backward`` of their sum: the shape of an actor update.

Measurement: every (SP, tokens) runs in a fresh Python process (SP 2: two gloo ranks spawned from it). Each rank
builds the model, runs a small warm-up step, notes its resident set (VmRSS), resets the kernel's high-water mark
(``/proc/self/clear_refs`` = 5) and runs the step; "peak extra" = VmHWM - VmRSS, the largest over the ranks. On the
CPU torch frees tensors back to the allocator, which returns large blocks to the OS, so RSS tracks live tensors.
Ratios are SP 2 / SP 1 at the same length, measured in the same run. What SP 2 should save: every token-local
activation (projections, MoE, norms) halves; attention and GDN hold the whole sequence for half of the heads, so
they halve too; the gathered final hidden state (T, H) and the block-diagonal mask are whole on every rank.
Measured here (2 cores, fp32): 2,048 tokens 0.57 -> 0.30 GiB (0.52), 8,192 tokens 2.48 -> 1.37 GiB (0.55).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

GIB = 1024**3


def _status_bytes(field: str) -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"{field} not found in /proc/self/status (Linux only).")


def _reset_peak() -> bool:
    try:
        with open("/proc/self/clear_refs", "w") as clear_refs:
            clear_refs.write("5")
        return True
    except OSError:
        return False


def _model():
    from verl.models.tiny import build_tiny_model
    from verl.models.transformers.patch_registry import apply_patches

    model = build_tiny_model(
        "qwen3_5_moe",
        vocab_size=4096,
        hidden_size=256,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=64,
        linear_num_key_heads=4,
        linear_num_value_heads=8,
        linear_key_head_dim=32,
        linear_value_head_dim=32,
        moe_intermediate_size=256,
        shared_expert_intermediate_size=256,
    )
    apply_patches(model, platform="cpu", report=False)
    return model


def _packed(tokens: int):
    import torch

    from verl.utils.packing import pack_padded_batch

    lengths = [tokens // 2 + 1, tokens // 4, tokens // 8, tokens - tokens // 2 - 1 - tokens // 4 - tokens // 8]
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(1, 4096, (len(lengths), max(lengths)), generator=generator)
    mask = (torch.arange(max(lengths))[None] < torch.tensor(lengths)[:, None]).long()
    return pack_padded_batch(ids, mask)


def _step(model, packed, group) -> None:
    from verl.models.transformers.packed_forward import forward_packed, get_lm_head
    from verl.utils.logprob import fused_linear_log_probs_and_entropy

    hidden = forward_packed(model, packed, return_hidden=True, ulysses_group=group)[0]
    labels = packed.input_ids[0].roll(-1)
    log_probs, _ = fused_linear_log_probs_and_entropy(hidden, get_lm_head(model).weight, labels, chunk_size=512)
    log_probs.sum().backward()
    model.zero_grad(set_to_none=True)


def _rank(rank: int, sp: int, tokens: int, out_dir: str, init_file: str) -> None:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    group = None
    if sp > 1:
        dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=sp)
        group = dist.new_group(list(range(sp)))
    model = _model()
    _step(model, _packed(64), group)  # warm-up: kernels, lazy imports, the SP attention wrapper
    before = _status_bytes("VmRSS")
    reset = _reset_peak()
    start = time.process_time()
    _step(model, _packed(tokens), group)
    result = {"peak_extra": _status_bytes("VmHWM") - before, "cpu_s": time.process_time() - start, "reset": reset}
    with open(os.path.join(out_dir, f"{rank}.json"), "w") as f:
        json.dump(result, f)
    if sp > 1:
        dist.destroy_process_group()


def worker(sp: int, tokens: int) -> dict:
    """One measurement in this (fresh) process: SP 1 inline, SP > 1 as spawned gloo ranks."""
    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory() as tmp:
        init_file = os.path.join(tmp, "init")
        if sp == 1:
            _rank(0, 1, tokens, tmp, init_file)
        else:
            mp.spawn(_rank, args=(sp, tokens, tmp, init_file), nprocs=sp, join=True)
        ranks = []
        for rank in range(sp):
            with open(os.path.join(tmp, f"{rank}.json")) as f:
                ranks.append(json.load(f))
    return {
        "peak_extra": max(r["peak_extra"] for r in ranks),
        "cpu_s": max(r["cpu_s"] for r in ranks),
        "reset": all(r["reset"] for r in ranks),
    }


def _measure(sp: int, tokens: int) -> dict:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, __file__, "--worker", str(sp), str(tokens)]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True, env=env).stdout
    return json.loads(out.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="short lengths (smoke test)")
    parser.add_argument("--worker", nargs=2, type=int, metavar=("SP", "TOKENS"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(worker(*args.worker)))
        return
    lengths = (512, 2048) if args.quick else (2048, 8192)
    print(f"{'tokens':>8} {'SP':>3} {'peak extra / rank':>18} {'ratio vs SP 1':>14} {'cpu s / rank':>13}")
    for tokens in lengths:
        base = None
        for sp in (1, 2):
            r = _measure(sp, tokens)
            base = base or r["peak_extra"]
            note = "" if r["reset"] else "  (peak not reset: includes start-up)"
            print(
                f"{tokens:>8} {sp:>3} {r['peak_extra'] / GIB:>14.3f} GiB {r['peak_extra'] / base:>14.2f} "
                f"{r['cpu_s']:>13.1f}{note}",
                flush=True,
            )


if __name__ == "__main__":
    main()
