"""ActorRolloutRefWorker on the simulated Ascend NPU with parameter and optimizer offload (field-report item 10):
every phase, including checkpoint save/load and the HF export, must see its tensors on one device."""

import os

import pytest
import torch
import torch.distributed as dist
from transformers import Qwen2ForCausalLM

from tests.workers.conftest import offloaded_policy_config, tiny_model_dir, two_prompts
from verl.protocol import DataProto
from verl.utils.testing.dist import free_port, spawn

RESPONSE_LEN = 4


def _npu_params(module) -> set[str]:
    return {p.device.type for p in module.parameters()}


@pytest.mark.parametrize("strategy", ["fsdp2", "fsdp"])
def test_offloaded_actor_phases_and_checkpoint_on_simulated_npu(tmp_path, strategy):
    """Invariants on the simulated NPU with param+optimizer offload: between phases parameters and AdamW state
    are on the CPU; generate, log-prob, update, save (with HF export) and load each run with every tensor on the
    npu (a CPU/NPU mix raises there, as on hardware); the reloaded worker reproduces the updated log-probs, which
    equal the exported HF model's. Save and load are audited: every state_dict / load_state_dict of the model and
    optimizer sees only npu:0, and a save whose offload is broken (parameters never reloaded, or one FSDP unit
    left on the host) raises — FSDP2 would otherwise write it silently on one rank.

    Runs in a fresh process: the autograd engine sizes its per-device queues at its first backward, so a
    simulated device installed after other tests' backward passes in the same process would not get one."""
    spawn(_scenario, args=(free_port(), str(tmp_path), strategy), nprocs=1)


def _scenario(rank: int, port: int, root: str, strategy: str) -> None:
    from pathlib import Path

    from verl.utils.platform.npu_sim import simulated_ascend

    os.environ.pop("VERL_PLATFORM", None)
    os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", LOCAL_WORLD_SIZE="1")
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    with simulated_ascend():
        try:
            _run_phases(Path(root), strategy)
        finally:
            if dist.is_initialized():
                dist.destroy_process_group()


def _run_phases(tmp_path, strategy: str) -> None:
    from verl.utils.device import get_device_name
    from verl.utils.platform.npu_sim.placement_audit import saved_tensor_devices
    from verl.workers.fsdp_workers import ActorRolloutRefWorker

    assert get_device_name() == "npu"
    path = tiny_model_dir(tmp_path)
    worker = ActorRolloutRefWorker(offloaded_policy_config(path, RESPONSE_LEN, strategy), role="actor_rollout")
    worker.init_model()
    assert _npu_params(worker.actor_module_fsdp) == {"cpu"}
    gen = worker.generate_sequences(two_prompts(worker.model_config.tokenizer.pad_token_id))
    batch = DataProto(batch=gen.batch, meta_info={"temperature": 1.0})
    batch.batch["response_mask"] = batch.batch["attention_mask"][:, -RESPONSE_LEN:]
    batch.batch["old_log_probs"] = worker.compute_log_prob(batch).batch["old_log_probs"]
    batch.batch["advantages"] = torch.randn(batch.batch["responses"].shape, generator=torch.Generator().manual_seed(1))
    metrics = worker.update_actor(batch).meta_info["metrics"]
    assert metrics["actor/skipped_steps"] == [0.0]
    states = [v for s in worker.actor_optimizer.state.values() for v in s.values() if isinstance(v, torch.Tensor)]
    assert states and {t.device.type for t in states if t.dim() > 0} == {"cpu"}
    assert _npu_params(worker.actor_module_fsdp) == {"cpu"}
    updated = worker.compute_log_prob(batch).batch["old_log_probs"]
    ckpt = str(tmp_path / "global_step_1" / "actor")
    with _audit(worker) as audit:
        worker.save_checkpoint(ckpt, None, 1, None)
    assert os.path.exists(os.path.join(ckpt, "huggingface", "model.safetensors"))
    # sharded model + full model (HF export) + optimizer, each read with everything on npu:0
    assert audit.events().count(f"state_dict of {type(worker.actor_module_fsdp).__name__}") == 2
    assert "state_dict of AdamW" in audit.events() and audit.devices() == {torch.device("npu", 0)}
    saved = saved_tensor_devices(ckpt)  # the torch.save files (extra state); DCP writes the model/optimizer shards
    assert saved and all(len(devices) == 1 for devices in saved.values()), saved

    resumed = ActorRolloutRefWorker(offloaded_policy_config(path, RESPONSE_LEN, strategy), role="actor")
    resumed.init_model()
    with _audit(resumed) as audit:
        resumed.load_checkpoint(ckpt)
    assert {"load_state_dict of AdamW"} < set(audit.events()) and audit.devices() == {torch.device("npu", 0)}
    torch.testing.assert_close(resumed.compute_log_prob(batch).batch["old_log_probs"], updated, rtol=0, atol=0)
    exported = Qwen2ForCausalLM.from_pretrained(os.path.join(ckpt, "huggingface"), dtype=torch.float32)
    td = batch.batch.to("cpu")  # the worker moved the batch to the npu in place (DataProto.to)
    updated = updated.cpu()
    with torch.no_grad():
        logits = exported(
            input_ids=td["input_ids"], attention_mask=td["attention_mask"], position_ids=td["position_ids"]
        )
    logp = torch.log_softmax(logits.logits[:, -RESPONSE_LEN - 1 : -1], -1)
    expected = logp.gather(-1, td["responses"].unsqueeze(-1)).squeeze(-1)
    mask = td["response_mask"].bool()
    torch.testing.assert_close(updated[mask], expected[mask], rtol=0, atol=1e-5)
    # an exception inside FSDP1's state_dict leaves its state-dict type half-set: one broken save per worker
    _missing_reload_fails_the_save(worker, str(tmp_path / "broken"))
    _partial_reload_fails_the_save(resumed, str(tmp_path / "broken"))


_NOT_ON_DEVICE = "found at least two devices|expected npu:0|Expects tensor to be on the compute device npu:0"


def _audit(worker):
    from verl.utils.platform.npu_sim.placement_audit import audit_state_dict_devices

    return audit_state_dict_devices(worker.actor_module_fsdp, worker.actor_optimizer, expect=torch.device("npu", 0))


def _missing_reload_fails_the_save(worker, ckpt: str) -> None:
    """Parameters never reloaded before the save: FSDP2 would write a consistent host-side shard on one rank and
    fail only at the HF export's collective on several; the audit (expect npu:0) fails it on one."""
    from verl.utils.checkpoint.save_errors import CheckpointSaveError
    from verl.utils.platform.npu_sim.placement_audit import DeviceDisciplineError

    placement = worker._actor_placement
    placement.param_offload = False  # on_device() now skips the reload (and the offload after it)
    try:
        # FSDP1 checks its flat parameters' device itself when its state_dict hook unshards them (as on hardware),
        # before the audit's hook runs; FSDP2 does not, and the audit reports the host-side parameters
        with _audit(worker), pytest.raises(CheckpointSaveError, match=_NOT_ON_DEVICE) as failed:
            worker.save_checkpoint(ckpt, None, 2, None)
    finally:
        placement.param_offload = True
    assert isinstance(failed.value.__cause__, (DeviceDisciplineError, AssertionError)), failed.value.__cause__
    assert not os.path.exists(ckpt)  # nothing half-written is committed


def _partial_reload_fails_the_save(worker, ckpt: str) -> None:
    """One FSDP unit left on the host while the rest is on the npu when the checkpoint reads the model."""
    from verl.utils.checkpoint.save_errors import CheckpointSaveError
    from verl.utils.platform.npu_sim.placement_audit import DeviceDisciplineError

    save = worker.checkpoint_manager.save_checkpoint

    def save_after_a_partial_reload(*args, **kwargs):
        _move_one_unit_to_host(worker.actor_module_fsdp)
        return save(*args, **kwargs)

    worker.checkpoint_manager.save_checkpoint = save_after_a_partial_reload
    with _audit(worker), pytest.raises(CheckpointSaveError, match=_NOT_ON_DEVICE) as failed:
        worker.save_checkpoint(ckpt, None, 2, None)
    assert isinstance(failed.value.__cause__, (DeviceDisciplineError, AssertionError)), failed.value.__cause__
    assert not os.path.exists(ckpt)


def _move_one_unit_to_host(module) -> None:
    """The partial move of a buggy offload: ONE FSDP unit's parameters go to the host, the rest stay on the npu."""
    from torch.distributed.fsdp import FSDPModule

    units = [m for m in module.modules() if isinstance(m, FSDPModule) and m is not module]
    if units:  # FSDP2: a decoder layer, moved the way FSDP2 moves modules
        units[0].to("cpu")
        return
    flat = next(module.parameters())  # FSDP1: the first flat parameter
    flat.data = flat.data.cpu()
