"""Engine-mode workers (verl/workers/engine_workers.py): offload on a device, checkpoints, TrainingWorker API
through a worker group, and the errors a user can trigger. Equality with the legacy workers is in
test_legacy_vs_engine.py."""

import functools
import os
import socket

import pytest
import torch
import torch.distributed as dist
from omegaconf import OmegaConf
from transformers import Qwen2ForCausalLM

from tests.workers.conftest import offloaded_policy_config, tiny_model_dir, two_prompts
from verl.protocol import DataProto

RESPONSE_LEN = 4


def _config(model_path: str, **actor_overrides):
    return offloaded_policy_config(model_path, RESPONSE_LEN, **actor_overrides)


@pytest.fixture
def single_rank_env(monkeypatch):
    """The env a worker group gives rank 0 of 1; the process group is torn down afterwards."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    for key, value in dict(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", LOCAL_WORLD_SIZE="1").items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(port))
    yield
    if dist.is_initialized():
        dist.destroy_process_group()


def _devices(tensors) -> set[str]:
    return {t.device.type for t in tensors}


def _generated_batch(worker) -> DataProto:
    gen = worker.generate_sequences(two_prompts(worker.config.model.tokenizer.pad_token_id))
    batch = DataProto(batch=gen.batch, meta_info={"temperature": 1.0})
    batch.batch["response_mask"] = batch.batch["attention_mask"][:, -RESPONSE_LEN:]
    return batch


@pytest.mark.usefixtures("npu_sim", "single_rank_env")
def test_offloaded_engine_actor_phases_and_checkpoint_on_simulated_npu(tmp_path):
    """Invariants (field-report item 10, engine path) on the simulated NPU with param + optimizer offload: between
    phases the engine's parameters and AdamW state are on the CPU; generate, log-prob, update, save (with HF export)
    and load each run with every tensor on the npu (a CPU/NPU mix raises there, as on hardware); a fresh engine
    worker that loads the checkpoint reproduces the updated log-probs exactly, and the HF export gives them too."""
    from verl.utils.device import get_device_name
    from verl.workers.engine_workers import ActorRolloutRefWorker

    assert get_device_name() == "npu"
    path = tiny_model_dir(tmp_path)
    worker = ActorRolloutRefWorker(_config(path), role="actor_rollout")
    worker.init_model()
    engine = worker.actor.engine
    assert engine.is_param_offload_enabled and _devices(engine.module.parameters()) == {"cpu"}
    batch = _generated_batch(worker)
    batch.batch["old_log_probs"] = worker.compute_log_prob(batch).batch["old_log_probs"]
    batch.batch["advantages"] = torch.randn(batch.batch["responses"].shape, generator=torch.Generator().manual_seed(1))
    metrics = worker.update_actor(batch).meta_info["metrics"]
    assert metrics["actor/skipped_steps"] == [0.0] and metrics["actor/lr"] == pytest.approx(1e-2)
    states = [v for s in engine.optimizer.state.values() for v in s.values() if isinstance(v, torch.Tensor)]
    assert states and _devices(t for t in states if t.dim() > 0) == {"cpu"}
    assert _devices(engine.module.parameters()) == {"cpu"}
    updated = worker.compute_log_prob(batch).batch["old_log_probs"]
    ckpt = str(tmp_path / "global_step_1" / "actor")
    worker.save_checkpoint(ckpt, None, 1, None)
    assert os.path.exists(os.path.join(ckpt, "huggingface", "model.safetensors"))

    resumed = ActorRolloutRefWorker(_config(path), role="actor")
    resumed.init_model()
    resumed.load_checkpoint(ckpt)
    torch.testing.assert_close(resumed.compute_log_prob(batch).batch["old_log_probs"], updated, rtol=0, atol=0)
    exported = Qwen2ForCausalLM.from_pretrained(os.path.join(ckpt, "huggingface"), dtype=torch.float32)
    td = batch.batch.to("cpu")
    with torch.no_grad():
        logits = exported(
            input_ids=td["input_ids"], attention_mask=td["attention_mask"], position_ids=td["position_ids"]
        )
    logp = torch.log_softmax(logits.logits[:, -RESPONSE_LEN - 1 : -1], -1)
    expected = logp.gather(-1, td["responses"].unsqueeze(-1)).squeeze(-1)
    mask = td["response_mask"].bool()
    torch.testing.assert_close(updated.cpu()[mask], expected[mask], rtol=0, atol=1e-5)


def _training_worker_config(path: str):
    from verl.workers.config import CheckpointConfig, FSDPEngineConfig, FSDPOptimizerConfig, HFModelConfig
    from verl.workers.engine_workers import TrainingWorkerConfig

    fsdp = FSDPEngineConfig(strategy="fsdp2", dtype="float32")
    model = HFModelConfig(path=path, enable_gradient_checkpointing=False)
    return TrainingWorkerConfig("language_model", model, fsdp, FSDPOptimizerConfig(lr=1e-2), CheckpointConfig())


def test_training_worker_api_through_a_worker_group(tmp_path, make_batch):
    """Invariants of upstream's TrainingWorker API through a (local) worker group: training before set_loss_fn
    raises; train_mini_batch takes its per-rank sizes from meta_info (8 rows / mini-batch 4 = 2 optimizer steps,
    each with a finite grad norm, then one lr-schedule step); infer_batch returns (B, R) log-probs and, on request,
    entropies, and they change after training."""
    from verl.single_controller.base.worker_group import ClassWithInitArgs
    from verl.single_controller.local import LocalWorkerGroup
    from verl.workers.config import FSDPActorConfig
    from verl.workers.engine.losses import ppo_loss
    from verl.workers.engine_workers import TrainingWorker

    path = tiny_model_dir(tmp_path)
    group = LocalWorkerGroup(ClassWithInitArgs(TrainingWorker, _training_worker_config(path)), world_size=1)
    try:
        group.reset()
        batch = make_batch(batch_size=8)
        batch.meta_info.update(micro_batch_size=2, calculate_entropy=True)
        before = group.infer_batch(batch)
        assert before.batch["log_probs"].shape == before.batch["entropys"].shape == (8, 7)
        batch.meta_info.update(mini_batch_size=4, epochs=1)
        with pytest.raises(RuntimeError, match="set_loss_fn"):
            group.train_mini_batch(batch)
        actor_config = FSDPActorConfig(strategy="fsdp2", ppo_micro_batch_size_per_gpu=2, use_torch_compile=False)
        group.set_loss_fn(functools.partial(ppo_loss, actor_config))
        # the group collects each rank's metrics into a list: [rank 0's per-mini-batch values]
        metrics = {k: v[0] for k, v in group.train_mini_batch(batch).meta_info["metrics"].items()}
        assert len(metrics["grad_norm"]) == 2 and all(torch.isfinite(torch.tensor(metrics["grad_norm"])))
        assert metrics["lr"] == [pytest.approx(1e-2)] and len(metrics["actor/pg_loss"]) == 2
        after = group.infer_batch(batch)
        assert (after.batch["log_probs"] - before.batch["log_probs"]).abs().max() > 1e-4
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


@pytest.mark.usefixtures("single_rank_env")
def test_user_errors_name_the_fix(tmp_path, make_batch):
    """Invariants: an unknown role, a method of a role the worker does not have, update_actor without the rollout
    temperature, and a critic asked for an HF export each raise an exception that says what to change."""
    from verl.workers.engine_workers import ActorRolloutRefWorker, CriticWorker

    path = tiny_model_dir(tmp_path)
    with pytest.raises(ValueError, match="role='critic' is not one of"):
        ActorRolloutRefWorker(_config(path), role="critic")
    ref_only = ActorRolloutRefWorker(_config(path), role="ref")
    ref_only.init_model()
    batch = make_batch(batch_size=4)
    assert ref_only.compute_ref_log_prob(batch).batch["ref_log_prob"].shape == (4, 7)
    with pytest.raises(RuntimeError, match="compute_log_prob needs a worker with the actor role"):
        ref_only.compute_log_prob(batch)
    with pytest.raises(RuntimeError, match="generate_sequences needs a worker with the rollout role"):
        ref_only.generate_sequences(batch)
    actor = ActorRolloutRefWorker(_config(path, ppo_mini_batch_size=4), role="actor")
    actor.init_model()
    batch.meta_info.pop("temperature")
    with pytest.raises(ValueError, match=r"meta_info\['temperature'\] is missing"):
        actor.update_actor(batch)
    critic = OmegaConf.create({"model": {"path": path}, "checkpoint": {"save_contents": ["model", "hf_model"]}})
    with pytest.raises(ValueError, match="remove 'hf_model'"):
        CriticWorker(critic)


@pytest.mark.dist
def test_engine_actor_rollout_worker_through_ray(tmp_path):
    """Invariant: the engine worker plugs into a 2-worker Ray group exactly like the legacy one (n-d mesh
    dispatch): init_model + generate_sequences + compute_log_prob return one row per prompt row in the driver's
    order, and the old log-probs equal the naive log-softmax of the checkpoint's logits at temperature 1 (fp32:
    1e-5)."""
    import ray

    from verl.single_controller.ray import RayClassWithInitArgs, RayResourcePool, RayWorkerGroup
    from verl.workers.engine_workers import ActorRolloutRefWorker

    path = tiny_model_dir(tmp_path)
    config = _config(path, ppo_mini_batch_size=4)
    config.actor.fsdp_config.param_offload = False
    prompts = DataProto.concat([two_prompts(0), two_prompts(0)])
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        pool = RayResourcePool(process_on_nodes=[2], use_gpu=True, max_colocate_count=1)
        group = RayWorkerGroup(pool, RayClassWithInitArgs(ray.remote(ActorRolloutRefWorker), config, "actor_rollout"))
        group.init_model()
        gen = group.generate_sequences(prompts)
        assert torch.equal(gen.batch["prompts"], prompts.batch["input_ids"])
        old = group.compute_log_prob(gen).batch["old_log_probs"]
    finally:
        ray.shutdown()
    model = Qwen2ForCausalLM.from_pretrained(path, dtype=torch.float32)
    td = gen.batch
    with torch.no_grad():
        logits = model(input_ids=td["input_ids"], attention_mask=td["attention_mask"], position_ids=td["position_ids"])
    logp = torch.log_softmax(logits.logits[:, -RESPONSE_LEN - 1 : -1].float(), -1)
    expected = logp.gather(-1, td["responses"].unsqueeze(-1)).squeeze(-1)
    mask = td["attention_mask"][:, -RESPONSE_LEN:].bool()
    torch.testing.assert_close(old[mask], expected[mask], rtol=0, atol=1e-5)


@pytest.mark.usefixtures("single_rank_env")
@pytest.mark.parametrize(("strategy", "version"), [("fsdp", 1), ("fsdp2", 2)])
def test_role_strategy_key_selects_the_engine_wrapper(tmp_path, strategy, version):
    """Invariant (field-report item 9; upstream #5885 built FSDP1 in the engine path for actor.strategy=fsdp2):
    with only actor_rollout_ref.actor.strategy set (fsdp_config.strategy left null), the engine worker's actor and
    reference engines are wrapped with exactly that FSDP version."""
    from verl.utils.fsdp_utils import fsdp_version
    from verl.workers.engine_workers import ActorRolloutRefWorker

    config = _config(tiny_model_dir(tmp_path), strategy=strategy)
    config.ref.strategy = strategy
    worker = ActorRolloutRefWorker(config, role="actor_rollout_ref")
    worker.init_model()
    assert fsdp_version(worker.actor.engine.module) == fsdp_version(worker.ref.engine.module) == version


def _veomni_config(model_path: str):
    """`_config` in the model_engine=veomni family: the same actor/ref settings with the engine block under
    `.veomni` (fp32, offload on, as the fsdp2 config) and the VeOmni role classes named by `_target_`."""
    config = OmegaConf.to_container(_config(model_path))
    engine = config["actor"].pop("fsdp_config")
    config["actor"].update(
        _target_="verl.workers.config.VeOmniActorConfig",
        strategy="veomni",
        veomni={
            "model_dtype": "fp32",
            "param_offload": engine["param_offload"],
            "optimizer_offload": engine["optimizer_offload"],
        },
    )
    config["ref"] = {
        "_target_": "verl.workers.config.VeOmniRefConfig",
        "strategy": "veomni",
        "log_prob_micro_batch_size_per_gpu": config["ref"]["log_prob_micro_batch_size_per_gpu"],
    }
    return OmegaConf.create(config)


@pytest.mark.usefixtures("npu_sim", "single_rank_env")
def test_veomni_family_worker_equals_the_fsdp2_worker(tmp_path, monkeypatch):
    """Invariants (model_engine=veomni on the engine-worker path, on the simulated Ascend device: VeOmni is
    registered for cuda and npu only, as upstream): a worker whose actor/ref configs are the VeOmni family builds VeOmni engines for the policy and a forward-only one for the reference, with offload as
    configured. The fake VeOmni (verl.utils.testing.fake_veomni) loads the same checkpoint and shards it with
    FSDP2 in fp32, so the old log-probs, the reference log-probs, one PPO update's metrics and the log-probs after
    it must equal the fsdp2 worker's on the same generated batch (1e-6: same core, same maths)."""
    from verl.utils.testing.fake_veomni import install_fake_veomni
    from verl.workers.engine.veomni import VeOmniEngineWithLMHead
    from verl.workers.engine_workers import ActorRolloutRefWorker

    recorder = install_fake_veomni(monkeypatch)
    path = tiny_model_dir(tmp_path)
    results = {}
    batch = None
    for name, config in (("fsdp2", _config(path)), ("veomni", _veomni_config(path))):
        worker = ActorRolloutRefWorker(config, role="actor_rollout_ref")
        worker.init_model()
        if name == "veomni":
            assert isinstance(worker.actor.engine, VeOmniEngineWithLMHead)
            assert isinstance(worker.ref.engine, VeOmniEngineWithLMHead)
            assert worker.ref.engine.engine_config.forward_only and not worker.actor.engine.engine_config.forward_only
            assert worker.actor.engine.is_param_offload_enabled
            assert recorder.calls["build_foundation_model"]["weights_path"] == path
        if batch is None:
            batch = _generated_batch(worker)
            batch.batch["advantages"] = torch.randn(
                batch.batch["responses"].shape, generator=torch.Generator().manual_seed(1)
            )
        step = DataProto(batch=batch.batch.clone(), meta_info=dict(batch.meta_info))
        step.batch["old_log_probs"] = worker.compute_log_prob(step).batch["old_log_probs"]
        step.batch["ref_log_prob"] = worker.compute_ref_log_prob(step).batch["ref_log_prob"]
        metrics = worker.update_actor(step).meta_info["metrics"]
        results[name] = {
            "old": step.batch["old_log_probs"].cpu(),
            "ref": step.batch["ref_log_prob"].cpu(),
            "after": worker.compute_log_prob(step).batch["old_log_probs"].cpu(),
            "loss": torch.tensor(metrics["actor/pg_loss"]),
            "grad_norm": torch.tensor(metrics["actor/grad_norm"]),
        }
    mask = batch.batch["response_mask"].cpu().bool()
    assert not torch.equal(results["fsdp2"]["after"][mask], results["fsdp2"]["old"][mask])  # the update moved them
    for key in ("old", "ref", "after"):
        torch.testing.assert_close(results["veomni"][key][mask], results["fsdp2"][key][mask], rtol=0, atol=1e-6)
    for key in ("loss", "grad_norm"):
        torch.testing.assert_close(results["veomni"][key], results["fsdp2"][key], rtol=1e-6, atol=0)


@pytest.mark.usefixtures("single_rank_env")
@pytest.mark.parametrize("path", ["engine", "legacy"])
def test_freeze_vision_tower_reaches_the_model_build_on_both_worker_paths(tmp_path, path):
    """Invariant: actor.freeze_vision_tower reaches build_fsdp_model on the engine and the legacy worker path (the
    freezing itself: tests/workers/core/test_fsdp_model.py). Shown with a text-only model, which is refused naming
    the key instead of silently freezing nothing."""
    from verl.base_config import ConfigError

    if path == "engine":
        from verl.workers.engine_workers import ActorRolloutRefWorker
    else:
        from verl.workers.fsdp_workers import ActorRolloutRefWorker

    worker = ActorRolloutRefWorker(_config(tiny_model_dir(tmp_path), freeze_vision_tower=True), role="actor")
    with pytest.raises(
        ConfigError, match=r"actor_rollout_ref\.actor\.freeze_vision_tower: is set but Qwen2ForCausalLM"
    ):
        worker.init_model()
