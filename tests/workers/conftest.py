"""Shared builders for the worker tests: tiny models, rollout batches and actor configs."""

import pytest
import torch
from tensordict import TensorDict
from transformers import Qwen2Config, Qwen2ForCausalLM

from verl.protocol import DataProto
from verl.utils.tokenizer import build_offline_tokenizer

VOCAB = 128


def tiny_qwen2(seed: int = 0, *, tie: bool = False, layers: int = 2) -> Qwen2ForCausalLM:
    """A random tiny Qwen2 (hidden 32, 2 layers, vocab 128), fp32, sdpa."""
    cfg = Qwen2Config(
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=VOCAB,
        max_position_embeddings=128,
        tie_word_embeddings=tie,
        attn_implementation="sdpa",
        use_cache=False,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return Qwen2ForCausalLM(cfg).float()


def tiny_model_dir(root) -> str:
    """A tiny Qwen2 (hidden 32, 2 layers, seed 0) saved with its offline tokenizer under ``root / "tiny"``: the
    model the worker tests load by path. Returns the directory."""
    tokenizer = build_offline_tokenizer([f"Q: {i} plus {i}? A: {2 * i}" for i in range(200)], vocab_size=300)
    cfg = Qwen2Config(
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=len(tokenizer),
        max_position_embeddings=64,
        tie_word_embeddings=False,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    torch.manual_seed(0)
    path = str(root / "tiny")
    Qwen2ForCausalLM(cfg).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def offloaded_policy_config(model_path: str, response_length: int, strategy: str = "fsdp2", **actor_overrides):
    """``actor_rollout_ref`` of the single-rank worker tests: an fp32 actor with parameter and optimizer offload and
    full checkpoints (+ HF export), the HF rollout, an fp32 reference; ``actor_overrides`` replace actor keys."""
    from omegaconf import OmegaConf

    actor = {
        "strategy": strategy,
        "ppo_mini_batch_size": 2,
        "ppo_micro_batch_size_per_gpu": 2,
        "rollout_n": 1,
        "use_torch_compile": False,
        "optim": {"lr": 1e-2},
        "checkpoint": {
            "save_contents": ["model", "optimizer", "extra", "hf_model"],
            "load_contents": ["model", "optimizer", "extra"],
        },
        "fsdp_config": {"dtype": "float32", "param_offload": True, "optimizer_offload": True},
    }
    actor.update(actor_overrides)
    ref = {"strategy": actor["strategy"], "log_prob_micro_batch_size_per_gpu": 2, "fsdp_config": {"dtype": "float32"}}
    return OmegaConf.create(
        {
            "model": {"path": model_path, "override_config": {"attn_implementation": "eager"}},
            "actor": actor,
            "rollout": {"name": "hf", "response_length": response_length, "log_prob_micro_batch_size_per_gpu": 2},
            "ref": ref,
        }
    )


def two_prompts(pad_id: int) -> DataProto:
    """Two prompts of 5 tokens, the second left-padded by 2 (sampling on)."""
    ids = torch.randint(5, 250, (2, 5), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(ids)
    mask[1, :2] = 0
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    td = TensorDict({"input_ids": ids.masked_fill(mask == 0, pad_id), "attention_mask": mask, "position_ids": pos}, [2])
    return DataProto(batch=td, meta_info={"do_sample": True})


def rollout_batch(
    batch_size: int = 8, prompt_len: int = 6, response_len: int = 7, seed: int = 0, vocab: int = VOCAB
) -> DataProto:
    """Left-padded prompts + right-padded responses with the upstream keys and random PPO targets.

    Row i has ``i % 3`` prompt pads and ``i % 4`` response pads, so lengths differ across rows.
    """
    g = torch.Generator().manual_seed(seed)
    seqlen = prompt_len + response_len
    input_ids = torch.randint(1, vocab, (batch_size, seqlen), generator=g)
    attention_mask = torch.ones(batch_size, seqlen, dtype=torch.long)
    for i in range(batch_size):
        attention_mask[i, : i % 3] = 0
        if i % 4:
            attention_mask[i, seqlen - i % 4 :] = 0
    input_ids = input_ids.masked_fill(attention_mask == 0, 0)
    position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)
    response_mask = attention_mask[:, prompt_len:].clone()
    td = TensorDict(
        {
            "input_ids": input_ids,
            "attention_mask": attention_mask,
            "position_ids": position_ids,
            "prompts": input_ids[:, :prompt_len],
            "responses": input_ids[:, prompt_len:],
            "response_mask": response_mask,
            "advantages": torch.randn(batch_size, response_len, generator=g) * response_mask,
            "old_log_probs": (-torch.rand(batch_size, response_len, generator=g) * 5) * response_mask,
            "ref_log_prob": (-torch.rand(batch_size, response_len, generator=g) * 5) * response_mask,
            "returns": torch.randn(batch_size, response_len, generator=g) * response_mask,
            "values": torch.randn(batch_size, response_len, generator=g) * response_mask,
        },
        batch_size=[batch_size],
    )
    return DataProto(batch=td, meta_info={"temperature": 0.7})


def log_probs_of(model, batch, response_length: int, *, remove_padding=True, group=None, routing=None) -> dict:
    """``forward_log_probs`` at temperature 1 without entropy: the plain forward the router-replay tests compare."""
    from verl.workers.core.model_forward import LogProbOptions, forward_log_probs

    options = LogProbOptions(use_remove_padding=remove_padding)
    return forward_log_probs(
        model,
        batch,
        response_length=response_length,
        temperature=1.0,
        calculate_entropy=False,
        options=options,
        ulysses_group=group,
        routing=routing,
    )


@pytest.fixture
def make_model():
    return tiny_qwen2


@pytest.fixture
def make_batch():
    return rollout_batch
