"""Trainer-level checkpoint directories: atomic commit, retention, and the three resume modes (damaged checkpoints\nand durability: test_checkpoint_durability.py)."""

import pytest

from verl.trainer.ppo import trainer_checkpoint as tc
from verl.utils.checkpoint.durable import CheckpointError


def _save(root, step, keep=None, payload="x"):
    tmp = tc.begin_step_dir(root, step)
    (tmp / "actor").mkdir()
    (tmp / "actor" / "weights.txt").write_text(payload)
    tc.save_driver_state(tmp, {"samples_yielded": step}, {"kl_coef": 0.1})
    return tc.commit_step_dir(root, tmp, step, keep)


def test_commit_writes_tracker_and_step_dir(tmp_path):
    """After commit, the tracker names the step and auto-resume finds it with its driver state."""
    _save(tmp_path, 3)
    point = tc.find_resume_point("auto", tmp_path, None)
    assert point.global_step == 3 and point.path == tmp_path / "global_step_3"
    state = tc.load_driver_state(point.path)
    assert state["dataloader"] == {"samples_yielded": 3} and state["extra"] == {"kl_coef": 0.1}


def test_interrupted_save_leaves_previous_checkpoint(tmp_path):
    """A save killed before commit (only the .tmp dir exists) must not change what auto-resume loads."""
    _save(tmp_path, 2)
    tmp = tc.begin_step_dir(tmp_path, 4)  # killed here: no commit
    (tmp / "actor").mkdir()
    point = tc.find_resume_point("auto", tmp_path, None)
    assert point.global_step == 2
    # The next save of step 4 starts from a clean temp dir.
    _save(tmp_path, 4, payload="new")
    assert (tmp_path / "global_step_4" / "actor" / "weights.txt").read_text() == "new"
    assert not (tmp_path / "global_step_4.tmp").exists()


def test_retention_keeps_newest(tmp_path):
    """max_to_keep=2 after saving steps 1..4 leaves exactly steps 3 and 4."""
    for step in range(1, 5):
        _save(tmp_path, step, keep=2)
    assert tc.list_steps(tmp_path) == [3, 4]


def test_resume_modes(tmp_path):
    """disable → None; auto with nothing saved → None; resume_path → that step; bad inputs → ValueError naming the key."""
    assert tc.find_resume_point("disable", tmp_path, None) is None
    assert tc.find_resume_point("auto", tmp_path, None) is None
    path = _save(tmp_path, 5)
    assert tc.find_resume_point("resume_path", tmp_path, str(path)).global_step == 5
    with pytest.raises(ValueError, match="trainer.resume_from_path"):
        tc.find_resume_point("resume_path", tmp_path, None)
    with pytest.raises(ValueError, match="global_step_<N>"):
        tc.find_resume_point("resume_path", tmp_path, str(tmp_path))
    with pytest.raises(ValueError, match="trainer.resume_mode"):
        tc.find_resume_point("sometimes", tmp_path, None)


def test_tracker_pointing_to_missing_dir_is_a_clear_error(tmp_path):
    """A tracker naming a step that does not exist, with nothing older: CheckpointError naming the file and the fix."""
    (tmp_path / tc.TRACKER_FILE).write_text("7")
    with pytest.raises(CheckpointError, match=r"names step 7, but .*global_step_7 does not exist.*resume_mode=disable"):
        tc.find_resume_point("auto", tmp_path, None)
