"""Qwen3.5 / Qwen3.5-MoE train exactly with remove-padding: alone == padded == packed (verl/models/transformers/qwen3_5.py).

Tiny models with mixed layers [GDN, GDN, GDN, full attention] (verl/models/tiny.py). The GDN decay is set slow
(A = 0.05, the long-memory heads of a trained model) so that a state leaked across a boundary stays visible over
the whole next sequence instead of decaying within a few tokens (docs/qwen3_5.md, "Packing pitfalls").
"""

import pytest
import torch

from verl.models.tiny import build_tiny_model
from verl.models.transformers.packed_forward import forward_packed, forward_padded
from verl.models.transformers.patch_registry import apply_patches, get_patch_status
from verl.models.transformers.qwen3_5 import apply_varlen_gdn
from verl.utils.packing import pack_padded_batch, unpack_to_padded

pytestmark = pytest.mark.tf_compat

VOCAB = 256
LENGTHS = (37, 1, 50, 29)  # length 1 and lengths not divisible by the 64-token chunk
KINDS = ["qwen3_5", "qwen3_5_moe"]


def _model(kind, patched=True, seed=0):
    model = build_tiny_model(kind, VOCAB, seed)
    with torch.no_grad():
        for module in model.modules():
            if hasattr(module, "A_log"):
                module.A_log.fill_(torch.log(torch.tensor(0.05)).item())
    if patched:
        statuses = apply_patches(model, platform="cpu", report=False)
        assert {s.name: s.state for s in statuses}["qwen3_5-varlen-gdn"] == "applied"
    return model


def _batch(lengths=LENGTHS, seed=1):
    """Left-padded batch (B, S) + the unpadded sequences."""
    gen = torch.Generator().manual_seed(seed)
    seqs = [torch.randint(0, VOCAB, (n,), generator=gen) for n in lengths]
    width = max(lengths) + 3
    ids = torch.zeros(len(seqs), width, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for row, seq in enumerate(seqs):
        ids[row, width - len(seq) :], mask[row, width - len(seq) :] = seq, 1
    return ids, mask, (mask.cumsum(-1) - 1).clamp(min=0), seqs


def _token_logprobs(logits, ids):
    """log p(ids[t+1] | ids[:t+1]) in fp32: (n-1,)."""
    return torch.log_softmax(logits[:-1].float(), -1).gather(-1, ids[1:, None]).squeeze(-1)


def _max_abs(x):
    return x.abs().max().item() if x.numel() else 0.0


def _per_sequence(padded_logits, mask, seqs):
    return [_token_logprobs(padded_logits[r][mask[r].bool()], s) for r, s in enumerate(seqs)]


@pytest.mark.parametrize("kind", KINDS)
def test_logprobs_alone_equal_padded_equal_packed(kind):
    """Invariant (docs/design.md "packed = padded = alone"): a sequence's log-probs are the same alone,
    left-padded in a batch, and packed with others (fp32, max |Δ| <= 1e-5)."""
    model = _model(kind)
    ids, mask, pos, seqs = _batch()
    packed = pack_padded_batch(ids, mask, pos)
    with torch.no_grad():
        alone = [_token_logprobs(model(input_ids=s[None], use_cache=False).logits[0], s) for s in seqs]
        padded = _per_sequence(forward_padded(model, ids, mask, pos), mask, seqs)
        packed_lp = _per_sequence(unpack_to_padded(forward_packed(model, packed), packed), mask, seqs)
    for a, p, k in zip(alone, padded, packed_lp):
        assert _max_abs(a - p) <= 1e-5
        assert _max_abs(a - k) <= 1e-5


@pytest.mark.parametrize("kind", KINDS)
def test_unpatched_hf_model_leaks_across_packed_sequences(kind):
    """Control: the same packed row through the UNPATCHED HF model (positions restarting, no mask, no cache — the
    best HF can do) changes later sequences' log-probs by far more than 1e-5, and forward_packed refuses it."""
    model = _model(kind, patched=False)
    ids, mask, pos, seqs = _batch()
    packed = pack_padded_batch(ids, mask, pos)
    with torch.no_grad():
        leaky = model(input_ids=packed.input_ids, position_ids=packed.position_ids, use_cache=False).logits
        leaky = _per_sequence(unpack_to_padded(leaky, packed), mask, seqs)
        alone = [_token_logprobs(model(input_ids=s[None], use_cache=False).logits[0], s) for s in seqs]
    assert _max_abs(leaky[0] - alone[0]) <= 1e-5  # the first sequence has nothing before it
    assert max(_max_abs(a - b) for a, b in zip(leaky[2:], alone[2:])) > 1e-2
    with pytest.raises(RuntimeError, match="apply the model patches"):
        forward_packed(model, packed)


def _param_grads(model):
    return {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}


def _packed_grads(model, ids, mask, pos, seqs):
    model.zero_grad()
    packed = pack_padded_batch(ids, mask, pos)
    logits = unpack_to_padded(forward_packed(model, packed), packed)
    sum(lp.sum() for lp in _per_sequence(logits, mask, seqs)).backward()
    return _param_grads(model)


def _assert_grads_close(grads, ref, rel=1e-4):
    assert grads.keys() == ref.keys()
    for name, g in grads.items():
        scale = ref[name].abs().max().clamp(min=1e-8)
        assert ((g - ref[name]).abs().max() / scale).item() <= rel, name


@pytest.mark.parametrize("kind", KINDS)
def test_packed_gradients_match_sequences_alone(kind):
    """Invariant: d(Σ log-probs)/dθ of the packed forward equals the sum of per-sequence gradients, relative 1e-4
    per parameter tensor (fp32 summation order only)."""
    model = _model(kind).train()
    ids, mask, pos, seqs = _batch()
    model.zero_grad()
    sum(_token_logprobs(model(input_ids=s[None], use_cache=False).logits[0], s).sum() for s in seqs).backward()
    ref = _param_grads(model)
    _assert_grads_close(_packed_grads(model, ids, mask, pos, seqs), ref)


def test_packed_gradients_with_gradient_checkpointing():
    """Boundaries survive the backward recomputation of gradient checkpointing (they travel as kwargs, not as a
    scope that has ended): checkpointed packed gradients equal the plain packed gradients (relative 1e-4)."""
    model = _model("qwen3_5_moe").train()
    ids, mask, pos, seqs = _batch()
    ref = _packed_grads(model, ids, mask, pos, seqs)
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    _assert_grads_close(_packed_grads(model, ids, mask, pos, seqs), ref)


def test_generation_with_cache_is_unchanged_by_the_patch():
    """Generation (with a recurrent cache) defers to HF's own GDN forward: greedy tokens are identical."""
    ids = torch.randint(0, VOCAB, (1, 9), generator=torch.Generator().manual_seed(5))
    reference = _model("qwen3_5", patched=False).generate(ids, max_new_tokens=6, do_sample=False, use_cache=True)
    patched = _model("qwen3_5").generate(ids, max_new_tokens=6, do_sample=False, use_cache=True)
    assert torch.equal(reference, patched)


def test_patch_status_and_training_defaults():
    """The registry reports the varlen patch as applied, every GDN layer (3 of the 4) is patched, and the config no
    longer defaults to creating a cache (which would disable HF's packed-mask detection)."""
    model = _model("qwen3_5")
    assert get_patch_status(model)["qwen3_5-varlen-gdn"].state == "applied"
    assert model.config.use_cache is False
    assert apply_varlen_gdn(model) == 3  # idempotent: re-applying patches nothing twice


def test_full_attention_only_model_is_skipped_with_reason():
    """A Qwen3.5 config without linear-attention layers has nothing to patch: skipped, with the reason."""
    model = build_tiny_model("qwen3_5", VOCAB, layer_types=["full_attention"] * 2)
    status = apply_patches(model, platform="cpu", report=False)
    assert status[0].state == "skipped" and "GatedDeltaNet" in status[0].reason


def test_unsupported_transformers_version_names_the_range(monkeypatch):
    """Outside the supported transformers range the required varlen patch cannot apply, so building the model for
    training stops with a message naming the supported range (instead of training on leaking packed sequences)."""
    from packaging.version import Version

    monkeypatch.setattr("verl.models.transformers.patch_registry._transformers_version", lambda: Version("6.0.0"))
    model = _model("qwen3_5", patched=False)
    with pytest.raises(RuntimeError, match=r"qwen3_5-varlen-gdn.*>=5\.4\.0,<6"):
        apply_patches(model, platform="cpu", report=False)
    # Without the patch, packed training still refuses the model.
    ids, mask, pos, _ = _batch()
    with pytest.raises(RuntimeError, match="apply the model patches"):
        forward_packed(model, pack_padded_batch(ids, mask, pos))


def test_packed_input_with_cache_or_mask_is_refused():
    """A patched GDN layer refuses packed boundaries together with a cache or a padding mask (both would make the
    packed row wrong) instead of silently ignoring one of them."""
    model = _model("qwen3_5")
    gdn = model.model.layers[0].linear_attn
    hidden = torch.randn(1, 6, 64)
    cu = torch.tensor([0, 2, 6], dtype=torch.int32)
    with pytest.raises(ValueError, match="use_cache=False"):
        gdn(hidden, object(), verl_cu_seqlens=cu)
    with pytest.raises(ValueError, match="attention_mask=None"):
        gdn(hidden, attention_mask=torch.ones(1, 6), verl_cu_seqlens=cu)


def test_patch_report_names_the_gdn_backend(monkeypatch):
    """The start-up report says which GDN kernels run: torch on the CPU; on an accelerator fla when it imports,
    else torch with the reason (the rule of verl.ops.backends.select_backend)."""
    from verl.models.transformers import qwen3_5 as patch_module
    from verl.ops import backends

    statuses = {s.name: s for s in apply_patches(build_tiny_model("qwen3_5", VOCAB, 0), platform="cpu", report=False)}
    assert statuses["qwen3_5-varlen-gdn"].line().endswith("; GDN kernels: torch")
    monkeypatch.setattr(backends, "fla_available", lambda: False)
    assert patch_module.gdn_backend_note("npu") == (
        "GDN kernels: torch (fla not importable: pure-torch chunked kernels, exact but slower)"
    )
    monkeypatch.setattr(backends, "fla_available", lambda: True)
    assert patch_module.gdn_backend_note("npu") == "GDN kernels: fla"
    assert patch_module.gdn_backend_note("npu", backend="torch") == "GDN kernels: torch"
