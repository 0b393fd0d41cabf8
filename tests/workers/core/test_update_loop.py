"""The loops both worker paths run (verl/workers/core/update_loop.py), on a one-parameter model ``y = w * x``.

Each micro-batch loss is ``sum(w * x * mask) / N`` with ``N`` the valid tokens of the whole mini-batch
(``GlobalBatchInfo.batch_num_tokens``), so d loss / d w summed over micro-batches is ``sum(x * mask) / N`` for any
split: the value each test works out by hand.
"""

import pytest
import torch

from verl.protocol import DataProto
from verl.workers.core.batch_plan import BatchPlan
from verl.workers.core.optimizer_step import StepResult
from verl.workers.core.update_loop import (
    forward_backward,
    forward_only,
    optimizer_step,
    prefixed_engine_metrics,
    run_mini_batches,
)


def _data(x: torch.Tensor, mask: torch.Tensor | None = None) -> DataProto:
    mask = torch.ones_like(x) if mask is None else mask
    rows = torch.arange(len(x)).float().unsqueeze(-1)
    return DataProto.from_dict(
        tensors={"x": x, "response_mask": mask, "attention_mask": mask.long(), "row": rows.expand_as(x).clone()}
    )


def _linear_loss(output, batch, info):
    loss = (output["y"] * batch["response_mask"]).sum() / info.batch_num_tokens
    return loss, {"actor/pg_loss": loss.item(), "actor/ratio": 1.0}


X = torch.tensor([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0], [7.0, 8.0]])


@pytest.mark.parametrize("micro", [1, 2, 4])
def test_forward_backward_accumulates_the_mini_batch_gradient_for_any_split(micro):
    """Invariant: the accumulated gradient and the summed loss do not depend on the micro-batch size.
    Mask drops x[3, 1] = 8: N = 7 valid tokens, sum(x * mask) = 36 - 8 = 28, so with w = 1 the loss is
    28 / 7 = 4 and d loss / d w = 28 / 7 = 4; the averaged ratio metric stays 1."""
    w = torch.nn.Parameter(torch.tensor(1.0))
    mask = torch.ones_like(X)
    mask[3, 1] = 0
    outputs, metrics = forward_backward(
        _data(X, mask), BatchPlan(micro), lambda mb: {"y": w * mb.batch["x"]}, _linear_loss
    )
    assert outputs == {}  # training keeps no outputs
    assert w.grad.item() == pytest.approx(4.0, abs=1e-6)
    assert metrics["actor/pg_loss"] == pytest.approx(4.0, abs=1e-6)  # a loss term: summed over micro-batches
    assert metrics["actor/ratio"] == 1.0  # a ratio: averaged


def test_forward_only_returns_outputs_in_input_order_without_a_graph():
    """Invariant: with dynamic batch size the micro-batches regroup rows by length, yet the concatenated outputs
    come back in the input order (row i holds i); nothing requires grad. Rows have 1, 4, 2, 3 tokens and a budget
    of 4 tokens per micro-batch, so at least 3 micro-batches regroup them."""
    x = torch.ones(4, 4)
    mask = torch.tensor([[1, 0, 0, 0], [1, 1, 1, 1], [1, 1, 0, 0], [1, 1, 1, 0]]).float()
    w = torch.nn.Parameter(torch.tensor(2.0))
    seen = []

    def forward(mb):
        seen.append(mb.batch["row"][:, 0].tolist())
        return {"y": w * mb.batch["x"], "row": mb.batch["row"]}

    out = forward_only(_data(x, mask), BatchPlan(None, use_dynamic_bsz=True, max_token_len=4), forward)
    assert len(seen) >= 3
    assert out["row"][:, 0].tolist() == [0.0, 1.0, 2.0, 3.0]
    assert not out["y"].requires_grad and torch.equal(out["y"], torch.full((4, 4), 2.0))


def test_optimizer_step_zeroes_accumulates_steps_and_reports_the_step():
    """Invariant: zero_grad → forward/backward → step, in that order; grad_norm is the step's, skipped_steps 1.0
    when the step was skipped (non-finite norm) and 0.0 otherwise."""
    calls = []

    def accumulate():
        calls.append("forward_backward")
        return {"actor/pg_loss": 0.5}

    def step(stepped):
        return lambda: calls.append("step") or StepResult(2.0, stepped)

    metrics = optimizer_step(accumulate, lambda: calls.append("zero_grad"), step(False))
    assert calls == ["zero_grad", "forward_backward", "step"]
    assert metrics == {"actor/pg_loss": 0.5, "grad_norm": 2.0, "skipped_steps": 1.0}
    assert optimizer_step(accumulate, lambda: None, step(True))["skipped_steps"] == 0.0


def test_run_mini_batches_epochs_shuffle_and_final_zero_grad():
    """Invariant: 2 epochs x (4 rows / 2 per mini-batch) = 4 steps; with shuffle, epoch e takes the rows in the
    order torch.randperm(4, generator seeded seed + e); gradients are dropped once, after the last step."""
    seen, zeroed = [], []

    def train_step(mini_batch):
        seen.append(mini_batch.batch["row"][:, 0].long().tolist())
        return {"grad_norm": float(len(seen))}

    plan = BatchPlan(1, mini_batch_size=2, epochs=2, shuffle=True, seed=7)
    metrics = run_mini_batches(_data(X), plan, train_step, lambda: zeroed.append(len(seen)))
    expected = []
    for epoch in range(2):
        order = torch.randperm(4, generator=torch.Generator().manual_seed(7 + epoch)).tolist()
        expected += [order[:2], order[2:]]
    assert seen == expected
    assert metrics == {"grad_norm": [1.0, 2.0, 3.0, 4.0]}
    assert zeroed == [4]


def test_run_mini_batches_refuses_a_batch_that_does_not_split():
    with pytest.raises(ValueError, match="not a multiple of the mini-batch size 3"):
        run_mini_batches(_data(X), BatchPlan(1, mini_batch_size=3), lambda mb: {}, lambda: None)


def test_step_metrics_get_the_role_prefix():
    """Invariant: step-level names get the role prefix (legacy names); loss terms keep theirs."""
    metrics = {"grad_norm": [1.0], "skipped_steps": [0.0], "actor/pg_loss": [0.5]}
    assert prefixed_engine_metrics(metrics, "actor") == {
        "actor/grad_norm": [1.0],
        "actor/skipped_steps": [0.0],
        "actor/pg_loss": [0.5],
    }
