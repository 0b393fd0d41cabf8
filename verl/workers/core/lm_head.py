"""Run the model's LM head only where log-probs are needed, optionally fused with the log-prob maths.

Two forward hooks, scoped to one call (:func:`lm_head_scope`), sit on the model's output projection:

* the *pre*-hook replaces the LM head's input ``(..., S, H)`` by the rows whose next token is a response token
  (``select``), so the ``(tokens, V)`` logits of the prompt are never computed;
* in *fused* mode the pre-hook also computes ``(log_prob, entropy)`` of those rows with
  ``fused_linear_log_probs_and_entropy`` (no ``(tokens, V)`` tensor at all), hands the LM head an empty input, and
  the forward hook returns the fused result as the LM head's output. The model then returns it as ``logits``.

Why hooks on the LM head instead of "return hidden states, then multiply by ``lm_head.weight``": under FSDP the
LM-head weight is only materialised (unsharded) while its module runs forward, and FSDP registers its backward
hooks on that module's outputs. Computing inside the module's forward and making the result its output keeps
every wrapper (none, FSDP1, FSDP2 with the head in its own unit or in the root) correct, with no special case.
The fused hook is prepended so that FSDP's post-forward hook sees the replaced output.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import torch
import torch.nn as nn

from verl.utils.logprob import fused_linear_log_probs_and_entropy

__all__ = ["FusedLogProbs", "LMHeadPlan", "lm_head_scope", "split_fused_output"]


@dataclass
class LMHeadPlan:
    """What the LM head computes during one forward.

    Attributes:
        select: ``hidden (..., S, H) -> (..., N, H)``, the rows whose log-probs are wanted.
        labels: ``(..., N)`` token ids those rows predict (fused mode only).
        temperature: logits divisor (applied out of place inside the kernel).
        fused: compute log-probs inside the LM head (``FusedLogProbs``) instead of returning logits.
        compute_entropy: fused mode: also compute the entropy.
        chunk_size: fused mode: tokens per chunk.
    """

    select: Callable[[torch.Tensor], torch.Tensor]
    labels: torch.Tensor | None = None
    temperature: float | torch.Tensor = 1.0
    fused: bool = False
    compute_entropy: bool = False
    chunk_size: int = 512
    calls: int = 0
    result: torch.Tensor | None = field(default=None, repr=False)


@dataclass(frozen=True)
class FusedLogProbs:
    log_probs: torch.Tensor
    entropy: torch.Tensor | None


def _pre_hook(plan: LMHeadPlan):
    def hook(module: nn.Module, args: tuple):
        plan.calls += 1
        hidden = plan.select(args[0])
        if not plan.fused:
            return (hidden,) + tuple(args[1:])
        weight = module.weight
        log_probs, entropy = fused_linear_log_probs_and_entropy(
            hidden.to(weight.dtype),
            weight,
            plan.labels,
            temperature=plan.temperature,
            chunk_size=plan.chunk_size,
            compute_entropy=plan.compute_entropy,
        )
        parts = [log_probs] if entropy is None else [log_probs, entropy]
        plan.result = torch.stack(parts, dim=-1)  # (..., N, 1|2)
        return (hidden[..., :0, :],) + tuple(args[1:])

    return hook


def _fused_output_hook(plan: LMHeadPlan):
    def hook(_module: nn.Module, _args: tuple, _output: torch.Tensor):
        return plan.result

    return hook


@contextlib.contextmanager
def lm_head_scope(lm_head: nn.Module, plan: LMHeadPlan) -> Iterator[LMHeadPlan]:
    """Install the hooks of ``plan`` on ``lm_head`` for the duration of the block (one model forward)."""
    handles = [lm_head.register_forward_pre_hook(_pre_hook(plan))]
    if plan.fused:
        handles.append(lm_head.register_forward_hook(_fused_output_hook(plan), prepend=True))
    try:
        yield plan
    finally:
        for handle in handles:
            handle.remove()
    if plan.calls != 1:
        raise RuntimeError(
            f"the LM head ran {plan.calls} times in one forward (expected once); this model is not supported by the "
            "response-window LM head: set actor_rollout_ref.model.use_fused_kernels=False and "
            "use_remove_padding=False"
        )


def split_fused_output(output: torch.Tensor, plan: LMHeadPlan) -> FusedLogProbs:
    """Split the model's ``logits`` output of a fused forward into log-probs ``(..., N)`` and entropy.

    The model must return the LM head's output unchanged; a model that post-processes logits (softcapping,
    scaling) would silently corrupt the log-probs, so that is checked here.
    """
    if plan.result is None or output.shape != plan.result.shape or output.data_ptr() != plan.result.data_ptr():
        raise RuntimeError(
            "the model post-processes its LM-head output (e.g. logit softcapping), so the fused log-prob path "
            "cannot be used with it: set actor_rollout_ref.model.use_fused_kernels=False"
        )
    entropy = output[..., 1] if plan.compute_entropy else None
    return FusedLogProbs(output[..., 0], entropy)
