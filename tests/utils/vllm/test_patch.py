"""Field-report item 1: pushing trained Qwen3.5-MoE weights into a vLLM engine whose MoE method re-created the fused
expert parameters without ``weight_loader``.

The engine is the fake vLLM model of ``fake_vllm_qwen3_5.py`` (vLLM's names, stacked loaders, FusedMoE loader, a
``load_weights`` that calls ``param.weight_loader`` directly). The source is a tiny HF Qwen3.5-MoE from
``verl.models.tiny``, in both weight formats vLLM accepts: the HF in-memory fused 3-D experts
(``experts.gate_up_proj`` [E, 2I, H]) and the checkpoint's per-expert names (``experts.{e}.gate_proj.weight``),
built by hand so that these tests do not depend on transformers' reverse conversion (the sync tests use it).

Engines built by verl's vLLMRollout record their canonical layout and never need the repair (the staged parameters
carry the loaders; the real engine's test is tests/workers/rollout/test_vllm_engine_sync.py); the repair remains the
path for engines built elsewhere, and vllm-ascend's transposing MoE method exists only as this stand-in here.
"""

import subprocess
import sys

import pytest
import torch
import torch.nn as nn

from verl.utils.vllm import patch as vllm_patch
from verl.utils.vllm.patch import (
    default_moe_weight_loader,
    find_moe_modules,
    repair_moe_weight_loaders,
)
from verl.utils.vllm.utils import require_vllm

# the field report ran transformers 5.4.0: these also run against it (make test-tf-compat)
pytestmark = pytest.mark.tf_compat

FIELD_REPORT_ERROR = "'Parameter' object has no attribute 'weight_loader'"


def hf_weights(model: nn.Module, fmt: str) -> list[tuple[str, torch.Tensor]]:
    """The trained model's tensors as the trainer streams them: ``fused`` = HF in-memory names (3-D experts),
    ``checkpoint`` = per-expert checkpoint names, split here by hand: gate_up_proj [E, 2I, H] -> experts.{e}.gate_proj
    = rows [0, I) and up_proj = rows [I, 2I) of expert e; down_proj [E, H, I] -> experts.{e}.down_proj = [e]."""
    out = []
    for name, tensor in model.state_dict().items():
        if fmt == "fused" or not name.endswith(("experts.gate_up_proj", "experts.down_proj")):
            out.append((name, tensor))
            continue
        prefix = name.rsplit(".", 1)[0]
        for e in range(tensor.shape[0]):
            if name.endswith("gate_up_proj"):
                gate, up = tensor[e].chunk(2, dim=0)
                out += [(f"{prefix}.{e}.gate_proj.weight", gate), (f"{prefix}.{e}.up_proj.weight", up)]
            else:
                out.append((f"{prefix}.{e}.down_proj.weight", tensor[e]))
    return out


def expected_vllm_state(hf_state: dict[str, torch.Tensor], transposed_experts: bool, multimodal: bool) -> dict:
    """Each fake vLLM parameter's expected value, built from the HF tensors by vLLM's stacking rules:

    qkv_proj = cat(q, k, v); in_proj_qkvz = cat(in_proj_qkv, in_proj_z); in_proj_ba = cat(b, a);
    shared_expert.gate_up_proj = cat(gate, up); experts.w13_weight = gate_up_proj [E, 2I, H] (gate rows first, as
    HF stores it) and w2_weight = down_proj [E, H, I] — both with the last two dims swapped when the platform
    transposed them; everything else unchanged. Names map model.language_model. -> language_model.model.,
    model.visual. -> visual., lm_head. -> language_model.lm_head. for the multimodal wrapper.
    """
    out = {}
    groups = {
        "self_attn.qkv_proj.weight": ("self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight"),
        "linear_attn.in_proj_qkvz.weight": ("linear_attn.in_proj_qkv.weight", "linear_attn.in_proj_z.weight"),
        "linear_attn.in_proj_ba.weight": ("linear_attn.in_proj_b.weight", "linear_attn.in_proj_a.weight"),
        "mlp.shared_expert.gate_up_proj.weight": (
            "mlp.shared_expert.gate_proj.weight",
            "mlp.shared_expert.up_proj.weight",
        ),
    }
    consumed = set()
    for name in hf_state:
        for target, parts in groups.items():
            if name.endswith(parts[0]):
                prefix = name[: -len(parts[0])]
                out[prefix + target] = torch.cat([hf_state[prefix + p] for p in parts])
                consumed |= {prefix + p for p in parts}
    for name, tensor in hf_state.items():
        if name in consumed:
            continue
        if name.endswith("experts.gate_up_proj") or name.endswith("experts.down_proj"):
            new = "w13_weight" if name.endswith("gate_up_proj") else "w2_weight"
            name = name.rsplit(".", 1)[0] + "." + new
            tensor = tensor.transpose(1, 2) if transposed_experts else tensor
        out[name] = tensor
    if multimodal:
        mapping = (
            ("model.language_model.", "language_model.model."),
            ("model.visual.", "visual."),
            ("lm_head.", "language_model.lm_head."),
        )
        out = {next(new + k[len(old) :] for old, new in mapping if k.startswith(old)): v for k, v in out.items()}
    return out


def assert_loaded_equals(fake_model: nn.Module, expected: dict) -> None:
    got = dict(fake_model.named_parameters())
    assert sorted(got) == sorted(expected), "every vLLM parameter has exactly one HF source"
    for name, tensor in expected.items():
        # a pure copy (fp32 -> fp32): bit-exact, and NaN (never written) fails it
        assert torch.equal(got[name].data, tensor), name


# ----------------------------------------------------------------------------------------------------------------
# the failure and the fix
# ----------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("moe_method", ["ascend", "legacy_cuda", "cpu"])
@pytest.mark.parametrize("fmt", ["fused", "checkpoint"])
def test_sync_without_repair_fails_with_field_report_error(fake_vllm, hf_text_square, moe_method, fmt):
    """Without the repair, every platform that re-creates the expert Parameters reproduces the field-report
    AttributeError, in both the fused-expert and the per-expert branch of vLLM's load_weights."""
    engine = fake_vllm.build_fake_vllm_model(hf_text_square.config, moe_method)
    with pytest.raises(AttributeError, match=FIELD_REPORT_ERROR):
        engine.load_weights(hf_weights(hf_text_square, fmt))


@pytest.mark.parametrize("moe_method", ["ascend", "legacy_cuda"])
@pytest.mark.parametrize("fmt", ["fused", "checkpoint"])
@pytest.mark.parametrize("source", ["hf_text_square", "hf_text_rect"])
def test_sync_after_repair_loads_exact_weights(fake_vllm, request, source, moe_method, fmt):
    """After the repair the same push succeeds and every vLLM parameter equals its HF source, experts stacked
    gate-then-up per expert and in the platform's layout (transposed on Ascend); square expert slots included."""
    hf_model = request.getfixturevalue(source)
    engine = fake_vllm.build_fake_vllm_model(hf_model.config, moe_method)
    report = repair_moe_weight_loaders(engine)
    assert len(report.reattached) == 2 * len(hf_model.config.layer_types)  # w13 + w2 per layer
    engine.load_weights(hf_weights(hf_model, fmt))
    expected = expected_vllm_state(hf_model.state_dict(), moe_method == "ascend", multimodal=False)
    assert_loaded_equals(engine, expected)


@pytest.mark.parametrize("fmt", ["fused", "checkpoint"])
def test_multimodal_wrapper_sync(fake_vllm, hf_vl, fmt):
    """Qwen3_5MoeForConditionalGeneration: the expert modules sit under language_model.model; the push (with the
    visual weights, loaded through the getattr default) fails without the repair and is exact with it."""
    engine = fake_vllm.build_fake_vllm_model(hf_vl.config, "ascend")
    with pytest.raises(AttributeError, match=FIELD_REPORT_ERROR):
        engine.load_weights(hf_weights(hf_vl, fmt))
    engine = fake_vllm.build_fake_vllm_model(hf_vl.config, "ascend")
    report = repair_moe_weight_loaders(engine)
    assert report.moe_modules == [f"language_model.model.layers.{i}.mlp.experts" for i in range(4)]
    engine.load_weights(hf_weights(hf_vl, fmt))
    assert_loaded_equals(engine, expected_vllm_state(hf_vl.state_dict(), True, multimodal=True))


def test_repair_is_idempotent_and_reports(fake_vllm, hf_text_square):
    """A second repair finds nothing to do and keeps the loaders; the report names each repaired parameter."""
    engine = fake_vllm.build_fake_vllm_model(hf_text_square.config, "ascend")
    first = repair_moe_weight_loaders(engine)
    loaders = {n: p.weight_loader for n, p in engine.named_parameters() if hasattr(p, "weight_loader")}
    second = repair_moe_weight_loaders(engine)
    assert first.changed and not second.changed
    assert first.reattached[:2] == ["model.layers.0.mlp.experts.w13_weight", "model.layers.0.mlp.experts.w2_weight"]
    assert second.moe_modules == first.moe_modules
    assert {n: p.weight_loader for n, p in engine.named_parameters() if hasattr(p, "weight_loader")} == loaders


def test_engine_that_keeps_loaders_needs_no_repair(fake_vllm, hf_text_rect):
    """vLLM >= 0.17 on CUDA keeps the loader: the repair changes nothing and the push is exact."""
    engine = fake_vllm.build_fake_vllm_model(hf_text_rect.config, "cuda")
    assert not repair_moe_weight_loaders(engine).changed
    engine.load_weights(hf_weights(hf_text_rect, "fused"))
    assert_loaded_equals(engine, expected_vllm_state(hf_text_rect.state_dict(), False, multimodal=False))


# ----------------------------------------------------------------------------------------------------------------
# layouts and fallbacks
# ----------------------------------------------------------------------------------------------------------------


def test_square_transposed_experts_need_the_layout_adapter(fake_vllm, hf_text_square):
    """Why the loader is not simply re-attached: with square expert slots (H == 2I) vllm-ascend's transposed
    w13 accepts the canonical loader's writes without a shape error, and the experts come out wrong. The repair
    writes through a transposed view and gets them right."""
    engine = fake_vllm.build_fake_vllm_model(hf_text_square.config, "ascend")
    repair_moe_weight_loaders(engine)
    for _, module in find_moe_modules(engine):
        module.w13_weight.weight_loader = module.weight_loader  # naive re-attach (w2 is not square: shape error)
    engine.load_weights(hf_weights(hf_text_square, "fused"))
    source = hf_text_square.model.layers[0].mlp.experts.gate_up_proj.detach()
    naive = engine.model.layers[0].mlp.experts.w13_weight.data
    assert not torch.equal(naive, source.transpose(1, 2))

    engine = fake_vllm.build_fake_vllm_model(hf_text_square.config, "ascend")
    repair_moe_weight_loaders(engine)
    engine.load_weights(hf_weights(hf_text_square, "fused"))
    assert torch.equal(engine.model.layers[0].mlp.experts.w13_weight.data, source.transpose(1, 2))


def test_emptied_experts_raise_a_clear_error(fake_vllm, hf_text_square):
    """vLLM's CPU oneDNN MoE path empties the expert Parameters: after the repair the push raises a RuntimeError
    that says why and what to use instead, not an AttributeError."""
    engine = fake_vllm.build_fake_vllm_model(hf_text_square.config, "cpu")
    repair_moe_weight_loaders(engine)
    with pytest.raises(RuntimeError, match="repacked the expert weights.*rollout.name=hf"):
        engine.load_weights(hf_weights(hf_text_square, "fused"))


@pytest.mark.parametrize("moe_method", ["ascend", "legacy_cuda"])
def test_default_loader_when_the_module_has_none(fake_vllm, hf_text_rect, moe_method):
    """A fused-expert module without any weight_loader: the parameters get the default per-expert loader, which
    places gate/up/down rows exactly in either layout."""
    engine = fake_vllm.build_fake_vllm_model(hf_text_rect.config, moe_method)
    for _, module in find_moe_modules(engine):
        module.weight_loader = None  # shadows the method: this module offers no loader
    report = repair_moe_weight_loaders(engine)
    assert len(report.defaulted) == 8 and not report.reattached
    engine.load_weights(hf_weights(hf_text_rect, "checkpoint"))
    assert_loaded_equals(engine, expected_vllm_state(hf_text_rect.state_dict(), moe_method == "ascend", False))


def test_default_moe_loader_by_hand():
    """default_moe_weight_loader on a [E=2, 2I=4, H=3] parameter: w1 of expert 1 fills rows 0-1, w3 rows 2-3,
    w2 ([H=3, I=2]) fills a [2, 3, 2] parameter's expert 0; a transposed [2, 3, 4] slot gets w1 transposed."""
    w13 = torch.zeros(2, 4, 3)
    gate, up = torch.arange(6.0).view(2, 3), 10 + torch.arange(6.0).view(2, 3)
    assert default_moe_weight_loader(w13, gate, "w13", "w1", 1, return_success=True) is True
    default_moe_weight_loader(w13, up, "w13", "w3", 1)
    assert torch.equal(w13[1], torch.cat([gate, up])) and torch.equal(w13[0], torch.zeros(4, 3))
    w2 = torch.zeros(2, 3, 2)
    down = torch.arange(6.0).view(3, 2)
    default_moe_weight_loader(w2, down, "w2", "w2", 0)
    assert torch.equal(w2[0], down)
    w13_t = torch.zeros(2, 3, 4)  # transposed: [E, H, 2I]
    default_moe_weight_loader(w13_t, gate, "w13", "w1", 0)
    assert torch.equal(w13_t[0, :, :2], gate.T) and torch.equal(w13_t[0, :, 2:], torch.zeros(3, 2))
    with pytest.raises(RuntimeError, match="expert 5"):
        default_moe_weight_loader(w13, gate, "w13", "w1", 5)
    with pytest.raises(RuntimeError, match="without an expert shard"):
        default_moe_weight_loader(w13, gate, "w13", None, None)


def test_lost_layer_loader_is_relinked(fake_vllm, hf_text_rect):
    """A platform that re-creates a stacked linear weight (qkv_proj) drops its loader too; the repair gives the
    layer's own loader back, so the shard-aware stacking still happens."""
    engine = fake_vllm.build_fake_vllm_model(hf_text_rect.config, "cuda")
    attn = engine.model.layers[3].self_attn
    attn.qkv_proj.weight = nn.Parameter(attn.qkv_proj.weight.data.clone(), requires_grad=False)
    with pytest.raises(AttributeError, match=FIELD_REPORT_ERROR):
        engine.load_weights(hf_weights(hf_text_rect, "fused"))
    report = repair_moe_weight_loaders(engine)
    assert report.relinked == ["model.layers.3.self_attn.qkv_proj.weight"]
    engine.load_weights(hf_weights(hf_text_rect, "fused"))
    assert_loaded_equals(engine, expected_vllm_state(hf_text_rect.state_dict(), False, multimodal=False))


def test_structural_detection_of_an_unlisted_moe_class():
    """Any module owning w13_*/w2_* parameters is repaired, whatever its class or the model's class, and through
    a graph wrapper (vllm-ascend's ACLGraphWrapper keeps the model in .runnable); quantisation scales included."""

    class MyExperts(nn.Module):
        def __init__(self):
            super().__init__()
            self.w13_weight = nn.Parameter(torch.zeros(2, 4, 3), requires_grad=False)
            self.w2_weight = nn.Parameter(torch.zeros(2, 3, 2), requires_grad=False)

        def weight_loader(self, param, loaded_weight, weight_name, shard_id, expert_id, return_success=False):
            param.data[expert_id].copy_(loaded_weight)

    class Wrapper:
        def __init__(self, runnable):
            self.runnable = runnable

    model = nn.Sequential(nn.Linear(3, 3), MyExperts())
    model[1].w13_weight_scale = nn.Parameter(torch.ones(2, 4, 1), requires_grad=False)  # a quantised MoE's scale
    report = repair_moe_weight_loaders(Wrapper(model))
    assert report.moe_modules == ["1"] and report.reattached == ["1.w13_weight", "1.w2_weight", "1.w13_weight_scale"]
    # scales get the module's loader itself (no layout adapter, which only knows the weights' shapes)
    assert model[1].w13_weight_scale.weight_loader == model[1].weight_loader
    assert not hasattr(model[0].weight, "weight_loader")  # plain layers without a loader are left alone
    down = torch.ones(3, 2)
    model[1].w2_weight.weight_loader(model[1].w2_weight, down, "w2", "w2", 1)
    assert torch.equal(model[1].w2_weight[1], down)
    with pytest.raises(TypeError, match="nn.Module"):
        repair_moe_weight_loaders(object())


def test_known_moe_model_without_experts_warns(caplog):
    """A model of a known MoE class with no fused-expert parameters is reported (a renamed layout)."""
    qwen = type("Qwen3_5MoeForCausalLM", (nn.Module,), {})()
    with caplog.at_level("WARNING", logger=vllm_patch.__name__):
        report = repair_moe_weight_loaders(qwen)
    assert not report.changed and "no fused-expert parameters" in caplog.text


# ----------------------------------------------------------------------------------------------------------------
# optional dependency
# ----------------------------------------------------------------------------------------------------------------


def test_import_is_side_effect_free():
    """Importing verl.utils.vllm, the vLLM rollout package and the weight sync imports neither vllm nor vllm_ascend
    (a fresh interpreter checks it)."""
    code = (
        "import sys, verl.utils.vllm, verl.workers.rollout.vllm_rollout, verl.workers.sharding_manager.vllm_weight_sync;"
        "print(any(m.split('.')[0] in ('vllm', 'vllm_ascend') for m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120)
    assert out.stdout.strip() == "False"


def test_missing_vllm_names_the_install(monkeypatch):
    """Without vllm, require_vllm raises ImportError naming `pip install verl[vllm]` and the Ascend image."""
    monkeypatch.setitem(sys.modules, "vllm", None)  # makes `import vllm` raise ImportError
    with pytest.raises(ImportError, match=r"pip install verl\[vllm\].*Ascend image"):
        require_vllm("cuda")


# ----------------------------------------------------------------------------------------------------------------
# the recorded-layout path (what engines built by vLLMRollout take), on the vllm-ascend stand-in
# ----------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("moe_method", ["ascend", "legacy_cuda"])
def test_recorded_layout_sync_is_exact_after_post_processing(fake_vllm, hf_text_square, moe_method):
    """An engine whose layout was recorded before post-processing (here: vllm-ascend's transposing MoE method,
    which vLLM's CPU build cannot show; the real engine's equivalent is tests/workers/rollout/
    test_vllm_engine_sync.py): each sync stages the canonical [E, 2I, H] experts, loads them with the module's own
    loader (no repair needed: the staged parameters carry it) and re-runs the transposing post-processing, so two
    successive syncs of different weights each leave exactly those weights, transposed as the platform wants."""
    from verl.workers.sharding_manager.vllm_weight_sync import load_weights_into_vllm

    engine = fake_vllm.build_fake_vllm_model(hf_text_square.config, moe_method, record_layout=True)
    state = {k: v.clone() for k, v in hf_text_square.state_dict().items()}
    for step in range(2):
        state = {k: v + 0.01 * (step + 1) for k, v in state.items()}
        report = load_weights_into_vllm(engine, list(state.items()))
        assert report.repair is None and len(report.reload.processed) == 4  # the 4 layers' FusedMoE modules
        assert_loaded_equals(engine, expected_vllm_state(state, moe_method == "ascend", multimodal=False))


def test_recorded_layout_refuses_a_partial_layer(fake_vllm, hf_text_rect):
    """A FusedMoE that receives gate_up_proj but not down_proj would compute with a stale w2: refused, naming the
    layer and the unwritten parameter, and the layer keeps its previous (kernel) parameters."""
    from verl.workers.sharding_manager.vllm_weight_sync import load_weights_into_vllm

    engine = fake_vllm.build_fake_vllm_model(hf_text_rect.config, "ascend", record_layout=True)
    state = hf_text_rect.state_dict()
    load_weights_into_vllm(engine, list(state.items()))
    before = {k: v.clone() for k, v in engine.named_parameters() if "experts" in k}
    partial = [(k, v + 1) for k, v in state.items() if k != "model.layers.1.mlp.experts.down_proj"]
    with pytest.raises(RuntimeError, match=r"model\.layers\.1\.mlp\.experts.*w2_weight"):
        load_weights_into_vllm(engine, partial)
    after = dict(engine.named_parameters())
    assert torch.equal(after["model.layers.1.mlp.experts.w13_weight"], before["model.layers.1.mlp.experts.w13_weight"])
