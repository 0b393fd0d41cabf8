"""Ulysses SP on the one packed format: SP = 2 (and 4) computes what SP = 1 computes (docs/design.md "SP 1 = 2").

Tiny Llama, Qwen2, Qwen3.5 and Qwen3.5-MoE ([GDN, GDN, GDN, full attention]) models run the same packed batch
with and without sequence parallelism over gloo ranks. The batches are chosen so that the packed length is not a
multiple of SP (the stream is padded) and sequences straddle the rank slices: Llama/Qwen2 lengths (7, 1, 12, 5),
T = 25 -> 26 with SP 2, slices [0, 13) [13, 26): the third sequence [8, 20) lies in both; Qwen3.5 lengths
(37, 1, 50, 29), T = 117 -> 118, slices [0, 59) [59, 118): the third sequence [38, 88) lies in both.

Log-probs: fp32, max |Δ| <= 1e-5 (only the reduction order of per-head attention differs). Gradients: the SP
gradient of every parameter averaged over the SP ranks (what FSDP's all-reduce does) equals the SP = 1 gradient
to 1e-4 of its largest entry (fp32 sums over different token splits).
"""

import os
import tempfile

import pytest
import torch
import torch.distributed as dist
from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

from verl.models.tiny import build_tiny_model
from verl.models.transformers.instance_patch import original_class
from verl.models.transformers.packed_forward import forward_packed
from verl.models.transformers.patch_registry import apply_patches
from verl.utils.packing import PackedBatch, pack_padded_batch, pack_values
from verl.utils.rope_utils import get_packed_mrope_position_ids
from verl.utils.testing.dist import spawn

pytestmark = pytest.mark.tf_compat

VOCAB = 128
LENGTHS = {"llama": (7, 1, 12, 5), "qwen2": (7, 1, 12, 5), "qwen3_5": (37, 1, 50, 29), "qwen3_5_moe": (37, 1, 50, 29)}
KINDS = tuple(LENGTHS)


def _model(kind: str, **overrides) -> torch.nn.Module:
    if kind in ("llama", "qwen2"):
        common = dict(
            vocab_size=VOCAB,
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=256,
        )
        common.update(overrides)
        torch.manual_seed(0)
        config = LlamaConfig(**common) if kind == "llama" else Qwen2Config(**common)
        config._attn_implementation = "sdpa"
        return (LlamaForCausalLM if kind == "llama" else Qwen2ForCausalLM)(config).float()
    model = build_tiny_model(kind, VOCAB, seed=0, **overrides)
    with torch.no_grad():  # slow GDN decay: a state leaked across a boundary would stay visible (test_qwen3_5.py)
        for module in model.modules():
            if hasattr(module, "A_log"):
                module.A_log.fill_(torch.log(torch.tensor(0.05)).item())
    apply_patches(model, platform="cpu", report=False)
    return model


def _packed(lengths, seed: int = 1) -> PackedBatch:
    gen = torch.Generator().manual_seed(seed)
    width = max(lengths) + 2
    ids = torch.zeros(len(lengths), width, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for row, n in enumerate(lengths):
        ids[row, width - n :] = torch.randint(1, VOCAB, (n,), generator=gen)
        mask[row, width - n :] = 1
    return pack_padded_batch(ids, mask)


def _next_token_logprobs(logits: torch.Tensor, packed: PackedBatch) -> torch.Tensor:
    """(T - 1,) fp32 log p(token t+1 | ...) over the packed stream, 0 where t is the last token of its sequence."""
    ids = packed.input_ids[0]
    lp = torch.log_softmax(logits[0, :-1].float(), -1).gather(-1, ids[1:, None]).squeeze(-1)
    is_last = torch.zeros(ids.numel(), dtype=torch.bool)
    is_last[packed.cu_seqlens[1:].long() - 1] = True
    return lp.masked_fill(is_last[:-1], 0.0)


def _run(model, packed, group):
    """Log-probs and parameter gradients of sum(w * log-probs) with fixed weights w (same on every rank)."""
    model.zero_grad()
    lp = _next_token_logprobs(forward_packed(model, packed, ulysses_group=group), packed)
    weights = torch.linspace(0.5, 1.5, lp.numel())
    (lp * weights).sum().backward()
    grads = {n: (p.grad if p.grad is not None else torch.zeros_like(p)).clone() for n, p in model.named_parameters()}
    return lp.detach(), grads


def _sp_mean(grads: dict, group) -> dict:
    """Average over the SP ranks, parameter by parameter in a fixed order (every rank joins every all-reduce)."""
    world = dist.get_world_size(group)
    for name in sorted(grads):
        dist.all_reduce(grads[name], group=group)
        grads[name] /= world
    return grads


def _compare(model, packed, group) -> dict:
    lp1, g1 = _run(model, packed, None)
    lp_sp, g_sp = _run(model, packed, group)
    g_sp = _sp_mean(g_sp, group)
    rel = {n: ((g_sp[n] - g1[n]).abs().max() / g1[n].abs().max().clamp(min=1e-12)).item() for n in g1}
    nonzero = sum(bool(g.abs().max() > 0) for g in g1.values())
    return {"lp": (lp1 - lp_sp).abs().max().item(), "grad": max(rel.values()), "nonzero": nonzero, "params": len(g1)}


def _equivalence(group, kinds: tuple[str, ...], checkpointing: bool) -> dict:
    res = {kind: _compare(_model(kind), _packed(LENGTHS[kind]), group) for kind in kinds}
    if not checkpointing:
        return res
    # one KV head and one GDN key head: fewer than the ranks, so both are replicated (what SP 4 does on the real
    # Qwen3.5 with its 2 KV heads)
    replicated = _model("qwen3_5_moe", num_key_value_heads=1, linear_num_key_heads=1)
    res["qwen3_5_moe+replicated_heads"] = _compare(replicated, _packed(LENGTHS["qwen3_5_moe"]), group)
    ckpt = _model("qwen3_5").train()
    ckpt.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    res["qwen3_5+checkpointing"] = _compare(ckpt, _packed(LENGTHS["qwen3_5"]), group)
    return res


def _fsdp2_compare(group) -> dict:
    """SP = 2 inside an FSDP2-sharded Qwen3.5 (FSDP over the same 2 ranks): FSDP's gradient reduce-scatter averages
    over the ranks, which is the SP mean, so the unsharded gradients must equal SP = 1 without any extra step."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    packed = _packed(LENGTHS["qwen3_5"])
    lp1, g1 = _run(_model("qwen3_5"), packed, None)
    model = _model("qwen3_5")
    mesh = init_device_mesh("cpu", (dist.get_world_size(group),))
    # fp32 "mixed" precision still casts the forward inputs: FSDP then rebuilds every dataclass among the kwargs
    policy = MixedPrecisionPolicy(param_dtype=torch.float32, reduce_dtype=torch.float32, cast_forward_inputs=True)
    for layer in model.model.layers:
        fully_shard(layer, mesh=mesh, mp_policy=policy)
    fully_shard(model, mesh=mesh, mp_policy=policy)
    lp_sp, g_sp = _run(model, packed, group)
    g_sp = {n: g.full_tensor() for n, g in g_sp.items()}
    rel = {n: ((g_sp[n] - g1[n]).abs().max() / g1[n].abs().max().clamp(min=1e-12)).item() for n in g1}
    nonzero = sum(bool(g.abs().max() > 0) for g in g1.values())
    return {"lp": (lp1 - lp_sp).abs().max().item(), "grad": max(rel.values()), "nonzero": nonzero, "params": len(g1)}


def _multimodal(seed: int = 0):
    """Two image samples (4x4 and 4x6 patches -> 4 and 6 merged tokens) around a text sample, packed with 4-row
    M-RoPE ids: lengths 21, 11, 19 -> T = 51 (padded to 52 under SP 2; slices [0, 26) [26, 52))."""
    image, start, end = VOCAB - 4, VOCAB - 2, VOCAB - 1  # tiny_qwen3_5_vl_config's default special ids
    gen = torch.Generator().manual_seed(seed)
    text = lambda n: torch.randint(0, VOCAB - 4, (n,), generator=gen)  # noqa: E731
    rows, pixels, grids = [], [], []
    for prefix, grid, suffix in ((5, (1, 4, 4), 10), (3, None, 8), (7, (1, 4, 6), 4)):
        if grid is None:
            rows.append(text(prefix + suffix))
            continue
        n_image = grid[0] * grid[1] * grid[2] // 4
        rows.append(
            torch.cat(
                [text(prefix), torch.tensor([start]), torch.full((n_image,), image), torch.tensor([end]), text(suffix)]
            )
        )
        pixels.append(torch.randn(grid[0] * grid[1] * grid[2], 3 * 2 * 4 * 4, generator=gen))
        grids.append(torch.tensor([grid]))
    width = max(len(r) for r in rows) + 2
    ids = torch.zeros(len(rows), width, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for row, seq in enumerate(rows):
        ids[row, width - len(seq) :], mask[row, width - len(seq) :] = seq, 1
    types = (ids == image).long()
    grids = torch.cat(grids)
    pos = get_packed_mrope_position_ids(types, mask, grids, spatial_merge_size=2)
    packed = pack_padded_batch(ids, mask, pos)
    return packed, dict(
        pixel_values=torch.cat(pixels), image_grid_thw=grids, mm_token_type_ids=pack_values(types, packed)
    )


def _multimodal_compare(group) -> dict:
    """Like _compare, for the tiny multimodal Qwen3.5 (vision tower gradients included)."""
    model = _model("qwen3_5_vl")
    packed, mm = _multimodal()
    results = []
    for g in (None, group):
        model.zero_grad()
        lp = _next_token_logprobs(forward_packed(model, packed, ulysses_group=g, **mm), packed)
        (lp * torch.linspace(0.5, 1.5, lp.numel())).sum().backward()
        grads = {
            n: (p.grad if p.grad is not None else torch.zeros_like(p)).clone() for n, p in model.named_parameters()
        }
        results.append((lp.detach(), grads))
    (lp1, g1), (lp_sp, g_sp) = results
    g_sp = _sp_mean(g_sp, group)
    rel = {n: ((g_sp[n] - g1[n]).abs().max() / g1[n].abs().max().clamp(min=1e-12)).item() for n in g1}
    nonzero = sum(bool(g.abs().max() > 0) for g in g1.values())
    vision = sum(bool(g.abs().max() > 0) for n, g in g1.items() if "visual" in n)
    return {
        "lp": (lp1 - lp_sp).abs().max().item(),
        "grad": max(rel.values()),
        "nonzero": nonzero,
        "params": len(g1),
        "vision": vision,
    }


def _worker_core_log_probs(group) -> float:
    """The workers' log-prob core unchanged, with only the SP group installed: fused LM head + entropy."""
    from verl.utils.ulysses import set_ulysses_sequence_parallel_group
    from verl.workers.core.model_forward import LogProbOptions, forward_log_probs

    model = _model("qwen3_5_moe")
    packed = _packed(LENGTHS["qwen3_5_moe"], seed=3)
    width = max(LENGTHS["qwen3_5_moe"]) + 2
    ids = torch.zeros(packed.batch_size * width, dtype=torch.long).index_copy(0, packed.indices, packed.input_ids[0])
    mask = torch.zeros(packed.batch_size * width, dtype=torch.long).index_fill(0, packed.indices, 1)
    batch = {"input_ids": ids.view(-1, width), "attention_mask": mask.view(-1, width)}
    batch["position_ids"] = (batch["attention_mask"].cumsum(-1) - 1).clamp(min=0)
    kwargs = dict(response_length=20, temperature=0.7, calculate_entropy=True, options=LogProbOptions())
    with torch.no_grad():
        ref = forward_log_probs(model, batch, **kwargs)
        set_ulysses_sequence_parallel_group(group)
        try:
            sp = forward_log_probs(model, batch, **kwargs)
        finally:
            set_ulysses_sequence_parallel_group(None)
    return max((ref[k] - sp[k]).abs().max().item() for k in ("log_probs", "entropys"))


def _error(fn) -> str:
    try:
        fn()
    except (ValueError, RuntimeError) as e:
        return f"{type(e).__name__}: {e}"
    return "no error"


def _guards(rank: int, group) -> dict:
    """Misuse is refused on every rank (symmetrically, so no rank hangs in a collective)."""
    res = {}
    model = _model("llama")
    other = _packed((7, 1, 12, 5), seed=1 + rank)  # rank 1 gets different tokens
    res["different_batches"] = _error(lambda: forward_packed(model, other, ulysses_group=group))
    three_heads = _model("llama", hidden_size=24, num_attention_heads=3, num_key_value_heads=3)
    res["heads"] = _error(lambda: forward_packed(three_heads, _packed((7, 1, 12, 5)), ulysses_group=group))
    bypassed = _model("llama")
    forward_packed(bypassed, _packed((3, 4)), ulysses_group=group)  # installs the SP attention wrapper
    attention = bypassed.model.layers[1].self_attn
    attention.__class__ = original_class(attention)  # a later pass dropping the wrapper: silent local attention
    res["bypassed"] = _error(lambda: forward_packed(bypassed, _packed((7, 1, 12, 5)), ulysses_group=group))
    return res


def _count_strided_collective_inputs() -> list:
    """Wrap the collectives SP uses; record every call whose tensors are not contiguous (field-report item 4)."""
    strided: list = []
    for name in ("all_to_all_single", "all_gather_single"):
        real = getattr(dist, name)

        def wrapped(output, input, *args, _real=real, _name=name, **kwargs):
            if not (output.is_contiguous() and input.is_contiguous()):
                strided.append((_name, tuple(input.shape)))
            return _real(output, input, *args, **kwargs)

        setattr(dist, name, wrapped)
    return strided


def _worker(rank: int, world: int, init_file: str, out_dir: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    group = dist.new_group(list(range(world)))
    strided = _count_strided_collective_inputs()
    if world == 2:
        res = {"equivalence": _equivalence(group, KINDS, checkpointing=True)}
        res["equivalence"]["qwen3_5_vl"] = _multimodal_compare(group)
        res["equivalence"]["qwen3_5+fsdp2"] = _fsdp2_compare(group)
        res["worker_core"] = _worker_core_log_probs(group)
        res["guards"] = _guards(rank, group)
    else:  # the kinds whose replication paths SP 4 exercises (Llama: KV heads; Qwen3.5: KV and GDN key heads)
        res = {"equivalence": _equivalence(group, ("llama", "qwen3_5"), checkpointing=False)}
    res["strided_collective_inputs"] = strided
    torch.save(res, os.path.join(out_dir, f"{rank}.pt"))
    dist.destroy_process_group()


def _spawn(world: int) -> list[dict]:
    with tempfile.TemporaryDirectory() as tmp:
        spawn(_worker, args=(world, os.path.join(tmp, "init"), tmp), nprocs=world)
        return [torch.load(os.path.join(tmp, f"{rank}.pt")) for rank in range(world)]


def _assert_equivalent(results: list[dict]) -> None:
    for res in results:
        assert res["strided_collective_inputs"] == []
        for kind, r in res["equivalence"].items():
            assert r["lp"] <= 1e-5, (kind, r)
            assert r["grad"] <= 1e-4, (kind, r)
            # the comparison is not vacuous: (nearly) every parameter has a gradient
            assert r["nonzero"] >= r["params"] - 4, (kind, r)


def test_context_passes_through_fsdp_input_handling_unchanged():
    """Invariant: FSDP's forward-input cast/move (torch.distributed.utils._apply_to_tensors) hands the layers the
    very UlyssesContext object forward_packed checks after the forward (a rebuilt copy would hide the layers'
    call counts; dataclasses are rebuilt, so the context must not be one)."""
    from torch.distributed.utils import _apply_to_tensors

    from verl.models.transformers.ulysses import ULYSSES_KWARG, UlyssesContext

    context = UlyssesContext(None, 2, 0, torch.tensor([0, 3, 4], dtype=torch.int32), 3)
    kwargs = {ULYSSES_KWARG: context, "input_ids": torch.zeros(1, 2, dtype=torch.long)}
    cast = _apply_to_tensors(lambda t: t.to(torch.float32) if t.is_floating_point() else t, kwargs)
    assert cast[ULYSSES_KWARG] is context


@pytest.mark.dist
def test_sp2_equals_sp1_for_every_model_and_refuses_misuse():
    """Invariant (docs/design.md "SP 1 = 2"): with SP = 2 the packed log-probs of Llama, Qwen2, Qwen3.5, Qwen3.5-MoE
    and multimodal Qwen3.5 (images, 4-row M-RoPE ids) equal SP = 1 (fp32 1e-5) and the SP-averaged parameter
    gradients equal the SP = 1 gradients (1e-4 relative), also with gradient checkpointing; the workers' log-prob
    core (fused LM head + entropy) gives the same log-probs and entropy when only the SP group is installed; every
    tensor handed to a collective is contiguous. Misuse raises on every rank: different micro-batches on the SP
    ranks, heads not divisible by SP (naming the config key), an attention layer that bypassed the SP wrapper."""
    results = _spawn(2)
    _assert_equivalent(results)
    for res in results:
        assert res["equivalence"]["qwen3_5_vl"]["vision"] > 0  # the vision tower's gradients are compared too
        assert res["worker_core"] <= 1e-5
        guards = res["guards"]
        assert guards["different_batches"].startswith("RuntimeError: Ulysses SP: the ranks of one SP group")
        assert "ulysses_sequence_parallel_size=2" in guards["heads"] and guards["heads"].startswith("ValueError")
        assert guards["bypassed"].startswith("RuntimeError: Ulysses SP forward: 1/2 attention")


@pytest.mark.dist
@pytest.mark.slow
def test_sp4_equals_sp1_with_replicated_kv_and_gdn_key_heads():
    """Invariant: SP = 4 equals SP = 1 as above. With 4 ranks the tiny models' 2 KV heads (attention) and 2 GDN key
    heads are fewer than the ranks, so they are replicated (each rank holds the key head of its query/value heads);
    T = 25 -> 28 (Llama) and 117 -> 120 (Qwen3.5) are padded by 3. Opt-in (slow: 4 processes on a shared machine,
    30-40 s); the replication paths also run at SP = 2 in the default test, with 1 KV / 1 GDN key head."""
    _assert_equivalent(_spawn(4))
