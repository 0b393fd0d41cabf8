"""The long-sequence recipe's two profiles, scaled to the tiny Qwen3.5-MoE, train one actor update on the CPU.

``recipes/qwen3_5/run_qwen3_5_35b_a3b_grpo_longseq.sh`` is run in print mode (``VERL_PRINT_OVERRIDES=1``) for
``SEQ_PROFILE=20k`` and ``128k``; every ``actor_rollout_ref.{model,actor,ref}`` override it launches is kept
(remove padding, gradient checkpointing, activation offload as the profile sets it, parameter + optimizer offload,
dynamic batch size, chunked entropy with checkpointing, KL loss, ...). Only what cannot exist here is replaced,
each derived from the recipe's own values:

* the model: the tiny Qwen3.5-MoE (``verl.models.tiny``) instead of the 35B checkpoint, fp32;
* the lengths: prompt and response divided by ``SCALE`` (20k: 20,480 -> 2,048 tokens; 128k: 131,072 -> 8,192);
* Ulysses SP: 2 (two gloo ranks) instead of 4 / 8, and the token budget per device recomputed with the recipe's
  formula ``ceil(sequence x sequences per micro-batch / SP)`` (sequences per micro-batch read back from the
  recipe's budget);
* the device (cpu) and the rollout (not run: the batch is built as a rollout would return it).

Step on both SP ranks (the same batch: one SP group): ``init_model``, ``compute_log_prob``,
``compute_ref_log_prob``, ``update_actor``. Invariants: the update reports finite upstream metrics and moves the
policy; before it the actor's log-probs equal the reference's (same weights, 1e-6).
"""

from __future__ import annotations

import math
import os
import socket
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from tensordict import TensorDict

from tests.recipes.test_recipes_parse import RECIPE_DIR, compose_tree, printed_overrides
from verl.models.tiny import save_tiny_checkpoint
from verl.protocol import DataProto
from verl.utils.testing.dist import spawn
from verl.utils.tokenizer import build_offline_tokenizer

RECIPE = RECIPE_DIR / "run_qwen3_5_35b_a3b_grpo_longseq.sh"
SP = 2
SCALE = {"20k": 10, "128k": 16}
_KEPT = ("actor_rollout_ref.model.", "actor_rollout_ref.actor.", "actor_rollout_ref.ref.")
_REPLACED = {
    "actor_rollout_ref.model.path",
    "actor_rollout_ref.actor.ulysses_sequence_parallel_size",
    "actor_rollout_ref.actor.ppo_max_token_len_per_gpu",
    "actor_rollout_ref.actor.ppo_mini_batch_size",
}


def _recipe(profile: str, home: Path) -> dict[str, str]:
    """The recipe's launched overrides, ``key -> value``."""
    return dict(o.split("=", 1) for o in printed_overrides(RECIPE, home, SEQ_PROFILE=profile))


def _scaled_overrides(recipe: dict[str, str], profile: str, model_path: str) -> tuple[list[str], dict]:
    """The recipe's actor/ref/model overrides with the scaled lengths, SP and token budget (module docstring)."""
    prompt = int(recipe["data.max_prompt_length"]) // SCALE[profile]
    response = int(recipe["data.max_response_length"]) // SCALE[profile]
    recipe_sp = int(recipe["actor_rollout_ref.actor.ulysses_sequence_parallel_size"])
    recipe_seq = int(recipe["data.max_prompt_length"]) + int(recipe["data.max_response_length"])
    recipe_budget = int(recipe["actor_rollout_ref.actor.ppo_max_token_len_per_gpu"])
    seqs_per_micro_batch = recipe_budget * recipe_sp // recipe_seq  # the recipe's budget = ceil(seq x n / SP)
    budget = math.ceil((prompt + response) * seqs_per_micro_batch / SP)
    kept = [f"{k}={v}" for k, v in recipe.items() if k.startswith(_KEPT) and k not in _REPLACED]
    overrides = kept + [
        f"actor_rollout_ref.model.path={model_path}",
        f"actor_rollout_ref.actor.ulysses_sequence_parallel_size={SP}",
        f"actor_rollout_ref.actor.ppo_max_token_len_per_gpu={budget}",
        f"actor_rollout_ref.actor.ppo_mini_batch_size={seqs_per_micro_batch}",
        "actor_rollout_ref.rollout.name=hf",
        "actor_rollout_ref.rollout.n=1",
        f"actor_rollout_ref.rollout.response_length={response}",
        f"actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu={budget}",
        f"actor_rollout_ref.ref.log_prob_max_token_len_per_gpu={budget}",
        "actor_rollout_ref.actor.fsdp_config.dtype=float32",
        "actor_rollout_ref.ref.fsdp_config.dtype=float32",
        "trainer.device=cpu",
    ]
    shape = dict(prompt=prompt, response=response, rows=seqs_per_micro_batch)
    return overrides, shape


def _batch(shape: dict, vocab: int) -> DataProto:
    """What a rollout returns: left-padded prompts, right-padded responses (the second row 1/4 shorter)."""
    prompt, response, rows = shape["prompt"], shape["response"], shape["rows"]
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(5, vocab, (rows, prompt + response), generator=g)
    mask = torch.ones_like(ids)
    for row in range(1, rows):
        mask[row, : prompt // 4] = 0
        mask[row, prompt + response - response // 4 :] = 0
    ids = ids.masked_fill(mask == 0, 0)
    td = TensorDict(
        {
            "input_ids": ids,
            "attention_mask": mask,
            "position_ids": (mask.cumsum(-1) - 1).clamp(min=0),
            "prompts": ids[:, :prompt],
            "responses": ids[:, prompt:],
            "response_mask": mask[:, prompt:],
            "advantages": torch.randn(rows, response, generator=g),
        },
        batch_size=[rows],
    )
    return DataProto(batch=td, meta_info={"temperature": 1.0})


def _worker(rank, port, cfg, shape, vocab, out):
    os.environ.update(
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        RANK=str(rank),
        WORLD_SIZE=str(SP),
        LOCAL_RANK=str(rank),
        LOCAL_WORLD_SIZE=str(SP),
    )
    torch.set_num_threads(1)
    from verl.workers.fsdp_workers import ActorRolloutRefWorker

    try:
        worker = ActorRolloutRefWorker(cfg.actor_rollout_ref, role="actor_rollout_ref")
        worker.init_model()
        batch = _batch(shape, vocab)
        old = worker.compute_log_prob(batch).batch["old_log_probs"]
        ref = worker.compute_ref_log_prob(batch).batch["ref_log_prob"]
        batch.batch["old_log_probs"], batch.batch["ref_log_prob"] = old, ref
        metrics = worker.update_actor(batch).meta_info["metrics"]
        new = worker.compute_log_prob(batch).batch["old_log_probs"]
        if rank == 0:
            out.update(old=old, ref=ref, new=new, metrics=metrics, mask=batch.batch["response_mask"])
    finally:
        dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
@pytest.mark.dist
@pytest.mark.parametrize("profile", ["20k", "128k"])
def test_longseq_profile_one_actor_update(tmp_path: Path, profile: str):
    """One actor update of the scaled profile (module docstring) on 2 SP ranks."""
    recipe = _recipe(profile, tmp_path)
    tokenizer = build_offline_tokenizer([f"step {i} of {i + 1}" for i in range(200)], vocab_size=300)
    model_path = save_tiny_checkpoint("qwen3_5_moe", tokenizer, str(tmp_path / "tiny"))
    overrides, shape = _scaled_overrides(recipe, profile, model_path)
    cfg = compose_tree(overrides)
    assert cfg.actor_rollout_ref.model.enable_activation_offload == (profile == "128k")  # as the recipe sets it
    assert cfg.actor_rollout_ref.actor.fsdp_config.param_offload and cfg.actor_rollout_ref.model.use_remove_padding
    out = mp.Manager().dict()
    spawn(_worker, args=(_free_port(), cfg, shape, len(tokenizer), out), nprocs=SP)
    mask = out["mask"].bool()
    torch.testing.assert_close(out["old"][mask], out["ref"][mask], rtol=0, atol=1e-6)
    metrics = out["metrics"]
    assert {"actor/pg_loss", "actor/kl_loss", "actor/grad_norm"} <= set(metrics)
    assert all(math.isfinite(v) for k in ("actor/pg_loss", "actor/grad_norm") for v in _values(metrics[k]))
    assert (out["new"] - out["old"])[mask].abs().max() > 1e-6  # the update moved the policy


def _values(metric) -> list[float]:
    return [float(v) for v in (metric if isinstance(metric, list | tuple) else [metric])]
