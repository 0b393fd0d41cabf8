"""Varlen gated delta rule (the recurrence of Gated DeltaNet layers), chunked, with backends.

Per value head, with state ``S`` of shape ``(K, V)`` and, for every token t (docs/qwen3_5.md, "Gated DeltaNet")::

    q̂_t = l2norm(q_t) * scale,  k̂_t = l2norm(k_t)               (when use_qk_l2norm_in_kernel)
    S_t = exp(g_t) (I - β_t k̂_t k̂_tᵀ) S_{t-1} + β_t k̂_t v_tᵀ
    o_t = S_tᵀ q̂_t                                                 (the read sees token t itself)

``g_t <= 0`` is the log-decay, ``β_t ∈ (0, 1)``. With packed input the state resets to zero (or to that
sequence's own ``initial_state``) at every ``cu_seqlens`` boundary.

The pure-torch implementation processes chunks of ``C`` tokens at once (the UT/WY form). Inside a chunk, with
cumulative log-decays ``γ_i = Σ_{j<=i} g_j``::

    A_ij = β_i (k_i·k_j) e^{γ_i-γ_j}  (i > j),   u = (I + A)⁻¹ (β v),   w = (I + A)⁻¹ (β e^{γ} k)
    δ = u - w S_prev                                                     (the per-token corrections)
    o = (q e^{γ}) S_prev + [(q kᵀ) ⊙ e^{γ_i-γ_j}]_{i>=j} δ
    S_next = e^{γ_last} S_prev + (k e^{γ_last-γ})ᵀ δ

Varlen without a loop over tokens or sequences: every sequence is cut into its own chunks (the last one padded
with k = v = β = g = 0, which leaves outputs and state unchanged), all intra-chunk algebra runs batched over all
chunks, and the state recurrence loops over the chunk *index* j, batched over the sequences that have a j-th chunk.
Chunks are numbered in that step order (sequences sorted by chunk count), so step j is a contiguous slice.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from verl.ops.backends import select_backend
from verl.utils.packing import validate_cu_seqlens

__all__ = ["chunk_gated_delta_rule", "torch_chunk_gated_delta_rule", "l2norm"]


def l2norm(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """``x / sqrt(Σ x² + eps)`` over the last dim (the normalisation HF and fla apply to q and k)."""
    return x * torch.rsqrt((x * x).sum(-1, keepdim=True) + eps)


@dataclass(frozen=True)
class _ChunkLayout:
    """Where every token sits in the ``(num_chunks, C)`` chunk layout, and which chunks each step processes.

    Attributes:
        slot_of_token: ``(T,)`` flat slot ``chunk_id * C + offset`` of each token.
        token_of_slot: ``(num_chunks * C,)`` token index of each slot, ``T`` (a zero row) for padding slots.
        step_counts: number of sequences that have a j-th chunk, for j = 0 .. max_chunks - 1 (non-increasing).
        order: ``(N,)`` sequence ids sorted by chunk count, descending (rank r holds sequence order[r]).
    """

    slot_of_token: torch.Tensor
    token_of_slot: torch.Tensor
    step_counts: tuple[int, ...]
    order: torch.Tensor

    @property
    def num_chunks(self) -> int:
        return sum(self.step_counts)


def _chunk_layout(boundaries: list[int], chunk_size: int, device: torch.device) -> _ChunkLayout:
    lengths = [b - a for a, b in zip(boundaries[:-1], boundaries[1:])]
    chunks = [math.ceil(n / chunk_size) for n in lengths]
    order = sorted(range(len(lengths)), key=lambda n: -chunks[n])  # stable: ties keep packing order
    step_counts = tuple(sum(1 for c in chunks if c > j) for j in range(chunks[order[0]]))
    step_offsets = [0]
    for count in step_counts[:-1]:
        step_offsets.append(step_offsets[-1] + count)
    rank = [0] * len(lengths)
    for r, n in enumerate(order):
        rank[n] = r
    total = boundaries[-1]
    seq_of_token = torch.repeat_interleave(torch.arange(len(lengths)), torch.tensor(lengths), output_size=total)
    offset = torch.arange(total) - torch.tensor(boundaries[:-1])[seq_of_token]
    chunk_id = torch.tensor(step_offsets)[offset // chunk_size] + torch.tensor(rank)[seq_of_token]
    slot_of_token = chunk_id * chunk_size + offset % chunk_size
    token_of_slot = torch.full((sum(step_counts) * chunk_size,), total, dtype=torch.long)
    token_of_slot[slot_of_token] = torch.arange(total)
    return _ChunkLayout(
        slot_of_token.to(device), token_of_slot.to(device), step_counts, torch.tensor(order, device=device)
    )


def _to_chunks(x: torch.Tensor, layout: _ChunkLayout, chunk_size: int) -> torch.Tensor:
    """``(T, H, *D)`` tokens -> ``(num_chunks, H, C, *D)``, zeros in padding slots."""
    padded = torch.cat([x, x.new_zeros((1, *x.shape[1:]))])
    chunks = padded.index_select(0, layout.token_of_slot).unflatten(0, (layout.num_chunks, chunk_size))
    return chunks.transpose(1, 2)


def _intra_chunk(q, k, v, g, beta):
    """All per-chunk algebra, batched over ``(num_chunks, H)``.

    Shapes: q, k ``(..., C, K)``; v ``(..., C, V)``; g, beta ``(..., C)``. Returns u ``(..., C, V)``,
    w ``(..., C, K)``, q_dec ``(..., C, K)``, local attention ``(..., C, C)``, k_tail ``(..., C, K)`` and the chunk
    decay ``e^{γ_last}`` ``(...)``.
    """
    size = g.shape[-1]
    gamma = g.cumsum(-1)
    causal = torch.ones(size, size, dtype=torch.bool, device=g.device).tril()
    # e^{γ_i-γ_j} for i >= j; -inf above the diagonal so exp gives exactly 0 (and no inf*0 in backward)
    decay = (gamma[..., :, None] - gamma[..., None, :]).masked_fill(~causal, float("-inf")).exp()
    a = (beta[..., :, None] * (k @ k.transpose(-1, -2)) * decay).tril(-1)
    eye = torch.eye(size, dtype=a.dtype, device=a.device)
    rhs = torch.cat([beta[..., None] * v, (beta * gamma.exp())[..., None] * k], dim=-1)
    solved = torch.linalg.solve_triangular(a + eye, rhs, upper=False, unitriangular=True)
    u, w = solved.split([v.shape[-1], k.shape[-1]], dim=-1)
    local = (q @ k.transpose(-1, -2)) * decay
    q_dec = q * gamma.exp()[..., None]
    gamma_last = gamma[..., -1:]
    k_tail = k * (gamma_last - gamma).exp()[..., None]
    return u, w, q_dec, local, k_tail, gamma_last[..., 0].exp()


def _recurrence(parts, layout: _ChunkLayout, state: torch.Tensor):
    """Carry the state across chunks: one step per chunk index j, batched over sequences with a j-th chunk.

    ``state`` is ``(N, H, K, V)`` in rank order. Returns the chunk outputs ``(num_chunks, H, C, V)`` (chunk-id
    order) and the final states ``(N, H, K, V)`` in rank order.
    """
    # One split per tensor, not a slice per step: the backward of a slice materialises a zero gradient of the whole
    # tensor, which made a long single sequence quadratic in its number of chunks; split's backward is one cat.
    steps = zip(*(x.split(layout.step_counts) for x in parts))
    outputs, finished = [], []
    for count, (u, w, q_dec, local, k_tail, chunk_decay) in zip(layout.step_counts, steps):
        if count < state.shape[0]:  # the shortest sequences ran out of chunks: their state is final
            finished.append(state[count:])
            state = state[:count]
        delta = u - w @ state
        outputs.append(q_dec @ state + local @ delta)
        state = state * chunk_decay[..., None, None] + k_tail.transpose(-1, -2) @ delta
    finished.append(state)
    return torch.cat(outputs), torch.cat(finished[::-1])


def _prepare_qk(q, k, num_v_heads: int, scale: float, use_l2norm: bool):
    if use_l2norm:
        q, k = l2norm(q), l2norm(k)
    groups = num_v_heads // q.shape[-2]
    if groups > 1:  # grouped value heads: v head h reads q/k head h // groups
        q, k = q.repeat_interleave(groups, dim=-2), k.repeat_interleave(groups, dim=-2)
    return q * scale, k


def torch_chunk_gated_delta_rule(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    *,
    scale: float | None = None,
    initial_state: torch.Tensor | None = None,
    output_final_state: bool = False,
    use_qk_l2norm_in_kernel: bool = False,
    cu_seqlens: torch.Tensor | None = None,
    chunk_size: int = 64,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Pure-torch chunked varlen gated delta rule (fp32, or fp64 for fp64 inputs; autograd through torch ops).

    Args:
        q, k: ``(B, T, H, K)``; v: ``(B, T, HV, V)`` with HV a multiple of H; g, beta: ``(B, T, HV)``.
        scale: multiplies q; default ``K ** -0.5``.
        initial_state: ``(N, HV, K, V)``, one per sequence; None = zeros.
        output_final_state: also return the final ``(N, HV, K, V)`` fp32 states.
        use_qk_l2norm_in_kernel: l2-normalise q and k first.
        cu_seqlens: ``(N + 1,)`` boundaries of sequences packed along T (B must be 1); None = each row of the
            batch is one sequence (N = B).
        chunk_size: tokens per chunk.

    Returns:
        ``(o (B, T, HV, V) in v.dtype, final_state or None)``.
    """
    batch, total = q.shape[:2]
    num_v_heads = v.shape[2]
    boundaries = _boundaries(cu_seqlens, batch, total)
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    dtype = torch.promote_types(v.dtype, torch.float32)  # fp32 at least (fp64 stays fp64 for exactness tests)
    flat = [x.reshape(batch * total, *x.shape[2:]).to(dtype) for x in (q, k, v, g, beta)]
    qf, kf = _prepare_qk(flat[0], flat[1], num_v_heads, scale, use_qk_l2norm_in_kernel)
    layout = _chunk_layout(boundaries, chunk_size, q.device)
    chunked = [_to_chunks(x, layout, chunk_size) for x in (qf, kf, *flat[2:])]
    parts = _intra_chunk(*chunked)
    num_seqs = len(boundaries) - 1
    if initial_state is None:
        state = qf.new_zeros(num_seqs, num_v_heads, qf.shape[-1], flat[2].shape[-1])
    else:
        state = initial_state.to(dtype).index_select(0, layout.order)
    out_chunks, final_ranked = _recurrence(parts, layout, state)
    out = out_chunks.transpose(1, 2).flatten(0, 1).index_select(0, layout.slot_of_token)
    out = out.reshape(batch, total, num_v_heads, -1).to(v.dtype)
    if not output_final_state:
        return out, None
    return out, final_ranked.index_select(0, torch.argsort(layout.order))


def _boundaries(cu_seqlens: torch.Tensor | None, batch: int, total: int) -> list[int]:
    if cu_seqlens is None:
        return [row * total for row in range(batch + 1)]
    if batch != 1:
        raise ValueError(f"gated delta rule: packed input (cu_seqlens given) must have batch 1, got {batch}")
    validate_cu_seqlens(cu_seqlens, total)
    return cu_seqlens.tolist()


def _fla_chunk_gated_delta_rule(
    q, k, v, g, beta, *, scale, initial_state, output_final_state, use_qk_l2norm_in_kernel, cu_seqlens
):
    from fla.ops.gated_delta_rule import chunk_gated_delta_rule as fla_chunk  # lazy: never imported on CPU

    groups = v.shape[2] // q.shape[2]
    if groups > 1:  # older fla releases have no grouped value heads; repeating is exact for all of them
        q, k = q.repeat_interleave(groups, dim=2), k.repeat_interleave(groups, dim=2)
    cu = None if cu_seqlens is None else cu_seqlens.to(torch.long).contiguous()
    return fla_chunk(
        q.contiguous(),
        k.contiguous(),
        v.contiguous(),
        g.contiguous(),
        beta.contiguous(),
        scale=scale,
        initial_state=initial_state,
        output_final_state=output_final_state,
        use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel,
        cu_seqlens=cu,
    )


def _check_shapes(q, k, v, g, beta) -> None:
    if q.dim() != 4 or k.shape != q.shape or v.dim() != 4 or v.shape[:2] != q.shape[:2]:
        raise ValueError(
            f"gated delta rule: expected q, k (B, T, H, K) and v (B, T, HV, V), got q {tuple(q.shape)}, "
            f"k {tuple(k.shape)}, v {tuple(v.shape)}"
        )
    if v.shape[2] % q.shape[2]:
        raise ValueError(f"gated delta rule: value heads {v.shape[2]} must be a multiple of q/k heads {q.shape[2]}")
    if g.shape != v.shape[:3] or beta.shape != v.shape[:3]:
        raise ValueError(
            f"gated delta rule: g and beta must be (B, T, HV) = {tuple(v.shape[:3])}, got "
            f"{tuple(g.shape)} and {tuple(beta.shape)}"
        )


def chunk_gated_delta_rule(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    *,
    scale: float | None = None,
    initial_state: torch.Tensor | None = None,
    output_final_state: bool = False,
    use_qk_l2norm_in_kernel: bool = False,
    cu_seqlens: torch.Tensor | None = None,
    backend: str = "auto",
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Varlen gated delta rule; shapes and semantics as :func:`torch_chunk_gated_delta_rule`.

    ``backend``: ``"auto"`` (fla's ``chunk_gated_delta_rule(cu_seqlens=...)`` on CUDA/NPU when importable, else
    torch), ``"torch"`` or ``"fla"``.
    """
    _check_shapes(q, k, v, g, beta)
    kwargs = dict(
        scale=scale,
        initial_state=initial_state,
        output_final_state=output_final_state,
        use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel,
        cu_seqlens=cu_seqlens,
    )
    if select_backend("chunk_gated_delta_rule", q.device.type, backend) == "fla":
        if cu_seqlens is not None and q.shape[0] != 1:
            raise ValueError(f"gated delta rule: packed input (cu_seqlens given) must have batch 1, got {q.shape[0]}")
        return _fla_chunk_gated_delta_rule(q, k, v, g, beta, **kwargs)
    return torch_chunk_gated_delta_rule(q, k, v, g, beta, **kwargs)
