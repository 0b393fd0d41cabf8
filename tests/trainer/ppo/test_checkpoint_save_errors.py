"""A save that fails (a full disk, in each of its disguises) says so, and the previous checkpoint stays usable.

Invariant: when the save of step 2 fails, the raised CheckpointSaveError names the step-2 path, calls a full disk a
full disk, gives the free bytes of that filesystem and names global_step_1 as intact; the partial ``.tmp`` is
gone, the tracker still says 1, and resuming loads exactly what step 1 saved.

The disk fills up in three ways: an ``ENOSPC`` injected where DCP opens its shard file (so DCP's own
``CheckpointException`` wrapping is exercised), torch's ``inline_container.cc ... unexpected pos`` short-write
error, and a real full filesystem (a small tmpfs; skipped where mounting is not allowed).
"""

import errno
import os
import pathlib
import subprocess
import uuid
from types import SimpleNamespace

import pytest
import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from verl.trainer.ppo import trainer_checkpoint as tc
from verl.utils.checkpoint.fsdp_checkpoint_manager import FSDPCheckpointManager
from verl.utils.checkpoint.save_errors import CheckpointSaveError, save_error

CONTENTS = SimpleNamespace(save_contents=["model", "optimizer", "extra"], load_contents=["model", "optimizer", "extra"])
TORCH_SHORT_WRITE = "[enforce fail at inline_container.cc:672] . unexpected pos 704 vs 598"


def _model(seed: int) -> Qwen2ForCausalLM:
    torch.manual_seed(seed)
    config = Qwen2Config(
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        vocab_size=64,
        max_position_embeddings=32,
    )
    return Qwen2ForCausalLM(config).float()


def _save(root, step: int, model) -> dict:
    """The trainer's save path (save_step) with the real checkpoint manager writing the actor part."""
    optim = torch.optim.AdamW(model.parameters(), lr=1e-2)

    def write_parts(tmp):
        FSDPCheckpointManager(model, optim, checkpoint_config=CONTENTS).save_checkpoint(str(tmp / "actor"))
        tc.save_driver_state(tmp, {"samples_yielded": step}, {"kl_coef": None})

    tc.save_step(root, step, write_parts, max_to_keep=None)
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def _assert_previous_intact_and_resume_exact(root, error: CheckpointSaveError, saved: dict) -> None:
    message = str(error)
    assert f"Saving the checkpoint {root / 'global_step_2'} failed" in message
    assert " bytes (" in message and "GiB) free of " in message
    assert f"The previous checkpoint global_step_1 ({root / 'global_step_1'}) is intact" in message
    assert not (root / "global_step_2.tmp").exists() and not (root / "global_step_2").exists()
    assert (root / tc.TRACKER_FILE).read_text() == "1"
    point = tc.find_resume_point("auto", root, None)
    assert point.global_step == 1
    model = _model(99)
    FSDPCheckpointManager(model, torch.optim.AdamW(model.parameters()), checkpoint_config=CONTENTS).load_checkpoint(
        str(point.path / "actor")
    )
    assert all(torch.equal(model.state_dict()[k], v) for k, v in saved.items())


def test_enospc_in_a_dcp_shard_write(tmp_path, monkeypatch):
    """ENOSPC where DCP opens the step-2 model shard: reported as 'the disk is full', errno ENOSPC, with the
    shard's path; through DCP's CheckpointException and the checkpoint manager's own error."""
    saved = _save(tmp_path, 1, _model(1))
    real_open = pathlib.Path.open

    def full_disk_open(self, *args, **kwargs):
        if "global_step_2.tmp" in str(self) and str(self).endswith(".distcp"):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(self))
        return real_open(self, *args, **kwargs)

    monkeypatch.setattr(pathlib.Path, "open", full_disk_open)
    with pytest.raises(CheckpointSaveError) as info:
        _save(tmp_path, 2, _model(2))
    monkeypatch.undo()
    assert info.value.errno == errno.ENOSPC
    assert "the disk is full (OSError: [Errno 28] No space left on device writing " in str(info.value)
    assert "global_step_2.tmp/actor.tmp/model_dcp/" in str(info.value)
    _assert_previous_intact_and_resume_exact(tmp_path, info.value, saved)


def test_torch_short_write_error(tmp_path, monkeypatch):
    """torch.save's 'inline_container.cc ... unexpected pos' (what a full disk looks like through torch.save) is
    explained as a full disk or quota, quoting torch's line."""
    saved = _save(tmp_path, 1, _model(1))
    real_save = torch.save

    def short_write(obj, f, *args, **kwargs):
        if "global_step_2.tmp" in str(f):
            raise RuntimeError(TORCH_SHORT_WRITE)
        return real_save(obj, f, *args, **kwargs)

    monkeypatch.setattr(torch, "save", short_write)
    with pytest.raises(CheckpointSaveError) as info:
        _save(tmp_path, 2, _model(2))
    monkeypatch.undo()
    assert f"a write came up short, which means the disk is full or over quota (torch: {TORCH_SHORT_WRITE})" in str(
        info.value
    )
    _assert_previous_intact_and_resume_exact(tmp_path, info.value, saved)


def test_a_workers_error_keeps_its_reason_through_ray(tmp_path):
    """The driver sees a worker's CheckpointSaveError inside a RayTaskError: the reason (and errno) come through,
    and the error survives pickling."""
    import pickle

    from ray.exceptions import RayTaskError

    worker_error = CheckpointSaveError(
        "worker message", path="/x/actor", reason="the disk is full (x)", error_number=28
    )
    wrapped = RayTaskError("save_checkpoint", "Traceback ...", pickle.loads(pickle.dumps(worker_error)))
    error = save_error(wrapped.as_instanceof_cause(), tmp_path / "global_step_2", "INTACT.")
    assert isinstance(error, CheckpointSaveError) and error.errno == 28
    assert str(error).startswith(f"Saving the checkpoint {tmp_path / 'global_step_2'} failed: the disk is full (x).")
    assert str(error).endswith("INTACT.")
    assert save_error(KeyboardInterrupt(), tmp_path, "x").__class__ is KeyboardInterrupt


@pytest.fixture
def small_tmpfs(tmp_path):
    """A tmpfs of 1.5 checkpoints' size (needs root and mount rights; skipped otherwise)."""
    probe = tmp_path / "probe"
    _save(probe, 1, _model(1))
    pages = sum(-(-p.stat().st_size // 4096) for p in (probe / "global_step_1").rglob("*") if p.is_file())
    mount_point = tmp_path / f"full-{uuid.uuid4().hex[:8]}"
    mount_point.mkdir()
    size = int(pages * 4096 * 1.5) + 16 * 4096
    result = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(mount_point)], capture_output=True
    )
    if result.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {result.stderr.decode().strip()}")
    try:
        yield mount_point
    finally:
        subprocess.run(["umount", "-l", str(mount_point)], check=False)


def test_real_full_disk(small_tmpfs):
    """Step 1 fits on the tmpfs, step 2 fills it mid-save: the error is the full disk, from whatever torch/DCP
    raised, with the tmpfs's (near zero) free bytes; step 1 resumes exactly."""
    root = small_tmpfs / "ckpt"
    saved = _save(root, 1, _model(1))
    with pytest.raises(CheckpointSaveError) as info:
        _save(root, 2, _model(2))
    assert "the disk is full" in str(info.value) or "a write came up short" in str(info.value)
    _assert_previous_intact_and_resume_exact(root, info.value, saved)
