"""Per-instance forwards (verl/models/transformers/instance_patch.py): they survive what later model-wide passes do
to ``forward`` attributes, touch no class, and a patched model deep-copies, pickles and round-trips its state."""

import copy
import pickle

import pytest
import torch
import torch.nn as nn

from verl.models.tiny import build_tiny_model
from verl.models.transformers.instance_patch import (
    call_original_forward,
    has_own_forward,
    original_class,
    set_forward,
)
from verl.models.transformers.packed_forward import forward_packed
from verl.models.transformers.patch_registry import apply_patches, get_patch_status
from verl.utils.packing import pack_padded_batch

pytestmark = pytest.mark.tf_compat


class _Doubler(nn.Module):
    def forward(self, x):
        return 2 * x


def _plus_one(module, x):
    return call_original_forward(module, x) + 1


def test_own_forward_survives_a_reset_of_the_instance_forward_and_leaves_the_class_alone():
    """Invariant: after ``set_forward`` the instance runs the replacement even when something pops or rebinds the
    instance's ``forward`` attribute (what kernels' ``kernelize`` does on ``train()`` in transformers 5.25); the
    class, and other instances of it, still run the original forward; name and isinstance are unchanged."""
    patched, fresh = _Doubler(), _Doubler()
    set_forward(patched, _plus_one)
    x = torch.tensor([3.0])
    assert patched(x).item() == 7.0  # 2 * 3 + 1
    vars(patched).pop("forward", None)  # kernels' reset of an instance to its class's forward
    assert patched(x).item() == 7.0
    assert fresh(x).item() == 6.0 and _Doubler.forward(patched, x).item() == 6.0  # the class is untouched
    assert type(fresh) is _Doubler and original_class(patched) is _Doubler and original_class(fresh) is _Doubler
    assert isinstance(patched, _Doubler) and type(patched).__name__ == "_Doubler"
    assert has_own_forward(patched) and not has_own_forward(fresh)
    assert type(patched).kernel_condition(patched) is False  # the kernels library's opt-out hook


def test_bound_methods_are_refused():
    """A bound method in the instance dict is what made deep copies recurse: refused with the reason."""
    module = _Doubler()
    with pytest.raises(TypeError, match="plain function"):
        set_forward(module, module.forward)


def _packed(device: str = "cpu"):
    lengths = (5, 2, 6)
    ids = torch.randint(1, 200, (3, 6), generator=torch.Generator().manual_seed(3))
    mask = (torch.arange(6)[None] < torch.tensor(lengths)[:, None]).long()
    return pack_padded_batch(ids.to(device), mask.to(device))


def _gdn_modules(model):
    return [m for m in model.modules() if type(m).__name__.endswith("GatedDeltaNet")]


@pytest.mark.parametrize("roundtrip", ["deepcopy", "pickle"])
def test_patched_qwen3_5_moe_deepcopies_and_pickles(roundtrip):
    """Invariant: a deep copy / an unpickled copy of a patched tiny Qwen3.5-MoE is itself patched (every GDN layer
    runs the project's forward, the report travels along) and gives the original's packed logits exactly; it is
    independent of the original (changing its weights does not change the original). Before, ``copy.deepcopy``
    recursed without end on the bound-method forward."""
    model = build_tiny_model("qwen3_5_moe", 256)
    apply_patches(model, platform="cpu", report=False)
    packed = _packed()
    with torch.no_grad():
        expected = forward_packed(model, packed)
        copied = copy.deepcopy(model) if roundtrip == "deepcopy" else pickle.loads(pickle.dumps(model))
        assert all(has_own_forward(m) for m in _gdn_modules(copied)) and len(_gdn_modules(copied)) == 3
        assert get_patch_status(copied)["qwen3_5-varlen-gdn"].state == "applied"
        torch.testing.assert_close(forward_packed(copied, packed), expected, atol=0, rtol=0)
        for p in copied.parameters():
            p.add_(0.1)
        assert (forward_packed(copied, packed) - expected).abs().max().item() > 1e-3
        torch.testing.assert_close(forward_packed(model, packed), expected, atol=0, rtol=0)


def test_state_dict_of_a_patched_model_round_trips_into_an_unpatched_one():
    """Invariant: patching adds no parameter or buffer (the state-dict keys equal an unpatched model's), and a state
    dict saved from a patched model, loaded into a freshly built and patched model of other weights, reproduces the
    packed logits exactly (a control: before loading they differ)."""
    patched = build_tiny_model("qwen3_5_moe", 256, seed=0)
    apply_patches(patched, platform="cpu", report=False)
    plain = build_tiny_model("qwen3_5_moe", 256, seed=0)
    assert list(patched.state_dict()) == list(plain.state_dict())
    other = build_tiny_model("qwen3_5_moe", 256, seed=1)
    apply_patches(other, platform="cpu", report=False)
    packed = _packed()
    with torch.no_grad():
        expected = forward_packed(patched, packed)
        assert (forward_packed(other, packed) - expected).abs().max().item() > 1e-3
        other.load_state_dict(patched.state_dict())
        torch.testing.assert_close(forward_packed(other, packed), expected, atol=0, rtol=0)


def test_npu_patched_model_deepcopies():
    """The NPU patches (simulated Ascend) keep no torch_npu module or closure on the instance: a deep copy of an
    NPU-patched Qwen3.5-MoE is patched the same way and gives the same packed logits."""
    from verl.utils.platform.npu_sim import simulated_ascend

    with simulated_ascend():
        model = build_tiny_model("qwen3_5_moe", 256).to("npu")
        statuses = {s.name: s.state for s in apply_patches(model, platform="npu", report=False)}
        assert statuses["npu-rms-norm"] == statuses["npu-grouped-matmul-moe"] == "applied"
        packed = _packed("npu")
        with torch.no_grad():
            expected = forward_packed(model, packed).cpu()
            copied = copy.deepcopy(model)
            torch.testing.assert_close(forward_packed(copied, packed).cpu(), expected, atol=0, rtol=0)
        assert sum(has_own_forward(m) for m in copied.modules()) == sum(has_own_forward(m) for m in model.modules())


def test_hub_kernelize_cannot_replace_a_patched_forward():
    """With the ``kernels`` package (transformers >= 5.25 installs it), transformers' own ``kernelize`` of a model —
    what ``from_pretrained`` and every mode change run — leaves the patched GDN layers on the project's forward
    (their class opts out of kernelization), with the packed boundaries, in train and eval mode."""
    pytest.importorskip("kernels")
    hub_kernels = pytest.importorskip("transformers.integrations.hub_kernels")
    from kernels import Mode

    from verl.models.transformers.patch_probe import missing_reason, run_probe

    model = build_tiny_model("qwen3_5_moe", 256)
    apply_patches(model, platform="cpu", report=False)
    hub_kernels.kernelize(model, mode=Mode.TRAINING)
    calls = run_probe(model, torch.device("cpu"))
    assert missing_reason(calls, "qwen3_5-varlen-gdn") is None
    assert calls.good["qwen3_5-varlen-gdn@train"] == calls.good["qwen3_5-varlen-gdn@eval"] == 3  # 3 GDN layers
