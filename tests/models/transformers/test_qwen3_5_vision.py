"""The matmul vision patch embedding (field-report item 5) — verl/models/transformers/qwen3_5_vision.py."""

import pytest
import torch
from packaging.version import Version

from verl.models.tiny import build_tiny_model
from verl.models.transformers.instance_patch import has_own_forward
from verl.models.transformers.patch_registry import apply_patches, get_patch_status
from verl.models.transformers.qwen3_5_vision import matmul_patch_embed, use_matmul_patch_embed

pytestmark = pytest.mark.tf_compat

PATCH = "qwen3_5-vision-patch-embed-matmul"


def test_matmul_equals_conv3d_kernel_equal_stride():
    """Conv3d with kernel == stride is a linear map on flattened patches: fp64 equal to 1e-12, fp32 to 1e-5."""
    gen = torch.Generator().manual_seed(0)
    for dtype, tol in ((torch.float64, 1e-12), (torch.float32, 1e-5)):
        conv = torch.nn.Conv3d(3, 8, kernel_size=(2, 4, 4), stride=(2, 4, 4), bias=True).to(dtype)
        patches = torch.randn(11, 3 * 2 * 4 * 4, generator=gen, dtype=dtype)
        reference = conv(patches.view(-1, 3, 2, 4, 4)).view(-1, 8)
        assert (matmul_patch_embed(patches, conv) - reference).abs().max().item() <= tol


def _vision_inputs():
    gen = torch.Generator().manual_seed(1)
    return torch.randn(16 + 24, 96, generator=gen), torch.tensor([[1, 4, 4], [1, 4, 6]])


def test_patched_vision_tower_is_unchanged():
    """The whole vision tower gives the same embeddings with the matmul patch (fp32, 1e-5), and a text-only
    model has nothing to patch."""
    model = build_tiny_model("qwen3_5_vl", 256)
    pixels, grids = _vision_inputs()
    with torch.no_grad():
        before = model.model.visual(pixels, grid_thw=grids).pooler_output
        assert use_matmul_patch_embed(model) == 1
        after = model.model.visual(pixels, grid_thw=grids).pooler_output
    assert (before - after).abs().max().item() <= 1e-5
    assert use_matmul_patch_embed(build_tiny_model("qwen3_5", 256)) == 0


@pytest.mark.parametrize(
    "cann, state",
    [(Version("8.3.0"), "applied"), (None, "applied"), (Version("8.5.1"), "skipped"), (Version("8.5.2"), "skipped")],
)
def test_chosen_on_ascend_only_with_old_or_unknown_cann(monkeypatch, cann, state):
    """On the npu platform the patch applies when CANN < 8.5.1 or the version is unknown (the matmul is exact, so
    it is the safe choice), and is skipped with the version in the reason otherwise."""
    monkeypatch.setattr("verl.utils.device.get_cann_version", lambda: cann)
    model = build_tiny_model("qwen3_5_vl", 256)
    apply_patches(model, platform="npu", report=False)
    status = get_patch_status(model)[PATCH]
    assert status.state == state
    if state == "skipped":
        assert str(cann) in status.reason
    embed = model.model.visual.patch_embed
    assert has_own_forward(embed) == (state == "applied")


def test_not_registered_for_cpu():
    """On CPU the Conv3d is fine: the patch is not part of the CPU patch set."""
    model = build_tiny_model("qwen3_5_vl", 256)
    apply_patches(model, platform="cpu", report=False)
    assert PATCH not in get_patch_status(model)
