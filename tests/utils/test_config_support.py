"""Upstream keys whose feature this distribution lacks are never ignored silently (verl/utils/config_support.py):
refused before Ray when ignoring them would change results, reported in one warning otherwise."""

import ast
import dataclasses
import logging
import re
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

import verl
from verl.base_config import ConfigError
from verl.utils.config import validate_config
from verl.utils.config_support import (
    CONFIG_ONLY,
    COVERED_BY,
    INERT_SETTINGS,
    UNSUPPORTED_FEATURES,
    report_inert_settings,
)

CONFIG_DIR = str(Path(verl.__file__).parent / "trainer" / "config")
# a valid launch on 2 devices: 16 prompts x 4 responses, mini-batch 8 prompts, micro-batches of 4
GOOD = [
    "actor_rollout_ref.rollout.name=hf",
    "actor_rollout_ref.rollout.n=4",
    "data.train_batch_size=16",
    "actor_rollout_ref.actor.ppo_mini_batch_size=8",
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4",
    "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=4",
    "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=4",
    "critic.ppo_micro_batch_size_per_gpu=4",
    "trainer.n_gpus_per_node=2",
]

# one override per refused key: the value a user script would set
REFUSED = {
    "actor_rollout_ref.actor.calculate_sum_pi_squared": "true",
    "algorithm.adv_estimator": "optimal_token_baseline",
    "actor_rollout_ref.model.lora_rank": "8",
    "actor_rollout_ref.model.lora_adapter_path": "/adapters/a",
    "critic.model.lora_rank": "8",
    "actor_rollout_ref.rollout.multi_turn.enable": "true",
    "actor_rollout_ref.rollout.agent.default_agent_loop": "tool_agent",
    "actor_rollout_ref.rollout.agent.agent_loop_config_path": "/loops.yaml",
    "actor_rollout_ref.rollout.agent.custom_async_server.path": "/server.py",
    "data.datagen.path": "/gen.py",
    "actor_rollout_ref.rollout.quantization_config_file": "/q.json",
    "reward.reward_model.enable": "true",
    "algorithm.use_pf_ppo": "true",
}
# refused values of a key that already has a row above (a dict holds one value per key)
REFUSED_TOO = [("algorithm.adv_estimator", "remax")]
INERT = {
    "actor_rollout_ref.model.use_liger": "true",
    "actor_rollout_ref.model.tiled_mlp.enabled": "true",
    "actor_rollout_ref.model.use_shm": "true",
    "critic.model.use_shm": "true",
    "data.use_shm": "true",
    "actor_rollout_ref.actor.use_prefix_grouper": "true",
    "actor_rollout_ref.actor.checkpoint.async_save": "true",
    "actor_rollout_ref.rollout.layered_summon": "true",
    "actor_rollout_ref.rollout.multi_stage_wake_up": "true",
    "actor_rollout_ref.rollout.over_sample_rate": "0.1",
    "actor_rollout_ref.rollout.skip_rollout": "true",
    "trainer.log_val_generations": "4",
    "trainer.validation_data_dir": "/tmp/val",
    "trainer.esi_redundant_time": "60",
    "trainer.default_hdfs_dir": "hdfs://ckpt",
    "trainer.del_local_ckpt_after_load": "true",
    "trainer.max_critic_ckpt_to_keep": "2",
    "trainer.ray_wait_register_center_timeout": "600",
    "ray_kwargs.timeline_json_file": "/tmp/timeline.json",
    "global_profiler.tool": "torch",
    "actor_rollout_ref.rollout.mode": "sync",
    "actor_rollout_ref.rollout.data_parallel_size": "2",
    "actor_rollout_ref.rollout.checkpoint_engine.backend": "nccl",
    "actor_rollout_ref.rollout.checkpoint_engine.update_weights_bucket_megabytes": "4096",
    "actor_rollout_ref.actor.use_torch_compile": "true",
    "actor_rollout_ref.ref.use_torch_compile": "true",
    "actor_rollout_ref.actor.fsdp_config.use_torch_compile": "true",
    "actor_rollout_ref.ref.fsdp_config.use_torch_compile": "true",
    "critic.model.fsdp_config.use_torch_compile": "true",
    "actor_rollout_ref.actor.fsdp_config.full_determinism": "true",
    "actor_rollout_ref.ref.fsdp_config.full_determinism": "true",
    "critic.model.fsdp_config.full_determinism": "true",
    "critic.checkpoint.async_save": "true",
    "actor_rollout_ref.actor.checkpoint.mbridge_config": "{a: 1}",
    "critic.checkpoint.mbridge_config": "{a: 1}",
    "actor_rollout_ref.model.fused_kernel_options.impl_backend": "triton",
    "reward.sandbox_fusion.max_concurrent": "8",
    "data.return_raw_input_ids": "true",
    "data.image_patch_size": "16",
    "data.validation_shuffle": "true",
    "data.filter_overlong_prompts_workers": "4",
}


def _validate(*overrides):
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base=None):
        cfg = compose(config_name="ppo_trainer", overrides=[*GOOD, *overrides])
    return validate_config(cfg, use_reference_policy=True, use_critic=True)


def test_tables_are_what_these_tests_cover():
    """Adding or removing a row without a test here fails (each row is a reviewed decision)."""
    assert [s.key for s in UNSUPPORTED_FEATURES] == [*REFUSED, *(key for key, _ in REFUSED_TOO)]
    assert [s.key for s in INERT_SETTINGS] == list(INERT)


def test_default_config_is_neither_refused_nor_reported(caplog):
    with caplog.at_level(logging.WARNING, logger="verl.utils.config_support"):
        typed = _validate()
    assert report_inert_settings(typed) == []
    assert "no effect" not in caplog.text


@pytest.mark.parametrize("key", list(REFUSED))
def test_unimplemented_feature_is_refused_naming_the_key(key):
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        _validate(f"{key}={REFUSED[key]}")


@pytest.mark.parametrize("key, value", REFUSED_TOO)
def test_other_refused_values_name_the_key(key, value):
    with pytest.raises(ConfigError, match=key.replace(".", r"\.") + f".*{value}"):
        _validate(f"{key}={value}")


def test_unregistered_rollout_is_refused_listing_the_registered_ones():
    """rollout.name=sglang used to pass validation and fail at worker build (only hf and vllm are registered)."""
    with pytest.raises(ConfigError, match=r"rollout\.name: \('sglang'\) is not a rollout.*\['hf', 'vllm'\]"):
        _validate("actor_rollout_ref.rollout.name=sglang")


def test_inert_settings_are_reported_in_one_warning(caplog):
    with caplog.at_level(logging.WARNING, logger="verl.utils.config_support"):
        # a dict value replaces an empty struct node: "++" (a plain override would merge key by key into it)
        typed = _validate(*(f"{'++' if v.startswith('{') else ''}{k}={v}" for k, v in INERT.items()))
    warnings = [r for r in caplog.records if "no effect" in r.getMessage()]  # validate_config's report
    assert len(warnings) == 1 and all(key in warnings[0].getMessage() for key in INERT)
    assert report_inert_settings(typed) == list(INERT)


# ---- every config leaf is read by the code or reviewed here -------------------------------------------------------

VERL = Path(verl.__file__).parent
# the modules that declare, compose and validate the config (reading a key there does not make it take effect)
CONFIG_MODULES = [
    VERL / "trainer" / "config",
    VERL / "workers" / "config",
    VERL / "base_config.py",
    VERL / "utils" / "config.py",
    VERL / "utils" / "config_support.py",
    VERL / "utils" / "profiler" / "config.py",
]
_DOTTED = re.compile(r"^[a-z_][a-z0-9_]*(\.[a-z_][a-z0-9_]*)*$")


def _is_config_module(path: Path) -> bool:
    return any(path == c or c in path.parents for c in CONFIG_MODULES)


def _not_reads(tree: ast.AST) -> set[int]:
    """Strings that name no config key: docstrings and the entries of ``__all__``."""
    nodes = (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)
    skip = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, nodes) and node.body and isinstance(node.body[0], ast.Expr)
    }
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "__all__" for t in node.targets):
            skip |= {id(c) for c in ast.walk(node.value)}
    return skip


def _names_read(tree: ast.AST) -> set[str]:
    """Attribute names, keyword names and identifier-like string constants (``cfg["a"]``, ``get("a.b")``) of a
    module; docstrings, ``__all__`` and prose strings (with spaces) are left out."""
    skip, names = _not_reads(tree), set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute):
            names.add(node.attr)
        elif isinstance(node, ast.keyword) and node.arg:
            names.add(node.arg)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in skip:
            if _DOTTED.match(node.value):
                names.update(node.value.split("."))
    return names


def _code_names() -> set[str]:
    files = [p for p in VERL.rglob("*.py") if not _is_config_module(p)]
    return set().union(*(_names_read(ast.parse(p.read_text())) for p in files))


def _leaves(node, prefix: str = ""):
    for f in dataclasses.fields(node):
        if f.name.startswith("_"):
            continue
        value, key = getattr(node, f.name), f"{prefix}{f.name}"
        if dataclasses.is_dataclass(value):
            yield from _leaves(value, key + ".")
        else:
            yield key


def _reviewed(key: str) -> bool:
    tables = {s.key for s in (*UNSUPPORTED_FEATURES, *INERT_SETTINGS)}
    if key in tables or key in CONFIG_ONLY:
        return True
    covering = [s for p, s in COVERED_BY.items() if key == p or (p.endswith(".") and key.startswith(p))]
    return any(switch in tables for switch in covering)


def test_every_config_leaf_is_read_by_the_code_or_reviewed():
    """Walks the typed default config (every dataclass leaf, 380+) and fails on a leaf that no module outside the
    config modules reads (by name: each part of its dotted path appears as an attribute, keyword or key string in
    the code) and that config_support does not list: refused or reported, a sub-key covered by a listed switch
    (COVERED_BY), or consumed by the config itself (CONFIG_ONLY). Such a leaf would be accepted and ignored
    silently. A name-based check: a leaf sharing its name with a read one passes, so the behaviour tests of the
    implemented keys (balance_batch, the refusals, the report) are what proves those."""
    names, typed = _code_names(), _validate()
    unread = [key for key in _leaves(typed) if not all(part in names for part in key.split("."))]
    assert len(unread) > 50  # the walk sees the upstream keys this distribution lists (not a vacuous pass)
    silent = [key for key in unread if not _reviewed(key)]
    assert not silent, f"config leaves neither read by the code nor listed in verl.utils.config_support: {silent}"
