"""Token log-probabilities and entropy that never hold a full-vocabulary fp32 tensor.

Field-report item 2: one `entropy_from_logits` call on a (T, V) tensor with V = 248,320 asked for 18.95 GiB
extra on a 64 GB NPU. The functions here stream over token chunks instead:

* `log_probs_and_entropy_chunked(logits (..., V), labels (...))` reads existing logits, chunk by chunk,
  upcasting one chunk at a time to fp32.
* `fused_linear_log_probs_and_entropy(hidden (..., H), weight (V, H), labels (...))` folds the LM head in, so the
  (T, V) logits never exist at all.

Both are custom autograd Functions whose backward recomputes the logits from the saved inputs, so the extra memory
is two reusable (chunk_size, V) fp32 work buffers in forward *and* backward (a plain chunked loop under autograd
would save every chunk's softmax, i.e. O(T x V) again). The forward saves each row's logsumexp and entropy, which
makes every element's gradient local: the fused backward is tiled over the vocabulary with all tokens at once
(same buffer budget), so each block of the weight gradient is one GEMM. Temperature is applied out of place
(field-report item 3): inputs are never modified.

Compute dtype: fp32 for fp16/bf16/fp32 inputs (fp64 inputs stay fp64); outputs are in the compute dtype.

Shape legend: T tokens (all leading dims flattened), V vocabulary, H hidden size, C tokens in one chunk.

Maths per row, with z = logits / temperature, lse = logsumexp(z), log p = z - lse:
    log_prob(y)  = z_y - lse
    entropy      = -sum_v p_v log p_v
    d log_prob(y) / dz = onehot(y) - p
    d entropy / dz     = -p * (log p + entropy)
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Union

import torch

__all__ = [
    "FusedLinearLogProbEntropyFunction",
    "LogProbEntropyFunction",
    "entropy_chunked",
    "fused_linear_log_probs_and_entropy",
    "log_probs_and_entropy_chunked",
]

Temperature = Union[float, torch.Tensor]

# Per-row temperatures travel as a (T,) tensor in the compute dtype; a single value stays a Python float.
_RowTemperature = Union[float, torch.Tensor]


# ----------------------------------------------------------------------------------------------------------------
# argument checks and normalisation
# ----------------------------------------------------------------------------------------------------------------


def _check_chunk_size(chunk_size: int) -> None:
    if isinstance(chunk_size, bool) or not isinstance(chunk_size, int) or chunk_size < 1:
        raise ValueError(
            f"chunk_size must be a positive int, got {chunk_size!r} "
            "(config key: entropy_from_logits_chunk_size / fused kernel chunk size)."
        )


def _check_labels(labels: torch.Tensor, expected_shape: torch.Size, what: str) -> None:
    if labels.dtype.is_floating_point or labels.dtype.is_complex or labels.dtype == torch.bool:
        raise TypeError(f"labels must be an integer tensor of token ids, got dtype {labels.dtype}.")
    if labels.shape != expected_shape:
        raise ValueError(
            f"labels shape {tuple(labels.shape)} must equal {what} shape without its last dim "
            f"{tuple(expected_shape)}; e.g. logits (B, S, V) need labels (B, S)."
        )


def _row_temperature(temperature: Temperature, labels_shape: torch.Size, like: torch.Tensor) -> _RowTemperature:
    """Normalise `temperature` to a float or a (T,) tensor (compute dtype of `like`) aligned with flat labels.

    A tensor must broadcast to `labels_shape` by torch rules: per-sample temperatures for labels (B, S) are (B, 1);
    for packed labels (1, T) give per-token temperatures (1, T) (see `expand_as_nested`).
    """
    if isinstance(temperature, torch.Tensor):
        try:
            rows = torch.broadcast_to(temperature.detach(), labels_shape)
        except RuntimeError as err:
            raise ValueError(
                f"temperature of shape {tuple(temperature.shape)} does not broadcast to the labels shape "
                f"{tuple(labels_shape)}; give per-sample temperatures of labels (B, S) as (B, 1)."
            ) from err
        rows = rows.reshape(-1).to(device=like.device, dtype=_compute_dtype(like.dtype))
        if rows.numel() and not bool((rows > 0).all()):
            raise ValueError("every temperature must be > 0 (config key: actor_rollout_ref.rollout.temperature).")
        return rows
    temperature = float(temperature)
    if not temperature > 0:
        raise ValueError(
            f"temperature must be > 0, got {temperature} (config key: actor_rollout_ref.rollout.temperature)."
        )
    return temperature


def _chunks(total: int, chunk_size: int) -> Iterator[tuple[int, int]]:
    for start in range(0, total, chunk_size):
        yield start, min(start + chunk_size, total)


def _rows(temperature: _RowTemperature, start: int, end: int) -> _RowTemperature:
    """Temperature of rows [start, end) shaped to divide a (C, V) chunk."""
    if isinstance(temperature, torch.Tensor):
        return temperature[start:end].unsqueeze(-1)
    return temperature


# ----------------------------------------------------------------------------------------------------------------
# per-chunk maths, shared by the logits path and the fused LM-head path
# ----------------------------------------------------------------------------------------------------------------


def _chunk_statistics(
    z: torch.Tensor, labels: torch.Tensor | None, compute_entropy: bool, scratch: torch.Tensor
) -> tuple[torch.Tensor | None, torch.Tensor, torch.Tensor | None]:
    """Log-probs, logsumexp and entropy of one chunk of scaled logits.

    With m = max z, z' = z - m, e = exp(z'), s = sum e:  lse = m + log s,  log p(y) = z'_y - log s,
    entropy = log s - (e . z') / s. Five passes over the chunk; at most two (C, V) buffers are alive.

    Args:
        z: (C, V) scaled logits in the compute dtype, owned by the caller (shifted in place).
        labels: (C,) int64 token ids or None.
        compute_entropy: whether to return the entropy.
        scratch: (C, V) work buffer of z's dtype (receives exp(z')).

    Returns:
        log_probs (C,) or None, lse (C,), entropy (C,) or None.
    """
    row_max = z.amax(dim=-1, keepdim=True)
    shifted = z.sub_(row_max)
    exp_shifted = torch.exp(shifted, out=scratch)
    sum_exp = exp_shifted.sum(dim=-1)
    log_sum_exp = sum_exp.log()
    lse = row_max.squeeze(-1) + log_sum_exp
    log_probs = None
    if labels is not None:
        log_probs = shifted.gather(-1, labels.unsqueeze(-1)).squeeze(-1) - log_sum_exp
    entropy = None
    if compute_entropy:
        # (C, 1, V) @ (C, V, 1): the row-wise dot product e . z' without a third (C, V) buffer
        dot = torch.bmm(exp_shifted.unsqueeze(1), shifted.unsqueeze(-1)).reshape(-1)
        entropy = log_sum_exp - dot / sum_exp
    return log_probs, lse, entropy


def _row_grad_coefficients(
    lse: torch.Tensor,
    entropy: torch.Tensor | None,
    grad_log_probs: torch.Tensor | None,
    grad_entropy: torch.Tensor | None,
    temperature: _RowTemperature,
) -> tuple[torch.Tensor | None, torch.Tensor | None, torch.Tensor | None]:
    """Per-row factors (R, 1) of the logits gradient: g = grad_lp / t, h = grad_ent / t, c = h (lse - H) - g.

    With p = softmax(z), z = logits / t and log p = z - lse, the gradient w.r.t. the logits is
        d loss / d logits = g (onehot(y) - p) - h p (log p + H) = p (c - h z) + g onehot(y),
    so each element needs only its row's (lse, g, h, c): any tile of the (T, V) logits can be done alone.
    `temperature` is a float or a (R, 1) tensor; h and c are None when the entropy is not in the loss.
    """
    g = grad_log_probs.unsqueeze(-1) / temperature if grad_log_probs is not None else None
    if grad_entropy is None:
        return g, None, None
    h = grad_entropy.unsqueeze(-1) / temperature
    c = h * (lse.unsqueeze(-1) - entropy.unsqueeze(-1))
    return g, h, c if g is None else c - g


def _add_label_term(grad: torch.Tensor, labels: torch.Tensor, g: torch.Tensor, col_start: int) -> None:
    """grad[r, y_r - col_start] += g_r for the rows whose label lies in this tile's columns (no host sync)."""
    cols = labels - col_start
    in_tile = (cols >= 0) & (cols < grad.shape[1])
    grad.scatter_add_(1, cols.clamp(0, grad.shape[1] - 1).unsqueeze(-1), g * in_tile.unsqueeze(-1))


def _tile_grad_logits(
    z: torch.Tensor,
    lse: torch.Tensor,
    coefficients: tuple[torch.Tensor | None, torch.Tensor | None, torch.Tensor | None],
    labels: torch.Tensor | None,
    col_start: int,
    scratch: torch.Tensor,
) -> torch.Tensor:
    """Gradient w.r.t. the unscaled logits of one (R, N) tile of scaled logits z, written into z's buffer.

    Args:
        z: (R, N) recomputed scaled logits of columns [col_start, col_start + N), compute dtype (overwritten).
        lse: (R,) logsumexp of the full rows, saved by the forward pass.
        coefficients: (g, h, c) of `_row_grad_coefficients` for these rows.
        labels: (R,) token ids or None. scratch: (R, N) work buffer (receives p when the entropy term is present).
    """
    g, h, c = coefficients
    lse = lse.unsqueeze(-1)
    if h is None:
        grad = z.sub_(lse).exp_().mul_(-g)  # only the log-prob term: -g p, one buffer
    else:
        probs = torch.sub(z, lse, out=scratch).exp_()
        grad = z.mul_(-h).add_(c).mul_(probs)  # five passes in all, temperature folded into g, h, c
    if g is not None and labels is not None:
        _add_label_term(grad, labels, g, col_start)
    return grad


def _slice_coefficients(coefficients: tuple, start: int, end: int) -> tuple:
    return tuple(None if x is None else x[start:end] for x in coefficients)


def _column_temperature(temperature: _RowTemperature) -> _RowTemperature:
    """(T,) per-row temperatures as a (T, 1) column; a float stays a float."""
    return temperature.unsqueeze(-1) if isinstance(temperature, torch.Tensor) else temperature


def _compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """fp32 for half/bf16/fp32 inputs; fp64 inputs keep fp64 (never downcast)."""
    return torch.promote_types(dtype, torch.float32)


def _scaled_copy(chunk: torch.Tensor, temperature: _RowTemperature, out: torch.Tensor) -> torch.Tensor:
    """`out` := chunk / temperature in the compute dtype; the input is never modified (field-report item 3)."""
    if isinstance(temperature, torch.Tensor) or temperature != 1.0:
        if chunk.dtype == out.dtype:
            return torch.div(chunk, temperature, out=out)  # one pass
        return out.copy_(chunk).div_(temperature)  # upcast first: dividing in bf16 would round
    return out.copy_(chunk)


def _work_buffers(
    total: int, chunk_size: int, cols: int, like: torch.Tensor
) -> Iterator[tuple[int, int, torch.Tensor, torch.Tensor]]:
    """Chunk bounds [start, end) with two (end - start, cols) work buffers in the compute dtype.

    The buffers are allocated once per pass and reused by every chunk: no allocator churn per chunk (on the CPU
    every large allocation is a fresh mmap with page faults).
    """
    rows = min(chunk_size, total)
    buffers = like.new_empty((2, rows, cols), dtype=_compute_dtype(like.dtype))
    for start, end in _chunks(total, chunk_size):
        yield start, end, buffers[0, : end - start], buffers[1, : end - start]


def _flat_grad(grad: torch.Tensor | None, total: int, dtype: torch.dtype) -> torch.Tensor | None:
    """Upstream output gradients as flat vectors of the compute dtype; an unrequested output has none."""
    if grad is None or grad.numel() != total:
        return None
    return grad.reshape(-1).to(dtype)


# ----------------------------------------------------------------------------------------------------------------
# from logits
# ----------------------------------------------------------------------------------------------------------------


class LogProbEntropyFunction(torch.autograd.Function):
    """Chunked log-prob + entropy of 2-D logits with a recomputing backward.

    forward(logits (T, V), labels (T,) int64 or None, temperature float | (T,) fp32, chunk_size, compute_entropy)
        -> (log_probs (T,) fp32 or empty, entropy (T,) fp32 or empty)
    Empty (0,) placeholders stand for outputs that were not requested; they carry no gradient.
    """

    @staticmethod
    def forward(ctx, logits, labels, temperature, chunk_size, compute_entropy):
        num_tokens, dtype = logits.shape[0], _compute_dtype(logits.dtype)
        log_probs = logits.new_empty(num_tokens if labels is not None else 0, dtype=dtype)
        lse = logits.new_empty(num_tokens, dtype=dtype)
        entropy = logits.new_empty(num_tokens if compute_entropy else 0, dtype=dtype)
        for start, end, z, scratch in _work_buffers(num_tokens, chunk_size, logits.shape[1], logits):
            z = _scaled_copy(logits[start:end], _rows(temperature, start, end), out=z)
            chunk_labels = labels[start:end] if labels is not None else None
            chunk_lp, lse[start:end], chunk_ent = _chunk_statistics(z, chunk_labels, compute_entropy, scratch)
            if chunk_lp is not None:
                log_probs[start:end] = chunk_lp
            if chunk_ent is not None:
                entropy[start:end] = chunk_ent
        ctx.set_materialize_grads(False)
        ctx.chunk_size = chunk_size
        ctx.temperature = temperature if not isinstance(temperature, torch.Tensor) else None
        saved_temperature = temperature if isinstance(temperature, torch.Tensor) else None
        ctx.save_for_backward(logits, labels, saved_temperature, lse, entropy if compute_entropy else None)
        if labels is None:
            ctx.mark_non_differentiable(log_probs)
        if not compute_entropy:
            ctx.mark_non_differentiable(entropy)
        return log_probs, entropy

    @staticmethod
    def backward(ctx, grad_log_probs, grad_entropy):
        logits, labels, saved_temperature, lse, entropy = ctx.saved_tensors
        temperature = saved_temperature if saved_temperature is not None else ctx.temperature
        num_tokens = logits.shape[0]
        grad_log_probs = _flat_grad(grad_log_probs, num_tokens, lse.dtype)
        grad_entropy = _flat_grad(grad_entropy, num_tokens, lse.dtype) if entropy is not None else None
        if grad_log_probs is None and grad_entropy is None:
            return None, None, None, None, None
        coefficients = _row_grad_coefficients(
            lse, entropy, grad_log_probs, grad_entropy, _column_temperature(temperature)
        )
        grad_logits = torch.empty_like(logits)
        for start, end, z, scratch in _work_buffers(num_tokens, ctx.chunk_size, logits.shape[1], logits):
            grad_logits[start:end] = _tile_grad_logits(
                _scaled_copy(logits[start:end], _rows(temperature, start, end), out=z),
                lse[start:end],
                _slice_coefficients(coefficients, start, end),
                labels[start:end] if labels is not None else None,
                0,
                scratch,
            )
        return grad_logits, None, None, None, None


def log_probs_and_entropy_chunked(
    logits: torch.Tensor,
    labels: torch.Tensor,
    *,
    temperature: Temperature = 1.0,
    chunk_size: int = 2048,
    compute_entropy: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Per-token log p(label) and entropy of softmax(logits / temperature), streamed over token chunks.

    Works for padded (B, S, V), packed (1, T, V) and flat (T, V) logits alike: all leading dims are flattened.
    Each chunk is upcast to fp32 on its own, so the extra memory is O(chunk_size x V) fp32 in forward and in
    backward (which recomputes the chunk instead of saving its softmax). Gradients flow to `logits` from both
    outputs; `temperature` is a constant (no gradient).

    Args:
        logits: (..., V) any float dtype; never modified.
        labels: (...) integer token ids, the shape of logits without the last dim.
        temperature: float, or a tensor broadcastable to labels' shape (e.g. (B, 1) per sample for (B, S) labels).
        chunk_size: tokens per chunk. At V = 248,320 one fp32 chunk buffer is chunk_size x 0.95 MiB.
        compute_entropy: also return the entropy (only when a loss or a logged metric needs it).

    Returns:
        log_probs (...) fp32 and entropy (...) fp32, or None when compute_entropy is False.
    """
    if logits.dim() < 1:
        raise ValueError("logits must have a vocabulary dimension: shape (..., V).")
    _check_labels(labels, logits.shape[:-1], "logits")
    _check_chunk_size(chunk_size)
    row_t = _row_temperature(temperature, labels.shape, logits)
    flat_logits = logits.reshape(-1, logits.shape[-1])
    flat_labels = labels.reshape(-1).to(torch.int64)
    log_probs, entropy = LogProbEntropyFunction.apply(flat_logits, flat_labels, row_t, chunk_size, compute_entropy)
    return log_probs.view(labels.shape), entropy.view(labels.shape) if compute_entropy else None


def entropy_chunked(logits: torch.Tensor, *, chunk_size: int = 2048, temperature: Temperature = 1.0) -> torch.Tensor:
    """Entropy (...) fp32 of softmax(logits (..., V) / temperature), chunked, with a recomputing backward."""
    if logits.dim() < 1:
        raise ValueError("logits must have a vocabulary dimension: shape (..., V).")
    _check_chunk_size(chunk_size)
    row_t = _row_temperature(temperature, logits.shape[:-1], logits)
    flat_logits = logits.reshape(-1, logits.shape[-1])
    _, entropy = LogProbEntropyFunction.apply(flat_logits, None, row_t, chunk_size, True)
    return entropy.view(logits.shape[:-1])


# ----------------------------------------------------------------------------------------------------------------
# fused LM head: hidden states in, log-probs out, no (T, V) tensor
# ----------------------------------------------------------------------------------------------------------------


def _chunk_logits(
    hidden_chunk: torch.Tensor, weight: torch.Tensor, temperature: _RowTemperature, out: torch.Tensor
) -> torch.Tensor:
    """(C, H) @ (V, H)^T in the input dtype (fp32 accumulation inside bf16 GEMMs), then scaled fp32 (C, V).

    The weight is not upcast: an fp32 copy of a 248,320 x 2,048 LM head would itself cost 1.9 GiB.
    """
    if hidden_chunk.dtype == out.dtype:
        z = torch.matmul(hidden_chunk, weight.t(), out=out)
    else:
        z = out.copy_(hidden_chunk @ weight.t())  # (C, V) in the input dtype for the moment of the copy
    if isinstance(temperature, torch.Tensor) or temperature != 1.0:
        z.div_(temperature)  # z is a work buffer: dividing it in place touches no input
    return z


def _vocab_tiles(
    vocab: int, tokens: int, chunk_size: int, like: torch.Tensor
) -> Iterator[tuple[int, int, torch.Tensor, torch.Tensor]]:
    """Vocabulary tiles [v0, v1) with two contiguous (T, v1 - v0) work buffers.

    The tile width keeps T x width <= chunk_size x V, the same budget as the forward's token chunks.
    """
    width = max(1, min(vocab, (chunk_size * vocab) // max(tokens, 1)))
    flat = like.new_empty((2, tokens * width), dtype=_compute_dtype(like.dtype))
    for v0, v1 in _chunks(vocab, width):
        size = tokens * (v1 - v0)
        yield v0, v1, flat[0, :size].view(tokens, v1 - v0), flat[1, :size].view(tokens, v1 - v0)


def _fused_backward(ctx, grad_log_probs, grad_entropy):
    """Shared backward of the fused Functions: returns (grad_hidden (T, H) | None, grad_weight (V, H) | None).

    Tiled over the vocabulary with all tokens at once (the forward saved each row's lse and entropy, so a tile
    needs nothing from the others): each weight-gradient row block is one GEMM over all T tokens, written once,
    instead of a (V, H) read-modify-write per token chunk; only the small (T, H) hidden gradient accumulates.
    """
    hidden, weight, labels, saved_temperature, lse, entropy = ctx.saved_tensors
    temperature = saved_temperature.unsqueeze(-1) if saved_temperature is not None else ctx.temperature
    num_tokens, vocab = hidden.shape[0], weight.shape[0]
    grad_log_probs = _flat_grad(grad_log_probs, num_tokens, lse.dtype)
    grad_entropy = _flat_grad(grad_entropy, num_tokens, lse.dtype) if entropy is not None else None
    need_hidden, need_weight = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
    if (grad_log_probs is None and grad_entropy is None) or not (need_hidden or need_weight):
        return None, None
    coefficients = _row_grad_coefficients(lse, entropy, grad_log_probs, grad_entropy, temperature)
    compute_dtype = lse.dtype
    grad_hidden = torch.zeros(hidden.shape, dtype=compute_dtype, device=hidden.device) if need_hidden else None
    grad_weight = torch.empty_like(weight) if need_weight else None
    for v0, v1, z, scratch in _vocab_tiles(vocab, num_tokens, ctx.chunk_size, hidden):
        weight_tile = weight[v0:v1]
        grad_z = _tile_grad_logits(
            _chunk_logits(hidden, weight_tile, temperature, out=z), lse, coefficients, labels, v0, scratch
        )
        low_precision = grad_z.dtype != weight.dtype
        grad_z_w = grad_z.to(weight.dtype) if low_precision else grad_z  # upstream also casts dlogits
        if need_hidden:
            grad_hidden.add_(grad_z_w @ weight_tile) if low_precision else grad_hidden.addmm_(grad_z, weight_tile)
        if need_weight:
            torch.matmul(grad_z_w.t(), hidden, out=grad_weight[v0:v1])  # one GEMM over all tokens
    if grad_hidden is not None and grad_hidden.dtype != hidden.dtype:
        grad_hidden = grad_hidden.to(hidden.dtype)
    return grad_hidden, grad_weight


def _fused_forward(ctx, hidden, weight, labels, temperature, chunk_size, compute_entropy):
    """Shared forward of the fused Functions on flat inputs; returns (log_probs (T,), entropy (T,) | empty)."""
    num_tokens, dtype = hidden.shape[0], _compute_dtype(hidden.dtype)
    log_probs = hidden.new_empty(num_tokens, dtype=dtype)
    lse = hidden.new_empty(num_tokens, dtype=dtype)
    entropy = hidden.new_empty(num_tokens if compute_entropy else 0, dtype=dtype)
    for start, end, z, scratch in _work_buffers(num_tokens, chunk_size, weight.shape[0], hidden):
        z = _chunk_logits(hidden[start:end], weight, _rows(temperature, start, end), out=z)
        log_probs[start:end], lse[start:end], chunk_ent = _chunk_statistics(
            z, labels[start:end], compute_entropy, scratch
        )
        if chunk_ent is not None:
            entropy[start:end] = chunk_ent
    ctx.set_materialize_grads(False)
    ctx.chunk_size = chunk_size
    ctx.temperature = temperature if not isinstance(temperature, torch.Tensor) else None
    saved_temperature = temperature if isinstance(temperature, torch.Tensor) else None
    ctx.save_for_backward(hidden, weight, labels, saved_temperature, lse, entropy if compute_entropy else None)
    if not compute_entropy:
        ctx.mark_non_differentiable(entropy)
    return log_probs, entropy


def _prepare_fused_inputs(
    hidden: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor, temperature: Temperature, chunk_size: int
) -> tuple[torch.Tensor, torch.Tensor, _RowTemperature]:
    """Validate fused-path arguments; return flat hidden (T, H), flat int64 labels (T,) and row temperatures."""
    if hidden.dim() < 1 or weight.dim() != 2 or weight.shape[1] != hidden.shape[-1]:
        raise ValueError(
            f"expected hidden (..., H) and weight (V, H) with the same H, got hidden {tuple(hidden.shape)} and "
            f"weight {tuple(weight.shape)}; pass the LM head's weight (vocab_size, hidden_size)."
        )
    if hidden.dtype != weight.dtype:
        raise TypeError(f"hidden dtype {hidden.dtype} differs from weight dtype {weight.dtype}; cast one of them.")
    _check_labels(labels, hidden.shape[:-1], "hidden")
    _check_chunk_size(chunk_size)
    row_t = _row_temperature(temperature, labels.shape, hidden)
    return hidden.reshape(-1, hidden.shape[-1]), labels.reshape(-1).to(torch.int64), row_t


class FusedLinearLogProbEntropyFunction(torch.autograd.Function):
    """Fused LM head + chunked log-prob/entropy with a recomputing backward.

    forward(hidden (T, H), weight (V, H), labels (T,) int64, temperature float | (T,) fp32, chunk_size,
            compute_entropy) -> (log_probs (T,) fp32, entropy (T,) fp32 or empty (0,))
    backward yields gradients for hidden and weight (from both outputs when both are used by the loss).
    """

    @staticmethod
    def forward(ctx, hidden, weight, labels, temperature, chunk_size, compute_entropy):
        return _fused_forward(ctx, hidden, weight, labels, temperature, chunk_size, compute_entropy)

    @staticmethod
    def backward(ctx, grad_log_probs, grad_entropy):
        grad_hidden, grad_weight = _fused_backward(ctx, grad_log_probs, grad_entropy)
        return grad_hidden, grad_weight, None, None, None, None


def fused_linear_log_probs_and_entropy(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    labels: torch.Tensor,
    *,
    temperature: Temperature = 1.0,
    chunk_size: int = 512,
    compute_entropy: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log p(label) and entropy of softmax(hidden @ weight^T / temperature) without materialising the logits.

    Each chunk of `chunk_size` tokens does its own (C, H) x (H, V) matmul and fp32 log-softmax; backward
    recomputes the chunk's logits and accumulates grad_hidden and grad_weight (weight grad in fp32, cast back).
    Peak extra memory: about 2 x chunk_size x V x 4 bytes, plus the (V, H) weight gradient in backward.

    Args:
        hidden: (..., H) final hidden states (before the LM head), any float dtype; never modified.
        weight: (V, H) LM-head weight (an `nn.Linear(H, V, bias=False).weight`); same dtype as hidden.
        labels: (...) integer token ids.
        temperature: float, or a tensor broadcastable to labels' shape.
        chunk_size: tokens per chunk (upstream FusedLinearForPPO uses 512).
        compute_entropy: also return the entropy.

    Returns:
        log_probs (...) fp32 and entropy (...) fp32, or None when compute_entropy is False.
    """
    flat_hidden, flat_labels, row_t = _prepare_fused_inputs(hidden, weight, labels, temperature, chunk_size)
    log_probs, entropy = FusedLinearLogProbEntropyFunction.apply(
        flat_hidden, weight, flat_labels, row_t, chunk_size, compute_entropy
    )
    return log_probs.view(labels.shape), entropy.view(labels.shape) if compute_entropy else None
