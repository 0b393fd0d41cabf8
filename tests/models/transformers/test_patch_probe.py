"""The call-path probe (verl/models/transformers/patch_probe.py): "applied" means the patched code ran.

The probe runs a tiny packed batch through the model in train() and eval() mode; a patch whose code does not run
(with the packed boundaries) is reported ``not on the call path``, and a required one stops the run naming the
transformers version.
"""

import pytest
import torch
import transformers

from verl.models.tiny import build_tiny_model
from verl.models.transformers import packed_forward, qwen3_5
from verl.models.transformers.instance_patch import call_original_forward, set_forward
from verl.models.transformers.patch_registry import (
    PATCH_REGISTRY,
    ModelPatch,
    PatchRegistry,
    _load_builtin_patches,
    apply_patches,
    get_patch_status,
)

pytestmark = pytest.mark.tf_compat


def test_every_builtin_patch_declares_what_its_code_records():
    """Every registered patch has a probe key, so no built-in patch can be reported applied without running."""
    _load_builtin_patches()
    assert PATCH_REGISTRY.patches
    assert [name for name, patch in PATCH_REGISTRY.patches.items() if not patch.probe_key] == []


def test_applied_patches_are_probed_in_both_modes_and_the_model_is_left_as_it_was():
    """Invariant: after apply_patches every applied patch of a tiny Qwen3.5-MoE is marked probed (its code ran in
    train() and eval()), and the probe leaves the model's mode, its parameters' gradients and the host RNG as they
    were."""
    model = build_tiny_model("qwen3_5_moe", 256)  # eval() mode
    torch.manual_seed(11)
    expected_draw = torch.rand(3)
    torch.manual_seed(11)
    statuses = apply_patches(model, platform="cpu", report=False)
    assert torch.equal(torch.rand(3), expected_draw)
    applied = {s.name: s.probed for s in statuses if s.state == "applied"}
    assert applied["qwen3_5-varlen-gdn"] and all(applied.values())  # (5.4.0 skips varlen-attention-cpu, with reason)
    assert not model.training and all(p.grad is None for p in model.parameters())
    assert "call path not probed" not in get_patch_status(model)["qwen3_5-varlen-gdn"].line()


def _miss_the_gdn(gdn, backend):
    """The varlen-GDN patch made to miss: its forward lands on the wrong module (the layer's output norm, as a
    pass-through), while the layer is marked patched as before."""
    set_forward(gdn.norm, call_original_forward)
    object.__setattr__(gdn, packed_forward.VARLEN_PATCHED_ATTR, True)


def test_a_required_patch_that_misses_stops_the_build_naming_the_transformers_version(monkeypatch, capsys):
    """Mutation: the GDN patch writes its forward to the wrong module. The report line says ``not on the call path``
    and the build stops with a RuntimeError naming the patch and the installed transformers version (on >= 5.20 HF's
    own kernel refuses the packed probe; on 5.4 it silently leaks: both are caught)."""
    monkeypatch.setattr(qwen3_5, "_patch_gdn_instance", _miss_the_gdn)
    model = build_tiny_model("qwen3_5_moe", 256)
    with pytest.raises(RuntimeError) as error:
        apply_patches(model, platform="cpu", report=True)
    message = str(error.value)
    assert "'qwen3_5-varlen-gdn'" in message and f"transformers {transformers.__version__}" in message
    assert "not on the call path" in message and "before its first step" in message
    assert "qwen3_5-varlen-gdn                   not on the call path" in capsys.readouterr().out


def test_a_layer_that_runs_without_the_boundaries_is_named(monkeypatch):
    """Mutation: the packed forward stops handing cu_seqlens down. The patched GDN code runs, but without the
    boundaries, which would leak state across sequences: reported as such, and the build stops."""
    monkeypatch.setattr(packed_forward, "packed_attention_kwargs", lambda packed, flash_kwargs=True: {})
    model = build_tiny_model("qwen3_5_moe", 256)
    with pytest.raises(RuntimeError, match=r"in train\(\) and eval\(\) it ran without the packed boundaries"):
        apply_patches(model, platform="cpu", report=False)


def test_an_optional_patch_off_the_call_path_is_reported_and_the_run_goes_on():
    """An optional patch whose code never runs is reported ``not on the call path`` (not ``applied``) and the other
    patches are unaffected; nothing is raised."""
    registry = PatchRegistry()
    registry.register(qwen3_5.VARLEN_GDN_PATCH)
    registry.register(
        ModelPatch(
            name="never-runs",
            model_types=("qwen3_5_moe",),
            platforms=("cpu",),
            apply=lambda model: None,
            probe_key="never-runs",
        )
    )
    model = build_tiny_model("qwen3_5_moe", 256)
    statuses = {s.name: s for s in apply_patches(model, platform="cpu", registry=registry, report=False)}
    assert statuses["never-runs"].state == "not on the call path"
    assert statuses["never-runs"].reason == "in train() and eval() its code never ran"
    assert statuses["qwen3_5-varlen-gdn"].state == "applied" and statuses["qwen3_5-varlen-gdn"].probed


def test_a_patch_without_probe_says_so_in_the_report():
    """A (user-registered) patch with no probe key is applied but reported as not probed, never as proven."""
    registry = PatchRegistry()
    registry.register(
        ModelPatch(name="unprobed", model_types=("qwen3_5_moe",), platforms=("cpu",), apply=lambda model: None)
    )
    model = build_tiny_model("qwen3_5_moe", 256)
    (status,) = apply_patches(model, platform="cpu", registry=registry, report=False)
    assert status.state == "applied" and not status.probed
    assert "applied (call path not probed)" in status.line()
