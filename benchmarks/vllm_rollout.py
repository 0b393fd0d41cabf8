"""vLLM rollout (its CPU build) against the HF rollout on the same tiny model and batch: tokens/s and where time goes.

Run in the vLLM environment (``make venv-vllm``)::

    .venv-vllm/bin/python benchmarks/vllm_rollout.py            # 64 prompts x 32 new tokens, 5 rounds
    .venv-vllm/bin/python benchmarks/vllm_rollout.py --quick    # 8 prompts x 8 tokens, 2 rounds

Both rollouts generate the same number of tokens (``ignore_eos``: every response is full length) with the same
sampling settings from the tiny Qwen3.5-MoE (verl.models.tiny, profile "vllm"), one torch thread:

* HF: ``HFRollout`` on the fp32 actor module itself (what ``rollout.name=hf`` runs, as in the CPU quickstart);
* vLLM: ``vLLMRollout`` (bf16, eager), one step = the weight sync from the fp32 actor (``FSDPVLLMShardingManager``)
  plus ``generate_sequences``; the engine's start-up is reported separately (paid once per run).

Printed per phase: median wall seconds over the rounds and the ratio vLLM / HF; tokens/s of generation alone and of
the whole step. Timings on a shared machine are noisy: compare the ratios, not the seconds.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time

import torch


def _prompts(batch: int, prompt_len: int, vocab: int, eos: int, pad: int):
    from verl.protocol import DataProto

    g = torch.Generator().manual_seed(0)
    ids = torch.randint(4, vocab, (batch, prompt_len), generator=g)
    mask = torch.ones_like(ids)
    positions = torch.arange(prompt_len).expand(batch, -1).clone()
    meta = {"eos_token_id": eos, "pad_token_id": pad, "do_sample": True, "validate": False}
    return DataProto.from_dict({"input_ids": ids, "attention_mask": mask, "position_ids": positions}, meta_info=meta)


def _timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    batch, prompt_len, new_tokens, rounds = (8, 12, 8, 2) if args.quick else (64, 24, 32, 5)
    torch.set_num_threads(1)
    os.environ.setdefault("OMP_NUM_THREADS", "1")

    from transformers import AutoModelForCausalLM

    from verl.models.tiny import save_tiny_checkpoint
    from verl.trainer.quickstart import build_char_tokenizer
    from verl.utils.testing.vllm import build_vllm_rollout, cpu_engine_rollout_config
    from verl.workers.rollout.hf_rollout import HFRollout
    from verl.workers.sharding_manager.vllm_weight_sync import FSDPVLLMShardingManager

    path = tempfile.mkdtemp(prefix="verl_bench_vllm_")
    save_tiny_checkpoint("qwen3_5_moe", build_char_tokenizer(path), path, seed=0, profile="vllm")
    actor = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    cfg = actor.config
    prompts = _prompts(batch, prompt_len, cfg.vocab_size, cfg.eos_token_id, cfg.pad_token_id)
    settings = dict(response_length=new_tokens, ignore_eos=True, max_num_seqs=batch, calculate_log_probs=False)

    hf = HFRollout(actor, cpu_engine_rollout_config(name="hf", **settings))
    hf_gen = [_timed(lambda: hf.generate_sequences(prompts)) for _ in range(rounds)]

    start = time.perf_counter()
    rollout = build_vllm_rollout(path, load_format="dummy", **settings)
    build_s = time.perf_counter() - start
    sync, gen = [], []
    for _ in range(rounds):
        manager = FSDPVLLMShardingManager(actor, rollout)
        sync.append(_timed(manager.__enter__))
        gen.append(_timed(lambda: rollout.generate_sequences(prompts)))
        manager.__exit__(None, None, None)

    tokens = batch * new_tokens
    med = statistics.median
    step = [s + g for s, g in zip(sync, gen, strict=True)]
    print(f"tiny Qwen3.5-MoE, {batch} prompts x {new_tokens} new tokens ({tokens} tokens), {rounds} rounds, 1 thread")
    print(f"{'phase':<28}{'HF (s)':>10}{'vLLM (s)':>10}{'vLLM/HF':>10}")
    print(f"{'generation':<28}{med(hf_gen):>10.3f}{med(gen):>10.3f}{med(gen) / med(hf_gen):>10.2f}")
    print(f"{'weight sync':<28}{'-':>10}{med(sync):>10.3f}")
    print(f"{'step (sync + generation)':<28}{med(hf_gen):>10.3f}{med(step):>10.3f}{med(step) / med(hf_gen):>10.2f}")
    print(f"{'engine start-up (once)':<28}{'-':>10}{build_s:>10.1f}")
    rates = (
        f"HF {tokens / med(hf_gen):.0f}, vLLM generation {tokens / med(gen):.0f}, vLLM step {tokens / med(step):.0f}"
    )
    print(f"tokens/s: {rates}")


if __name__ == "__main__":
    main()
