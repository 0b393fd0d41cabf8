"""NPU kernel patches (verl/models/transformers/npu_patches.py) on the simulated Ascend.

Each patch swaps module forwards for torch_npu fused ops; the simulated torch_npu implements the documented op
semantics, so a patched model on the simulated npu must reproduce the unpatched HF model on the CPU. fp32
throughout: differences are summation-order round-off, bounded by 1e-5 on logits of magnitude ~1.
"""

import copy

import pytest
import torch
import transformers

from verl.models.tiny import build_tiny_model
from verl.models.transformers import npu_patches
from verl.models.transformers.packed_forward import forward_packed, forward_padded
from verl.models.transformers.patch_registry import apply_patches, get_patch_status
from verl.utils.packing import pack_padded_batch
from verl.utils.platform.npu_sim import simulated_ascend

VOCAB = 128
NPU_PATCH_NAMES = [p.name for p in npu_patches.NPU_PATCHES]
KINDS = ["llama", "qwen2", "qwen3", "qwen3_moe", "qwen3_5", "qwen3_5_moe"]
MOE_KINDS = {"qwen3_moe", "qwen3_5_moe"}


@pytest.fixture
def sim():
    with simulated_ascend():
        yield


def _hf_tiny(kind: str):
    common = dict(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        max_position_embeddings=256,
        tie_word_embeddings=False,
    )
    if kind == "llama":
        return transformers.LlamaForCausalLM(transformers.LlamaConfig(**common))
    if kind == "qwen2":
        return transformers.Qwen2ForCausalLM(transformers.Qwen2Config(**common))
    if kind == "qwen3":
        return transformers.Qwen3ForCausalLM(transformers.Qwen3Config(**common))
    config = transformers.Qwen3MoeConfig(**common, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=16)
    return transformers.Qwen3MoeForCausalLM(config)


def _model(kind: str, seed: int = 0):
    """A tiny model of ``kind`` in fp32/eval with sdpa attention; random (non-zero) norm weights."""
    if kind.startswith("qwen3_5"):
        model = build_tiny_model(kind, VOCAB, seed)
    else:
        torch.manual_seed(seed)
        model = _hf_tiny(kind).float().eval()
        model.config._attn_implementation = "sdpa"
    torch.manual_seed(seed + 1)
    with torch.no_grad():  # ones/zeros norm weights would hide a w vs (1 + w) mix-up
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_(torch.randn_like(p) * 0.3 + (0.0 if kind.startswith("qwen3_5") else 1.0))
    return model


def _batch(device: str):
    torch.manual_seed(1)
    lengths = (7, 1, 12)
    ids = torch.randint(0, VOCAB, (3, 12))
    mask = (torch.arange(12)[None] < torch.tensor(lengths)[:, None]).long()
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    return ids.to(device), mask.to(device), pos.to(device)


def _reference(kind: str):
    """Unpatched model on the CPU (the required Qwen3.5 varlen-GDN patch applied, so packing is exact)."""
    model = _model(kind)
    if kind.startswith("qwen3_5"):
        apply_patches(model, platform="cpu", report=False)
    return model


def _on_npu(model, **patch_kwargs):
    model = copy.deepcopy(model).to("npu")
    statuses = apply_patches(model, platform="npu", report=False, **patch_kwargs)
    return model, {s.name: s for s in statuses}


def _logits(model, device: str, packed: bool):
    ids, mask, pos = _batch(device)
    if packed:
        return forward_packed(model, pack_padded_batch(ids, mask, pos)).cpu()
    out = forward_padded(model, ids, mask, pos)
    return (out * mask.unsqueeze(-1)).cpu()  # pad rows are not compared


@pytest.mark.parametrize("kind", KINDS)
def test_all_npu_patches_apply_and_match_reference(sim, kind):
    """Every NPU patch applies to its family and the patched npu model equals the CPU reference (packed+padded)."""
    reference = _reference(kind)
    patched, status = _on_npu(_model(kind))
    expected = {n: "applied" for n in NPU_PATCH_NAMES if kind in MOE_KINDS or n != "npu-grouped-matmul-moe"}
    if kind == "qwen3_moe":  # every layer is sparse: no dense Qwen3MoeMLP to fuse
        expected["npu-swiglu"] = "skipped"
        assert "no Qwen3MoeMLP module" in status["npu-swiglu"].reason
    assert {n: status[n].state for n in expected} == expected
    for packed in (True, False):
        torch.testing.assert_close(
            _logits(patched, "npu", packed), _logits(reference, "cpu", packed), atol=1e-5, rtol=0
        )


ALONE_CASES = [
    (kind, patch)
    for kind in ("qwen3", "qwen3_5", "qwen3_5_moe")
    for patch in NPU_PATCH_NAMES
    if kind in MOE_KINDS or patch != "npu-grouped-matmul-moe"
]


@pytest.mark.parametrize("kind, patch", ALONE_CASES)
def test_each_patch_alone_matches_reference(sim, kind, patch):
    """Each patch on its own (the others disabled) keeps the packed forward equal to the reference."""
    others = [n for n in NPU_PATCH_NAMES if n != patch]
    patched, status = _on_npu(_model(kind), disabled=others)
    assert status[patch].state == "applied", status[patch]
    torch.testing.assert_close(_logits(patched, "npu", True), _logits(_reference(kind), "cpu", True), atol=1e-5, rtol=0)


@pytest.mark.parametrize("kind", ["qwen3_moe", "qwen3_5_moe"])
def test_gradients_through_patched_model_match_reference(sim, kind):
    """Backward through the fused ops (incl. the grouped-matmul autograd function) gives the reference gradients."""
    reference = _reference(kind)
    patched, _ = _on_npu(_model(kind))
    _logits_with_grad = {}
    for name, model, device in (("ref", reference, "cpu"), ("npu", patched, "npu")):
        ids, mask, pos = _batch(device)
        logits = forward_packed(model, pack_padded_batch(ids, mask, pos))
        (logits.float().pow(2).mean()).backward()
        _logits_with_grad[name] = {n: p.grad.cpu() for n, p in model.named_parameters() if p.grad is not None}
    ref, npu = _logits_with_grad["ref"], _logits_with_grad["npu"]
    assert ref.keys() == npu.keys() and any("experts" in n for n in ref)
    for name in ref:
        # gradient magnitudes ~1e-3..1e-1: 1e-6 absolute is fp32 round-off over a few hundred terms
        torch.testing.assert_close(npu[name], ref[name], atol=1e-6, rtol=1e-4, msg=name)


def test_fusion_attention_runs_tnd_on_packed_input_only(sim, monkeypatch):
    """Packed input calls npu_fusion_attention in TND layout with cumulative lengths cu_seqlens[1:]; padded input
    keeps the configured attention (the kernel is not called)."""
    import torch_npu

    calls = []
    real = torch_npu.npu_fusion_attention

    def spy(*args, **kwargs):
        calls.append((args[4], kwargs["actual_seq_qlen"], kwargs["sparse_mode"]))
        return real(*args, **kwargs)

    monkeypatch.setattr(torch_npu, "npu_fusion_attention", spy)
    patched, _ = _on_npu(_model("qwen3"))
    calls.clear()  # the start-up probe's own packed batch (lengths 3, 2) in train and eval mode
    _logits(patched, "npu", packed=True)
    assert calls == [("TND", [7, 8, 20], 3)] * 2  # 2 layers; lengths 7, 1, 12 → cumulative ends 7, 8, 20
    calls.clear()
    _logits(patched, "npu", packed=False)
    assert calls == []


def test_missing_target_class_is_skipped_and_others_still_apply(sim, monkeypatch):
    """A transformers without Qwen3MLP: npu-swiglu is skipped with the reason; the other patches still apply."""
    from transformers.models.qwen3 import modeling_qwen3

    model = _model("qwen3")  # models are built before the class disappears
    expected = _logits(_reference("qwen3"), "cpu", True)
    monkeypatch.delattr(modeling_qwen3, "Qwen3MLP")
    patched, status = _on_npu(model)
    assert status["npu-swiglu"].state == "skipped"
    assert "has no transformers.models.qwen3.modeling_qwen3.Qwen3MLP" in status["npu-swiglu"].reason
    assert {status[n].state for n in ("npu-rms-norm", "npu-rotary-mul", "npu-fusion-attention")} == {"applied"}
    assert get_patch_status(patched)["npu-swiglu"].state == "skipped"
    torch.testing.assert_close(_logits(patched, "npu", True), expected, atol=1e-5, rtol=0)


def test_op_missing_from_torch_npu_is_skipped(sim, monkeypatch):
    """An older torch_npu without npu_swiglu: that patch is skipped naming the op; the report line says so."""
    import torch_npu

    monkeypatch.delattr(torch_npu, "npu_swiglu")
    _, status = _on_npu(_model("llama"))
    assert status["npu-swiglu"].state == "skipped" and "has no npu_swiglu" in status["npu-swiglu"].reason
    assert "skipped: torch_npu" in status["npu-swiglu"].line()
    assert status["npu-rms-norm"].state == "applied"


def test_zero_centred_norm_without_gemma_op_matches(sim, monkeypatch):
    """Qwen3.5's x·(1+w) norm through plain npu_rms_norm (older torch_npu) still equals the reference in fp32."""
    import torch_npu

    monkeypatch.delattr(torch_npu, "npu_gemma_rms_norm")
    patched, status = _on_npu(_model("qwen3_5"), disabled=[n for n in NPU_PATCH_NAMES if n != "npu-rms-norm"])
    assert status["npu-rms-norm"].state == "applied"
    torch.testing.assert_close(
        _logits(patched, "npu", True), _logits(_reference("qwen3_5"), "cpu", True), atol=1e-5, rtol=0
    )


def test_patches_touch_instances_not_classes(sim):
    """The class forwards are untouched; an unpatched instance of the same class runs the original code."""
    from transformers.models.qwen3 import modeling_qwen3

    from verl.models.transformers.instance_patch import has_own_forward, original_class

    class_forwards = {c: c.forward for c in (modeling_qwen3.Qwen3RMSNorm, modeling_qwen3.Qwen3Attention)}
    patched, _ = _on_npu(_model("qwen3"))
    fresh = _model("qwen3")
    assert {c: c.forward for c in class_forwards} == class_forwards
    patched_attention, fresh_attention = patched.model.layers[0].self_attn, fresh.model.layers[0].self_attn
    assert has_own_forward(patched_attention) and original_class(patched_attention) is modeling_qwen3.Qwen3Attention
    assert not has_own_forward(fresh_attention) and type(fresh_attention) is modeling_qwen3.Qwen3Attention
    assert modeling_qwen3.apply_rotary_pos_emb.__module__ == modeling_qwen3.__name__


def test_applying_twice_is_idempotent(sim):
    """A second apply_patches neither double-wraps a forward nor changes the output."""
    patched, _ = _on_npu(_model("qwen3_5_moe"))
    apply_patches(patched, platform="npu", report=False)
    torch.testing.assert_close(
        _logits(patched, "npu", True), _logits(_reference("qwen3_5_moe"), "cpu", True), atol=1e-5, rtol=0
    )


def test_without_torch_npu_every_npu_patch_is_skipped():
    """No torch_npu (this CPU machine): each NPU patch is reported skipped with the import error, none fails."""
    statuses = {s.name: s for s in apply_patches(_model("qwen3"), platform="npu", report=False)}
    for name in [n for n in NPU_PATCH_NAMES if n != "npu-grouped-matmul-moe"]:
        assert statuses[name].state == "skipped"
        assert "torch_npu is not importable" in statuses[name].reason
