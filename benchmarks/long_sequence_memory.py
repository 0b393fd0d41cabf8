"""Peak memory and time per token of one actor update at 8K -> 128K packed tokens, Ulysses SP 1 and SP 2 (CPU, gloo).

    python benchmarks/long_sequence_memory.py                        # 8K..32K, SP 1/2, offload off/on
    python benchmarks/long_sequence_memory.py --lengths 131072 --sp 2 --offload off   # one point (the 128K run)
    python benchmarks/long_sequence_memory.py --quick                # 2K and 4K (smoke test, seconds)

Model (``--model``): ``tiny``, the project's tiny Qwen3.5-MoE (``verl.models.tiny``: hidden 64, [GDN, GDN, GDN,
full attention], 4 attention heads / 2 KV heads of 16 dims, 2 GDN key / 4 value heads, 4 experts top-2), or
``wide``, the same widened to hidden 256 (heads of 64 dims, 4 / 8 GDN heads of 32, experts 256 wide); vocab 4096,
fp32, sdpa attention with the platform's patches (the packed
attention runs per ``cu_seqlens`` segment, ``verl.models.transformers.varlen_attention``), gradient checkpointing
on. Batch: four sequences of uneven lengths (T/2+1, T/4, T/8, rest) packed into one row.

Step (one actor update): ``forward_packed(return_hidden=True)``, the fused LM-head log-probs
(``fused_linear_log_probs_and_entropy``), ``backward`` of their mean, an AdamW step. With ``--offload on`` the
activations saved outside the checkpointed layers go through ``enable_activation_offloading``; on the CPU that
offload is a copy into other host memory, so it can only cost memory here (it exercises the mechanism at length).

Measurement: every point runs in a fresh Python process (SP 2: two gloo ranks spawned from it), each rank under an
address-space cap (``RLIMIT_AS``, ``--cap-gib`` per process; the machine is shared). Each rank builds the model,
runs a small warm-up update, notes its resident set (VmRSS), resets the kernel's high-water mark
(``/proc/self/clear_refs`` = 5) and runs the update; "peak / rank" = VmHWM - VmRSS, the largest over the ranks;
"MiB / token" = that / T; "ms / token" = the rank's CPU time / T (summed over its ``--threads`` threads). "x first" is
MiB / token relative to the first length (8K by default) of the same (SP, offload) configuration, measured in the
same run. A point that exceeds the cap prints "over cap".
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time

GIB = 1024**3
MIB = 1024**2


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


# The project's tiny Qwen3.5-MoE (verl.models.tiny) and the same widened to hidden 256 (the earlier SP benchmark).
_WIDE = dict(
    hidden_size=256,
    head_dim=64,
    linear_num_key_heads=4,
    linear_num_value_heads=8,
    linear_key_head_dim=32,
    linear_value_head_dim=32,
    moe_intermediate_size=256,
    shared_expert_intermediate_size=256,
)
MODELS = {"tiny": {}, "wide": _WIDE}


def _model(name: str):
    from verl.models.tiny import build_tiny_model
    from verl.models.transformers.patch_registry import apply_patches

    model = build_tiny_model("qwen3_5_moe", vocab_size=4096, max_position_embeddings=262_144, **MODELS[name])
    apply_patches(model, platform="cpu", report=False)
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    return model.train()


def _packed(tokens: int):
    import torch

    from verl.utils.packing import pack_padded_batch

    lengths = [tokens // 2 + 1, tokens // 4, tokens // 8, tokens - tokens // 2 - 1 - tokens // 4 - tokens // 8]
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(1, 4096, (len(lengths), max(lengths)), generator=generator)
    mask = (torch.arange(max(lengths))[None] < torch.tensor(lengths)[:, None]).long()
    return pack_padded_batch(ids, mask)


def _update(model, optimizer, packed, group) -> None:
    """One actor update: packed forward, fused LM-head log-probs, backward, optimizer step."""
    from verl.models.transformers.packed_forward import forward_packed, get_lm_head
    from verl.utils.logprob import fused_linear_log_probs_and_entropy

    hidden = forward_packed(model, packed, return_hidden=True, ulysses_group=group)[0]
    labels = packed.input_ids[0].roll(-1)
    log_probs, _ = fused_linear_log_probs_and_entropy(hidden, get_lm_head(model).weight, labels, chunk_size=512)
    (-log_probs.mean()).backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def _cap_address_space(cap_gib: float) -> None:
    cap = int(cap_gib * GIB)
    resource.setrlimit(resource.RLIMIT_AS, (cap, cap))


def _rank(rank: int, point: dict, out_dir: str, init_file: str) -> None:
    sp, tokens, offload = point["sp"], point["tokens"], point["offload"]
    import torch
    import torch.distributed as dist

    from verl.utils.activation_offload import enable_activation_offloading

    _cap_address_space(point["cap_gib"])
    torch.set_num_threads(point["threads"])
    group = None
    if sp > 1:
        dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=sp)
        group = dist.new_group(list(range(sp)))
    model = _model(point["model"])
    if offload:
        enable_activation_offloading(model, "fsdp2", enable_ckpt=True)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5)
    _update(model, optimizer, _packed(64), group)  # warm-up: kernels, lazy imports, optimizer state, SP wrapper
    before = _status_bytes("VmRSS")
    result = {"reset": _reset_peak()}
    start = time.process_time()
    try:
        _update(model, optimizer, _packed(tokens), group)
        result.update(peak_extra=_status_bytes("VmHWM") - before, cpu_s=time.process_time() - start)
    except (MemoryError, RuntimeError) as e:  # the address-space cap: "can't allocate memory" / DefaultCPUAllocator
        if "alloc" not in str(e).lower() and not isinstance(e, MemoryError):
            raise
        result.update(over_cap=True, error=f"{type(e).__name__}: {str(e)[:120]}")
    with open(os.path.join(out_dir, f"{rank}.json"), "w") as f:
        json.dump(result, f)
    if sp > 1 and "over_cap" not in result:
        dist.destroy_process_group()


def worker(point: dict) -> dict:
    """One measurement in this (fresh) process: SP 1 inline, SP > 1 as spawned gloo ranks."""
    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory() as tmp:
        init_file = os.path.join(tmp, "init")
        sp = point["sp"]
        if sp == 1:
            _rank(0, point, tmp, init_file)
        else:
            mp.spawn(_rank, args=(point, tmp, init_file), nprocs=sp, join=True)
        ranks = []
        for rank in range(sp):
            with open(os.path.join(tmp, f"{rank}.json")) as f:
                ranks.append(json.load(f))
    if any(r.get("over_cap") for r in ranks):
        return {"over_cap": True, "error": next(r["error"] for r in ranks if r.get("over_cap"))}
    return {
        "peak_extra": max(r["peak_extra"] for r in ranks),
        "cpu_s": max(r["cpu_s"] for r in ranks),
        "reset": all(r["reset"] for r in ranks),
    }


def _measure(point: dict) -> dict:
    env = {**os.environ, "OMP_NUM_THREADS": str(point["threads"])}
    cmd = [sys.executable, __file__, "--worker", json.dumps(point)]
    done = subprocess.run(cmd, capture_output=True, text=True, env=env)
    lines = done.stdout.strip().splitlines()
    if done.returncode or not lines:
        return {"over_cap": True, "error": (done.stderr.strip().splitlines() or ["exit " + str(done.returncode)])[-1]}
    return json.loads(lines[-1])


def _print_row(tokens: int, sp: int, offload: bool, r: dict, base_per_token: float | None) -> None:
    config = f"{tokens:>8} {sp:>3} {'on' if offload else 'off':>8}"
    if r.get("over_cap"):
        print(f"{config}   over cap ({r['error']})", flush=True)
        return
    per_token = r["peak_extra"] / tokens
    ratio = per_token / base_per_token if base_per_token else 1.0
    note = "" if r["reset"] else "  (peak not reset: includes start-up)"
    print(
        f"{config} {r['peak_extra'] / GIB:>11.2f} GiB {per_token / MIB:>11.4f} {1e3 * r['cpu_s'] / tokens:>11.2f}"
        f" {ratio:>7.2f}{note}",
        flush=True,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="2K and 4K tokens (smoke test)")
    parser.add_argument("--lengths", type=lambda v: [int(x) for x in v.split(",")], default=[8192, 16384, 32768])
    parser.add_argument("--sp", type=lambda v: [int(x) for x in v.split(",")], default=[1, 2])
    parser.add_argument("--offload", choices=["off", "on", "both"], default="both")
    parser.add_argument("--cap-gib", type=float, default=12.0, help="address-space cap per process (RLIMIT_AS)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads per rank (ms / token is CPU time)")
    parser.add_argument("--model", choices=sorted(MODELS), default="tiny")
    parser.add_argument("--worker", metavar="POINT_JSON", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(worker(json.loads(args.worker))))
        return
    lengths = [2048, 4096] if args.quick else args.lengths
    offloads = {"off": [False], "on": [True], "both": [False, True]}[args.offload]
    print(
        f"{'tokens':>8} {'SP':>3} {'offload':>8} {'peak / rank':>15} {'MiB / token':>11} {'ms / token':>11} {'x first':>7}"
    )
    for sp in args.sp:
        for offload in offloads:
            base = None
            for tokens in lengths:
                point = dict(sp=sp, tokens=tokens, offload=offload, model=args.model)
                r = _measure(dict(point, cap_gib=args.cap_gib, threads=args.threads))
                _print_row(tokens, sp, offload, r, base)
                if base is None and not r.get("over_cap"):
                    base = r["peak_extra"] / tokens


if __name__ == "__main__":
    main()
