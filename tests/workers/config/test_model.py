"""HFModelConfig: cheap to build (no disk access), HF config loaded lazily from the path."""

import sys

from transformers import Qwen2Config

from verl.workers.config import HFModelConfig


def test_building_does_not_touch_the_disk():
    """A config with a non-existent path builds fine: nothing is loaded until an artefact is accessed."""
    cfg = HFModelConfig(path="/does/not/exist")
    assert cfg.local_path == "/does/not/exist"
    assert "hf_config" not in cfg  # lazily loaded artefacts are not config keys


def test_hf_config_is_loaded_lazily_and_cached(tmp_path):
    """hf_config reads config.json from hf_config_path (else path) on first access and caches it."""
    Qwen2Config(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, vocab_size=128).save_pretrained(tmp_path)
    cfg = HFModelConfig(path=str(tmp_path))
    assert cfg.hf_config.hidden_size == 32
    assert cfg.hf_config is cfg.hf_config


def test_external_lib_is_imported_only_on_load(tmp_path, monkeypatch):
    """external_lib is imported when an artefact is loaded, not when the config is built."""
    Qwen2Config(hidden_size=32, num_hidden_layers=1, num_attention_heads=4, vocab_size=128).save_pretrained(tmp_path)
    (tmp_path / "my_model_lib.py").write_text("LOADED = True\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    cfg = HFModelConfig(path=str(tmp_path), external_lib="my_model_lib")
    assert "my_model_lib" not in sys.modules
    assert cfg.hf_config.num_hidden_layers == 1
    assert sys.modules["my_model_lib"].LOADED
    monkeypatch.delitem(sys.modules, "my_model_lib")
