"""Field-report item 7: model patches apply each in isolation with a queryable status
(verl/models/transformers/patch_registry.py). A crashing optional patch is reported as failed and the patches
after it still apply; a crashing required patch stops the run naming the patch."""

import pytest
import torch.nn as nn

from verl.models.transformers.patch_registry import ModelPatch, PatchRegistry, apply_patches, get_patch_status


def _mark(name: str):
    def apply(model: nn.Module) -> None:
        model.marks.append(name)

    return apply


def _crash(model: nn.Module) -> None:
    raise AttributeError("module 'transformers.models.qwen3_5' has no attribute 'Qwen3_5GatedDeltaNet'")


def _registry(*patches: ModelPatch) -> PatchRegistry:
    registry = PatchRegistry()
    for patch in patches:
        registry.register(patch)
    return registry


def _model() -> nn.Module:
    model = nn.Linear(2, 2)
    model.marks = []
    return model


def test_a_crashing_optional_patch_is_isolated_and_the_others_still_apply():
    """Patches run in registration order: before, crash, after. The crash (what a transformers version
    difference does to a patch) leaves 'failed' with the exception in its status; 'after' still applies.
    Without the isolation the AttributeError escapes apply_patches and this test fails."""
    registry = _registry(
        ModelPatch("before", ("toy",), ("cpu",), _mark("before")),
        ModelPatch("crash", ("toy",), ("cpu",), _crash),
        ModelPatch("after", ("toy",), ("cpu",), _mark("after")),
    )
    model = _model()
    statuses = apply_patches(model, platform="cpu", model_type="toy", registry=registry, report=False)
    assert [(s.name, s.state) for s in statuses] == [("before", "applied"), ("crash", "failed"), ("after", "applied")]
    assert model.marks == ["before", "after"]
    status = get_patch_status(model)["crash"]
    assert status.reason.startswith("AttributeError: module 'transformers.models.qwen3_5'")


def test_a_crashing_required_patch_stops_the_run_naming_it():
    """A required patch is one without which training is wrong: its failure raises, naming the patch."""
    registry = _registry(ModelPatch("needed", ("toy",), ("cpu",), _crash, required=True))
    with pytest.raises(RuntimeError, match=r"required model patch 'needed' failed \(AttributeError"):
        apply_patches(_model(), platform="cpu", model_type="toy", registry=registry, report=False)
