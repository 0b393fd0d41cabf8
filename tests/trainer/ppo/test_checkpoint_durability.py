"""A checkpoint is trusted only when it can be proven complete, and a commit is durable.

Invariants:
* commit order: every file and directory of the step is fsynced, then the manifest is written, then the directory
  is renamed, then the tracker is written to a temp file, fsynced and renamed (the tracker never names a step whose
  data may still be in the page cache);
* resume with an empty tracker, a tracker naming an empty directory, a truncated model shard, or an empty
  ``data.pt`` in the latest step falls back to the newest complete checkpoint with a warning naming the skipped
  directory and the file, and what is then loaded equals what that step saved, bit for bit; with no complete
  checkpoint it stops with a CheckpointError naming the file and the fix. The worker-level loader refuses a damaged
  model directory on its own too.

The checkpoints are written by the real ``FSDPCheckpointManager`` (one process, a tiny Qwen2) into the trainer's
step layout, as a run writes them.
"""

import logging
import os
from types import SimpleNamespace

import pytest
import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from verl.trainer.ppo import trainer_checkpoint as tc
from verl.utils.checkpoint.durable import MANIFEST_FILE, CheckpointError
from verl.utils.checkpoint.fsdp_checkpoint_manager import FSDPCheckpointManager

SHARD = "actor/model_dcp/__0_0.distcp"
CONTENTS = SimpleNamespace(save_contents=["model", "optimizer", "extra"], load_contents=["model", "optimizer", "extra"])


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


def _save_step(root, step: int, model) -> dict:
    """One trainer checkpoint of ``model`` (actor dir + data.pt), committed; returns the saved parameters."""
    optim = torch.optim.AdamW(model.parameters(), lr=1e-2)
    tmp = tc.begin_step_dir(root, step)
    FSDPCheckpointManager(model, optim, checkpoint_config=CONTENTS).save_checkpoint(
        str(tmp / "actor"), global_step=step
    )
    tc.save_driver_state(tmp, {"samples_yielded": 8 * step}, {"kl_coef": None})
    tc.commit_step_dir(root, tmp, step, max_to_keep=None)
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


@pytest.fixture
def two_steps(tmp_path):
    """Steps 1 and 2 of different models under tmp_path; returns {step: saved parameters}."""
    return {1: _save_step(tmp_path, 1, _model(1)), 2: _save_step(tmp_path, 2, _model(2))}


def _resume(root, caplog) -> tc.ResumePoint:
    with caplog.at_level(logging.WARNING, logger="verl.trainer.ppo.trainer_checkpoint"):
        return tc.find_resume_point("auto", root, None)


def _load_actor(point: tc.ResumePoint) -> dict:
    model = _model(99)
    optim = torch.optim.AdamW(model.parameters(), lr=1e-2)
    FSDPCheckpointManager(model, optim, checkpoint_config=CONTENTS).load_checkpoint(str(point.path / "actor"))
    assert tc.load_driver_state(point.path)["dataloader"] == {"samples_yielded": 8 * point.global_step}
    return model.state_dict()


def _assert_loads(point: tc.ResumePoint, saved: dict) -> None:
    loaded = _load_actor(point)
    assert all(torch.equal(loaded[k], v) for k, v in saved.items())


def test_commit_fsyncs_everything_before_the_rename_and_the_tracker(tmp_path, monkeypatch):
    """Recorded os.fsync / os.replace calls of one commit: each file of the step is fsynced before the step rename,
    the manifest is written before it, the root directory is fsynced after it, and the tracker's temp file is fsynced
    before it replaces the tracker."""
    events = []
    real_fsync, real_replace = os.fsync, os.replace
    monkeypatch.setattr(
        os, "fsync", lambda fd: (events.append(("fsync", os.readlink(f"/proc/self/fd/{fd}"))), real_fsync(fd))[1]
    )
    monkeypatch.setattr(os, "replace", lambda a, b: (events.append(("replace", str(a), str(b))), real_replace(a, b))[1])
    _save_step(tmp_path, 3, _model(3))
    final = tmp_path / "global_step_3"
    tmp = f"{final}.tmp"
    step_rename = events.index(("replace", tmp, str(final)))
    fsynced_before = {e[1] for e in events[:step_rename] if e[0] == "fsync"}
    files = {str(p).replace(str(final), tmp) for p in final.rglob("*")}
    assert files - fsynced_before == set()  # every file and directory, the manifest included
    assert (final / MANIFEST_FILE).is_file()
    assert ("fsync", str(tmp_path)) in events[step_rename:]
    tracker, tracker_tmp = tmp_path / tc.TRACKER_FILE, tmp_path / f".{tc.TRACKER_FILE}.tmp"
    tracker_rename = events.index(("replace", str(tracker_tmp), str(tracker)))
    assert tracker_rename > step_rename and ("fsync", str(tracker_tmp)) in events[step_rename:tracker_rename]
    assert tracker.read_text() == "3"


def test_resume_with_an_empty_tracker_uses_the_newest_complete_step(tmp_path, two_steps, caplog):
    """Empty tracker (e.g. written non-atomically by an older version and cut by a crash): warn naming the file,
    resume from global_step_2, the newest complete one."""
    (tmp_path / tc.TRACKER_FILE).write_text("")
    point = _resume(tmp_path, caplog)
    assert point.global_step == 2
    assert f"{tmp_path / tc.TRACKER_FILE} is empty" in caplog.text and "global_step_2" in caplog.text
    _assert_loads(point, two_steps[2])


def test_resume_with_a_tracker_naming_an_empty_directory_falls_back(tmp_path, two_steps, caplog):
    """The tracker names global_step_3, which is an empty directory: skipped (warning names it), step 2 loads."""
    (tmp_path / "global_step_3").mkdir()
    (tmp_path / tc.TRACKER_FILE).write_text("3")
    point = _resume(tmp_path, caplog)
    assert point.global_step == 2
    assert f"{tmp_path / 'global_step_3'} is an empty directory" in caplog.text
    _assert_loads(point, two_steps[2])


def test_resume_with_a_truncated_model_shard_falls_back(tmp_path, two_steps, caplog):
    """Step 2's model shard cut to half its size: step 2 is skipped with the shard's name and both sizes, step 1
    loads exactly; loading step 2's actor directly is refused naming the shard."""
    shard = tmp_path / "global_step_2" / SHARD
    size = shard.stat().st_size
    os.truncate(shard, size // 2)
    point = _resume(tmp_path, caplog)
    assert point.global_step == 1
    assert f"has {SHARD} of {size // 2} bytes, but its manifest says {size}" in caplog.text
    _assert_loads(point, two_steps[1])
    with pytest.raises(CheckpointError, match="model_dcp/__0_0.distcp of"):
        _load_actor(tc.ResumePoint(2, tmp_path / "global_step_2"))


def test_resume_with_an_empty_data_pt_falls_back(tmp_path, two_steps, caplog):
    """Step 2's data.pt emptied: skipped (warning names data.pt), step 1 loads exactly."""
    os.truncate(tmp_path / "global_step_2" / "data.pt", 0)
    point = _resume(tmp_path, caplog)
    assert point.global_step == 1
    assert "has data.pt of 0 bytes, but its manifest says" in caplog.text
    _assert_loads(point, two_steps[1])


def test_no_complete_checkpoint_stops_naming_every_file(tmp_path):
    """Only step 1, with an empty data.pt: CheckpointError naming the directory, data.pt and the two fixes; an
    explicit resume_path to it is refused the same way."""
    _save_step(tmp_path, 1, _model(1))
    os.truncate(tmp_path / "global_step_1" / "data.pt", 0)
    with pytest.raises(
        CheckpointError, match=r"global_step_1 has data.pt of 0 bytes.*resume_mode=disable.*resume_path"
    ):
        tc.find_resume_point("auto", tmp_path, None)
    with pytest.raises(CheckpointError, match=r"trainer.resume_from_path=.*data.pt of 0 bytes"):
        tc.find_resume_point("resume_path", tmp_path, str(tmp_path / "global_step_1"))


def test_checkpoint_without_manifest_is_accepted_only_with_data(tmp_path, two_steps, caplog):
    """A step directory without a manifest (older format) is used with a warning when data.pt and actor/ hold data,
    and skipped when data.pt is empty; no tracker but step directories: start fresh, saying so."""
    os.remove(tmp_path / "global_step_2" / MANIFEST_FILE)
    point = _resume(tmp_path, caplog)
    assert point.global_step == 2 and "accepted after checking only that data.pt and actor/ hold data" in caplog.text
    os.truncate(tmp_path / "global_step_2" / "data.pt", 0)
    assert _resume(tmp_path, caplog).global_step == 1
    assert "has no checkpoint_manifest.json and its data.pt is missing or empty" in caplog.text
    os.remove(tmp_path / tc.TRACKER_FILE)
    assert _resume(tmp_path, caplog) is None and "but no latest_checkpointed_iteration.txt" in caplog.text
