"""VeOmniEngine (verl/workers/engine/veomni/transformer_impl.py) against a fake ``veomni`` package
(``verl.utils.testing.fake_veomni``).

VeOmni's Qwen3.5 forward cannot run on a CPU (docs/veomni.md), so these tests check the wiring only: the import
guard, the arguments VeOmni's entry points receive, and that once the stand-in has built and sharded the model
every computation is the shared core's (same log-probs as the FSDP engine: the stand-in is this repository's FSDP2,
so this is not a VeOmni result). They do not cover VeOmni's own kernels or expert parallelism; VeOmni's Ulysses SP
wiring is in test_sequence_parallel.py.
"""

import sys

import pytest
import torch

from verl.models.tiny import build_tiny_model
from verl.models.transformers.packed_forward import VARLEN_PATCHED_ATTR
from verl.utils.testing.fake_veomni import install_fake_veomni
from verl.workers.config import FSDPEngineConfig, FSDPOptimizerConfig, HFModelConfig
from verl.workers.engine import EngineRegistry
from verl.workers.engine.veomni import VeOmniEngineConfig, VeOmniEngineWithLMHead
from verl.workers.engine.veomni.transformer_impl import _mark_varlen_mixers


def test_missing_veomni_error_says_how_to_install(single_rank_group, tiny_qwen2_dir, monkeypatch):
    """Invariant: without veomni, initialize() raises ImportError naming `pip install verl[veomni]` and the
    strategy key; constructing the engine does not import veomni."""
    monkeypatch.setitem(sys.modules, "veomni", None)  # makes `import veomni...` raise ImportError
    engine = VeOmniEngineWithLMHead(
        HFModelConfig(path=tiny_qwen2_dir), VeOmniEngineConfig(), FSDPOptimizerConfig(lr=0.1)
    )
    with pytest.raises(ImportError, match=r"strategy=veomni.*pip install verl\[veomni\]"):
        engine.initialize()


def test_wrong_strategy_is_refused(tiny_qwen2_dir):
    """Invariant: the VeOmni engine refuses an engine config of another strategy (one key picks the backend)."""
    with pytest.raises(ValueError, match="strategy=veomni"):
        VeOmniEngineWithLMHead(HFModelConfig(path=tiny_qwen2_dir), FSDPEngineConfig(strategy="fsdp2"), None)


def test_fake_veomni_wiring_and_same_log_probs_as_fsdp_engine(
    single_rank_group, tiny_qwen2_dir, make_batch, monkeypatch
):
    """Invariant: VeOmni's entry points get the mapped arguments (dp 1 = 1 shard, ep via extra_parallel_sizes, the
    ops config, gradient checkpointing, MixedPrecisionConfig), and the log-probs of the VeOmni-built model equal
    the FSDP2 engine's on the same weights exactly (fp32, same core: 1e-6)."""
    recorder = install_fake_veomni(monkeypatch)
    model_config = HFModelConfig(path=tiny_qwen2_dir, enable_gradient_checkpointing=False)
    veomni = VeOmniEngineWithLMHead(
        model_config, VeOmniEngineConfig(chunk_gated_delta_rule_implementation="npu"), FSDPOptimizerConfig(lr=0.1)
    )
    veomni.initialize()
    state = recorder.calls["init_parallel_state"]
    assert (state["dp_size"], state["dp_shard_size"], state["dp_replicate_size"]) == (1, 1, 1)
    assert state["extra_parallel_sizes"] == (1,) and state["extra_parallel_names"] == ("ep",)
    assert state["device_type"] == "cpu" and state["dp_mode"] == "fsdp2"
    built = recorder.calls["build_foundation_model"]
    assert built["weights_path"] == tiny_qwen2_dir and built["init_device"] == "meta"
    assert built["ops_implementation"].kwargs["chunk_gated_delta_rule_implementation"] == "npu"
    parallel = recorder.calls["build_parallelize_model"]
    assert parallel["mixed_precision"].enable is True and parallel["enable_gradient_checkpointing"] is False
    assert parallel["basic_modules"] == ["Qwen2DecoderLayer"]

    fsdp_config = FSDPEngineConfig(strategy="fsdp2", mixed_precision={"param_dtype": "fp32"})
    fsdp = EngineRegistry.new("language_model", "fsdp2", model_config, fsdp_config, FSDPOptimizerConfig(lr=0.1))
    fsdp.initialize()
    batch = make_batch()
    batch.meta_info.update(micro_batch_size=4, calculate_entropy=True)
    outputs = []
    for engine in (veomni, fsdp):
        with engine.eval_mode():
            outputs.append(engine.infer_batch(batch)["model_output"])
    for key in ("log_probs", "entropys"):
        torch.testing.assert_close(outputs[0][key], outputs[1][key], rtol=0, atol=1e-6)


def test_gated_delta_net_mixers_are_marked_varlen():
    """Invariant: every Gated DeltaNet mixer of a VeOmni-built Qwen3.5 is marked as honouring packed boundaries
    (VeOmni derives them from position ids), so the packed forward accepts it; other modules are untouched.
    The tiny Qwen3.5 has layer types [L, L, L, F]: 3 GDN mixers."""
    model = build_tiny_model("qwen3_5", vocab_size=64)
    assert _mark_varlen_mixers(model) == 3
    marked = [type(m).__name__ for m in model.modules() if getattr(m, VARLEN_PATCHED_ATTR, False)]
    assert len(marked) == 3 and all(name.endswith("GatedDeltaNet") for name in marked)
