"""Where the quickstart's update goes: torch.profiler over ``DataParallelPPOActor.update_policy`` in one process.

The quickstart's actor (its tiny Qwen3.5-MoE checkpoint, patched as the workers patch it, fp32, one thread) runs
the update of one quickstart-shaped batch (64 responses: prompts of 43-49 tokens, 4 response tokens) in four
layouts, alternating, so that load from other jobs moves all of them alike:

* ``packed`` / ``padded``: ``use_remove_padding`` True / False (the packed path runs one row of all the tokens);
* ``fsdp2`` / ``plain``: wrapped with FSDP2 on a 1-rank gloo group, as the worker does at world size 1, or not.

Prints the median update time of each layout (ratios to ``fsdp2 packed``, the quickstart's setting) and the top
operators of the profile of each. ``--old-log-prob`` also times the no-grad forward of step 3.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def quickstart_batch(tokenizer, seed: int = 0):
    """64 rows shaped like a quickstart step: 8 prompts x 8 samples, 4 response tokens (some shorter)."""
    from tensordict import TensorDict

    from verl.protocol import DataProto
    from verl.trainer.quickstart import make_rows

    g = torch.Generator().manual_seed(seed)
    prompts = [
        tokenizer.apply_chat_template(r["prompt"], add_generation_prompt=True, tokenize=False)
        for r in make_rows(8, seed, "train")
    ]
    ids = [tokenizer(p, add_special_tokens=False)["input_ids"] for p in prompts for _ in range(8)]
    p_len, r_len = max(map(len, ids)), 4
    input_ids = torch.full((64, p_len + r_len), tokenizer.pad_token_id)
    attention_mask = torch.zeros_like(input_ids)
    for i, row in enumerate(ids):
        n_resp = int(torch.randint(1, r_len + 1, (1,), generator=g))
        input_ids[i, p_len - len(row) : p_len] = torch.tensor(row)
        input_ids[i, p_len : p_len + n_resp] = torch.randint(4, len(tokenizer), (n_resp,), generator=g)
        attention_mask[i, p_len - len(row) : p_len + n_resp] = 1
    position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)
    response_mask = attention_mask[:, p_len:]
    td = TensorDict(
        {
            "input_ids": input_ids,
            "attention_mask": attention_mask,
            "position_ids": position_ids,
            "responses": input_ids[:, p_len:],
            "response_mask": response_mask,
            "advantages": torch.randn(64, r_len, generator=g) * response_mask,
            "old_log_probs": -torch.rand(64, r_len, generator=g) * response_mask,
        },
        batch_size=[64],
    )
    return DataProto(batch=td, meta_info={"temperature": 1.0, "micro_batch_size": 64, "use_dynamic_bsz": False})


def build_actor(model_dir: Path, fsdp: bool, packed: bool):
    from transformers import AutoModelForCausalLM

    from verl.models.transformers.patch_registry import apply_patches
    from verl.workers.actor.dp_actor import DataParallelPPOActor
    from verl.workers.config.actor import FSDPActorConfig

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    apply_patches(model, platform="cpu", report=False)
    if fsdp:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard

        mesh = init_device_mesh("cpu", (1,), mesh_dim_names=("fsdp",))
        for layer in model.model.layers:
            fully_shard(layer, mesh=mesh)
        fully_shard(model, mesh=mesh)
    config = FSDPActorConfig(
        strategy="fsdp2",
        ppo_mini_batch_size=64,
        ppo_micro_batch_size_per_gpu=64,
        use_torch_compile=False,
        use_remove_padding=packed,
    )
    optimizer = torch.optim.AdamW(model.parameters(), lr=2e-3, weight_decay=0.01)
    return DataParallelPPOActor(config, model, optimizer)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dir", type=Path, default=ROOT / ".quickstart")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--top", type=int, default=8)
    parser.add_argument("--old-log-prob", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(1)
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(29500 + os.getpid() % 1000))
    import torch.distributed as dist

    dist.init_process_group("gloo", rank=0, world_size=1)
    from transformers import AutoTokenizer

    from verl.trainer.quickstart import prepare

    paths = prepare(args.dir)
    tokenizer = AutoTokenizer.from_pretrained(paths["model"])
    batch = quickstart_batch(tokenizer)
    layouts = {(f, p): build_actor(paths["model"], f, p) for f in (True, False) for p in (True, False)}
    times: dict = {k: [] for k in layouts}
    fwd: dict = {k: [] for k in layouts}
    for _ in range(args.rounds):
        for key, actor in layouts.items():
            t0 = time.perf_counter()
            actor.update_policy(batch)
            times[key].append(time.perf_counter() - t0)
            if args.old_log_prob:
                t0 = time.perf_counter()
                actor.compute_log_prob(batch, calculate_entropy=True)
                fwd[key].append(time.perf_counter() - t0)
    base = statistics.median(times[(True, True)][1:])
    print(
        f"update of one quickstart batch (64 x {batch.batch['input_ids'].shape[1]} padded, "
        f"{int(batch.batch['attention_mask'].sum())} tokens), median of {args.rounds - 1} rounds after a warm-up"
    )
    for (f, p), values in times.items():
        med = statistics.median(values[1:])
        extra = f", old log-prob {statistics.median(fwd[(f, p)][1:]):.3f} s" if args.old_log_prob else ""
        print(f"  {'fsdp2' if f else 'plain'} {'packed' if p else 'padded'}: {med:.3f} s ({med / base:.2f}x){extra}")
    from torch.profiler import ProfilerActivity, profile

    for key, actor in layouts.items():
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            actor.update_policy(batch)
        print(f"\n== profile: {'fsdp2' if key[0] else 'plain'} {'packed' if key[1] else 'padded'} ==")
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=args.top, max_name_column_width=48))
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
