"""The response-window LM head (verl/workers/core/lm_head.py) on a bare ``nn.Linear`` head.

Reference: the head applied to the selected hidden rows, ``log_softmax(h @ W^T / T)`` gathered at the labels and
``-sum(p log p)``, written out with torch ops.
"""

import pytest
import torch

from verl.workers.core.lm_head import LMHeadPlan, lm_head_scope, split_fused_output

T = 0.5


def _head_and_hidden():
    torch.manual_seed(0)
    head = torch.nn.Linear(4, 6, bias=False)
    return head, torch.randn(1, 5, 4)  # (1, S = 5, H = 4)


def _select(hidden):
    return hidden[:, 2:4]  # the two rows whose next token is a response token


def test_logits_mode_computes_only_the_selected_rows():
    head, hidden = _head_and_hidden()
    with lm_head_scope(head, LMHeadPlan(select=_select)):
        logits = head(hidden)
    assert logits.shape == (1, 2, 6)
    torch.testing.assert_close(logits, hidden[:, 2:4] @ head.weight.T)


def test_fused_mode_returns_log_probs_and_entropy_of_the_rows():
    head, hidden = _head_and_hidden()
    labels = torch.tensor([[1, 5]])
    plan = LMHeadPlan(select=_select, labels=labels, temperature=T, fused=True, compute_entropy=True, chunk_size=1)
    with lm_head_scope(head, plan):
        output = head(hidden)
    fused = split_fused_output(output, plan)
    logp = torch.log_softmax(hidden[:, 2:4] @ head.weight.T / T, -1)
    torch.testing.assert_close(fused.log_probs, logp.gather(-1, labels.unsqueeze(-1)).squeeze(-1))
    torch.testing.assert_close(fused.entropy, -(logp.exp() * logp).sum(-1))


def test_a_head_run_twice_or_a_post_processed_output_is_refused():
    """Invariant: the plan must see exactly one LM-head call; a model that changes the head's output (softcapping)
    cannot use the fused path. Both errors name the key to switch off."""
    head, hidden = _head_and_hidden()
    with pytest.raises(RuntimeError, match="ran 2 times"), lm_head_scope(head, LMHeadPlan(select=_select)):
        head(hidden)
        head(hidden)
    plan = LMHeadPlan(select=_select, labels=torch.tensor([[1, 5]]), fused=True)
    with lm_head_scope(head, plan):
        output = head(hidden)
    with pytest.raises(RuntimeError, match="use_fused_kernels=False"):
        split_fused_output(output * 30.0, plan)
