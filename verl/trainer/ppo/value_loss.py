"""Critic loss (clipped value loss) and the entropy bonus term."""

from __future__ import annotations

import torch

from verl.trainer.ppo.input_checks import check_2d, check_same_shape
from verl.trainer.ppo.loss_aggregation import agg_loss
from verl.utils import torch_functional as verl_F


def compute_value_loss(
    vpreds: torch.Tensor,
    returns: torch.Tensor,
    values: torch.Tensor,
    response_mask: torch.Tensor,
    cliprange_value: float,
    loss_agg_mode: str = "token-mean",
    dp_size: int = 1,
    batch_num_tokens: int | torch.Tensor | None = None,
    global_batch_size: int | torch.Tensor | None = None,
    loss_scale_factor: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Clipped value loss: ½·agg(max((v − R)², (clip(v, v_old − c, v_old + c) − R)²)).

    The clipped term keeps one update from moving the value prediction more than ``cliprange_value``
    (``critic.cliprange_value``) away from the value the advantages were computed with; taking the max makes the
    clip pessimistic (it can only raise the loss).

    Args:
        vpreds: ``(bs, T)`` values predicted by the critic being trained.
        returns: ``(bs, T)`` regression targets.
        values: ``(bs, T)`` values at rollout time (v_old).
        response_mask: ``(bs, T)``.
        cliprange_value: c.
        loss_agg_mode, dp_size, batch_num_tokens, global_batch_size, loss_scale_factor: see ``agg_loss``.

    Returns:
        ``(vf_loss, vf_clipfrac)``: scalar loss and the fraction of valid tokens where the clipped term is larger.
    """
    where = "compute_value_loss"
    check_2d(where, "vpreds", vpreds)
    check_same_shape(where, vpreds=vpreds, returns=returns, values=values, response_mask=response_mask)
    vpred_clipped = torch.clamp(vpreds, values - cliprange_value, values + cliprange_value)
    loss_unclipped = (vpreds - returns).square()
    loss_clipped = (vpred_clipped - returns).square()
    vf_loss = 0.5 * agg_loss(
        torch.maximum(loss_unclipped, loss_clipped),
        response_mask,
        loss_agg_mode,
        dp_size=dp_size,
        batch_num_tokens=batch_num_tokens,
        global_batch_size=global_batch_size,
        loss_scale_factor=loss_scale_factor,
    )
    vf_clipfrac = verl_F.masked_mean((loss_clipped > loss_unclipped).float(), response_mask)
    return vf_loss, vf_clipfrac


def compute_entropy_loss(
    logits: torch.Tensor, response_mask: torch.Tensor, loss_agg_mode: str = "token-mean"
) -> torch.Tensor:
    """Aggregated categorical entropy of ``logits`` ``(bs, T, V)`` over ``response_mask`` ``(bs, T)``.

    Kept for compatibility; it materialises the full softmax. The actors use the chunked / fused entropy from
    ``verl.utils.torch_functional`` and ``agg_loss`` instead.
    """
    if logits.shape[:-1] != response_mask.shape:
        raise ValueError(
            f"compute_entropy_loss: logits {tuple(logits.shape)} must be (bs, T, V) with (bs, T) = response_mask "
            f"{tuple(response_mask.shape)}."
        )
    token_entropy = verl_F.entropy_from_logits(logits)
    return agg_loss(token_entropy, response_mask, loss_agg_mode)
