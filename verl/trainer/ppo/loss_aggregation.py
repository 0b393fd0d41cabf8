"""``agg_loss``: reduce a per-token loss matrix to the scalar that is back-propagated.

The aggregation mode decides how tokens and sequences are weighted (``actor.loss_agg_mode`` /
``critic.loss_agg_mode``):

===========================  ==================================================================================
``token-mean``               Σ_valid tokens loss / N_tokens            (every token weighs the same)
``token-sum``                Σ_valid tokens loss                       (no normalisation)
``seq-mean-token-sum``       mean over sequences of Σ_t loss            (long sequences weigh more)
``seq-mean-token-sum-norm``  ``seq-mean-token-sum`` / loss_scale_factor (Dr.GRPO; factor defaults to the
                             padded response length, a constant)
``seq-mean-token-mean``      mean over sequences of mean_t loss         (every sequence weighs the same)
===========================  ==================================================================================

Data parallelism. DDP/FSDP *average* gradients over ``dp_size`` ranks. To make the result equal to the loss of
the whole global batch, each rank divides by the *global* count (``batch_num_tokens`` tokens or
``global_batch_size`` sequences) and multiplies by ``dp_size``; the average over ranks then undoes the factor.
With ``dp_size == 1`` and no global count the local count is used. Fully-masked sequences are left out of the
sequence means. Positions outside the mask never contribute, even if they hold NaN or inf.
"""

from __future__ import annotations

import torch

from verl.trainer.ppo.input_checks import check_same_shape

LOSS_AGG_MODES = (
    "token-mean",
    "token-sum",
    "seq-mean-token-sum",
    "seq-mean-token-sum-norm",
    "seq-mean-token-mean",
)


def masked_token_sum(loss_mat: torch.Tensor, loss_mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Sum of ``loss_mat`` over valid positions; masked positions are *replaced* by 0, so NaN/inf there vanish.

    Args:
        loss_mat: ``(bs, T)``.
        loss_mask: ``(bs, T)``, nonzero = valid.
        dim: None for a scalar, -1 for per-sequence sums ``(bs,)``.
    """
    kept = torch.where(loss_mask.bool(), loss_mat, torch.zeros_like(loss_mat))
    return kept.sum() if dim is None else kept.sum(dim=dim)


def _global_count(local_count: torch.Tensor, global_count, dp_size: int, name: str) -> torch.Tensor | float:
    """The normaliser: the global count when given, else the local one (only valid without data parallelism)."""
    if global_count is not None:
        return global_count
    if dp_size > 1:
        raise ValueError(
            f"agg_loss: {name} (the count over the whole global batch) is required when dp_size={dp_size} > 1; "
            "without it every rank would normalise by its own count and the averaged gradient would be biased."
        )
    # An all-masked micro-batch has a zero sum; dividing by 1 keeps the loss 0 instead of NaN.
    return local_count.clamp(min=1)


def _seq_mean(seq_losses: torch.Tensor, seq_valid: torch.Tensor, dp_size: int, global_batch_size) -> torch.Tensor:
    """Mean of per-sequence losses ``(bs,)`` over valid sequences, scaled for data parallelism."""
    local_sequences = seq_valid.sum().to(seq_losses.dtype)
    denom = _global_count(local_sequences, global_batch_size, dp_size, "global_batch_size")
    return masked_token_sum(seq_losses, seq_valid) / denom * dp_size


def agg_loss(
    loss_mat: torch.Tensor,
    loss_mask: torch.Tensor,
    loss_agg_mode: str,
    dp_size: int = 1,
    batch_num_tokens: int | torch.Tensor | None = None,
    global_batch_size: int | torch.Tensor | None = None,
    loss_scale_factor: float | None = None,
) -> torch.Tensor:
    """Aggregate a per-token loss matrix into a scalar (see the module docstring for the modes).

    Args:
        loss_mat: ``(bs, response_length)`` per-token loss.
        loss_mask: ``(bs, response_length)``, 1 for tokens that count.
        loss_agg_mode: one of :data:`LOSS_AGG_MODES`.
        dp_size: data-parallel world size; the result is multiplied by it (see module docstring).
        batch_num_tokens: valid tokens in the global batch (``token-mean``); required when ``dp_size > 1``.
        global_batch_size: valid sequences in the global batch (``seq-mean-*``); required when ``dp_size > 1``.
        loss_scale_factor: divisor of ``seq-mean-token-sum-norm``; None -> ``response_length``.

    Returns:
        scalar tensor.
    """
    check_same_shape("agg_loss", loss_mat=loss_mat, loss_mask=loss_mask)
    if loss_agg_mode == "token-mean":
        local_tokens = loss_mask.sum().to(loss_mat.dtype)
        denom = _global_count(local_tokens, batch_num_tokens, dp_size, "batch_num_tokens")
        return masked_token_sum(loss_mat, loss_mask) / denom * dp_size
    if loss_agg_mode == "token-sum":
        return masked_token_sum(loss_mat, loss_mask) * dp_size
    tokens_per_seq = loss_mask.sum(dim=-1)
    seq_valid = tokens_per_seq > 0
    if loss_agg_mode in ("seq-mean-token-sum", "seq-mean-token-sum-norm"):
        loss = _seq_mean(masked_token_sum(loss_mat, loss_mask, dim=-1), seq_valid, dp_size, global_batch_size)
        if loss_agg_mode == "seq-mean-token-sum-norm":
            loss = loss / (loss_scale_factor if loss_scale_factor is not None else loss_mask.shape[-1])
        return loss
    if loss_agg_mode == "seq-mean-token-mean":
        per_seq_mean = masked_token_sum(loss_mat, loss_mask, dim=-1) / tokens_per_seq.clamp(min=1).to(loss_mat.dtype)
        return _seq_mean(per_seq_mean, seq_valid, dp_size, global_batch_size)
    raise ValueError(
        f"Invalid loss_agg_mode: {loss_agg_mode} (actor_rollout_ref.actor.loss_agg_mode / critic.loss_agg_mode); "
        f"choose one of {list(LOSS_AGG_MODES)}."
    )
