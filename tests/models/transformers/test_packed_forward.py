"""packed == padded == alone for generic HF causal LMs (Llama, Qwen2) through verl's packed forward."""

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

from verl.models.transformers.packed_forward import (
    forward_packed,
    forward_padded,
    get_lm_head,
    packed_attention_kwargs,
)
from verl.utils.packing import pack_padded_batch, unpack_to_padded

pytestmark = pytest.mark.tf_compat

VOCAB = 128
LENGTHS = (7, 1, 12, 5)  # includes a length-1 sequence


def _tiny(kind: str, attn: str) -> torch.nn.Module:
    common = dict(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        use_cache=True,
    )
    torch.manual_seed(0)
    config = LlamaConfig(**common) if kind == "llama" else Qwen2Config(**common)
    config._attn_implementation = attn
    model = (LlamaForCausalLM if kind == "llama" else Qwen2ForCausalLM)(config)
    return model.float().eval()


def _batch(lengths=LENGTHS, left_pad=True, seed=1):
    """Left-padded (B, S) ids/mask/position ids, and the list of unpadded sequences."""
    gen = torch.Generator().manual_seed(seed)
    seqs = [torch.randint(1, VOCAB, (n,), generator=gen) for n in lengths]
    width = max(lengths) + 2  # every row has padding
    ids = torch.zeros(len(seqs), width, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for row, seq in enumerate(seqs):
        cols = slice(width - len(seq), width) if left_pad else slice(0, len(seq))
        ids[row, cols], mask[row, cols] = seq, 1
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    return ids, mask, pos, seqs


def _next_token_logprobs(logits: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """log p(ids[t+1] | ids[:t+1]) for t < len-1, computed in fp32: (n-1,)."""
    return torch.log_softmax(logits[:-1].float(), -1).gather(-1, ids[1:, None]).squeeze(-1)


def _max_abs(x: torch.Tensor) -> float:
    return x.abs().max().item() if x.numel() else 0.0


def _three_ways(model, ids, mask, pos, seqs):
    alone = [_next_token_logprobs(model(input_ids=s[None], use_cache=False).logits[0], s) for s in seqs]
    padded_logits = forward_padded(model, ids, mask, pos)
    packed = pack_padded_batch(ids, mask, pos)
    packed_logits = unpack_to_padded(forward_packed(model, packed), packed)
    padded, packed_lp = [], []
    for row, s in enumerate(seqs):
        keep = mask[row].bool()
        padded.append(_next_token_logprobs(padded_logits[row][keep], s))
        packed_lp.append(_next_token_logprobs(packed_logits[row][keep], s))
    return alone, padded, packed_lp


@pytest.mark.parametrize("kind", ["llama", "qwen2"])
@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_logprobs_alone_equal_padded_equal_packed(kind, attn):
    """Invariant: each sequence's log-probs are the same alone, left-padded in a batch and packed (fp32, 1e-5)."""
    model = _tiny(kind, attn)
    ids, mask, pos, seqs = _batch()
    with torch.no_grad():
        alone, padded, packed = _three_ways(model, ids, mask, pos, seqs)
    assert sum(a.numel() for a in alone) == sum(LENGTHS) - len(LENGTHS)
    for a, p, k in zip(alone, padded, packed):
        # a length-1 sequence has no next-token log-prob: max over an empty diff is taken as 0
        assert _max_abs(a - p) <= 1e-5
        assert _max_abs(a - k) <= 1e-5


def test_naive_packing_without_restarting_positions_leaks():
    """Control: packing the same row with positions 0..T-1 (no restart) changes the log-probs of later sequences,
    so the equality above is a real check, and forward_packed refuses such position ids."""
    model = _tiny("llama", "sdpa")
    ids, mask, pos, seqs = _batch()
    packed = pack_padded_batch(ids, mask, pos)
    with torch.no_grad():
        leaky = model(input_ids=packed.input_ids, use_cache=False).logits[0]
        alone = model(input_ids=seqs[2][None], use_cache=False).logits[0]
    start = int(packed.cu_seqlens[2])
    assert (leaky[start : start + len(seqs[2])] - alone).abs().max().item() > 1e-2
    packed.position_ids = torch.arange(packed.total_tokens)[None]
    with pytest.raises(ValueError, match="do not match cu_seqlens"):
        forward_packed(model, packed)


def test_packed_gradients_match_separate_sequences():
    """Invariant: d(sum of log-probs)/d(params) of the packed forward equals the sum over sequences run alone
    (fp32 reduction order only: relative 1e-4)."""
    model = _tiny("qwen2", "sdpa").train()
    ids, mask, pos, seqs = _batch()
    model.zero_grad()
    sum(_next_token_logprobs(model(input_ids=s[None], use_cache=False).logits[0], s).sum() for s in seqs).backward()
    ref = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad()
    packed = pack_padded_batch(ids, mask, pos)
    logits = unpack_to_padded(forward_packed(model, packed), packed)
    sum(_next_token_logprobs(logits[r][mask[r].bool()], s).sum() for r, s in enumerate(seqs)).backward()
    for name, p in model.named_parameters():
        scale = ref[name].abs().max().clamp(min=1e-6)
        assert ((p.grad - ref[name]).abs().max() / scale).item() <= 1e-4, name


def test_return_hidden_gives_pre_head_states():
    """return_hidden=True returns (1, T, H) states with lm_head(states) == logits of the normal forward."""
    model = _tiny("llama", "sdpa")
    ids, mask, pos, _ = _batch()
    packed = pack_padded_batch(ids, mask, pos)
    with torch.no_grad():
        logits = forward_packed(model, packed)
        hidden = forward_packed(model, packed, return_hidden=True)
        padded_hidden = forward_padded(model, ids, mask, pos, return_hidden=True)
    assert hidden.shape == (1, packed.total_tokens, 32)
    assert padded_hidden.shape == (*ids.shape, 32)
    head = get_lm_head(model)
    assert isinstance(head, torch.nn.Linear)
    assert (head(hidden) - logits).abs().max().item() <= 1e-6


def _strided(t: torch.Tensor) -> torch.Tensor:
    """The same values as ``t`` in a non-contiguous view (every other element of a doubled tensor)."""
    view = torch.stack([t, t], dim=-1)[..., 0]
    assert torch.equal(view, t) and not view.is_contiguous()
    return view


def _seen_kwargs(model, call) -> dict:
    seen = {}
    handle = model.register_forward_pre_hook(lambda m, a, kw: seen.update(kw), with_kwargs=True)
    try:
        with torch.no_grad():
            call()
    finally:
        handle.remove()
    return seen


def test_model_receives_contiguous_tensors_and_no_mask_no_cache():
    """Field-report item 4 and the HF packing conditions: the model gets contiguous ids/positions/cu_seqlens,
    attention_mask=None and use_cache=False, even when the PackedBatch holds strided views (as a caller slicing
    or re-using a packed batch produces; pack_padded_batch's own outputs are contiguous by construction).
    Removing forward_packed's .contiguous() on input_ids/position_ids, or packed_attention_kwargs' on
    cu_seqlens, fails this test."""
    model = _tiny("llama", "sdpa")
    ids, mask, pos, _ = _batch()
    packed = pack_padded_batch(ids, mask, pos)
    packed.input_ids, packed.position_ids = _strided(packed.input_ids), _strided(packed.position_ids)
    packed.cu_seqlens = _strided(packed.cu_seqlens)
    seen = _seen_kwargs(model, lambda: forward_packed(model, packed))
    assert seen["attention_mask"] is None and seen["use_cache"] is False
    for key in ("input_ids", "position_ids", "cu_seq_lens_q", "cu_seq_lens_k", "verl_cu_seqlens"):
        assert seen[key].is_contiguous(), key
    assert seen["cu_seq_lens_q"].dtype == torch.int32 and seen["verl_cu_seqlens"].tolist() == packed.cu_seqlens.tolist()
    assert seen["max_length_q"] == max(LENGTHS)


def test_padded_forward_hands_the_model_contiguous_position_ids():
    """Field-report item 4 on the padded path: position ids handed in as a strided view reach the model
    contiguous, with the same values (removing forward_padded's .contiguous() fails this test)."""
    model = _tiny("llama", "sdpa")
    ids, mask, pos, _ = _batch()
    strided = _strided(pos)
    seen = _seen_kwargs(model, lambda: forward_padded(model, ids, mask, strided))
    assert seen["position_ids"].is_contiguous() and torch.equal(seen["position_ids"], pos)


def test_forward_packed_rejects_bad_cu_seqlens_and_three_row_mrope():
    """A corrupted cu_seqlens and 3-row M-RoPE ids are ValueErrors, not silent cross-sequence attention."""
    model = _tiny("llama", "sdpa")
    ids, mask, pos, _ = _batch()
    packed = pack_padded_batch(ids, mask, pos)
    bad = pack_padded_batch(ids, mask, pos)
    bad.cu_seqlens = bad.cu_seqlens.clone()
    bad.cu_seqlens[-1] += 1
    with pytest.raises(ValueError, match="end at the packed token count"):
        forward_packed(model, bad)
    packed.position_ids = packed.position_ids.unsqueeze(0).expand(3, 1, -1).contiguous()
    with pytest.raises(ValueError, match="4 rows"):
        forward_packed(model, packed)


def test_flash_kwargs_are_left_out_with_vision_inputs():
    """With pixel inputs only verl_cu_seqlens is passed: the vision tower's flash attention passes its own
    cu_seq_lens_q/k and would otherwise receive them twice (text-only inputs get both kinds)."""
    ids, mask, pos, _ = _batch()
    packed = pack_padded_batch(ids, mask, pos)
    assert set(packed_attention_kwargs(packed)) == {
        "verl_cu_seqlens",
        "cu_seq_lens_q",
        "cu_seq_lens_k",
        "max_length_q",
        "max_length_k",
    }
    assert set(packed_attention_kwargs(packed, flash_kwargs=False)) == {"verl_cu_seqlens"}
    seen = {}
    model = _tiny("llama", "sdpa")
    model.register_forward_pre_hook(
        lambda m, a, kw: seen.update(kw) or (a, {**kw, "pixel_values": None}), with_kwargs=True
    )
    with torch.no_grad():
        forward_packed(model, packed, pixel_values=torch.zeros(1))
    assert "verl_cu_seqlens" in seen and "cu_seq_lens_q" not in seen
