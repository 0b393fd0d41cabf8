"""Legacy path = engine path: the proof that both worker paths run one core.

(docs/design.md "Two worker paths, one core".)

Two levels:

* actor level, one process: ``DataParallelPPOActor`` over an FSDP2 model built here by hand (``from_pretrained``,
  platform patches, the FSDP adapter, the core's optimizer) vs the engine-mode ``ActorRolloutRefWorker``
  (``trainer.use_legacy_worker_impl=disable``) building its ``FSDPEngine`` from the same checkpoint; a dense Qwen2
  and the hybrid GDN/attention Qwen3.5-MoE;
* worker level, 2 gloo ranks: ``fsdp_workers.ActorRolloutRefWorker``/``CriticWorker`` vs
  ``engine_workers.ActorRolloutRefWorker``/``CriticWorker`` configured from the same ``ppo_trainer.yaml`` tree, with
  parameter and optimizer offload on, driven through the same calls as the trainer.

fp32 on one thread per rank makes every kernel deterministic, so the paths agree to 1e-6 (observed: bitwise), far
below the ~1e-2 a different loss term, temperature or batch split produces (a 1.4% temperature change fails).
Not covered: Ulysses SP > 1 (the engines support it through the core, tested with the core), vLLM.
"""

import dataclasses
import os
import socket

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

import verl.trainer.config as trainer_config_pkg
from tests.workers.conftest import tiny_model_dir
from verl.models.tiny import build_tiny_model
from verl.models.transformers.patch_registry import apply_patches
from verl.protocol import DataProto
from verl.trainer.config.ppo_trainer import ActorRolloutRefConfig
from verl.utils.fsdp_utils import create_device_mesh, get_fsdp_adapter
from verl.utils.testing.dist import spawn
from verl.utils.tokenizer import build_offline_tokenizer
from verl.workers.actor.dp_actor import DataParallelPPOActor
from verl.workers.config import (
    FSDPActorConfig,
    FSDPEngineConfig,
    FSDPOptimizerConfig,
    FSDPRefConfig,
    HFModelConfig,
    RolloutConfig,
)
from verl.workers.core.optimizer_step import build_optimizer

_FP32 = {"param_dtype": torch.float32, "reduce_dtype": torch.float32, "buffer_dtype": torch.float32}
TEMPERATURE = 0.7


def _tokenizer():
    return build_offline_tokenizer([f"Q: {i} plus {i}? A: {2 * i}" for i in range(200)], vocab_size=300)


# ----------------------------------------------------------------------------------------------------------------
# actor level, one process
# ----------------------------------------------------------------------------------------------------------------


def _configs(model_dir: str, *, mini_batch_prompts: int, rollout_n: int) -> ActorRolloutRefConfig:
    """fp32 FSDP2 actor with KL + entropy loss terms, 2 responses per micro-batch, 3 per log-prob micro-batch."""
    fsdp = FSDPEngineConfig(mixed_precision={"param_dtype": "fp32", "reduce_dtype": "fp32", "buffer_dtype": "fp32"})
    actor = FSDPActorConfig(
        strategy="fsdp2",
        ppo_mini_batch_size=mini_batch_prompts,
        ppo_micro_batch_size_per_gpu=2,
        use_kl_loss=True,
        entropy_coeff=0.01,
        use_torch_compile=False,
        optim=FSDPOptimizerConfig(lr=1e-3),
        fsdp_config=fsdp,
    )
    rollout = RolloutConfig(name="hf", n=rollout_n, temperature=TEMPERATURE, log_prob_micro_batch_size_per_gpu=3)
    model = HFModelConfig(path=model_dir, enable_gradient_checkpointing=False)
    return ActorRolloutRefConfig(model=model, actor=actor, ref=FSDPRefConfig(strategy="fsdp2"), rollout=rollout)


def _legacy_actor(model_dir: str, config: ActorRolloutRefConfig, mini_batch: int) -> DataParallelPPOActor:
    """What a legacy worker builds: HF model + platform patches, FSDP2 through the adapter, the core's optimizer,
    and the actor config rescaled to ``mini_batch`` responses per rank."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    apply_patches(model, platform="cpu", report=False)
    wrapped = get_fsdp_adapter("fsdp2").wrap(
        model, mesh=create_device_mesh(dist.get_world_size(), -1), dtypes=_FP32, wrap_policy=None
    )
    optimizer = build_optimizer(wrapped.parameters(), config.actor.optim)
    return DataParallelPPOActor(dataclasses.replace(config.actor, ppo_mini_batch_size=mini_batch), wrapped, optimizer)


@pytest.fixture
def qwen3_5_moe_dir(tmp_path):
    path = tmp_path / "tiny_qwen3_5_moe"
    build_tiny_model("qwen3_5_moe", vocab_size=128).save_pretrained(path)
    _tokenizer().save_pretrained(path)
    return str(path)


@pytest.fixture
def qwen2_dir(tmp_path, make_model):
    path = tmp_path / "tiny_qwen2"
    make_model().save_pretrained(path)
    _tokenizer().save_pretrained(path)
    return str(path)


@pytest.mark.parametrize("model", ["qwen2", "qwen3_5_moe"])
def test_actor_level_log_probs_update_and_weights_match(model, qwen2_dir, qwen3_5_moe_dir, make_batch, tmp_path):
    """Invariant (legacy actor = engine worker, one process): the same 8 responses give the same old log-probs and
    entropies (3 rows per micro-batch), the same PPO losses (pg + KL + entropy bonus), grad norm and AdamW-updated
    weights after one update (4 prompts x 2 responses = one mini-batch, 2 rows per micro-batch), for a dense Qwen2
    and the hybrid GDN/attention Qwen3.5-MoE (packed forward, varlen GDN patch on both sides)."""
    from verl.workers.engine_workers import ActorRolloutRefWorker

    model_dir = qwen2_dir if model == "qwen2" else qwen3_5_moe_dir
    batch = make_batch(batch_size=8)
    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/pg", rank=0, world_size=1)
    try:
        config = _configs(model_dir, mini_batch_prompts=4, rollout_n=2)
        engine = ActorRolloutRefWorker(config, role="actor")
        engine.init_model()
        legacy = _legacy_actor(model_dir, config, mini_batch=8)

        engine_lp = engine.compute_log_prob(batch.select(deepcopy=True)).batch
        legacy_batch = batch.select(deepcopy=True)
        legacy_batch.meta_info.update(temperature=TEMPERATURE, micro_batch_size=3, use_dynamic_bsz=False)
        legacy_lp = legacy.compute_log_prob(legacy_batch, calculate_entropy=True)
        engine_metrics = engine.update_actor(batch.select(deepcopy=True)).meta_info["metrics"]
        legacy_metrics = legacy.update_policy(legacy_batch)
        adapter = get_fsdp_adapter("fsdp2")
        legacy_state = adapter.full_state_dict(legacy.actor_module)
        engine_state = adapter.full_state_dict(engine.actor.engine.module)
    finally:
        dist.destroy_process_group()
    torch.testing.assert_close(engine_lp["old_log_probs"], legacy_lp["log_probs"], rtol=0, atol=1e-6)
    torch.testing.assert_close(engine_lp["entropys"], legacy_lp["entropys"], rtol=0, atol=1e-6)
    assert len(engine_metrics["actor/pg_loss"]) == 1  # 8 responses = one mini-batch → one optimizer step
    for key in ("actor/pg_loss", "actor/kl_loss", "actor/entropy", "actor/pg_clipfrac", "actor/grad_norm"):
        assert engine_metrics[key] == pytest.approx(legacy_metrics[key], abs=1e-6, rel=0), key
    assert engine_metrics["actor/skipped_steps"] == legacy_metrics["actor/skipped_steps"] == [0.0]
    assert legacy_state.keys() == engine_state.keys()
    for name, value in legacy_state.items():
        torch.testing.assert_close(engine_state[name], value, rtol=0, atol=1e-6, msg=name)


# ----------------------------------------------------------------------------------------------------------------
# worker level, 2 ranks
# ----------------------------------------------------------------------------------------------------------------

PROMPTS_PER_RANK, N, PROMPT_LEN, RESPONSE_LEN = 2, 2, 6, 5


def _yaml_config(model_path: str, strategy: str, sp: int):
    overrides = [
        f"actor_rollout_ref.actor.ulysses_sequence_parallel_size={sp}",
        f"critic.ulysses_sequence_parallel_size={sp}",
        # the critic's padded forward at SP 1, its packed forward (required by SP) at SP 2
        f"critic.model.use_remove_padding={sp > 1}",
        "actor_rollout_ref.rollout.name=hf",
        f"actor_rollout_ref.model.path={model_path}",
        f"critic.model.path={model_path}",
        f"actor_rollout_ref.actor.strategy={strategy}",
        f"critic.strategy={strategy}",
        f"actor_rollout_ref.rollout.n={N}",
        f"actor_rollout_ref.rollout.response_length={RESPONSE_LEN}",
        "actor_rollout_ref.actor.ppo_mini_batch_size=2",  # 2 prompts x n=2 / 2 ranks = 2 responses per rank
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=1",
        "actor_rollout_ref.actor.use_kl_loss=true",
        "actor_rollout_ref.actor.entropy_coeff=0.01",
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
    with initialize_config_dir(config_dir=os.path.dirname(trainer_config_pkg.__file__), version_base=None):
        cfg = compose("ppo_trainer", overrides=overrides)
    OmegaConf.resolve(cfg)
    return cfg


def _prompts(rank: int, pad_id: int) -> DataProto:
    from tensordict import TensorDict

    g = torch.Generator().manual_seed(rank)
    ids = torch.randint(5, 250, (PROMPTS_PER_RANK, PROMPT_LEN), generator=g)
    mask = torch.ones_like(ids)
    mask[1, :2] = 0
    ids = ids.masked_fill(mask == 0, pad_id)
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    td = TensorDict({"input_ids": ids, "attention_mask": mask, "position_ids": pos}, batch_size=[PROMPTS_PER_RANK])
    return DataProto(batch=td, meta_info={"do_sample": True}).repeat(N, interleave=True)


def _one_step(module, cfg, rank: int) -> dict:
    """The trainer's calls on one rank: generate, old/ref log-probs, values, critic and actor updates, log-probs
    after the update. Sampling is seeded, so both paths draw the same responses from the same weights. ``rank`` is
    the data-parallel rank: the rows this rank holds."""
    actor = module.ActorRolloutRefWorker(cfg.actor_rollout_ref, role="actor_rollout_ref")
    actor.init_model()
    critic = module.CriticWorker(cfg.critic)
    critic.init_model()
    torch.manual_seed(100 + rank)
    gen = actor.generate_sequences(_prompts(rank, pad_id=0))
    batch = DataProto(batch=gen.batch, meta_info={"temperature": 1.0})
    # row 0's response stops 2 tokens early (as after an EOS): right padding inside the response window
    for key in ("attention_mask", "input_ids", "responses"):
        batch.batch[key][0, -2:] = 0
    batch.batch["response_mask"] = batch.batch["attention_mask"][:, -RESPONSE_LEN:]
    old = actor.compute_log_prob(batch).batch
    batch.batch["old_log_probs"] = old["old_log_probs"]
    batch.batch["ref_log_prob"] = actor.compute_ref_log_prob(batch).batch["ref_log_prob"]
    batch.batch["values"] = critic.compute_values(batch).batch["values"]
    g = torch.Generator().manual_seed(10 + rank)
    batch.batch["advantages"] = torch.randn(batch.batch["responses"].shape, generator=g)
    batch.batch["returns"] = torch.randn(batch.batch["responses"].shape, generator=g)
    critic_metrics = critic.update_critic(batch).meta_info["metrics"]
    actor_metrics = actor.update_actor(batch).meta_info["metrics"]
    return {
        "responses": gen.batch["responses"],
        "old": old["old_log_probs"],
        "entropys": old["entropys"],
        "ref": batch.batch["ref_log_prob"],
        "values": batch.batch["values"],
        "critic_metrics": critic_metrics,
        "actor_metrics": actor_metrics,
        "new": actor.compute_log_prob(batch).batch["old_log_probs"],
        "new_values": critic.compute_values(batch).batch["values"],
    }


def _assert_same_step(legacy: dict, engine: dict) -> None:
    assert torch.equal(engine["responses"], legacy["responses"])
    for key in ("old", "entropys", "ref", "values", "new", "new_values"):
        torch.testing.assert_close(engine[key], legacy[key], rtol=0, atol=1e-6, msg=key)
    for group in ("critic_metrics", "actor_metrics"):
        assert engine[group].keys() == legacy[group].keys(), group
        for key, value in legacy[group].items():
            if key.startswith("perf/"):  # memory of the process/host at that moment: not a result of the maths
                continue
            assert engine[group][key] == pytest.approx(value, abs=1e-6, rel=0), key


def _dist_worker(rank: int, world_size: int, port: int, cfg, sp: int, out) -> None:
    os.environ.update(
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        RANK=str(rank),
        WORLD_SIZE=str(world_size),
        LOCAL_RANK=str(rank),
        LOCAL_WORLD_SIZE=str(world_size),
    )
    torch.set_num_threads(1)
    from verl.workers import engine_workers, fsdp_workers

    try:
        # the sp ranks of one Ulysses group hold the same rows (dispatch by dp rank = rank // sp)
        legacy = _one_step(fsdp_workers, cfg, rank // sp)
        engine = _one_step(engine_workers, cfg, rank // sp)
        _assert_same_step(legacy, engine)
        assert (legacy["new"] - legacy["old"]).abs().max() > 1e-4  # the update moved the policy
        out[rank] = sorted(engine["actor_metrics"])
    finally:
        dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.dist
@pytest.mark.parametrize("sp", [1, 2])
def test_worker_level_one_trainer_step_matches_on_two_ranks(tmp_path, sp):
    """Invariant (fsdp_workers = engine_workers, FSDP2 on 2 gloo ranks, param + optimizer offload, Ulysses SP 1 =
    2 data-parallel ranks or SP 2 = one sequence-parallel group): the same trainer calls give the same sampled
    responses, old/ref log-probs, entropies, values, critic and actor metrics (same names and values, incl. actor/lr,
    actor/kl_loss, actor/entropy, critic/vf_loss) and the same log-probs and values after the updates, on every
    rank (1e-6)."""
    model_path = tiny_model_dir(tmp_path)
    out = mp.Manager().dict()
    cfg = _yaml_config(model_path, "fsdp2", sp)
    spawn(_dist_worker, args=(2, _free_port(), cfg, sp, out), nprocs=2)
    assert out[0] == out[1] and {"actor/pg_loss", "actor/kl_loss", "actor/entropy", "actor/lr"} <= set(out[0])
