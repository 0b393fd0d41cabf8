"""The simulated torch_npu ops follow their documented semantics (checked by hand or against plain torch)."""

import pytest
import torch
import torch.nn.functional as F


@pytest.fixture
def torch_npu(npu_sim):
    import torch_npu

    return torch_npu


def test_ops_refuse_cpu_tensors(torch_npu):
    """Like the real kernels, the fused ops only take npu tensors."""
    with pytest.raises(RuntimeError, match="expected all tensors on npu"):
        torch_npu.npu_swiglu(torch.ones(2, 4))


def test_rms_norm_by_hand(torch_npu):
    """x = [3, 4]: mean(x²) = 12.5, rstd = 1/sqrt(12.5 + 0) = 0.28284; y = x·rstd·[1, 2] = [0.8485, 2.2627]."""
    x = torch.tensor([[3.0, 4.0]], device="npu")
    y, rstd = torch_npu.npu_rms_norm(x, torch.tensor([1.0, 2.0], device="npu"), epsilon=0.0)
    torch.testing.assert_close(y.cpu(), torch.tensor([[0.848528, 2.262742]]), atol=1e-6, rtol=0)
    torch.testing.assert_close(rstd.cpu(), torch.tensor([[0.282843]]), atol=1e-6, rtol=0)
    # zero-centred form: gamma [0, 1] acts as (1 + gamma) = [1, 2], same result
    y_gemma, _ = torch_npu.npu_gemma_rms_norm(x, torch.tensor([0.0, 1.0], device="npu"), epsilon=0.0)
    torch.testing.assert_close(y_gemma.cpu(), y.cpu(), atol=1e-6, rtol=0)


def test_swiglu_by_hand(torch_npu):
    """x = [a | b] = [0, 2 | 3, 5]: silu(0)·3 = 0, silu(2)·5 = 2·sigmoid(2)·5 = 8.8080."""
    out = torch_npu.npu_swiglu(torch.tensor([[0.0, 2.0, 3.0, 5.0]], device="npu"))
    torch.testing.assert_close(out.cpu(), torch.tensor([[0.0, 8.807971]]), atol=1e-5, rtol=0)


def test_rotary_mul_half_and_interleave(torch_npu):
    """x = [1, 2, 3, 4], cos = 0, sin = 1: half rotation gives [-3, -4, 1, 2]; interleaved gives [-2, 1, -4, 3]."""
    x = torch.tensor([1.0, 2.0, 3.0, 4.0], device="npu").view(1, 1, 1, 4)
    cos, sin = torch.zeros_like(x), torch.ones_like(x)
    assert torch_npu.npu_rotary_mul(x, cos, sin).flatten().tolist() == [-3.0, -4.0, 1.0, 2.0]
    assert torch_npu.npu_rotary_mul(x, cos, sin, rotary_mode="interleave").flatten().tolist() == [-2.0, 1.0, -4.0, 3.0]
    with pytest.raises(RuntimeError, match="4-D"):
        torch_npu.npu_rotary_mul(x.view(4), cos.view(4), sin.view(4))


def _causal_mask():
    return torch.triu(torch.ones(2048, 2048, dtype=torch.bool, device="npu"), diagonal=1)


def test_fusion_attention_tnd_equals_per_sequence_causal_sdpa(torch_npu):
    """TND with cumulative lengths [3, 8]: sequence 0 = tokens 0..2, sequence 1 = tokens 3..7, each causal, GQA
    (4 query heads over 2 kv heads) — equals causal SDPA run on each sequence separately."""
    torch.manual_seed(0)
    q, k, v = torch.randn(8, 4, 16), torch.randn(8, 2, 16), torch.randn(8, 2, 16)
    out = torch_npu.npu_fusion_attention(
        q.npu(),
        k.npu(),
        v.npu(),
        4,
        "TND",
        atten_mask=_causal_mask(),
        scale=0.25,
        sparse_mode=3,
        actual_seq_qlen=[3, 8],
        actual_seq_kvlen=[3, 8],
    )[0].cpu()
    expected = []
    for s, e in ((0, 3), (3, 8)):
        qs, ks, vs = (t[s:e].transpose(0, 1) for t in (q, k, v))  # (N, S, D)
        ks, vs = ks.repeat_interleave(2, 0), vs.repeat_interleave(2, 0)
        expected.append(F.scaled_dot_product_attention(qs, ks, vs, is_causal=True, scale=0.25).transpose(0, 1))
    torch.testing.assert_close(out, torch.cat(expected), atol=1e-6, rtol=1e-5)


def test_fusion_attention_rejects_bad_lengths_and_missing_mask(torch_npu):
    """Lengths must be cumulative and end at T; causal modes need the compressed 2048² mask."""
    q = torch.randn(5, 2, 8, device="npu")
    with pytest.raises(ValueError, match="cumulative"):
        torch_npu.npu_fusion_attention(
            q, q, q, 2, "TND", atten_mask=_causal_mask(), sparse_mode=3, actual_seq_qlen=[2, 3], actual_seq_kvlen=[2, 3]
        )
    with pytest.raises(RuntimeError, match="2048"):
        torch_npu.npu_fusion_attention(q, q, q, 2, "TND", sparse_mode=3, actual_seq_qlen=[5], actual_seq_kvlen=[5])


def test_grouped_matmul_groups_along_m_and_k(torch_npu):
    """group_type 0: rows [0,1] use W0 = I·1, row [2] uses W1 = I·2 → x·[1,1,2]; group_type 2 (weight gradient):
    Y_g = x[rows_g]ᵀ @ b[rows_g]."""
    x = torch.arange(6.0).view(3, 2)  # rows [0,1], [2,3], [4,5]
    w = torch.stack([torch.eye(2), 2 * torch.eye(2)])
    y = torch_npu.npu_grouped_matmul(
        [x.npu()],
        [w.npu()],
        group_list=torch.tensor([2, 1], device="npu"),
        split_item=3,
        group_type=0,
        group_list_type=1,
    )[0].cpu()
    assert y.tolist() == [[0.0, 1.0], [2.0, 3.0], [8.0, 10.0]]
    # cumulative group_list ([2, 3]) is the same grouping
    y_cum = torch_npu.npu_grouped_matmul([x.npu()], [w.npu()], group_list=[2, 3], split_item=3, group_type=0)[0]
    assert torch.equal(y_cum.cpu(), y)
    b = torch.ones(3, 1)
    dw = torch_npu.npu_grouped_matmul(
        [x.t().contiguous().npu()], [b.npu()], group_list=[2, 1], split_item=3, group_type=2, group_list_type=1
    )[0].cpu()
    # group 0: columns sums of rows 0..1 = [0+2, 1+3] = [2, 4]; group 1: row 2 = [4, 5]
    assert dw.tolist() == [[[2.0], [4.0]], [[4.0], [5.0]]]
    with pytest.raises(RuntimeError, match="do not add up"):
        torch_npu.npu_grouped_matmul([x.npu()], [w.npu()], group_list=[1, 1], split_item=3, group_type=0)


def test_cross_entropy_loss_matches_torch(torch_npu):
    """loss and log_prob equal F.cross_entropy / log_softmax (ignore_index honoured)."""
    torch.manual_seed(0)
    logits, target = torch.randn(5, 7), torch.tensor([0, 3, -100, 6, 2])
    loss, log_prob, _, _ = torch_npu.npu_cross_entropy_loss(logits.npu(), target.npu(), reduction="none")
    torch.testing.assert_close(loss.cpu(), F.cross_entropy(logits, target, reduction="none"), atol=1e-6, rtol=0)
    torch.testing.assert_close(log_prob.cpu(), torch.log_softmax(logits, -1), atol=1e-6, rtol=0)


def test_convolution_and_histc_on_device(npu_sim):
    """Kernels ATen routes specially for new devices work: conv1d (+ backward) equals the CPU; integer histc counts."""
    torch.manual_seed(0)
    x, w = torch.randn(1, 3, 10, requires_grad=True), torch.randn(3, 1, 4, requires_grad=True)
    ref = F.conv1d(x, w, padding=3, groups=3)
    ref.sum().backward()
    xn, wn = x.detach().npu().requires_grad_(), w.detach().npu().requires_grad_()
    out = F.conv1d(xn, wn, padding=3, groups=3)
    out.sum().backward()
    torch.testing.assert_close(out.detach().cpu(), ref.detach(), atol=1e-6, rtol=0)
    torch.testing.assert_close(wn.grad.cpu(), w.grad, atol=1e-5, rtol=0)
    with pytest.raises(RuntimeError, match="same device"):
        F.conv1d(xn, w, padding=3, groups=3)
    counts = torch.histc(torch.tensor([0, 2, 2, 3], device="npu", dtype=torch.int32), bins=4, min=0, max=3)
    assert counts.dtype == torch.int32 and counts.cpu().tolist() == [1, 0, 2, 1]
