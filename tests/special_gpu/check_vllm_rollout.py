"""GPU-only check of the vLLM rollout and the actor -> vLLM weight sync (not collected by pytest; not run in CI).

Hardware: 1 CUDA GPU (about 4 GiB free is plenty) with ``vllm`` >= 0.17 installed (Qwen3.5 support).
Run:      python tests/special_gpu/check_vllm_rollout.py [--kind qwen3_5_moe] [--gpu-memory-utilization 0.3]

What it does, with the tiny Qwen3.5-MoE of ``verl.models.tiny`` (GDN + gated attention layers, fused experts):
  1. saves the tiny HF model as a checkpoint and builds ``vLLMRollout`` on it with ``load_format=dummy`` (the engine
     starts with random weights, as in training);
  2. inside ``FSDPVLLMShardingManager`` (wake weights, MoE loader repair + sync, wake KV cache) generates for a few
     prompts and compares vLLM's log-prob of every sampled token with the HF model's teacher-forced log-prob;
  3. changes the actor's weights (as a training step would), syncs again, regenerates, compares again;
  4. checks that generation before a sync is refused and that sleep gives memory back.
Exit code 0 = all checks passed. Expect 1-3 minutes, most of it vLLM start-up.

Tolerance: vLLM computes in bf16 and the HF reference here too, so per-token log-probs of the same weights agree to a
few 1e-2 nats; a missed or misplaced weight (dummy values, a transposed expert) moves them by whole nats. The
thresholds (mean 0.05, max 0.5 nats) sit between the two.
"""

from __future__ import annotations

import argparse
import sys
import tempfile

import torch

MEAN_TOL, MAX_TOL = 0.05, 0.5


def _hf_log_probs(model: torch.nn.Module, batch: dict[str, torch.Tensor], prompt_len: int) -> torch.Tensor:
    """Teacher-forced log-probs (B, R) of ``batch["responses"]`` under ``model`` (no padding inside the prompts)."""
    with torch.no_grad():
        logits = model(
            input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], use_cache=False
        ).logits.float()
    log_probs = torch.log_softmax(logits[:, prompt_len - 1 : -1], dim=-1)
    return log_probs.gather(-1, batch["responses"].unsqueeze(-1)).squeeze(-1)


def _compare(tag: str, model: torch.nn.Module, out, prompt_len: int) -> bool:
    batch = {k: out.batch[k] for k in ("input_ids", "attention_mask", "responses", "rollout_log_probs")}
    batch = {k: v.to(next(model.parameters()).device) for k, v in batch.items()}
    mask = batch["attention_mask"][:, prompt_len:].bool()
    diff = (_hf_log_probs(model, batch, prompt_len) - batch["rollout_log_probs"]).abs()[mask]
    ok = diff.numel() > 0 and diff.mean().item() < MEAN_TOL and diff.max().item() < MAX_TOL
    print(f"[{tag}] {int(mask.sum())} tokens, |log p_vllm - log p_hf| mean {diff.mean():.4f} max {diff.max():.4f}: "
          f"{'OK' if ok else 'FAIL'}")  # fmt: skip
    return ok


def _prompts(vocab_size: int, eos: int, batch: int, prompt_len: int, seed: int):
    from verl.protocol import DataProto

    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(10, vocab_size - 10, (batch, prompt_len), generator=g)
    mask = torch.ones_like(ids)
    pos = torch.arange(prompt_len).expand(batch, -1).clone()
    meta = {"eos_token_id": eos, "pad_token_id": 0, "do_sample": True, "validate": False}
    return DataProto.from_dict({"input_ids": ids, "attention_mask": mask, "position_ids": pos}, meta_info=meta)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kind", default="qwen3_5_moe", help="verl.models.tiny kind (qwen3_5_moe, qwen3_5, ...)")
    parser.add_argument("--gpu-memory-utilization", type=float, default=0.3)
    args = parser.parse_args()

    from verl.models.tiny import build_tiny_model
    from verl.utils.device import get_device_name, get_platform
    from verl.workers.config import HFModelConfig, RolloutConfig
    from verl.workers.rollout.vllm_rollout import vLLMRollout
    from verl.workers.sharding_manager.vllm_weight_sync import FSDPVLLMShardingManager

    if get_device_name() != "cuda":
        print(f"needs a CUDA GPU (found device {get_device_name()!r})")
        return 2
    prompt_len, response_len, vocab = 8, 16, 512
    hf_model = build_tiny_model(args.kind, vocab_size=vocab, seed=0, dtype=torch.bfloat16)
    checkpoint = tempfile.mkdtemp(prefix="verl_vllm_check_")
    hf_model.save_pretrained(checkpoint)
    hf_model = hf_model.to(torch.device(get_device_name()))

    config = RolloutConfig(
        name="vllm", prompt_length=prompt_len, response_length=response_len, tensor_model_parallel_size=1,
        gpu_memory_utilization=args.gpu_memory_utilization, enforce_eager=True, load_format="dummy",
        free_cache_engine=True, calculate_log_probs=True, max_num_batched_tokens=1024, max_num_seqs=16,
    )  # fmt: skip
    rollout = vLLMRollout(config, HFModelConfig(path=checkpoint))
    results = []

    try:
        rollout.generate_sequences(_prompts(vocab, vocab - 1, 4, prompt_len, 0))
        print("[guard] generation before the first sync was NOT refused: FAIL")
        results.append(False)
    except RuntimeError as err:
        print(f"[guard] generation before the first sync refused ({err}): OK")
        results.append(True)

    free_asleep = get_platform().mem_get_info()[0]
    with FSDPVLLMShardingManager(hf_model, rollout) as manager:
        free_awake = get_platform().mem_get_info()[0]
        print(f"[sync 1] {manager.last_report.num_tensors} tensors, repair: {manager.last_report.repair.summary()}")
        first = rollout.generate_sequences(_prompts(vocab, vocab - 1, 8, prompt_len, 1))
    results.append(_compare("after sync 1", hf_model, first, prompt_len))
    print(f"[sleep] free device memory asleep {free_asleep / 2**30:.2f} GiB, awake {free_awake / 2**30:.2f} GiB")
    results.append(free_asleep > free_awake)

    with torch.no_grad():  # a "training step": every weight changes
        for param in hf_model.parameters():
            param.add_(torch.randn_like(param) * 0.02)
    with FSDPVLLMShardingManager(hf_model, rollout):
        second = rollout.generate_sequences(_prompts(vocab, vocab - 1, 8, prompt_len, 1))
    results.append(_compare("after sync 2", hf_model, second, prompt_len))

    print("ALL CHECKS PASSED" if all(results) else f"FAILED: {results}")
    return 0 if all(results) else 1


if __name__ == "__main__":
    sys.exit(main())
