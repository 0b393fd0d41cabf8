"""The chunked varlen gated delta rule against a per-token recurrence reference (verl/ops/gated_delta_rule.py)."""

import pytest
import torch

from verl.ops.gated_delta_rule import chunk_gated_delta_rule, l2norm, torch_chunk_gated_delta_rule
from verl.utils.packing import cu_seqlens_from_lengths

H, HV, DK, DV = 2, 4, 8, 6  # grouped value heads: v head h reads q/k head h // 2
# includes length 1, lengths below / equal to / just above the chunk size, and not divisible by it
LENGTHS = (1, 5, 16, 17, 40, 3)


def reference_recurrence(q, k, v, g, beta, lengths, scale, initial_state=None):
    """Per-token loop, one sequence at a time (the definition in docs/qwen3_5.md, "Gated DeltaNet").

    q, k (T, H, K) already l2-normalised; v (T, HV, V); g, beta (T, HV). Returns o (T, HV, V), final (N, HV, K, V).
    """
    groups = v.shape[1] // q.shape[1]
    q, k = q.repeat_interleave(groups, 1) * scale, k.repeat_interleave(groups, 1)
    outs, finals, start = [], [], 0
    for n, length in enumerate(lengths):
        state = q.new_zeros(v.shape[1], q.shape[-1], v.shape[-1]) if initial_state is None else initial_state[n]
        for t in range(start, start + length):
            kt, vt = k[t], v[t]  # (HV, K), (HV, V)
            # S_t = e^{g} (I - β k kᵀ) S_{t-1} + β k vᵀ
            decayed = g[t].exp()[:, None, None] * state
            correction = vt - torch.einsum("hk,hkv->hv", kt, decayed)
            state = decayed + beta[t][:, None, None] * torch.einsum("hk,hv->hkv", kt, correction)
            outs.append(torch.einsum("hk,hkv->hv", q[t], state))
        finals.append(state)
        start += length
    return torch.stack(outs), torch.stack(finals)


def _inputs(lengths=LENGTHS, dtype=torch.float64, seed=0, requires_grad=False):
    gen = torch.Generator().manual_seed(seed)
    total = sum(lengths)

    def rand(*shape):
        return torch.randn(*shape, generator=gen, dtype=dtype)

    q, k = rand(1, total, H, DK), rand(1, total, H, DK)
    v = rand(1, total, HV, DV)
    # half the heads decay fast, half slowly (long memory, so a leaked state would persist)
    rate = torch.tensor([2.0, 0.02, 1.0, 0.05], dtype=dtype)
    g = -torch.nn.functional.softplus(rand(1, total, HV)) * rate
    beta = torch.sigmoid(rand(1, total, HV))
    tensors = [q, k, v, g, beta]
    if requires_grad:
        tensors = [t.requires_grad_() for t in tensors]
    return tensors


def _ref(q, k, v, g, beta, lengths, initial_state=None):
    return reference_recurrence(l2norm(q[0]), l2norm(k[0]), v[0], g[0], beta[0], lengths, DK**-0.5, initial_state)


@pytest.mark.parametrize("chunk_size", [4, 16, 64])
def test_forward_matches_recurrence_fp64(chunk_size):
    """Invariant: chunked varlen output and final states equal the per-token recurrence with a state reset at
    every boundary (fp64: the algebra is exact up to rounding, 1e-10)."""
    q, k, v, g, beta = _inputs()
    cu = cu_seqlens_from_lengths(torch.tensor(LENGTHS))
    out, final = torch_chunk_gated_delta_rule(
        q, k, v, g, beta, cu_seqlens=cu, use_qk_l2norm_in_kernel=True, output_final_state=True, chunk_size=chunk_size
    )
    ref_out, ref_final = _ref(q, k, v, g, beta, LENGTHS)
    assert out.shape == (1, sum(LENGTHS), HV, DV)
    assert (out[0] - ref_out).abs().max().item() <= 1e-10
    assert (final - ref_final).abs().max().item() <= 1e-10


@pytest.mark.parametrize("chunk_size", [16, 64])
def test_forward_and_backward_fp32_within_1e5(chunk_size):
    """Invariant: in fp32, outputs and the gradients of q, k, v, g, beta agree with the fp64 reference within
    1e-5 (max |Δ|; values and gradients are O(1), so this is ~1e-5 relative)."""
    inputs32 = _inputs(dtype=torch.float32, requires_grad=True)
    inputs64 = [t.detach().double().requires_grad_() for t in inputs32]
    cu = cu_seqlens_from_lengths(torch.tensor(LENGTHS))
    out, _ = chunk_gated_delta_rule(*inputs32, cu_seqlens=cu, use_qk_l2norm_in_kernel=True, backend="torch")
    ref_out, _ = _ref(*inputs64, LENGTHS)
    weights = torch.randn(ref_out.shape, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    (out[0].double() * weights).sum().backward()
    (ref_out * weights).sum().backward()
    assert (out[0].double() - ref_out).abs().max().item() <= 1e-5
    for mine, ref, name in zip(inputs32, inputs64, ("q", "k", "v", "g", "beta")):
        assert (mine.grad.double() - ref.grad).abs().max().item() <= 1e-5, name


def test_initial_state_per_sequence():
    """Each packed sequence starts from its own initial state (not the previous sequence's final state)."""
    q, k, v, g, beta = _inputs()
    init = torch.randn(len(LENGTHS), HV, DK, DV, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    cu = cu_seqlens_from_lengths(torch.tensor(LENGTHS))
    out, final = torch_chunk_gated_delta_rule(
        q, k, v, g, beta, cu_seqlens=cu, initial_state=init, output_final_state=True, use_qk_l2norm_in_kernel=True
    )
    ref_out, ref_final = _ref(q, k, v, g, beta, LENGTHS, initial_state=init)
    assert (out[0] - ref_out).abs().max().item() <= 1e-10
    assert (final - ref_final).abs().max().item() <= 1e-10


def test_no_leak_and_leak_control():
    """A packed sequence's output equals running it alone; treating the row as ONE sequence (what HF does without
    cu_seqlens) differs by far more than the tolerance, so the boundary reset is what the test checks."""
    q, k, v, g, beta = _inputs()
    cu = cu_seqlens_from_lengths(torch.tensor(LENGTHS))
    packed, _ = torch_chunk_gated_delta_rule(q, k, v, g, beta, cu_seqlens=cu, use_qk_l2norm_in_kernel=True)
    leaky, _ = torch_chunk_gated_delta_rule(q, k, v, g, beta, use_qk_l2norm_in_kernel=True)
    s, e = int(cu[4]), int(cu[5])  # the 40-token sequence
    alone, _ = torch_chunk_gated_delta_rule(*(t[:, s:e] for t in (q, k, v, g, beta)), use_qk_l2norm_in_kernel=True)
    assert (packed[:, s:e] - alone).abs().max().item() <= 1e-12
    assert (leaky[:, s:e] - alone).abs().max().item() > 1e-2


def test_batch_rows_equal_packing_the_rows():
    """Without cu_seqlens each row of a (B, T) batch is one sequence: identical to packing the rows."""
    lengths = (12, 12, 12)
    q, k, v, g, beta = _inputs(lengths)
    batched, final_b = torch_chunk_gated_delta_rule(
        *(t.reshape(3, 12, *t.shape[2:]) for t in (q, k, v, g, beta)), output_final_state=True, chunk_size=8
    )
    cu = cu_seqlens_from_lengths(torch.tensor(lengths))
    packed, final_p = torch_chunk_gated_delta_rule(
        q, k, v, g, beta, cu_seqlens=cu, output_final_state=True, chunk_size=8
    )
    assert torch.allclose(batched.reshape(1, 36, HV, DV), packed, atol=1e-12, rtol=0)
    assert torch.allclose(final_b, final_p, atol=1e-12, rtol=0)


def test_bad_inputs_raise():
    """Bad cu_seqlens, a batch > 1 with cu_seqlens, and mismatched head counts are ValueErrors."""
    q, k, v, g, beta = _inputs()
    with pytest.raises(ValueError, match="end at the packed token count"):
        chunk_gated_delta_rule(q, k, v, g, beta, cu_seqlens=torch.tensor([0, 5], dtype=torch.int32))
    with pytest.raises(ValueError, match="start at 0"):
        chunk_gated_delta_rule(q, k, v, g, beta, cu_seqlens=torch.tensor([2, sum(LENGTHS)], dtype=torch.int32))
    two = [torch.cat([t, t]) for t in (q, k, v, g, beta)]
    with pytest.raises(ValueError, match="batch 1"):
        chunk_gated_delta_rule(*two, cu_seqlens=torch.tensor([0, sum(LENGTHS)], dtype=torch.int32))
    with pytest.raises(ValueError, match="multiple"):
        chunk_gated_delta_rule(q, k, v[:, :, :3], g[:, :, :3], beta[:, :, :3])
