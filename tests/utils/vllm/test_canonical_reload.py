"""The pieces of the exact weight sync that need no engine: block keys, the loader's kwargs, staging one layer.

The sync itself runs against the real vLLM engine in tests/workers/rollout/test_vllm_engine_sync.py and against the
vllm-ascend stand-in in tests/utils/vllm/test_patch.py.
"""

import pytest
import torch
import torch.nn as nn

from verl.utils.vllm.canonical_reload import CanonicalLayout, block_key
from verl.utils.vllm.loader import canonical_loader_kwargs


def test_block_keys_match_across_hf_and_vllm_names():
    """HF and vLLM name the same block differently; the key is (tower, block) either way; non-block -> None."""
    assert block_key("model.language_model.layers.3.mlp.gate.weight") == "text/layers.3"
    assert block_key("language_model.model.layers.3.mlp.gate") == "text/layers.3"
    assert block_key("model.layers.3.linear_attn.A_log") == "text/layers.3"
    assert block_key("model.visual.blocks.1.attn.qkv.weight") == "visual/blocks.1"
    assert block_key("visual.blocks.1.attn.qkv") == "visual/blocks.1"
    assert block_key("lm_head.weight") is None and block_key("model.visual.merger.linear_fc1.weight") is None


def test_loader_kwargs_carry_the_configured_format():
    assert canonical_loader_kwargs("dummy", {"num_threads": 2}) == {
        "load_format": "verl_canonical",
        "model_loader_extra_config": {"num_threads": 2, "verl_inner_load_format": "dummy"},
    }
    with pytest.raises(ValueError, match="verl_inner_load_format"):
        canonical_loader_kwargs("auto", {"verl_inner_load_format": "x"})


class _DoublingMethod:
    """A post-processing that changes values in place and keeps state (like a kernel setup on first call)."""

    def __init__(self):
        self.calls = 0

    def process_weights_after_loading(self, layer):
        self.calls += 1
        layer.weight = nn.Parameter(layer.weight.data * 2, requires_grad=False)


class _Layer(nn.Module):
    def __init__(self):
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(2, 3), requires_grad=False)
        self.weight.weight_loader = lambda param, w: param.data.copy_(w)
        self.register_parameter("bias", None)
        self.quant_method = _DoublingMethod()


def test_reload_processes_like_a_fresh_engine_and_keeps_the_storage():
    """Loading [[1..6]] into a layer whose processing doubles: the layer holds 2x the new values (not 4x: the kernel
    value is never processed again), in the same storage it had, with a pristine method (one call each), and the
    ``None`` bias entry survives; a group that does not touch the layer leaves it as it was."""
    model = nn.Module()
    model.layer = _Layer()
    layout = CanonicalLayout.capture(model)
    model.layer.quant_method.process_weights_after_loading(model.layer)  # what the engine does after loading
    storage = model.layer.weight.data_ptr()
    new = torch.arange(1.0, 7.0).view(2, 3)

    def load():
        param = model.layer.weight
        param.weight_loader(param, new)

    report = layout.reload(model, None, load)
    assert report.processed == ["layer"]
    assert torch.equal(model.layer.weight, 2 * new) and model.layer.weight.data_ptr() == storage
    assert model.layer.quant_method.calls == 1 and "bias" in model.layer._parameters
    untouched = layout.reload(model, None, lambda: None)
    assert untouched.untouched == ["layer"] and torch.equal(model.layer.weight, 2 * new)
