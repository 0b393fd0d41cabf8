"""Shared setup of the distributed FSDP tests: a tiny Qwen3.5-MoE checkpoint, PPO batches, actor-worker configs and
the single-process reference actor. Everything the spawned ranks need travels to them as picklable arguments
(configs, DataProto batches), so the rank functions in the test modules never import this file."""

from dataclasses import dataclass

import pytest
import torch
from omegaconf import DictConfig, OmegaConf
from tensordict import TensorDict

from verl.models.tiny import save_tiny_checkpoint
from verl.protocol import DataProto
from verl.utils.tokenizer import build_offline_tokenizer

ROWS, PROMPT_LEN, RESPONSE_LEN, LR, TEMPERATURE = 8, 6, 6, 1e-3, 1.0
FP32 = {"param_dtype": "fp32", "reduce_dtype": "fp32", "buffer_dtype": "fp32"}


def ppo_batch(step: int, vocab: int) -> DataProto:
    """8 rollouts of 6 prompt + 6 response tokens, rows with different left/right padding.

    old/ref log-probs sit near log(1/V) = the log-prob of a random-init model, so the PPO ratio stays inside the clip
    range and every valid token contributes a gradient; advantages ~ N(1, 0.5^2), so the pg_loss (about -1) is not
    a cancellation of positive and negative terms that a relative tolerance could not judge.
    """
    g = torch.Generator().manual_seed(1000 + step)
    seqlen = PROMPT_LEN + RESPONSE_LEN
    attention_mask = torch.ones(ROWS, seqlen, dtype=torch.long)
    for i in range(ROWS):
        attention_mask[i, : i % 3] = 0
        if i % 4:
            attention_mask[i, seqlen - i % 4 :] = 0
    input_ids = torch.randint(1, vocab, (ROWS, seqlen), generator=g).masked_fill(attention_mask == 0, 0)
    response_mask = attention_mask[:, PROMPT_LEN:].clone()
    near_uniform = -torch.log(torch.tensor(float(vocab)))
    td = TensorDict(
        {
            "input_ids": input_ids,
            "attention_mask": attention_mask,
            "position_ids": (attention_mask.cumsum(-1) - 1).clamp(min=0),
            "prompts": input_ids[:, :PROMPT_LEN],
            "responses": input_ids[:, PROMPT_LEN:],
            "response_mask": response_mask,
            "advantages": (1.0 + 0.5 * torch.randn(ROWS, RESPONSE_LEN, generator=g)) * response_mask,
            "old_log_probs": (near_uniform + 0.05 * torch.randn(ROWS, RESPONSE_LEN, generator=g)) * response_mask,
            "ref_log_prob": (near_uniform + 0.05 * torch.randn(ROWS, RESPONSE_LEN, generator=g)) * response_mask,
        },
        batch_size=[ROWS],
    )
    return DataProto(batch=td, meta_info={"temperature": TEMPERATURE})


def actor_keys() -> dict:
    """Actor keys shared by the worker config and the single-process reference: 8 responses per mini-batch (one
    optimizer step per update), 2 per micro-batch, KL loss on, grad clip 1."""
    return dict(
        ppo_mini_batch_size=ROWS,
        rollout_n=1,
        ppo_micro_batch_size_per_gpu=2,
        use_kl_loss=True,
        kl_loss_coef=0.1,
        use_torch_compile=False,
        grad_clip=1.0,
    )


@dataclass
class PPOSetup:
    """The tiny Qwen3.5-MoE checkpoint (``model_dir``) and builders around it."""

    model_dir: str
    vocab: int

    def batches(self, steps: int) -> list[DataProto]:
        return [ppo_batch(step, self.vocab) for step in range(steps)]

    def worker_config(self, strategy: str, fsdp_overrides: dict | None = None, **actor_overrides) -> DictConfig:
        """``actor_rollout_ref`` node of an actor worker: fp32 FSDP (unless overridden), AdamW lr 1e-3."""
        fsdp = {"mixed_precision": FP32, **(fsdp_overrides or {})}
        actor = {"strategy": strategy, "optim": {"lr": LR}, "fsdp_config": fsdp, **actor_keys(), **actor_overrides}
        return OmegaConf.create(
            {
                "model": {"path": self.model_dir, "enable_gradient_checkpointing": False},
                "actor": actor,
                "rollout": {"name": "hf", "log_prob_micro_batch_size_per_gpu": 2},
                "ref": {"strategy": strategy},
            }
        )

    def reference_actor(self):
        """One process, no FSDP: the HF model + platform patches, the core's AdamW, ``DataParallelPPOActor``.
        Returns ``(model, optimizer, actor)``."""
        from transformers import AutoModelForCausalLM

        from verl.models.transformers.patch_registry import apply_patches
        from verl.workers.actor.dp_actor import DataParallelPPOActor
        from verl.workers.config import FSDPActorConfig, FSDPOptimizerConfig
        from verl.workers.core.optimizer_step import build_optimizer

        model = AutoModelForCausalLM.from_pretrained(self.model_dir, dtype=torch.float32)
        apply_patches(model, platform="cpu", report=False)
        optim_config = FSDPOptimizerConfig(lr=LR)
        optimizer = build_optimizer(model.parameters(), optim_config)
        config = FSDPActorConfig(strategy="fsdp2", optim=optim_config, **actor_keys())
        return model, optimizer, DataParallelPPOActor(config, model, optimizer)

    @staticmethod
    def update(actor, batch: DataProto) -> tuple[float, float]:
        """One update of the reference actor: (pg_loss, grad_norm)."""
        metrics = actor.update_policy(batch)
        return metrics["actor/pg_loss"][0], metrics["actor/grad_norm"][0]

    @staticmethod
    def mean_over_ranks(per_rank_steps: list[list[tuple[float, float]]]) -> list[tuple[float, float]]:
        """Per-step (pg_loss, grad_norm) of the whole mini-batch from each rank's (pg_loss, grad_norm).

        pg_loss is a per-rank partial sum normalised by the GLOBAL token count times dp (core.micro_batching), so
        the mini-batch loss is the mean over ranks; the grad norm is global and must be identical on every rank.
        """
        out = []
        for step in zip(*per_rank_steps):
            losses, norms = zip(*step)
            assert len(set(norms)) == 1, f"ranks disagree on the grad norm: {norms}"
            out.append((sum(losses) / len(losses), norms[0]))
        return out


@pytest.fixture(scope="session")
def ppo_setup(tmp_path_factory) -> PPOSetup:
    tokenizer = build_offline_tokenizer([f"Q: {i} plus {i}? A: {2 * i}" for i in range(200)], vocab_size=300)
    model_dir = save_tiny_checkpoint("qwen3_5_moe", tokenizer, str(tmp_path_factory.mktemp("tiny_qwen3_5_moe")))
    return PPOSetup(model_dir=model_dir, vocab=len(tokenizer))
