"""Backend selection of verl.ops and the fla adapters (fla/triton are not installed here: fakes stand in)."""

import importlib
import logging
import sys
import types

import pytest
import torch

from verl.ops import backends, causal_conv1d, chunk_gated_delta_rule
from verl.ops.backends import select_backend


def _never(*_):
    raise AssertionError("fla availability must not be probed on this device")


def test_cpu_always_torch_and_never_probes_fla():
    """On CPU the torch reference runs and fla is never imported (it crashes HF on CPU with triton installed)."""
    assert select_backend("op", "cpu", "auto", is_fla_available=_never) == "torch"
    assert select_backend("op", "cpu", "torch", is_fla_available=_never) == "torch"
    with pytest.raises(ValueError, match="CUDA GPU or an Ascend NPU"):
        select_backend("op", "cpu", "fla", is_fla_available=_never)


@pytest.mark.parametrize("device", ["cuda", "npu"])
def test_accelerators_prefer_fla_and_fall_back_loudly(device, caplog):
    """On CUDA/NPU: fla when importable; otherwise torch with a warning, or a RuntimeError if fla was demanded."""
    assert select_backend("op", device, "auto", is_fla_available=lambda: True) == "fla"
    assert select_backend("op", device, "torch", is_fla_available=_never) == "torch"
    backends._warn_fallback.cache_clear()
    with caplog.at_level(logging.WARNING, logger="verl.ops.backends"):
        assert select_backend("op", device, "auto", is_fla_available=lambda: False) == "torch"
    assert "pure-torch" in caplog.text
    with pytest.raises(RuntimeError, match="triton-ascend"):
        select_backend("op", device, "fla", is_fla_available=lambda: False)


def test_unknown_backend_name():
    """A typo in the backend name is a ValueError listing the valid names."""
    with pytest.raises(ValueError, match="valid"):
        select_backend("op", "cpu", "triton")


def test_fla_not_importable_here():
    """This CPU environment has no fla: the probe says so instead of raising."""
    backends.fla_available.cache_clear()
    assert backends.fla_available() is False


def _install_fake_fla(monkeypatch, calls):
    def fake_chunk(q, k, v, g, beta, **kw):
        calls["chunk"] = dict(q=q, k=k, v=v, **kw)
        return torch.zeros_like(v), None

    def fake_conv(x, weight, bias=None, activation=None, cu_seqlens=None, **kw):
        calls["conv"] = dict(x=x, cu_seqlens=cu_seqlens, activation=activation)
        return x.clone(), None

    gdr = types.ModuleType("fla.ops.gated_delta_rule")
    gdr.chunk_gated_delta_rule = fake_chunk
    conv = types.ModuleType("fla.modules.causal_conv1d")
    conv.causal_conv1d = fake_conv
    for name, module in {
        "fla": types.ModuleType("fla"),
        "fla.ops": types.ModuleType("fla.ops"),
        "fla.modules": types.ModuleType("fla.modules"),
        "fla.ops.gated_delta_rule": gdr,
        "fla.modules.causal_conv1d": conv,
    }.items():
        monkeypatch.setitem(sys.modules, name, module)
    # by module object: `verl.ops.causal_conv1d` as a dotted attribute path is the re-exported function
    for module in ("verl.ops.gated_delta_rule", "verl.ops.causal_conv1d"):
        monkeypatch.setattr(importlib.import_module(module), "select_backend", lambda *a, **k: "fla")


def test_fla_adapters_pass_cu_seqlens_and_expand_grouped_heads(monkeypatch):
    """The fla adapters hand fla contiguous tensors, int64 cu_seqlens, and q/k repeated to the value-head count
    (exact for fla releases without grouped value heads); the conv returns the tensor, not fla's tuple."""
    calls = {}
    _install_fake_fla(monkeypatch, calls)
    q = torch.randn(1, 7, 2, 4)
    v = torch.randn(1, 7, 4, 3)
    g, beta = -torch.rand(1, 7, 4), torch.rand(1, 7, 4)
    cu = torch.tensor([0, 3, 7], dtype=torch.int32)
    chunk_gated_delta_rule(q, q.clone(), v, g, beta, cu_seqlens=cu, use_qk_l2norm_in_kernel=True)
    seen = calls["chunk"]
    assert seen["q"].shape == (1, 7, 4, 4) and seen["k"].shape == (1, 7, 4, 4)
    assert torch.equal(seen["q"][:, :, 1], q[:, :, 0]) and torch.equal(seen["q"][:, :, 2], q[:, :, 1])
    assert seen["cu_seqlens"].dtype == torch.int64 and seen["cu_seqlens"].tolist() == [0, 3, 7]
    assert seen["use_qk_l2norm_in_kernel"] is True
    x = torch.randn(1, 7, 5).transpose(1, 2).contiguous().transpose(1, 2)  # strided view
    out = causal_conv1d(x, torch.randn(5, 4), activation="silu", cu_seqlens=cu)
    assert isinstance(out, torch.Tensor) and calls["conv"]["x"].is_contiguous()
    assert calls["conv"]["cu_seqlens"].dtype == torch.int64
