"""Upstream's fused LM-head log-prob/entropy API (`use_fused_kernels` with `impl_backend=torch`).

`FusedLinearForPPO(chunk_size=512)(hidden_states, vocab_weights, input_ids, temperature)` returns
`(log_probs, entropy)` without materialising the (T, V) logits. It is a thin, upstream-compatible face of
`verl.utils.logprob.fused_linear_log_probs_and_entropy`, which new code should call directly.

Compatible with upstream: 2-D (T, H) and 3-D (B, S, H) hidden states (here any leading shape), log_probs in
fp32, entropy in the hidden dtype, gradients for hidden_states and vocab_weights from both outputs.
Unlike upstream, `temperature` may also be a tensor broadcastable to input_ids' shape (per-token or (B, 1)
per-sample) and is applied inside the kernel, never to the inputs.
"""

from __future__ import annotations

import torch

from verl.utils.logprob import Temperature, _fused_backward, _fused_forward, _prepare_fused_inputs

__all__ = ["FusedLinearForPPO", "FusedLinearForPPOFunction"]


class FusedLinearForPPOFunction(torch.autograd.Function):
    """apply(hidden_states (..., H), vocab_weights (V, H), input_ids (...), temperature=1.0, chunk_size=512)
    -> (log_probs (...) fp32, entropy (...) in hidden dtype)."""

    @staticmethod
    def forward(ctx, hidden_states, vocab_weights, input_ids, temperature=1.0, chunk_size=512):
        flat_hidden, flat_ids, row_t = _prepare_fused_inputs(
            hidden_states, vocab_weights, input_ids, temperature, chunk_size
        )
        ctx.hidden_shape = hidden_states.shape
        log_probs, entropy = _fused_forward(ctx, flat_hidden, vocab_weights, flat_ids, row_t, chunk_size, True)
        return log_probs.view(input_ids.shape), entropy.to(hidden_states.dtype).view(input_ids.shape)

    @staticmethod
    def backward(ctx, dlog_probs, dentropy):
        grad_hidden, grad_weight = _fused_backward(ctx, dlog_probs, dentropy)
        if grad_hidden is not None:
            grad_hidden = grad_hidden.view(ctx.hidden_shape)
        return grad_hidden, grad_weight, None, None, None


class FusedLinearForPPO(torch.nn.Module):
    """Module form of `FusedLinearForPPOFunction` with a fixed chunk size (tokens per chunk)."""

    def __init__(self, chunk_size: int = 512):
        super().__init__()
        self.chunk_size = chunk_size

    def forward(
        self,
        hidden_states: torch.Tensor,
        vocab_weights: torch.Tensor,
        input_ids: torch.Tensor,
        temperature: Temperature = 1.0,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """hidden_states (..., H), vocab_weights (V, H), input_ids (...) -> (log_probs (...), entropy (...))."""
        return FusedLinearForPPOFunction.apply(
            hidden_states, vocab_weights, input_ids.to(torch.int64), temperature, self.chunk_size
        )
