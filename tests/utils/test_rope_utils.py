"""Set-typed rope config keys arriving as lists (field-report item 8) — verl/utils/rope_utils.py."""

import json

import pytest
import transformers
from packaging.version import Version

from verl.utils.rope_utils import load_hf_config, normalize_rope_validation_keys

pytestmark = pytest.mark.tf_compat

ROPE = {
    "rope_type": "default",
    "rope_theta": 10_000_000.0,
    "partial_rotary_factor": 0.25,
    "mrope_section": [11, 11, 10],
    "mrope_interleaved": True,
}


def test_normalize_turns_lists_into_sets_at_any_depth():
    """Lists/tuples under set-typed keys become sets, nested configs included; other values are untouched."""
    raw = {
        "ignore_keys_at_rope_validation": ["a"],
        "text_config": {"ignore_keys_at_rope_validation": ("mrope_section", "mrope_interleaved"), "x": [1, 2]},
        "layer_types": ["linear_attention"],
    }
    out = normalize_rope_validation_keys(raw)
    assert out["ignore_keys_at_rope_validation"] == {"a"}
    assert out["text_config"]["ignore_keys_at_rope_validation"] == {"mrope_section", "mrope_interleaved"}
    assert out["text_config"]["x"] == [1, 2] and out["layer_types"] == ["linear_attention"]
    assert raw["ignore_keys_at_rope_validation"] == ["a"]  # the input is not modified


def _write_checkpoint_config(tmp_path):
    text = {
        "hidden_size": 64,
        "rope_parameters": ROPE,
        "ignore_keys_at_rope_validation": ["mrope_section", "mrope_interleaved"],
    }
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "qwen3_5_moe", "text_config": text}))
    return str(tmp_path)


def test_load_hf_config_accepts_list_typed_keys(tmp_path):
    """A config.json whose text_config carries ignore_keys_at_rope_validation as a JSON list loads on every
    supported transformers version (on 5.4.0 plain AutoConfig raises the set/list TypeError — checked below)."""
    path = _write_checkpoint_config(tmp_path)
    config = load_hf_config(path)
    assert config.model_type == "qwen3_5_moe"
    assert config.text_config.hidden_size == 64
    assert set(config.text_config.ignore_keys_at_rope_validation) >= {"mrope_section", "mrope_interleaved"}
    assert config.text_config.rope_parameters["mrope_section"] == [11, 11, 10]


def test_plain_autoconfig_fails_on_the_field_report_version(tmp_path):
    """Control, version-dependent: transformers < 5.5 raises on the list (the bug load_hf_config avoids); later
    versions accept it. On 5.4.0 this proves the previous test exercises the fix."""
    path = _write_checkpoint_config(tmp_path)
    if Version(transformers.__version__) < Version("5.5"):
        with pytest.raises(Exception, match="unsupported operand"):
            transformers.AutoConfig.from_pretrained(path)
    else:
        transformers.AutoConfig.from_pretrained(path)


def test_load_hf_config_is_autoconfig_without_set_keys(tmp_path):
    """Without set-typed keys load_hf_config is plain AutoConfig (same class and values)."""
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "qwen2", "hidden_size": 32}))
    config = load_hf_config(str(tmp_path))
    assert type(config).__name__ == "Qwen2Config" and config.hidden_size == 32
