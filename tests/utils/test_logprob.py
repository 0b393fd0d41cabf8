"""Chunked and fused log-prob/entropy (verl.utils.logprob) against the naive full-vocabulary formulas.

Tolerances: outputs and gradients are compared in fp32 at 1e-5 absolute (values are O(1)-O(10); fp32 round-off
of a V <= 64 log-softmax is ~1e-6); fp64 gradchecks use torch's defaults.
"""

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from verl.utils.logprob import entropy_chunked, fused_linear_log_probs_and_entropy, log_probs_and_entropy_chunked

V = 37  # not divisible by any chunk size used below
H = 8


def naive(logits, labels, temperature=1.0):
    """Reference: full log_softmax of logits / temperature; (log p(label), entropy)."""
    if isinstance(temperature, torch.Tensor):
        temperature = temperature.unsqueeze(-1)
    logp = torch.log_softmax(logits.float() / temperature, dim=-1)
    return logp.gather(-1, labels.unsqueeze(-1)).squeeze(-1), -(logp.exp() * logp).sum(-1)


def _weighted_loss(log_probs, entropy, w_lp, w_ent):
    loss = (log_probs * w_lp).sum()
    return loss if entropy is None else loss + (entropy * w_ent).sum()


def _grads(fn, inputs, w_lp, w_ent):
    """Run fn(*inputs) -> (lp, ent) and return (lp, ent, grads of a weighted sum w.r.t. inputs)."""
    inputs = [x.detach().clone().requires_grad_(True) for x in inputs]
    lp, ent = fn(*inputs)
    grads = torch.autograd.grad(_weighted_loss(lp, ent, w_lp, w_ent), inputs)
    return lp.detach(), None if ent is None else ent.detach(), grads


def _close(actual, expected):
    torch.testing.assert_close(actual, expected, atol=1e-5, rtol=0)


@pytest.mark.parametrize("lead_shape", [(2, 5), (1, 9), (9,)], ids=["padded", "packed", "flat"])
@pytest.mark.parametrize("chunk_size", [1, 4, 7, 64])
@pytest.mark.parametrize("compute_entropy", [True, False])
def test_chunked_matches_naive_with_gradients(lead_shape, chunk_size, compute_entropy):
    """Chunked log-probs/entropy and d(loss)/d(logits) equal the naive formulas for padded (B,S,V), packed
    (1,T,V) and flat (T,V) logits, any chunk size (1, not dividing T, larger than T), with and without entropy."""
    torch.manual_seed(0)
    logits = 3 * torch.randn(*lead_shape, V)
    labels = torch.randint(0, V, lead_shape)
    w_lp, w_ent = torch.randn(lead_shape), torch.randn(lead_shape)

    def chunked(x):
        return log_probs_and_entropy_chunked(
            x, labels, temperature=0.7, chunk_size=chunk_size, compute_entropy=compute_entropy
        )

    def reference(x):
        lp, ent = naive(x, labels, 0.7)
        return lp, ent if compute_entropy else None

    lp, ent, (grad,) = _grads(chunked, [logits], w_lp, w_ent)
    lp_ref, ent_ref, (grad_ref,) = _grads(reference, [logits], w_lp, w_ent)
    assert lp.shape == lead_shape and lp.dtype == torch.float32
    _close(lp, lp_ref)
    _close(grad, grad_ref)
    if compute_entropy:
        _close(ent, ent_ref)
    else:
        assert ent is None


@pytest.mark.parametrize("temperature_shape", [(2, 1), (2, 6)], ids=["per-sample", "per-token"])
def test_chunked_tensor_temperature(temperature_shape):
    """A temperature tensor broadcastable to labels (B,1) or (B,S) scales each row by its own temperature."""
    torch.manual_seed(1)
    logits = torch.randn(2, 6, V)
    labels = torch.randint(0, V, (2, 6))
    temperature = torch.rand(temperature_shape) + 0.5
    w_lp, w_ent = torch.randn(2, 6), torch.randn(2, 6)

    def chunked(x):
        return log_probs_and_entropy_chunked(x, labels, temperature=temperature, chunk_size=5, compute_entropy=True)

    lp, ent, (grad,) = _grads(chunked, [logits], w_lp, w_ent)
    lp_ref, ent_ref, (grad_ref,) = _grads(lambda x: naive(x, labels, temperature.expand(2, 6)), [logits], w_lp, w_ent)
    _close(lp, lp_ref)
    _close(ent, ent_ref)
    _close(grad, grad_ref)


def test_temperature_never_modifies_inputs():
    """Field-report item 3: temperature scaling is out of place - logits, hidden and weight keep values and version."""
    torch.manual_seed(2)
    logits = torch.randn(3, V, requires_grad=True)
    hidden = torch.randn(3, H, requires_grad=True)
    weight = torch.randn(V, H, requires_grad=True)
    labels = torch.randint(0, V, (3,))
    snapshots = [(t, t.detach().clone(), t._version) for t in (logits, hidden, weight)]
    lp, ent = log_probs_and_entropy_chunked(logits, labels, temperature=0.5, chunk_size=2, compute_entropy=True)
    lp2, ent2 = fused_linear_log_probs_and_entropy(
        hidden, weight, labels, temperature=torch.full((3,), 0.5), chunk_size=2, compute_entropy=True
    )
    (lp.sum() + ent.sum() + lp2.sum() + ent2.sum()).backward()
    for tensor, before, version in snapshots:
        assert torch.equal(tensor.detach(), before) and tensor._version == version


@pytest.mark.parametrize("lead_shape", [(2, 5), (7,)], ids=["3d", "2d"])
@pytest.mark.parametrize("chunk_size", [1, 3, 16])
@pytest.mark.parametrize("entropy_in_loss", [True, False])
def test_fused_matches_naive_with_gradients(lead_shape, chunk_size, entropy_in_loss):
    """Fused LM head == (hidden @ W^T) then naive log-softmax: outputs and gradients for hidden AND weight,
    with the entropy in the loss or not, for 2-D and 3-D hidden states and odd chunk sizes."""
    torch.manual_seed(3)
    hidden, weight = torch.randn(*lead_shape, H), torch.randn(V, H) / 2
    labels = torch.randint(0, V, lead_shape)
    temperature = torch.rand(lead_shape) + 0.5
    w_lp = torch.randn(lead_shape)
    w_ent = torch.randn(lead_shape) if entropy_in_loss else torch.zeros(lead_shape)

    def fused(h, w):
        return fused_linear_log_probs_and_entropy(
            h, w, labels, temperature=temperature, chunk_size=chunk_size, compute_entropy=True
        )

    def reference(h, w):
        return naive(h @ w.t(), labels, temperature)

    lp, ent, (g_h, g_w) = _grads(fused, [hidden, weight], w_lp, w_ent)
    lp_ref, ent_ref, (g_h_ref, g_w_ref) = _grads(reference, [hidden, weight], w_lp, w_ent)
    _close(lp, lp_ref)
    _close(ent, ent_ref)
    _close(g_h, g_h_ref)
    _close(g_w, g_w_ref)


def test_fused_without_entropy_returns_none():
    """compute_entropy=False returns (log_probs, None); the log-prob gradient is unchanged."""
    torch.manual_seed(4)
    hidden, weight = torch.randn(6, H), torch.randn(V, H)
    labels = torch.randint(0, V, (6,))
    w_lp = torch.randn(6)
    lp, ent, (g_h, g_w) = _grads(
        lambda h, w: fused_linear_log_probs_and_entropy(h, w, labels, chunk_size=4), [hidden, weight], w_lp, None
    )
    lp_ref, _, (g_h_ref, g_w_ref) = _grads(
        lambda h, w: (naive(h @ w.t(), labels)[0], None), [hidden, weight], w_lp, None
    )
    assert ent is None
    _close(lp, lp_ref)
    _close(g_h, g_h_ref)
    _close(g_w, g_w_ref)


def test_gradcheck_fp64():
    """Finite differences in fp64 confirm both custom backwards (entropy and log-prob terms, tensor temperature)."""
    torch.manual_seed(5)
    logits = torch.randn(2, 3, 6, dtype=torch.float64, requires_grad=True)
    hidden = torch.randn(5, 3, dtype=torch.float64, requires_grad=True)
    weight = torch.randn(6, 3, dtype=torch.float64, requires_grad=True)
    labels3, labels5 = torch.randint(0, 6, (2, 3)), torch.randint(0, 6, (5,))
    temperature = torch.rand(2, 1, dtype=torch.float64) + 0.5
    assert torch.autograd.gradcheck(
        lambda x: log_probs_and_entropy_chunked(
            x, labels3, temperature=temperature, chunk_size=4, compute_entropy=True
        ),
        (logits,),
    )
    assert torch.autograd.gradcheck(
        lambda h, w: fused_linear_log_probs_and_entropy(
            h, w, labels5, temperature=1.3, chunk_size=2, compute_entropy=True
        ),
        (hidden, weight),
    )
    assert torch.autograd.gradcheck(lambda x: entropy_chunked(x, chunk_size=5), (logits,))


def test_bf16_logits_are_upcast_per_chunk():
    """bf16 logits give fp32 outputs equal to the fp32 computation on the same (bf16-representable) values."""
    torch.manual_seed(6)
    logits = torch.randn(4, 5, V).bfloat16()
    labels = torch.randint(0, V, (4, 5))
    lp, ent = log_probs_and_entropy_chunked(logits, labels, chunk_size=3, compute_entropy=True)
    lp_ref, ent_ref = naive(logits.float(), labels)
    assert lp.dtype == ent.dtype == torch.float32
    _close(lp, lp_ref)
    _close(ent, ent_ref)


class _LargestTensor(TorchDispatchMode):
    """Records the largest number of elements of any tensor an op produces."""

    def __init__(self):
        super().__init__()
        self.max_numel = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(t, torch.Tensor):
                self.max_numel = max(self.max_numel, t.numel())
        return out


def test_fused_never_materialises_full_logits():
    """Forward and backward of the fused path never create a tensor as large as the (T, V) logits: the biggest
    is the (2, chunk, V) work buffer or a gradient of an input. T=64, V=37, H=8, chunk 4:
    T*V = 2368 > max(2*4*37, 37*8, 64*8) = 512."""
    torch.manual_seed(7)
    hidden = torch.randn(64, H, requires_grad=True)
    weight = torch.randn(V, H, requires_grad=True)
    labels = torch.randint(0, V, (64,))
    with _LargestTensor() as mode:
        lp, ent = fused_linear_log_probs_and_entropy(hidden, weight, labels, chunk_size=4, compute_entropy=True)
        (lp.sum() + ent.sum()).backward()
    assert mode.max_numel <= max(2 * 4 * V, V * H, 64 * H)


def test_chunked_saves_no_full_vocab_activation():
    """The chunked path saves for backward only its input logits and O(T) vectors, never a softmax (T, V)."""
    torch.manual_seed(8)
    logits = torch.randn(64, V, requires_grad=True)
    labels = torch.randint(0, V, (64,))
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
        log_probs_and_entropy_chunked(logits, labels, chunk_size=4, compute_entropy=True)
    full_vocab = [t for t in saved if t.numel() >= 64 * V]
    assert len(full_vocab) == 1 and full_vocab[0].data_ptr() == logits.data_ptr()


def test_empty_input():
    """Zero tokens give empty outputs (e.g. a micro-batch without response tokens)."""
    lp, ent = log_probs_and_entropy_chunked(torch.zeros(0, V), torch.zeros(0, dtype=torch.long), compute_entropy=True)
    assert lp.shape == (0,) and ent.shape == (0,)


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({"labels": torch.zeros(2, 4, dtype=torch.long)}, ValueError),
        ({"labels": torch.zeros(2, 3)}, TypeError),
        ({"chunk_size": 0}, ValueError),
        ({"temperature": 0.0}, ValueError),
        ({"temperature": torch.tensor([1.0, -1.0]).view(2, 1)}, ValueError),
        ({"temperature": torch.ones(4)}, ValueError),
    ],
    ids=["shape", "float-labels", "chunk", "zero-temp", "negative-temp", "temp-broadcast"],
)
def test_chunked_bad_arguments(kwargs, error):
    """Wrong shapes, non-integer labels, chunk_size < 1 and non-positive or non-broadcastable temperatures raise."""
    args = {"labels": torch.zeros(2, 3, dtype=torch.long)} | kwargs
    labels = args.pop("labels")
    with pytest.raises(error):
        log_probs_and_entropy_chunked(torch.zeros(2, 3, V), labels, **args)


def test_fused_bad_arguments():
    """Weight (V, H) with a different H, or a dtype mismatch between hidden and weight, raise before any matmul."""
    labels = torch.zeros(2, dtype=torch.long)
    with pytest.raises(ValueError, match="weight"):
        fused_linear_log_probs_and_entropy(torch.zeros(2, H), torch.zeros(V, H + 1), labels)
    with pytest.raises(TypeError, match="dtype"):
        fused_linear_log_probs_and_entropy(torch.zeros(2, H), torch.zeros(V, H, dtype=torch.float64), labels)


@pytest.mark.parametrize(("hidden_grad", "weight_grad"), [(True, False), (False, True)])
def test_fused_partial_requires_grad_and_no_grad(hidden_grad, weight_grad):
    """A frozen LM head (or frozen hidden states) gets no gradient while the other input gets the naive one;
    under no_grad (log-prob recomputation) the outputs equal the naive values."""
    torch.manual_seed(9)
    hidden = torch.randn(12, H).requires_grad_(hidden_grad)
    weight = torch.randn(V, H).requires_grad_(weight_grad)
    labels = torch.randint(0, V, (12,))
    lp, ent = fused_linear_log_probs_and_entropy(hidden, weight, labels, chunk_size=5, compute_entropy=True)
    (lp.sum() + ent.sum()).backward()
    lp_ref, ent_ref = naive(hidden.detach() @ weight.detach().t(), labels)
    trained = hidden if hidden_grad else weight
    frozen = weight if hidden_grad else hidden
    reference = trained.detach().clone().requires_grad_(True)
    h_ref, w_ref = (reference, weight.detach()) if hidden_grad else (hidden.detach(), reference)
    lp_r, ent_r = naive(h_ref @ w_ref.t(), labels)
    (lp_r.sum() + ent_r.sum()).backward()
    assert frozen.grad is None
    _close(trained.grad, reference.grad)
    with torch.no_grad():
        lp_ng, ent_ng = fused_linear_log_probs_and_entropy(hidden, weight, labels, chunk_size=5, compute_entropy=True)
    _close(lp_ng, lp_ref)
    _close(ent_ng, ent_ref)
    assert not lp_ng.requires_grad
