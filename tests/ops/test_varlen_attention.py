"""The segment attention equals the mask path and HF's attention per sequence alone, outputs and gradients.

Two independent references, both HF's own ``sdpa_attention_forward`` (transformers.integrations.sdpa_attention):

* *the mask path* (what packed sdpa did before the lean attention): the whole packed row with the
  ``(1, 1, T, T)`` block-diagonal causal bool mask ``segment[i] == segment[j] and j <= i``;
* *alone*: every sequence through HF's attention by itself (no mask: HF uses ``is_causal``).

fp32; every op is an fp32 softmax over at most a few hundred keys, so 1e-5 absolute is ~100 ulp of room and a
wrong mask (one leaked key changes a row by O(1 / length)) is far outside it.
"""

from __future__ import annotations

import pytest
import torch
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from verl.ops.varlen_attention import chunked_causal_attention, varlen_causal_attention

HEADS, KV_HEADS, HEAD_DIM = 4, 2, 16
TOL = 1e-5


class _Module:
    """What HF's attention functions read from the attention module."""

    is_causal = True
    num_key_value_groups = HEADS // KV_HEADS
    training = False


def _cu_seqlens(lengths: list[int]) -> torch.Tensor:
    return torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32)


def _lengths(count: int, seed: int) -> list[int]:
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(1, 60, (count,), generator=generator).tolist()


def _qkv(total: int, seed: int = 0):
    generator = torch.Generator().manual_seed(seed)
    shapes = [(HEADS, total, HEAD_DIM), (KV_HEADS, total, HEAD_DIM), (KV_HEADS, total, HEAD_DIM)]
    return [torch.randn(s, generator=generator).requires_grad_() for s in shapes]


def _mask_path(q, k, v, cu_seqlens):
    total = q.shape[1]
    segment = torch.repeat_interleave(torch.arange(len(cu_seqlens) - 1), torch.diff(cu_seqlens).long())
    mask = (segment[:, None] == segment[None, :]) & torch.ones(total, total, dtype=torch.bool).tril()
    out, _ = sdpa_attention_forward(_Module(), q[None], k[None], v[None], mask[None, None], scaling=HEAD_DIM**-0.5)
    return out[0].transpose(0, 1)  # (1, T, H, d) -> (H, T, d)


def _alone(q, k, v, cu_seqlens):
    bounds = cu_seqlens.tolist()
    outs = []
    for a, b in zip(bounds[:-1], bounds[1:]):
        out, _ = sdpa_attention_forward(
            _Module(), q[None, :, a:b], k[None, :, a:b], v[None, :, a:b], None, scaling=HEAD_DIM**-0.5
        )
        outs.append(out[0].transpose(0, 1))
    return torch.cat(outs, dim=1)


def _grads(fn, q, k, v, cu_seqlens, weight):
    q.grad = k.grad = v.grad = None
    out = fn(q, k, v, cu_seqlens)
    (out * weight).sum().backward()
    return out.detach(), [t.grad.clone() for t in (q, k, v)]


def _assert_close(actual, expected):
    out_a, grads_a = actual
    out_e, grads_e = expected
    assert (out_a - out_e).abs().max().item() <= TOL
    for name, a, e in zip("qkv", grads_a, grads_e):
        assert (a - e).abs().max().item() <= TOL, f"d{name}"


@pytest.mark.parametrize("count", [1, 5, 50])
@pytest.mark.parametrize("long_segments", ["sdpa", "chunked"])
def test_equals_mask_path_and_alone(count: int, long_segments: str):
    """Packed batches of 1, 5, 50 sequences; chunk_tokens=32 sends the longer ones (33..59 tokens) down the long
    path (sdpa or chunked with 8-token key spans: several blocks, a partial last one) and batches the rest."""
    lengths = _lengths(count, seed=count)
    if count == 1:
        lengths = [57]
    cu = _cu_seqlens(lengths)
    q, k, v = _qkv(sum(lengths), seed=count)
    weight = torch.randn(q.shape, generator=torch.Generator().manual_seed(1))

    def lean(q_, k_, v_, cu_):
        return varlen_causal_attention(
            q_, k_, v_, cu_, long_segments=long_segments, chunk_tokens=32, key_span_tokens=8, batch_tokens=64
        )

    result = _grads(lean, q, k, v, cu, weight)
    _assert_close(result, _grads(_mask_path, q, k, v, cu, weight))
    _assert_close(result, _grads(_alone, q, k, v, cu, weight))


def test_many_short_sequences_one_batch_per_length():
    """A GRPO-like row (64 sequences of 50..56 tokens) with the default chunking: every segment is short, equal
    lengths share one sdpa call; the result is the mask path's."""
    lengths = [50 + i % 7 for i in range(64)]
    cu = _cu_seqlens(lengths)
    q, k, v = _qkv(sum(lengths), seed=3)
    weight = torch.randn(q.shape, generator=torch.Generator().manual_seed(2))
    result = _grads(lambda *a: varlen_causal_attention(*a), q, k, v, cu, weight)
    _assert_close(result, _grads(_mask_path, q, k, v, cu, weight))


def test_chunked_single_sequence_uneven_blocks():
    """One 300-token sequence, 64-token query blocks and 96-token key spans (blocks straddle the diagonal at
    different offsets); equals HF's attention on it (same heads: no grouping)."""
    generator = torch.Generator().manual_seed(5)
    q, k, v = (torch.randn(HEADS, 300, HEAD_DIM, generator=generator).requires_grad_() for _ in range(3))
    weight = torch.randn(q.shape, generator=generator)

    class _Same(_Module):
        num_key_value_groups = 1

    out = chunked_causal_attention(q, k, v, chunk_tokens=64, key_span_tokens=96)
    (out * weight).sum().backward()
    got = [out.detach()] + [t.grad.clone() for t in (q, k, v)]
    for t in (q, k, v):
        t.grad = None
    ref, _ = sdpa_attention_forward(_Same(), q[None], k[None], v[None], None, scaling=HEAD_DIM**-0.5)
    ref = ref[0].transpose(0, 1)
    (ref * weight).sum().backward()
    expected = [ref.detach()] + [t.grad for t in (q, k, v)]
    for a, e in zip(got, expected):
        assert (a - e).abs().max().item() <= TOL


def test_rejects_unknown_strategy():
    q, k, v = _qkv(4)
    with pytest.raises(ValueError, match="long_segments"):
        varlen_causal_attention(q, k, v, _cu_seqlens([4]), long_segments="flash")
