"""Causal attention over the packed stream's ``cu_seqlens`` segments without a ``T x T`` mask.

The mask path (HF sdpa/eager on a packed row) builds a ``(T, T)`` block-diagonal causal mask: 16 GiB of bool at
131,072 tokens, before a single score is computed. This kernel never forms anything that grows with ``T^2``:

* **short segments** (``<= chunk_tokens``): segments of equal length are gathered into one ``(n, H, L, d)`` batch
  and run through ``scaled_dot_product_attention(is_causal=True)``, a batch holding at most ``batch_tokens``
  tokens. Many short sequences (a GRPO row of 64 x 53 tokens) cost one fused call per distinct length instead of a
  ``T x T`` masked call; the largest score block is ``H * L * batch_tokens``.
* **long segments**, one strategy per platform (:attr:`verl.utils.platform.base.Platform.long_segment_attention`):

  - ``"sdpa"``: the whole segment through ``scaled_dot_product_attention(is_causal=True)``. On the CPU torch runs
    its fused flash-attention kernel, which saves only the output and the log-sum-exp for backward.
  - ``"chunked"``: :class:`ChunkedCausalAttention`, online-softmax attention over query blocks of
    ``chunk_tokens`` and key spans of ``key_span_tokens`` in plain torch ops (any device, the simulated NPU
    included). Its backward recomputes the scores per block from the saved log-sum-exp, so neither direction holds
    more than one ``(H, chunk_tokens, key_span_tokens)`` block.

Shapes: query ``(H, T, d)``, key/value ``(KV, T, d)`` with ``H % KV == 0`` (grouped-query attention: query head
``h`` reads KV head ``h // (H / KV)``, HF's ``repeat_kv`` order); output ``(H, T, d)``.
"""

from __future__ import annotations

from collections import defaultdict

import torch
import torch.nn.functional as F

__all__ = [
    "LONG_SEGMENT_STRATEGIES",
    "ChunkedCausalAttention",
    "chunked_causal_attention",
    "varlen_causal_attention",
]

LONG_SEGMENT_STRATEGIES = ("sdpa", "chunked")
DEFAULT_CHUNK_TOKENS = 512
DEFAULT_KEY_SPAN_TOKENS = 4096
DEFAULT_BATCH_TOKENS = 4096


def varlen_causal_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    cu_seqlens: torch.Tensor,
    *,
    scale: float | None = None,
    long_segments: str = "chunked",
    chunk_tokens: int = DEFAULT_CHUNK_TOKENS,
    key_span_tokens: int = DEFAULT_KEY_SPAN_TOKENS,
    batch_tokens: int = DEFAULT_BATCH_TOKENS,
) -> torch.Tensor:
    """Causal attention inside every ``cu_seqlens`` segment (module docstring).

    Args:
        query: ``(H, T, d)``; key, value: ``(KV, T, d)``.
        cu_seqlens: ``(N + 1,)`` cumulative segment lengths, leading 0, last = T.
        scale: score scale, default ``d ** -0.5``.
        long_segments: ``"sdpa" | "chunked"``, the strategy for segments longer than ``chunk_tokens``.
        chunk_tokens: longest segment handled by the batched short path; query block of the chunked path.
        key_span_tokens: key block of the chunked path.
        batch_tokens: most tokens in one batched short-segment call.

    Returns:
        ``(H, T, d)``: row ``t`` attends to rows ``s <= t`` of its own segment only.
    """
    if long_segments not in LONG_SEGMENT_STRATEGIES:
        raise ValueError(f"long_segments must be one of {LONG_SEGMENT_STRATEGIES}, got {long_segments!r}")
    heads, total, head_dim = query.shape
    if key.shape[1] != total or heads % key.shape[0]:
        raise ValueError(f"query {tuple(query.shape)} and key {tuple(key.shape)}: need (H, T, d) and (KV, T, d)")
    scale = head_dim**-0.5 if scale is None else scale
    groups = heads // key.shape[0]
    key, value = (t.repeat_interleave(groups, dim=0) if groups > 1 else t for t in (key, value))
    pieces, order = [], []
    for rows, out in _short_segment_batches(query, key, value, cu_seqlens, scale, chunk_tokens, batch_tokens):
        pieces.append(out)
        order.append(rows)
    for start, end in _long_segments(cu_seqlens, chunk_tokens):
        q, k, v = (t[:, start:end] for t in (query, key, value))
        if long_segments == "sdpa":
            out = F.scaled_dot_product_attention(q[None], k[None], v[None], is_causal=True, scale=scale)[0]
        else:
            out = ChunkedCausalAttention.apply(q, k, v, scale, chunk_tokens, key_span_tokens)
        pieces.append(out)
        order.append(torch.arange(start, end, device=query.device))
    if len(pieces) == 1:  # one batch or one long segment covering the stream in order
        return pieces[0]
    rows = torch.cat(order)
    inverse = torch.empty_like(rows)
    inverse[rows] = torch.arange(total, device=rows.device)
    return torch.cat(pieces, dim=1).index_select(1, inverse)


def _segment_bounds(cu_seqlens: torch.Tensor) -> list[tuple[int, int]]:
    bounds = cu_seqlens.tolist()
    return [(a, b) for a, b in zip(bounds[:-1], bounds[1:]) if b > a]


def _long_segments(cu_seqlens: torch.Tensor, chunk_tokens: int) -> list[tuple[int, int]]:
    return [(a, b) for a, b in _segment_bounds(cu_seqlens) if b - a > chunk_tokens]


def _short_segment_batches(query, key, value, cu_seqlens, scale, chunk_tokens, batch_tokens):
    """Yield ``(rows, out)``: ``out (H, n*L, d)`` is the attention of ``n`` equal-length segments, ``rows`` their
    stream positions in the same order."""
    starts_by_length: dict[int, list[int]] = defaultdict(list)
    for start, end in _segment_bounds(cu_seqlens):
        if end - start <= chunk_tokens:
            starts_by_length[end - start].append(start)
    heads, _, head_dim = query.shape
    for length, starts in starts_by_length.items():
        per_call = max(1, batch_tokens // length)
        offsets = torch.arange(length, device=query.device)
        for i in range(0, len(starts), per_call):
            batch = torch.tensor(starts[i : i + per_call], device=query.device)
            rows = (batch[:, None] + offsets[None]).reshape(-1)
            q, k, v = (
                t.index_select(1, rows).view(heads, len(batch), length, -1).transpose(0, 1) for t in (query, key, value)
            )
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale)  # (n, H, L, d)
            yield rows, out.transpose(0, 1).reshape(heads, -1, head_dim)


def chunked_causal_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    *,
    scale: float | None = None,
    chunk_tokens: int = DEFAULT_CHUNK_TOKENS,
    key_span_tokens: int = DEFAULT_KEY_SPAN_TOKENS,
) -> torch.Tensor:
    """Causal attention of one sequence, ``(H, L, d)`` each (same heads) -> ``(H, L, d)``, in blocks."""
    scale = query.shape[-1] ** -0.5 if scale is None else scale
    return ChunkedCausalAttention.apply(query, key, value, scale, chunk_tokens, key_span_tokens)


def _blocks(length: int, size: int) -> list[tuple[int, int]]:
    return [(i, min(i + size, length)) for i in range(0, length, size)]


def _scores(q_blk, k_blk, q0: int, k0: int, scale: float) -> torch.Tensor:
    """``(H, Cq, Ck)`` scaled scores, future keys (``k0 + j > q0 + i``) set to -inf."""
    scores = torch.matmul(q_blk, k_blk.transpose(-1, -2)) * scale
    if k0 + k_blk.shape[1] - 1 > q0:  # the block reaches past the first query: mask the future
        q_pos = torch.arange(q0, q0 + q_blk.shape[1], device=q_blk.device)
        k_pos = torch.arange(k0, k0 + k_blk.shape[1], device=q_blk.device)
        scores = scores.masked_fill(k_pos[None, None, :] > q_pos[None, :, None], float("-inf"))
    return scores


class ChunkedCausalAttention(torch.autograd.Function):
    """Online-softmax causal attention whose forward and backward hold one score block at a time.

    Forward, per query block ``[q0, q1)``: running max ``m``, normaliser ``l`` and accumulator over the key spans
    ``[k0, k1)`` with ``k0 < q1``: ``m' = max(m, rowmax(S))``, ``l' = l e^{m-m'} + rowsum(e^{S-m'})``,
    ``acc' = acc e^{m-m'} + e^{S-m'} V``; the output is ``acc / l`` and ``lse = m + log l`` is saved (``(H, L)``).
    Backward recomputes ``P = exp(S - lse)`` per block: with ``D = rowsum(dO * O)``, ``dV += P^T dO``,
    ``dS = P * (dO V^T - D)``, ``dQ += scale dS K``, ``dK += scale dS^T Q``. Saved: q, k, v, out, lse.
    """

    @staticmethod
    def forward(ctx, query, key, value, scale: float, chunk_tokens: int, key_span_tokens: int):
        length = query.shape[1]
        out = torch.empty_like(query)
        lse = query.new_empty(query.shape[:2], dtype=torch.float32)
        for q0, q1 in _blocks(length, chunk_tokens):
            q_blk = query[:, q0:q1]
            m = torch.full(q_blk.shape[:2], float("-inf"), dtype=torch.float32, device=query.device)
            norm = torch.zeros_like(m)
            acc = torch.zeros(q_blk.shape, dtype=torch.float32, device=query.device)
            for k0, k1 in _blocks(q1, key_span_tokens):
                scores = _scores(q_blk, key[:, k0:k1], q0, k0, scale).float()
                m_new = torch.maximum(m, scores.amax(-1))
                probs = torch.exp(scores - m_new[..., None])
                decay = torch.exp(m - m_new)
                norm = norm * decay + probs.sum(-1)
                acc = acc * decay[..., None] + torch.matmul(probs.to(value.dtype), value[:, k0:k1]).float()
                m = m_new
            out[:, q0:q1] = (acc / norm[..., None]).to(out.dtype)
            lse[:, q0:q1] = m + torch.log(norm)
        ctx.save_for_backward(query, key, value, out, lse)
        ctx.scale, ctx.chunk_tokens, ctx.key_span_tokens = scale, chunk_tokens, key_span_tokens
        return out

    @staticmethod
    def backward(ctx, grad_out):
        query, key, value, out, lse = ctx.saved_tensors
        scale = ctx.scale
        grad_out = grad_out.contiguous()
        dq = torch.zeros(query.shape, dtype=torch.float32, device=query.device)
        dk = torch.zeros(key.shape, dtype=torch.float32, device=query.device)
        dv = torch.zeros(value.shape, dtype=torch.float32, device=query.device)
        delta = (grad_out.float() * out.float()).sum(-1)  # (H, L)
        for q0, q1 in _blocks(query.shape[1], ctx.chunk_tokens):
            q_blk, do_blk = query[:, q0:q1], grad_out[:, q0:q1].float()
            for k0, k1 in _blocks(q1, ctx.key_span_tokens):
                k_blk, v_blk = key[:, k0:k1], value[:, k0:k1]
                probs = torch.exp(_scores(q_blk, k_blk, q0, k0, scale).float() - lse[:, q0:q1, None])
                dv[:, k0:k1] += torch.matmul(probs.transpose(-1, -2), do_blk)
                dscores = probs * (torch.matmul(do_blk, v_blk.float().transpose(-1, -2)) - delta[:, q0:q1, None])
                dq[:, q0:q1] += torch.matmul(dscores, k_blk.float()) * scale
                dk[:, k0:k1] += torch.matmul(dscores.transpose(-1, -2), q_blk.float()) * scale
        return dq.to(query.dtype), dk.to(key.dtype), dv.to(value.dtype), None, None, None
