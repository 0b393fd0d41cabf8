"""ActorRolloutRefWorker and CriticWorker (verl/workers/fsdp_workers.py) on 2 gloo ranks, configured from the real
ppo_trainer.yaml tree, with parameter and optimizer offload on."""

import os

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf
from tensordict import TensorDict
from transformers import Qwen2ForCausalLM

import verl.trainer.config as trainer_config_pkg
from tests.workers.conftest import tiny_model_dir
from verl.protocol import DataProto
from verl.utils.testing.dist import free_port, spawn

PROMPTS_PER_RANK, N, PROMPT_LEN, RESPONSE_LEN = 2, 2, 6, 5


def _config(model_path: str, strategy: str):
    overrides = [
        "actor_rollout_ref.rollout.name=hf",
        f"actor_rollout_ref.model.path={model_path}",
        f"critic.model.path={model_path}",
        f"actor_rollout_ref.actor.strategy={strategy}",
        f"critic.strategy={strategy}",
        f"actor_rollout_ref.rollout.n={N}",
        f"actor_rollout_ref.rollout.response_length={RESPONSE_LEN}",
        "actor_rollout_ref.actor.ppo_mini_batch_size=2",  # prompts: 2 x n=2 / 2 ranks = 2 responses per rank
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=1",
        "actor_rollout_ref.actor.use_kl_loss=true",
        "actor_rollout_ref.actor.optim.lr=1e-2",
        "actor_rollout_ref.actor.use_torch_compile=false",
        "actor_rollout_ref.actor.fsdp_config.dtype=float32",
        "actor_rollout_ref.actor.fsdp_config.param_offload=true",
        "actor_rollout_ref.actor.fsdp_config.optimizer_offload=true",
        "actor_rollout_ref.ref.fsdp_config.dtype=float32",
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=2",
        "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=2",
        "critic.ppo_mini_batch_size=2",
        "critic.ppo_micro_batch_size_per_gpu=1",
        "critic.model.fsdp_config.dtype=float32",
    ]
    config_dir = os.path.dirname(trainer_config_pkg.__file__)
    with initialize_config_dir(config_dir=config_dir, version_base=None):
        cfg = compose("ppo_trainer", overrides=overrides)
    OmegaConf.resolve(cfg)
    return cfg


def _prompts(rank: int, pad_id: int) -> DataProto:
    g = torch.Generator().manual_seed(rank)
    ids = torch.randint(5, 250, (PROMPTS_PER_RANK, PROMPT_LEN), generator=g)
    mask = torch.ones_like(ids)
    mask[1, :2] = 0
    ids = ids.masked_fill(mask == 0, pad_id)
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    td = TensorDict({"input_ids": ids, "attention_mask": mask, "position_ids": pos}, batch_size=[PROMPTS_PER_RANK])
    return DataProto(batch=td, meta_info={"do_sample": True}).repeat(N, interleave=True)


def _worker(rank, world_size, port, cfg, ckpt_dir, out):
    os.environ.update(
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        RANK=str(rank),
        WORLD_SIZE=str(world_size),
        LOCAL_RANK=str(rank),
        LOCAL_WORLD_SIZE=str(world_size),
    )
    torch.set_num_threads(1)
    from verl.workers.fsdp_workers import ActorRolloutRefWorker, CriticWorker

    try:
        worker = ActorRolloutRefWorker(cfg.actor_rollout_ref, role="actor_rollout_ref")
        worker.init_model()
        pad = worker.model_config.tokenizer.pad_token_id
        prompts = _prompts(rank, pad)
        gen = worker.generate_sequences(prompts)
        batch = DataProto(batch=gen.batch, meta_info={"temperature": 1.0})
        batch.batch["response_mask"] = batch.batch["attention_mask"][:, -RESPONSE_LEN:]
        old = worker.compute_log_prob(batch)
        ref = worker.compute_ref_log_prob(batch)
        g = torch.Generator().manual_seed(10 + rank)
        batch.batch["old_log_probs"] = old.batch["old_log_probs"]
        batch.batch["ref_log_prob"] = ref.batch["ref_log_prob"]
        batch.batch["advantages"] = torch.randn(batch.batch["responses"].shape, generator=g)
        metrics = worker.update_actor(batch).meta_info["metrics"]
        new = worker.compute_log_prob(batch).batch["old_log_probs"]
        worker.save_checkpoint(ckpt_dir, None, 1, None)

        resumed = ActorRolloutRefWorker(cfg.actor_rollout_ref, role="actor")
        resumed.init_model()
        resumed.load_checkpoint(ckpt_dir)
        reloaded = resumed.compute_log_prob(batch).batch["old_log_probs"]

        critic = CriticWorker(cfg.critic)
        critic.init_model()
        batch.batch["values"] = critic.compute_values(batch).batch["values"]
        batch.batch["returns"] = torch.randn(batch.batch["responses"].shape, generator=g)
        critic_metrics = critic.update_critic(batch).meta_info["metrics"]
        if rank == 0:
            out.update(
                gen=gen.batch,
                old=old.batch,
                ref=ref.batch,
                metrics=metrics,
                new=new,
                reloaded=reloaded,
                critic_metrics=critic_metrics,
                values=batch.batch["values"],
                mask=batch.batch["response_mask"],
            )
    finally:
        dist.destroy_process_group()


@pytest.mark.dist
@pytest.mark.parametrize("strategy", ["fsdp2", "fsdp"])
def test_workers_one_step_two_ranks(tmp_path, strategy):
    """Invariants on 2 ranks, param+optimizer offload on: generate returns the upstream keys with (B*n, P+R)
    shapes; before any update the actor's old log-probs equal the reference policy's (same weights, 1e-6);
    update_actor reports the upstream metric names (no entropy metric: entropy_coeff=0) and moves the policy;
    save -> load into a fresh worker reproduces the updated log-probs exactly; the critic returns values that
    are 0 outside the response and reports critic/vf_loss and critic/lr."""
    cfg = _config(tiny_model_dir(tmp_path), strategy)
    out = mp.Manager().dict()
    ckpt = str(tmp_path / "global_step_1" / "actor")
    spawn(_worker, args=(2, free_port(), cfg, ckpt, out), nprocs=2)
    rows = PROMPTS_PER_RANK * N
    gen = out["gen"]
    assert set(gen.keys()) >= {"prompts", "responses", "input_ids", "attention_mask", "position_ids"}
    assert gen["input_ids"].shape == (rows, PROMPT_LEN + RESPONSE_LEN) and gen["responses"].shape == (
        rows,
        RESPONSE_LEN,
    )
    mask = out["mask"].bool()
    torch.testing.assert_close(out["old"]["old_log_probs"], out["ref"]["ref_log_prob"], rtol=0, atol=1e-6)
    assert "entropys" in out["old"].keys()
    metrics = out["metrics"]
    assert {"actor/pg_loss", "actor/kl_loss", "actor/grad_norm", "actor/lr", "actor/pg_clipfrac"} <= set(metrics)
    assert "actor/entropy" not in metrics
    assert (out["new"] - out["old"]["old_log_probs"])[mask].abs().max() > 1e-4
    torch.testing.assert_close(out["reloaded"], out["new"], rtol=0, atol=0)
    assert torch.all(out["values"][~mask] == 0)
    assert {"critic/vf_loss", "critic/grad_norm", "critic/lr"} <= set(out["critic_metrics"])


@pytest.mark.dist
def test_actor_rollout_worker_through_ray(tmp_path):
    """Invariant: through a 2-worker Ray group (nd-mesh dispatch), init_model + generate_sequences +
    compute_log_prob return one row per prompt row in the driver's order, and the old log-probs equal the naive
    log-softmax of the HF checkpoint's logits at the rollout temperature (fp32: 1e-5)."""
    import ray

    from verl.single_controller.ray import RayClassWithInitArgs, RayResourcePool, RayWorkerGroup
    from verl.workers.fsdp_workers import ActorRolloutRefWorker

    model_path = tiny_model_dir(tmp_path)
    cfg = _config(model_path, "fsdp2")
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        pool = RayResourcePool(process_on_nodes=[2], use_gpu=True, max_colocate_count=1)
        cls = RayClassWithInitArgs(
            ray.remote(ActorRolloutRefWorker), config=cfg.actor_rollout_ref, role="actor_rollout"
        )
        group = RayWorkerGroup(pool, cls)
        group.init_model()
        prompts = DataProto.concat([_prompts(0, 0), _prompts(1, 0)])
        gen = group.generate_sequences(prompts)
        assert torch.equal(gen.batch["prompts"], prompts.batch["input_ids"])
        old = group.compute_log_prob(gen).batch["old_log_probs"]
    finally:
        ray.shutdown()
    model = Qwen2ForCausalLM.from_pretrained(model_path, dtype=torch.float32)
    td = gen.batch
    with torch.no_grad():
        logits = model(input_ids=td["input_ids"], attention_mask=td["attention_mask"], position_ids=td["position_ids"])
    logp = torch.log_softmax(logits.logits[:, -RESPONSE_LEN - 1 : -1].float(), -1)
    expected = logp.gather(-1, td["responses"].unsqueeze(-1)).squeeze(-1)
    mask = td["attention_mask"][:, -RESPONSE_LEN:].bool()
    torch.testing.assert_close(old[mask], expected[mask], rtol=0, atol=1e-5)


def test_workers_keep_the_global_config_and_plan_per_rank(tmp_path, monkeypatch):
    """Invariant (no field changes units): building the legacy workers leaves every batch-size key as configured
    (ppo_mini_batch_size counts prompts) and puts the per-rank numbers in their BatchPlans. One rank:
    2 prompts x rollout.n 2 / dp 1 = 4 responses per optimizer step, micro-batches of 1; critic 2 x 2 / 1 = 4."""
    from verl.workers.fsdp_workers import ActorRolloutRefWorker, CriticWorker

    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(key, raising=False)
    cfg = _config(tiny_model_dir(tmp_path), "fsdp2")
    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/pg", rank=0, world_size=1)
    try:
        actor = ActorRolloutRefWorker(cfg.actor_rollout_ref, role="actor_rollout_ref")
        critic = CriticWorker(cfg.critic)
    finally:
        dist.destroy_process_group()
    assert (actor.actor_config.ppo_mini_batch_size, actor.actor_config.ppo_micro_batch_size_per_gpu) == (2, 1)
    assert (actor.update_plan.mini_batch_size, actor.update_plan.micro_batch_size) == (4, 1)
    assert actor.rollout_config.log_prob_micro_batch_size_per_gpu == 2
    assert (critic.config.ppo_mini_batch_size, critic.update_plan.mini_batch_size) == (2, 4)
