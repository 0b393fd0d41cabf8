"""``verl.tools.memory_plan``'s prediction vs the measured peak of one actor update on the CPU (tiny Qwen3.5-MoE).

    python benchmarks/memory_plan_check.py                      # every case of CASES
    python benchmarks/memory_plan_check.py --tokens 4096        # shorter

Model: ``benchmarks/long_sequence_memory.py``'s ``wide`` tiny Qwen3.5-MoE (``verl.models.tiny`` widened to hidden
256, vocab 4096, fp32), its packed batch and its update (packed forward, fused chunked LM-head log-probs with chunk
512, backward, AdamW step), gradient checkpointing on or off, Ulysses SP 1 or 2 (gloo ranks).

Measurement (the same as that benchmark's): every case runs in a fresh process (SP 2: two spawned ranks). A rank
first runs a throw-away model once (kernels, lazy imports), frees it, notes its resident set (VmRSS) and resets the
kernel's high-water mark (``/proc/self/clear_refs`` = 5); then it builds the model and AdamW, runs one short update
(so the optimizer state exists, as in every step after the first) and one update of ``--tokens`` tokens.
"measured" = VmHWM - that VmRSS (largest over the ranks): parameters, gradients, AdamW state, activations and
log-prob chunks together, since on the CPU device and host memory are the same memory. The prediction is
``plan_memory`` for one device holding the whole model (no FSDP sharding: these ranks are SP ranks of one
unsharded model), so with parameter/optimizer offload the CPU can only check the sum of the device and host
columns, not the split: parameter/optimizer offload is not measured here. The activation-offload case
(``enable_activation_offloading``, what ``model.enable_activation_offload`` turns on) moves the checkpointed layer
inputs to host memory, which on the CPU is a copy into the same memory, so its total is compared likewise.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from long_sequence_memory import MODELS, _packed, _reset_peak, _status_bytes, _update  # noqa: E402

MIB = 1024**2
VOCAB = 4096
CHUNK = 512  # long_sequence_memory._update's log-prob chunk
CASES = [
    {"sp": 1, "ckpt": True},
    {"sp": 2, "ckpt": True},
    {"sp": 1, "ckpt": False},
    {"sp": 1, "ckpt": True, "offload": True},
]


def tiny_config():
    from verl.models.tiny import tiny_config as make

    return make("qwen3_5_moe", VOCAB, max_position_embeddings=262_144, **MODELS["wide"])


def _build(ckpt: bool):
    from verl.models.tiny import build_tiny_model
    from verl.models.transformers.patch_registry import apply_patches

    model = build_tiny_model("qwen3_5_moe", vocab_size=VOCAB, max_position_embeddings=262_144, **MODELS["wide"])
    apply_patches(model, platform="cpu", report=False)
    if ckpt:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    return model.train()


def _trim() -> None:
    """Give freed heap pages back to the kernel, so the baseline RSS holds no reusable garbage."""
    import ctypes

    gc.collect()
    with contextlib.suppress(OSError):
        ctypes.CDLL("libc.so.6").malloc_trim(0)


def _rank(rank: int, case: dict, out_dir: str, init_file: str) -> None:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    group = None
    if case["sp"] > 1:
        dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=case["sp"])
        group = dist.new_group(list(range(case["sp"])))
    warm = _build(case["ckpt"])
    _update(warm, torch.optim.AdamW(warm.parameters()), _packed(64), group)
    del warm
    _trim()
    before = _status_bytes("VmRSS")
    reset = _reset_peak()
    model = _build(case["ckpt"])
    if case.get("offload"):
        from verl.utils.activation_offload import enable_activation_offloading

        enable_activation_offloading(model, "fsdp2", enable_ckpt=case["ckpt"])
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5)
    _update(model, optimizer, _packed(64), group)  # creates the AdamW state
    _update(model, optimizer, _packed(case["tokens"]), group)
    result = {"measured": _status_bytes("VmHWM") - before, "reset": reset}
    with open(os.path.join(out_dir, f"{rank}.json"), "w") as f:
        json.dump(result, f)
    if group is not None:
        dist.destroy_process_group()


def worker(case: dict) -> dict:
    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory() as tmp:
        init_file = os.path.join(tmp, "init")
        if case["sp"] == 1:
            _rank(0, case, tmp, init_file)
        else:
            mp.spawn(_rank, args=(case, tmp, init_file), nprocs=case["sp"], join=True)
        ranks = [json.loads(Path(tmp, f"{r}.json").read_text()) for r in range(case["sp"])]
    return {"measured": max(r["measured"] for r in ranks), "reset": all(r["reset"] for r in ranks)}


def predict(case: dict) -> float:
    """``plan_memory``'s device peak plus what it puts on the host, for the case (one unsharded device, fp32, no
    vLLM): on the CPU both are the same memory."""
    from verl.tools.memory_plan import ModelShape, PlanInputs, plan_memory

    shape = ModelShape.from_config_dict(tiny_config().to_dict())
    inputs = PlanInputs(
        world_size=1,
        gpus_per_node=1,
        tokens_per_micro_batch=case["tokens"],
        sp=case["sp"],
        gradient_checkpointing=case["ckpt"],
        activation_offload=bool(case.get("offload")),
        logprob_chunk=CHUNK,
    )
    plan = plan_memory(shape, inputs)
    return plan.device_peak + sum(host for _, _, host in plan.rows)


def measure(case: dict) -> dict:
    """Measured (fresh process) and predicted bytes of one case, and the relative error of the prediction."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run(
        [sys.executable, __file__, "--worker", json.dumps(case)], capture_output=True, text=True, env=env
    )
    if done.returncode:
        raise RuntimeError(f"case {case} failed:\n{done.stderr[-3000:]}")
    result = json.loads(done.stdout.strip().splitlines()[-1])
    result["predicted"] = predict(case)
    result["error"] = result["predicted"] / result["measured"] - 1
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=8192)
    parser.add_argument("--worker", metavar="CASE_JSON", help=argparse.SUPPRESS)
    parser.add_argument("--cases", type=lambda v: [int(i) for i in v.split(",")], help="indices into CASES")
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(worker(json.loads(args.worker))))
        return
    print(
        f"{'tokens':>7} {'SP':>3} {'ckpt':>5} {'act. offload':>12} {'measured MiB':>13} {'predicted MiB':>14} {'error':>7}"
    )
    for case in [CASES[i] for i in args.cases] if args.cases else CASES:
        r = measure({**case, "tokens": args.tokens})
        note = "" if r["reset"] else "  (peak not reset)"
        print(
            f"{args.tokens:>7} {case['sp']:>3} {'on' if case['ckpt'] else 'off':>5}"
            f" {'on' if case.get('offload') else 'off':>12} {r['measured'] / MIB:>13.1f}"
            f" {r['predicted'] / MIB:>14.1f} {100 * r['error']:>6.1f}%{note}",
            flush=True,
        )


if __name__ == "__main__":
    main()
