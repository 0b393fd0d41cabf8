"""GPU-only check of the vLLM rollout and the actor -> vLLM weight sync (not collected by pytest; not run in CI).

Hardware: 1 CUDA GPU (about 4 GiB free is plenty) with ``vllm`` >= 0.17 installed (Qwen3.5 support).
Run:      python tests/special_gpu/check_vllm_rollout.py [--kind qwen3_5_moe|qwen3_5] [--gpu-memory-utilization 0.3]
Time:     under 5 minutes on one GPU (three engine start-ups in eager mode, tiny model).

The same exactness the CPU tests prove on vLLM's CPU build (tests/workers/rollout/test_vllm_engine_sync.py), on the
CUDA platform, whose MoE backends shuffle or repack expert weights in their own ways. With the tiny Qwen3.5 of
``verl.models.tiny`` (profile "vllm"; fp32 actor, bf16 engine):

  1. fresh engine F from the checkpoint of the actor after a weight change (built first: engines of one process share
     vLLM's parallel state, see verl.utils.testing.vllm.release_vllm_rollout);
  2. engine E from the original checkpoint: pushing the original weights back (identity sync) leaves its prompt
     log-probs unchanged (<= 1e-6);
  3. E synced with the changed weights equals F (<= 1e-6); control: the change moved the log-probs by > 0.01;
  4. an engine that starts with dummy weights (training's load_format), synced inside FSDPVLLMShardingManager,
     samples tokens whose engine log-probs stay within bf16 rounding of the fp32 actor's (mean < 0.01 nats), and
     sleeping gives device memory back.
Exit code 0 = all checks passed; each check prints its numbers.

Tolerance: one process, same weights, same kernels, same batch shapes: bf16 CUDA kernels are run-to-run deterministic
for a fixed shape, so the two engines' log-probs are bitwise equal when the sync is exact; 1e-6 only absorbs float
formatting. A non-deterministic kernel on some GPU would show up here as a small non-zero difference (report it).
"""

from __future__ import annotations

import argparse
import sys
import tempfile

import torch

EXACT = 1e-6


def _check(results: list[bool], label: str, ok: bool, detail: str) -> None:
    print(f"[{label}] {detail}: {'OK' if ok else 'FAIL'}")
    results.append(ok)


def _prompts(vocab: int, batch: int, length: int, seed: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(4, vocab, (batch, length), generator=g).tolist()


def _changed_copy(model: torch.nn.Module, out_dir: str) -> torch.nn.Module:
    """The actor after a 'training step' (every weight moved by N(0, 0.02)), saved as an HF checkpoint."""
    import copy

    changed = copy.deepcopy(model)
    torch.manual_seed(1)
    with torch.no_grad():
        for param in changed.parameters():
            param.add_(torch.randn_like(param) * 0.02)
    changed.save_pretrained(out_dir)
    return changed


def _sampled_gap(rollout, actor: torch.nn.Module, vocab: int, eos: int, pad: int) -> float:
    from verl.protocol import DataProto

    ids = torch.tensor(_prompts(vocab, 8, 12, 2))
    meta = {"eos_token_id": eos, "pad_token_id": pad, "do_sample": True, "validate": False}
    batch = DataProto.from_dict(
        {"input_ids": ids, "attention_mask": torch.ones_like(ids), "position_ids": torch.arange(12).expand(8, -1)},
        meta_info=meta,
    )
    out = rollout.generate_sequences(batch)
    device = next(actor.parameters()).device
    input_ids, mask = out.batch["input_ids"].to(device), out.batch["attention_mask"].to(device)
    response_len = out.batch["responses"].shape[1]
    with torch.no_grad():
        logits = actor(input_ids=input_ids, attention_mask=mask, use_cache=False).logits.float()
    log_probs = torch.log_softmax(logits[:, -response_len - 1 : -1], -1)
    actor_lp = log_probs.gather(-1, out.batch["responses"].to(device)[..., None])[..., 0]
    response_mask = mask[:, -response_len:].bool()
    return (actor_lp - out.batch["rollout_log_probs"].to(device)).abs()[response_mask].mean().item()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kind", default="qwen3_5_moe", help="verl.models.tiny kind (qwen3_5_moe, qwen3_5)")
    parser.add_argument("--gpu-memory-utilization", type=float, default=0.3)
    args = parser.parse_args()

    from transformers import AutoModelForCausalLM

    from verl.models.tiny import save_tiny_checkpoint
    from verl.trainer.quickstart import build_char_tokenizer
    from verl.utils.device import get_device_name, get_platform
    from verl.utils.testing.vllm import build_vllm_rollout, prompt_log_probs, release_vllm_rollout
    from verl.workers.sharding_manager.vllm_weight_sync import FSDPVLLMShardingManager, iter_vllm_weights

    if get_device_name() != "cuda":
        print(f"needs a CUDA GPU (found device {get_device_name()!r})")
        return 2
    base_dir, changed_dir = tempfile.mkdtemp(prefix="verl_vllm_base_"), tempfile.mkdtemp(prefix="verl_vllm_new_")
    tokenizer = build_char_tokenizer(base_dir)
    save_tiny_checkpoint(args.kind, tokenizer, base_dir, seed=0, profile="vllm")
    actor = AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32).cuda()
    changed = _changed_copy(actor, changed_dir)
    vocab, results = actor.config.vocab_size, []
    prompts = _prompts(vocab, 4, 24, 0)
    engine_settings = dict(enforce_eager=True, gpu_memory_utilization=args.gpu_memory_utilization, engine_kwargs={})

    fresh = build_vllm_rollout(changed_dir, **engine_settings)
    expected = prompt_log_probs(fresh.llm, prompts)
    release_vllm_rollout(fresh)

    engine = build_vllm_rollout(base_dir, **engine_settings)
    base = prompt_log_probs(engine.llm, prompts)
    engine.load_weights(iter_vllm_weights(actor, dtype=torch.bfloat16))
    identity = (prompt_log_probs(engine.llm, prompts) - base).abs().max().item()
    _check(results, "identity sync", identity <= EXACT, f"max |dlogp| {identity:.3g} (<= {EXACT})")
    report = engine.load_weights(iter_vllm_weights(changed, dtype=torch.bfloat16))
    synced = prompt_log_probs(engine.llm, prompts)
    moved, diff = (synced - base).abs().max().item(), (synced - expected).abs().max().item()
    _check(results, "update sync", diff <= EXACT and moved > 0.01, f"synced vs fresh {diff:.3g}, moved {moved:.3g}")
    print(f"[update sync] {report.num_tensors} tensors, re-processed layers: {len(report.reload.processed)}")
    release_vllm_rollout(engine)

    rollout = build_vllm_rollout(base_dir, load_format="dummy", free_cache_engine=True, **engine_settings)
    free_asleep = get_platform().mem_get_info()[0]
    with FSDPVLLMShardingManager(actor, rollout):
        free_awake = get_platform().mem_get_info()[0]
        gap = _sampled_gap(rollout, actor, vocab, actor.config.eos_token_id, actor.config.pad_token_id)
    _check(results, "generation", gap < 0.01, f"mean |log p_vllm - log p_actor| of sampled tokens {gap:.4f}")
    memory = f"free {free_asleep / 2**30:.2f} GiB asleep, {free_awake / 2**30:.2f} GiB awake"
    _check(results, "sleep", free_asleep > free_awake, memory)
    release_vllm_rollout(rollout)

    print("ALL CHECKS PASSED" if all(results) else f"FAILED: {results}")
    return 0 if all(results) else 1


if __name__ == "__main__":
    sys.exit(main())
