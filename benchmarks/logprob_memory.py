"""Peak extra memory and time of per-token log-prob + entropy: naive vs chunked vs fused LM head (CPU).

    python benchmarks/logprob_memory.py            # vocab 248,320 (Qwen3.5), hidden 2,048: a few minutes, ~19 GiB
    python benchmarks/logprob_memory.py --quick    # vocab 32,768, hidden 64: seconds (smoke test)

Variants (all compute log p(label) AND the entropy, in fp32):
  (a)  naive          logits (T, V) in; upstream's default: `logprobs_from_logits` + `entropy_from_logits`
  (b)  chunked        logits (T, V) in; `log_probs_and_entropy_chunked(..., compute_entropy=True)`
  (a') naive+LM head  hidden (T, H) and weight (V, H) in; logits = hidden @ weight^T, then (a)
  (c)  fused          hidden and weight in; `fused_linear_log_probs_and_entropy(..., compute_entropy=True)`
Passes: "forward" under no_grad (old/ref log-prob recomputation) and "fwd+bwd" (loss = sum log p + sum entropy).

Measurement: every (pass, variant) runs in a fresh Python process. After the inputs are allocated and touched,
the process notes its resident set (VmRSS) and resets the kernel's high-water mark (`/proc/self/clear_refs` = 5;
if that is not allowed, the earlier peak is kept and reported). "peak extra" = VmHWM after the pass - VmRSS
before it: everything the pass allocated, including the gradients it returns. On the CPU, torch does not cache
freed blocks and glibc returns large (> 32 MiB) blocks to the OS, so RSS tracks live tensors. The fused rows also
show the extra memory without the (V, H) weight gradient, which exists in any training step as the LM head's
`.grad` (the ratio target for (c) is judged on that column). Ratios are against the naive variant with the same
inputs, measured in the same run: (b) / (a) and (c) / (a').

Time is the process CPU time of the pass (default one torch thread), which other jobs on a shared machine
disturb far less than wall time; wall time is printed too.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from dataclasses import asdict, dataclass

VARIANTS = ("naive", "chunked", "naive_lm_head", "fused")
LABELS = {
    "naive": "(a)  naive, logits in",
    "chunked": "(b)  chunked, logits in",
    "naive_lm_head": "(a') naive + LM head, hidden in",
    "fused": "(c)  fused LM head, hidden in",
}
BASELINE = {"naive": "naive", "chunked": "naive", "naive_lm_head": "naive_lm_head", "fused": "naive_lm_head"}
PASSES = ("forward", "fwd+bwd")
GIB = 1024**3


@dataclass
class BenchConfig:
    vocab: int = 248_320
    hidden: int = 2_048
    fwd_tokens: int = 4_096
    bwd_tokens: int = 1_024
    chunk_size: int = 512
    fused_chunk_size: int = 128
    threads: int = 1


QUICK = BenchConfig(vocab=32_768, hidden=64, fwd_tokens=512, bwd_tokens=256, chunk_size=32, fused_chunk_size=32)


# ----------------------------------------------------------------------------------------------------------------
# worker: one measurement in a fresh process
# ----------------------------------------------------------------------------------------------------------------


def _status_bytes(field: str) -> int:
    """VmRSS / VmHWM of this process in bytes (Linux)."""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"{field} not found in /proc/self/status (Linux only).")


def _reset_peak() -> bool:
    """Reset VmHWM to the current RSS; False when the kernel does not allow it."""
    try:
        with open("/proc/self/clear_refs", "w") as clear_refs:
            clear_refs.write("5")
        return True
    except OSError:
        return False


def _make_inputs(variant: str, tokens: int, cfg: BenchConfig, requires_grad: bool) -> dict:
    import torch

    generator = torch.Generator().manual_seed(0)
    labels = torch.randint(0, cfg.vocab, (tokens,), generator=generator)
    if variant in ("naive", "chunked"):
        logits = 2.0 * torch.randn(tokens, cfg.vocab, generator=generator)
        return {"logits": logits.requires_grad_(requires_grad), "labels": labels}
    hidden = torch.randn(tokens, cfg.hidden, generator=generator)
    weight = torch.randn(cfg.vocab, cfg.hidden, generator=generator) / cfg.hidden**0.5
    return {
        "hidden": hidden.requires_grad_(requires_grad),
        "weight": weight.requires_grad_(requires_grad),
        "labels": labels,
    }


def _log_probs_and_entropy(variant: str, inputs: dict, cfg: BenchConfig):
    from verl.utils import torch_functional as verl_F

    labels = inputs["labels"]
    if variant == "naive":
        return verl_F.logprobs_from_logits(inputs["logits"], labels), verl_F.entropy_from_logits(inputs["logits"])
    if variant == "chunked":
        return verl_F.log_probs_and_entropy_chunked(
            inputs["logits"], labels, chunk_size=cfg.chunk_size, compute_entropy=True
        )
    if variant == "naive_lm_head":
        logits = inputs["hidden"] @ inputs["weight"].t()
        return verl_F.logprobs_from_logits(logits, labels), verl_F.entropy_from_logits(logits)
    return verl_F.fused_linear_log_probs_and_entropy(
        inputs["hidden"], inputs["weight"], labels, chunk_size=cfg.fused_chunk_size, compute_entropy=True
    )


def _run_pass(variant: str, inputs: dict, cfg: BenchConfig, backward: bool) -> None:
    import torch

    if not backward:
        with torch.no_grad():
            _log_probs_and_entropy(variant, inputs, cfg)
        return
    log_probs, entropy = _log_probs_and_entropy(variant, inputs, cfg)
    (log_probs.sum() + entropy.sum()).backward()


def worker(pass_name: str, variant: str, cfg: BenchConfig) -> dict:
    """Measure one (pass, variant); returns bytes and seconds."""
    import torch

    torch.set_num_threads(cfg.threads)
    backward = pass_name == "fwd+bwd"
    tokens = cfg.bwd_tokens if backward else cfg.fwd_tokens
    _run_pass(variant, _make_inputs(variant, 4, BenchConfig(**{**asdict(cfg), "vocab": 64}), backward), cfg, backward)
    inputs = _make_inputs(variant, tokens, cfg, backward)
    baseline = _status_bytes("VmRSS")
    reset = _reset_peak()
    start_cpu, start_wall = time.process_time(), time.perf_counter()
    _run_pass(variant, inputs, cfg, backward)
    seconds, wall_seconds = time.process_time() - start_cpu, time.perf_counter() - start_wall
    peak = _status_bytes("VmHWM") if reset else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    weight = inputs.get("weight")
    weight_grad = (
        weight.grad.numel() * weight.grad.element_size() if weight is not None and weight.grad is not None else 0
    )
    return {
        "extra": peak - baseline,
        "weight_grad": weight_grad,
        "seconds": seconds,
        "wall_seconds": wall_seconds,
        "peak_reset": reset,
    }


# ----------------------------------------------------------------------------------------------------------------
# driver: one subprocess per measurement, then the table
# ----------------------------------------------------------------------------------------------------------------


def measure(pass_name: str, variant: str, cfg: BenchConfig) -> dict:
    cmd = [
        sys.executable,
        os.path.abspath(__file__),
        "--worker",
        pass_name,
        variant,
        "--config",
        json.dumps(asdict(cfg)),
    ]
    env = {**os.environ, "OMP_NUM_THREADS": str(cfg.threads)}
    done = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if done.returncode != 0:
        raise RuntimeError(f"{pass_name}/{variant} failed (rc {done.returncode}):\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def _fmt_bytes(n: float) -> str:
    return f"{n / GIB:8.3f} GiB" if abs(n) >= 0.1 * GIB else f"{n / 1024**2:8.1f} MiB"


def format_table(results: dict, cfg: BenchConfig) -> str:
    """results[(pass, variant)] -> a table of extra memory, time and ratios to the same-input naive variant."""
    lines = [
        f"log-prob + entropy, fp32, vocab {cfg.vocab:,}, hidden {cfg.hidden:,}, {cfg.threads} threads; "
        f"chunk {cfg.chunk_size} tokens (b), {cfg.fused_chunk_size} tokens (c)",
        f"{'pass':8} {'tokens':>6}  {'variant':33} {'peak extra':>12} {'x naive':>8} "
        f"{'excl. W grad':>13} {'x naive':>8} {'cpu s':>8} {'x naive':>8} {'wall s':>8}",
    ]
    for pass_name in PASSES:
        tokens = cfg.bwd_tokens if pass_name == "fwd+bwd" else cfg.fwd_tokens
        for variant in VARIANTS:
            row, base = results[(pass_name, variant)], results[(pass_name, BASELINE[variant])]
            no_w, base_no_w = row["extra"] - row["weight_grad"], base["extra"] - base["weight_grad"]
            hidden_in = variant in ("naive_lm_head", "fused")
            lines.append(
                f"{pass_name:8} {tokens:>6,}  {LABELS[variant]:33} {_fmt_bytes(row['extra']):>12} "
                f"{row['extra'] / base['extra']:8.3f} "
                f"{_fmt_bytes(no_w) if hidden_in else '-':>13} {no_w / base_no_w if hidden_in else float('nan'):8.3f} "
                f"{row['seconds']:8.2f} {row['seconds'] / base['seconds']:8.2f} {row['wall_seconds']:8.2f}"
            )
    return "\n".join(lines)


def target_summary(results: dict) -> list[tuple[str, float, float]]:
    """(description, measured ratio, target) for the three acceptance targets."""

    def ratio(pass_name, variant, key="extra", exclude_weight_grad=False):
        row, base = results[(pass_name, variant)], results[(pass_name, BASELINE[variant])]
        if exclude_weight_grad:
            return (row[key] - row["weight_grad"]) / (base[key] - base["weight_grad"])
        return row[key] / base[key]

    return [
        ("chunked forward memory / naive", ratio("forward", "chunked"), 0.15),
        (
            "fused fwd+bwd memory / naive+LM head (excl. W grad)",
            ratio("fwd+bwd", "fused", exclude_weight_grad=True),
            0.1,
        ),
        ("fused fwd+bwd memory / naive+LM head (incl. W grad)", ratio("fwd+bwd", "fused"), float("nan")),
        ("fused fwd+bwd time / naive+LM head", ratio("fwd+bwd", "fused", key="seconds"), 1.5),
        ("fused forward time / naive+LM head", ratio("forward", "fused", key="seconds"), 1.5),
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="small vocab/hidden sizes (smoke test)")
    parser.add_argument("--threads", type=int, default=None, help="torch threads per measurement (default 1)")
    parser.add_argument("--worker", nargs=2, metavar=("PASS", "VARIANT"), help=argparse.SUPPRESS)
    parser.add_argument("--config", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        print(json.dumps(worker(*args.worker, BenchConfig(**json.loads(args.config)))))
        return 0
    cfg = QUICK if args.quick else BenchConfig()
    if args.threads is not None:
        cfg.threads = args.threads
    results = {(p, v): measure(p, v, cfg) for p in PASSES for v in VARIANTS}
    if not all(r["peak_reset"] for r in results.values()):
        print("note: /proc/self/clear_refs not writable; peaks include input allocation transients")
    print(format_table(results, cfg))
    print()
    for description, measured, target in target_summary(results):
        verdict = "" if target != target else ("  meets target" if measured <= target else "  MISSES target")
        bound = "" if target != target else f" (target <= {target})"
        print(f"{description:55} {measured:6.3f}{bound}{verdict}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
