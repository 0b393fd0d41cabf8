"""FSDPCheckpointManager: exact resume, atomic writes, retention, HF export (verl/utils/checkpoint)."""

import json
import os
from types import SimpleNamespace

import pytest
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from transformers import AutoModelForCausalLM, Qwen2Config, Qwen2ForCausalLM

from verl.utils.checkpoint.checkpoint_manager import find_latest_ckpt_path, get_checkpoint_tracker_filename
from verl.utils.checkpoint.fsdp_checkpoint_manager import FSDPCheckpointManager
from verl.utils.fsdp_utils import create_device_mesh, get_fsdp_adapter
from verl.utils.testing.dist import run_on_ranks

_FP32 = {"param_dtype": torch.float32, "reduce_dtype": torch.float32, "buffer_dtype": torch.float32}


def _config(*contents):
    contents = list(contents) or ["model", "optimizer", "extra"]
    return SimpleNamespace(save_contents=contents, load_contents=contents)


def _tiny(seed: int) -> Qwen2ForCausalLM:
    torch.manual_seed(seed)
    cfg = Qwen2Config(
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=128,
        max_position_embeddings=64,
        attn_implementation="eager",
    )
    return Qwen2ForCausalLM(cfg).float()


def _make(seed: int, model=None):
    model = model if model is not None else _tiny(seed)
    optim = torch.optim.AdamW(model.parameters(), lr=1e-2)
    sched = torch.optim.lr_scheduler.LambdaLR(optim, lambda step: 1.0 / (1 + step))
    return model, optim, sched


def _step(model, optim, sched, ids):
    optim.zero_grad()
    # dropout-free model: the RNG draw below checks that the RNG state is restored too
    noise = torch.rand(()).item()
    loss = model(input_ids=ids, labels=ids).loss * (1.0 + 0.0 * noise)
    loss.backward()
    optim.step()
    sched.step()
    return noise


def _params(model):
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def test_save_load_resumes_exactly_single_process(tmp_path):
    """Invariant: save after step 1 → fresh objects → load → step 2 equals the uninterrupted step 2 bit for bit
    (model, AdamW moments, lr schedule and the torch RNG stream all restored)."""
    ids = torch.randint(0, 128, (2, 10), generator=torch.Generator().manual_seed(1))
    model, optim, sched = _make(0)
    _step(model, optim, sched, ids)
    FSDPCheckpointManager(model, optim, sched, checkpoint_config=_config()).save_checkpoint(str(tmp_path / "s1"))
    noise_a = _step(model, optim, sched, ids)
    expected = _params(model)

    model2, optim2, sched2 = _make(seed=123)
    FSDPCheckpointManager(model2, optim2, sched2, checkpoint_config=_config()).load_checkpoint(str(tmp_path / "s1"))
    noise_b = _step(model2, optim2, sched2, ids)
    assert noise_a == noise_b
    assert sched2.get_last_lr() == sched.get_last_lr()
    for key, value in expected.items():
        assert torch.equal(_params(model2)[key], value), key


def test_crash_mid_save_leaves_previous_checkpoint_intact(tmp_path, monkeypatch):
    """Invariant (atomic write): if a save dies after writing some files, the previous checkpoint — a different
    step or the same path — is untouched and loadable, and no half-written directory carries a final name."""
    model, optim, sched = _make(0)
    manager = FSDPCheckpointManager(model, optim, sched, checkpoint_config=_config())
    first = str(tmp_path / "global_step_1" / "actor")
    manager.save_checkpoint(first)
    saved = _params(model)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(1.0)

    real_save = dcp.save

    def dying_save(state, *args, checkpoint_id, **kwargs):
        if "optim_dcp" in str(checkpoint_id):  # the model shards are already written by then
            raise OSError("disk full (simulated)")
        return real_save(state, *args, checkpoint_id=checkpoint_id, **kwargs)

    monkeypatch.setattr(dcp, "save", dying_save)
    second = str(tmp_path / "global_step_2" / "actor")
    for target in (second, first):
        with pytest.raises(OSError, match="simulated"):
            manager.save_checkpoint(target)
    monkeypatch.setattr(dcp, "save", real_save)

    assert not os.path.exists(second) and os.path.isdir(second + ".tmp")
    fresh, fresh_optim, fresh_sched = _make(seed=7)
    FSDPCheckpointManager(fresh, fresh_optim, fresh_sched, checkpoint_config=_config()).load_checkpoint(first)
    for key, value in saved.items():
        assert torch.equal(_params(fresh)[key], value), key
    # the next successful save replaces the stale temporary directory
    manager.save_checkpoint(second)
    assert os.path.isdir(second) and not os.path.exists(second + ".tmp")


def test_max_ckpt_to_keep_drops_the_oldest(tmp_path):
    """Invariant: with max_ckpt_to_keep=2, after three saves only the two newest directories remain."""
    model, optim, sched = _make(0)
    manager = FSDPCheckpointManager(model, optim, sched, checkpoint_config=_config("model"))
    paths = [str(tmp_path / f"global_step_{i}") for i in (1, 2, 3)]
    for i, path in enumerate(paths, start=1):
        manager.save_checkpoint(path, global_step=i, max_ckpt_to_keep=2)
    assert [os.path.isdir(p) for p in paths] == [False, True, True]


def test_load_errors_name_the_problem(tmp_path):
    """Invariant: a missing directory or optimizer state raises an error naming the path / the config key."""
    model, optim, sched = _make(0)
    with pytest.raises(FileNotFoundError, match="does not exist"):
        FSDPCheckpointManager(model, optim, checkpoint_config=_config()).load_checkpoint(str(tmp_path / "nope"))
    FSDPCheckpointManager(model, optim, checkpoint_config=_config("model", "extra")).save_checkpoint(
        str(tmp_path / "m")
    )
    with pytest.raises(FileNotFoundError, match="load_contents"):
        FSDPCheckpointManager(model, optim, checkpoint_config=_config()).load_checkpoint(str(tmp_path / "m"))


def _write_per_rank_checkpoint(path, model, optim, world_size: int) -> None:
    """A checkpoint in upstream's per-rank layout (one torch.save file per rank and kind) written by hand."""
    os.makedirs(path)
    torch.save(model.state_dict(), os.path.join(path, f"model_world_size_{world_size}_rank_0.pt"))
    torch.save(optim.state_dict(), os.path.join(path, f"optim_world_size_{world_size}_rank_0.pt"))
    rng = FSDPCheckpointManager.get_rng_state()
    torch.save({"lr_scheduler": None, "rng": rng}, os.path.join(path, f"extra_state_world_size_{world_size}_rank_0.pt"))
    with open(os.path.join(path, "fsdp_config.json"), "w") as f:
        json.dump({"FSDP_version": 0, "world_size": world_size}, f)


def test_per_rank_layout_loads_at_its_world_size_only(tmp_path):
    """Invariant: a checkpoint in the per-rank layout (upstream's model/optim_world_size_W_rank_r.pt) restores the
    model exactly at its own world size; saved by 2 ranks and loaded by 1 it raises a RuntimeError saying why
    (per-rank files cannot be resharded) and what to do."""
    ids = torch.randint(0, 128, (2, 10), generator=torch.Generator().manual_seed(1))
    model, optim, sched = _make(0)
    _step(model, optim, sched, ids)
    _write_per_rank_checkpoint(str(tmp_path / "ws1"), model, optim, world_size=1)
    fresh, fresh_optim, _ = _make(seed=9)
    FSDPCheckpointManager(fresh, fresh_optim, checkpoint_config=_config()).load_checkpoint(str(tmp_path / "ws1"))
    for key, value in _params(model).items():
        assert torch.equal(_params(fresh)[key], value), key
    _write_per_rank_checkpoint(str(tmp_path / "ws2"), model, optim, world_size=2)
    with pytest.raises(RuntimeError, match="cannot be resharded to this run's 1 ranks"):
        FSDPCheckpointManager(fresh, fresh_optim, checkpoint_config=_config()).load_checkpoint(str(tmp_path / "ws2"))


def test_find_latest_ckpt_path(tmp_path):
    """Invariant: the tracker file's step selects global_step_N; no tracker means no checkpoint."""
    assert find_latest_ckpt_path(str(tmp_path)) is None
    (tmp_path / "global_step_4").mkdir()
    with open(get_checkpoint_tracker_filename(str(tmp_path)), "w") as f:
        f.write("4")
    assert find_latest_ckpt_path(str(tmp_path)) == str(tmp_path / "global_step_4")


# ------------------------------------------------------------------------------------------------------------
# world size 2, FSDP1 and FSDP2
# ------------------------------------------------------------------------------------------------------------


def _dist_save_resume(root: str) -> dict:
    """For FSDP1 then FSDP2 on this rank: step 1, save (with HF export), step 2; a differently initialised model
    loads the checkpoint and makes step 2. Rank 0 reports the largest weight difference after step 2."""
    rank, world_size = dist.get_rank(), dist.get_world_size()
    out = {}
    for strategy in ("fsdp", "fsdp2"):
        adapter = get_fsdp_adapter(strategy)
        mesh = create_device_mesh(world_size, -1)
        ids = torch.randint(0, 128, (2, 10), generator=torch.Generator().manual_seed(10 + rank))
        model, optim, sched = _make(0, adapter.wrap(_tiny(0), mesh=mesh, dtypes=_FP32, wrap_policy=None))
        _step(model, optim, sched, ids)
        config = _config("model", "optimizer", "extra", "hf_model")
        FSDPCheckpointManager(model, optim, sched, checkpoint_config=config).save_checkpoint(f"{root}/{strategy}")
        _step(model, optim, sched, ids)
        expected = adapter.full_state_dict(model)

        model2, optim2, sched2 = _make(5, adapter.wrap(_tiny(5), mesh=mesh, dtypes=_FP32, wrap_policy=None))
        FSDPCheckpointManager(model2, optim2, sched2, checkpoint_config=config).load_checkpoint(f"{root}/{strategy}")
        _step(model2, optim2, sched2, ids)
        resumed = adapter.full_state_dict(model2)
        if rank == 0:
            out[strategy] = max((expected[k] - resumed[k]).abs().max().item() for k in expected)
    return out


@pytest.fixture(scope="module")
def dist_resume(tmp_path_factory):
    root = str(tmp_path_factory.mktemp("dist_ckpt"))
    return root, run_on_ranks(_dist_save_resume, 2, args=(root,), timeout_s=300)[0]


@pytest.mark.dist
@pytest.mark.parametrize("strategy", ["fsdp", "fsdp2"])
def test_sharded_resume_and_hf_export_world_size_2(dist_resume, strategy):
    """Invariants on 2 gloo ranks: (1) save → load into a differently initialised model → next step equals the
    uninterrupted step exactly; (2) the HF export of the step-1 weights loads with
    AutoModelForCausalLM.from_pretrained and gives the same log-probs as the single-process model after the same
    step 1 (fp32, 1e-5)."""
    root, max_diff = dist_resume
    root = f"{root}/{strategy}"
    assert max_diff[strategy] == 0.0

    # the single-process reference of step 1: FSDP averages the two ranks' gradients
    ref, optim, sched = _make(0)
    optim.zero_grad()
    batches = [torch.randint(0, 128, (2, 10), generator=torch.Generator().manual_seed(10 + r)) for r in (0, 1)]
    loss = sum(0.5 * ref(input_ids=b, labels=b).loss for b in batches)
    loss.backward()
    optim.step()
    exported = AutoModelForCausalLM.from_pretrained(os.path.join(root, "huggingface"), dtype=torch.float32)
    assert type(exported).__name__ == "Qwen2ForCausalLM"
    probe = torch.randint(0, 128, (3, 12), generator=torch.Generator().manual_seed(99))
    with torch.no_grad():
        lp_ref = torch.log_softmax(ref(input_ids=probe).logits, -1)
        lp_hf = torch.log_softmax(exported(input_ids=probe).logits, -1)
    torch.testing.assert_close(lp_hf, lp_ref, rtol=0, atol=1e-5)
