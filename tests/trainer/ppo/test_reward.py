"""load_reward_manager / get_custom_reward_fn / compute_reward: user reward functions by file path (v0.7 and
legacy keys), reward_kwargs, manager selection, clear errors, and a file-loaded function scoring inside Ray."""

import os
import textwrap

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf

from verl.protocol import DataProto
from verl.trainer.ppo.reward import (
    compute_reward,
    compute_reward_async,
    get_custom_reward_fn,
    load_reward_manager,
    reward_metrics_from_extra_info,
)
from verl.utils.reward_score import default_compute_score
from verl.utils.tokenizer import build_offline_tokenizer
from verl.workers.config.reward import RewardConfig
from verl.workers.reward_manager import BatchRewardManager, DAPORewardManager, NaiveRewardManager
from verl.workers.reward_manager.scorer import ScoringLimits

USER_REWARD = textwrap.dedent(
    """
    def compute_score(data_source, solution_str, ground_truth, extra_info=None, bonus=0.0):
        hit = solution_str.strip().endswith(str(ground_truth))
        return {"score": float(hit) + bonus, "hit": hit}

    def batch_score(data_sources, solution_strs, ground_truths, extra_infos):
        return [float(s.endswith(g)) for s, g in zip(solution_strs, ground_truths)]

    def too_few_args(solution_str, ground_truth):
        return 1.0

    NOT_A_FUNCTION = 3
    """
)


@pytest.fixture(scope="module")
def tokenizer():
    return build_offline_tokenizer([f"Q: {i} plus {i}? A: {2 * i} #### {2 * i}" for i in range(100)], vocab_size=300)


@pytest.fixture
def reward_file(tmp_path):
    path = tmp_path / "my_reward.py"
    path.write_text(USER_REWARD)
    return str(path)


def make_batch(tokenizer, responses, ground_truths, data_source="openai/gsm8k"):
    """Rollout batch: 8-token left-padded prompts, 12-token right-padded responses."""
    b, p_len, r_len = len(responses), 8, 12
    prompts = torch.full((b, p_len), tokenizer.pad_token_id)
    resp = torch.full((b, r_len), tokenizer.pad_token_id)
    mask = torch.zeros((b, p_len + r_len), dtype=torch.long)
    prompt_ids = tokenizer.encode("Q: 1?", add_special_tokens=False)
    for i, text in enumerate(responses):
        ids = tokenizer.encode(text, add_special_tokens=False)
        prompts[i, p_len - len(prompt_ids) :] = torch.tensor(prompt_ids)
        resp[i, : len(ids)] = torch.tensor(ids)
        mask[i, p_len - len(prompt_ids) : p_len + len(ids)] = 1
    non_tensors = {
        "data_source": np.array([data_source] * b, dtype=object),
        "reward_model": np.array([{"ground_truth": g} for g in ground_truths], dtype=object),
    }
    return DataProto.from_dict({"prompts": prompts, "responses": resp, "attention_mask": mask}, non_tensors)


def cfg(**tree):
    """A root config as Hydra gives it (DictConfig); only the keys a test needs."""
    return OmegaConf.create({"data": {"reward_fn_key": "data_source"}, **tree})


def test_default_is_naive_with_default_compute_score_and_the_reward_config_limits(tokenizer):
    """No custom function: NaiveRewardManager + default_compute_score, scoring in reward.num_workers processes with
    reward.compute_score_timeout / reward.batch_timeout (RewardConfig's defaults when the config has no reward
    node); reward.* keys and reward_kwargs override them."""
    defaults = RewardConfig()
    manager = load_reward_manager(cfg(), tokenizer, num_examine=0)
    assert isinstance(manager, NaiveRewardManager) and manager.compute_score is default_compute_score
    assert manager.scorer.limits == ScoringLimits(
        defaults.num_workers, defaults.compute_score_timeout, defaults.batch_timeout
    )
    batch = make_batch(tokenizer, ["A: 2 #### 2", "#### 3"], ["2", "4"])
    tensor, extra = compute_reward(batch, manager)
    assert tensor.sum() == 1.0 and extra["reward_failed"] == [False, False]
    manager.close()
    configured = cfg(reward={"num_workers": 2, "compute_score_timeout": 7.0, "batch_timeout": 30.0})
    train, val = (load_reward_manager(configured, tokenizer, num_examine=n) for n in (0, 1))
    assert train.scorer.limits == ScoringLimits(2, 7.0, 30.0)
    assert train.scorer.pool is val.scorer.pool  # training and validation share their worker processes
    assert load_reward_manager(cfg(), tokenizer, compute_score_timeout=5).compute_score_timeout == 5


def test_v07_custom_function_with_reward_kwargs(tokenizer, reward_file):
    """reward.custom_reward_function.{path,name,reward_kwargs}: kwargs are bound; dict keys reach extra info."""
    config = cfg(
        reward={
            "custom_reward_function": {"path": reward_file, "name": "compute_score", "reward_kwargs": {"bonus": 0.5}}
        }
    )
    manager = load_reward_manager(config, tokenizer, num_examine=0)
    tensor, extra = compute_reward(make_batch(tokenizer, ["A: 2", "A: 3"], ["2", "4"]), manager)
    assert extra["score"] == [1.5, 0.5] and extra["hit"] == [True, False]
    assert tensor.sum() == 2.0


def test_legacy_custom_function_keys(tokenizer, reward_file):
    """Legacy custom_reward_function.path with a null name loads 'compute_score' (upstream default)."""
    config = cfg(
        custom_reward_function={"path": reward_file, "name": None},
        reward={"custom_reward_function": {"path": None, "name": "compute_score"}},
    )
    fn = get_custom_reward_fn(config)
    assert fn(data_source="x", solution_str="7", ground_truth="7") == {"score": 1.0, "hit": True}


def test_contradicting_legacy_and_new_path(reward_file, tmp_path):
    """Both keys set to different files: ValueError naming both keys."""
    config = cfg(
        custom_reward_function={"path": str(tmp_path / "other.py")},
        reward={"custom_reward_function": {"path": reward_file}},
    )
    with pytest.raises(
        ValueError, match=r"custom_reward_function\.path=.*contradicts reward\.custom_reward_function\.path"
    ):
        get_custom_reward_fn(config)


def test_missing_file_function_and_bad_signature(reward_file, tmp_path):
    """Each user mistake names the config key / file and what to do."""
    missing = cfg(reward={"custom_reward_function": {"path": str(tmp_path / "nope.py"), "name": "f"}})
    with pytest.raises(FileNotFoundError, match=r"reward\.custom_reward_function\.path=.*nope\.py"):
        get_custom_reward_fn(missing)
    wrong_name = cfg(reward={"custom_reward_function": {"path": reward_file, "name": "score_fn"}})
    with pytest.raises(AttributeError, match=r"'score_fn' \(reward\.custom_reward_function\.name\).*'compute_score'"):
        get_custom_reward_fn(wrong_name)
    bad_sig = cfg(reward={"custom_reward_function": {"path": reward_file, "name": "too_few_args"}})
    with pytest.raises(TypeError, match=r"too_few_args.*def too_few_args\(data_source, solution_str"):
        get_custom_reward_fn(bad_sig)
    not_fn = cfg(reward={"custom_reward_function": {"path": reward_file, "name": "NOT_A_FUNCTION"}})
    with pytest.raises(TypeError, match="not a function"):
        get_custom_reward_fn(not_fn)


def test_manager_selection_v07_legacy_and_importlib(tokenizer, reward_file, tmp_path):
    """reward.reward_manager.name=dapo; legacy reward_model.reward_manager=batch (with a batch function);
    source=importlib loads a user class; an unknown name lists the registered ones."""
    assert isinstance(
        load_reward_manager(cfg(reward={"reward_manager": {"name": "dapo"}}), tokenizer), DAPORewardManager
    )
    legacy = cfg(
        reward_model={"reward_manager": "batch"},
        reward={
            "reward_manager": {"name": "naive"},
            "custom_reward_function": {"path": reward_file, "name": "batch_score"},
        },
    )
    manager = load_reward_manager(legacy, tokenizer)
    assert isinstance(manager, BatchRewardManager)
    assert compute_reward(make_batch(tokenizer, ["A: 2", "A: 3"], ["2", "4"]), manager)[0].sum() == 1.0
    user_cls = tmp_path / "mgr.py"
    user_cls.write_text(
        "class MyManager:\n"
        "    def __init__(self, tokenizer, num_examine, compute_score, reward_fn_key, **kw):\n"
        "        self.kw = kw\n"
        "    def __call__(self, data):\n"
        "        return 'called'\n"
    )
    importlib_cfg = cfg(
        reward={"reward_manager": {"source": "importlib", "module": {"path": str(user_cls), "name": "MyManager"}}}
    )
    custom = load_reward_manager(importlib_cfg, tokenizer, extra=1)
    assert custom.kw == {"extra": 1}  # no compute_score_timeout injected: the class does not declare it
    assert compute_reward(None, custom) == ("called", {})  # no return_dict in its signature: tensor only
    with pytest.raises(ValueError, match="Registered"):
        load_reward_manager(cfg(reward={"reward_manager": {"name": "nope"}}), tokenizer)


def test_reward_metrics_from_extra_info():
    """Counts come from the per-sample columns; absent columns count 0."""
    extra = {"reward_failed": [True, False, True], "reward_timed_out": [False, False, True]}
    assert reward_metrics_from_extra_info(extra) == {"reward/num_failed": 2, "reward/num_timed_out": 1}
    assert reward_metrics_from_extra_info({}) == {"reward/num_failed": 0, "reward/num_timed_out": 0}


def test_upstream_composed_config_with_legacy_override(tokenizer, reward_file):
    """With the project's ppo_trainer.yaml and a legacy `custom_reward_function.path=` override (no migration),
    the user's function is used."""
    config_dir = os.path.join(os.path.dirname(__import__("verl").__file__), "trainer", "config")
    if not os.path.isfile(os.path.join(config_dir, "ppo_trainer.yaml")):
        pytest.skip("ppo_trainer.yaml not present yet")
    from hydra import compose, initialize_config_dir

    with initialize_config_dir(config_dir=config_dir, version_base=None):
        config = compose(config_name="ppo_trainer", overrides=[f"custom_reward_function.path={reward_file}"])
    manager = load_reward_manager(config, tokenizer, num_examine=0)
    assert compute_reward(make_batch(tokenizer, ["A: 2"], ["2"]), manager)[1]["hit"] == [True]


def test_compute_reward_async_in_ray_with_file_loaded_function(tokenizer, reward_file):
    """A reward manager holding a file-loaded function is shipped to a Ray task (by value) and scores there, even
    though the task's process cannot import the file by name."""
    ray = pytest.importorskip("ray")
    config = cfg(reward={"custom_reward_function": {"path": reward_file, "name": "compute_score"}})
    manager = load_reward_manager(config, tokenizer, num_examine=0)
    os.remove(reward_file)  # from here on the function exists only as the loaded object
    batch = make_batch(tokenizer, ["A: 2", "A: 3"], ["2", "4"])
    assert compute_reward_async(batch, reward_fn=manager)[1]["hit"] == [True, False]  # direct call
    ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False)
    try:
        tensor, extra = ray.get(compute_reward_async.remote(batch, reward_fn=manager), timeout=120)
    finally:
        ray.shutdown()
    assert extra["hit"] == [True, False] and tensor.sum() == 1.0
