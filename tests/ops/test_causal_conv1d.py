"""Varlen causal depthwise conv1d against nn.Conv1d run on each sequence alone (verl/ops/causal_conv1d.py)."""

import pytest
import torch
import torch.nn.functional as F

from verl.ops.causal_conv1d import causal_conv1d
from verl.utils.packing import cu_seqlens_from_lengths

D, W = 6, 4
LENGTHS = (1, 2, 3, 9, 5)  # sequences shorter than the kernel width included


def _conv_alone(x, weight, bias):
    """What HF's torch fallback computes for one sequence: F.conv1d with W-1 zeros on the left, then SiLU.
    x (L, D) -> (L, D)."""
    y = F.conv1d(x.t()[None], weight[:, None], bias, padding=W - 1, groups=D)[0, :, : x.shape[0]]
    return F.silu(y).t()


def _inputs(dtype=torch.float64, requires_grad=False):
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(1, sum(LENGTHS), D, generator=gen, dtype=dtype)
    weight = torch.randn(D, W, generator=gen, dtype=dtype)
    bias = torch.randn(D, generator=gen, dtype=dtype)
    return [t.requires_grad_(requires_grad) for t in (x, weight, bias)]


def _per_sequence(x, weight, bias):
    return torch.cat([_conv_alone(seg, weight, bias) for seg in x[0].split(list(LENGTHS))])[None]


def test_varlen_equals_each_sequence_alone():
    """Invariant: every token sees only its own sequence (zero left context at each boundary); fp64 exact."""
    x, weight, bias = _inputs()
    cu = cu_seqlens_from_lengths(torch.tensor(LENGTHS))
    out = causal_conv1d(x, weight, bias, activation="silu", cu_seqlens=cu)
    assert (out - _per_sequence(x, weight, bias)).abs().max().item() <= 1e-12
    # control: one conv over the whole row leaks into the first W-1 tokens of the following sequences
    leaky = _conv_alone(x[0], weight, bias)[None]
    assert (leaky - _per_sequence(x, weight, bias)).abs().max().item() > 1e-2


def test_gradients_fp32_match_reference():
    """Invariant: fp32 gradients w.r.t. x, weight and bias equal the per-sequence reference's (fp64) within 1e-5."""
    x, weight, bias = _inputs(torch.float32, requires_grad=True)
    ref_inputs = [t.detach().double().requires_grad_() for t in (x, weight, bias)]
    cu = cu_seqlens_from_lengths(torch.tensor(LENGTHS))
    out = causal_conv1d(x, weight, bias, activation="silu", cu_seqlens=cu)
    ref = _per_sequence(*ref_inputs)
    probe = torch.randn(ref.shape, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    (out.double() * probe).sum().backward()
    (ref * probe).sum().backward()
    assert (out.double() - ref).abs().max().item() <= 1e-5
    for mine, theirs in zip((x, weight, bias), ref_inputs):
        assert (mine.grad.double() - theirs.grad).abs().max().item() <= 1e-5


def test_rows_without_cu_seqlens_and_no_activation():
    """Without cu_seqlens each batch row is one sequence; activation=None and no bias match F.conv1d directly."""
    x, weight, _ = _inputs()
    rows = x[0, :12].reshape(2, 6, D)
    out = causal_conv1d(rows, weight, None)
    ref = F.conv1d(rows.transpose(1, 2), weight[:, None], None, padding=W - 1, groups=D)[..., :6].transpose(1, 2)
    assert (out - ref).abs().max().item() <= 1e-12


def test_bad_inputs_raise():
    """Batch > 1 with cu_seqlens, bad cu_seqlens, an unknown activation and a wrong weight shape are ValueErrors."""
    x, weight, bias = _inputs()
    with pytest.raises(ValueError, match="batch 1"):
        causal_conv1d(torch.cat([x, x]), weight, cu_seqlens=torch.tensor([0, 20], dtype=torch.int32))
    with pytest.raises(ValueError, match="strictly increasing"):
        causal_conv1d(x, weight, cu_seqlens=torch.tensor([0, 3, 3, 20], dtype=torch.int32))
    with pytest.raises(ValueError, match="activation"):
        causal_conv1d(x, weight, activation="gelu")
    with pytest.raises(ValueError, match="weight"):
        causal_conv1d(x, weight.t())
