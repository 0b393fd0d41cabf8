"""VeOmni's own Ulysses SP in the VeOmni engine (verl/workers/engine/veomni/sequence_parallel.py).

Against the stand-in ``verl.utils.testing.fake_veomni`` (VeOmni's Qwen3.5 forward cannot run on a CPU,
docs/veomni.md): these tests check the calls and the shapes — VeOmni's parallel state gets the Ulysses size, each
SP rank feeds the model its ``T_pad / sp`` slice with the boundaries of the whole padded stream, and the gathered
hidden states are the whole stream again. The fake's HF model has no Ulysses attention, so no numbers are compared;
this is not a VeOmni result. The signature test checks the engine's keywords against the real veomni 0.1.12 in
``/tmp/venv-veomni`` (skipped when that environment is absent).
"""

import json
import os
import subprocess

import pytest
import torch

from verl.utils.testing.dist import run_on_ranks
from verl.workers.config import VeOmniEngineConfig
from verl.workers.engine.veomni.config import parallel_state_kwargs
from verl.workers.engine.veomni.sequence_parallel import shard_packed_kwargs

VEOMNI_PYTHON = "/tmp/venv-veomni/bin/python"


class _Modules(dict):
    """``monkeypatch.setitem`` for a spawned rank: the fake modules go straight into ``sys.modules``."""

    def setitem(self, mapping, name, value):
        mapping[name] = value


def _sp2_rank(path: str, batch):
    from verl.utils.testing.fake_veomni import install_fake_veomni
    from verl.workers.config import FSDPOptimizerConfig, HFModelConfig
    from verl.workers.engine.veomni import VeOmniEngineWithLMHead

    recorder = install_fake_veomni(_Modules())
    engine = VeOmniEngineWithLMHead(
        HFModelConfig(path=path, enable_gradient_checkpointing=False),
        VeOmniEngineConfig(ulysses_parallel_size=2),
        FSDPOptimizerConfig(lr=0.1),
    )
    engine.initialize()
    fed = []
    embed = engine.module.get_input_embeddings()
    embed.register_forward_pre_hook(lambda _m, args: fed.append(tuple(args[0].shape)))
    batch.meta_info.update(micro_batch_size=4, temperature=1.0)
    with engine.eval_mode():
        log_probs = engine.infer_batch(batch)["model_output"]["log_probs"]
    return {
        "init": {k: v for k, v in recorder.calls["init_parallel_state"].items() if k.endswith("size")},
        "events": recorder.sp_events,
        "fed": fed,
        "log_probs": tuple(log_probs.shape),
        "dp": (engine.get_data_parallel_size(), engine.get_data_parallel_rank()),
        "collect": engine.is_mp_src_rank_with_outputs(),
    }


def test_veomni_ulysses_2_feeds_each_rank_its_slice_and_gathers_the_stream(tiny_qwen2_dir, make_batch):
    """Invariant (world 2, veomni.ulysses_parallel_size 2, fake VeOmni): VeOmni's parallel state gets ulysses 2 and
    dp 1; the 8 rows (micro-batches of 4) pack into T = 13+11+9+10 = 43 and 12+10+11+9 = 42 tokens (row i drops
    i%3 + i%4 pads of 13); 43 is padded to 44 (the pad a sequence of its own: cu = [0,13,24,33,43,44]) and each
    rank feeds the model 22 tokens, 42 needs no pad (21 each); the gathered hidden states are (1, 43, H) and
    (1, 42, H); both ranks are dp rank 0 of 1 and only SP rank 0 collects; log-probs are (8, 7) on both."""
    batch = make_batch()
    tokens = [int(batch.batch["attention_mask"][i : i + 4].sum()) for i in (0, 4)]
    assert tokens == [43, 42]
    results = run_on_ranks(_sp2_rank, world_size=2, args=(tiny_qwen2_dir, batch))
    for rank, result in enumerate(results):
        assert result["init"]["ulysses_size"] == 2 and result["init"]["dp_size"] == 1
        assert result["init"]["dp_shard_size"] == 1 and result["init"]["dp_replicate_size"] == 1
        collates = [e for name, e in result["events"] if name == "collate"]
        gathers = [e for name, e in result["events"] if name == "gather"]
        assert [c["tokens"] for c in collates] == tokens
        assert [c["input_ids"] for c in collates] == [(1, 22), (1, 21)]
        assert collates[0]["cu_seq_lens_q"] == [0, 13, 24, 33, 43, 44]
        assert result["fed"] == [(1, 22), (1, 21)]  # what the model's embedding saw on this rank
        assert [g["local"][:2] for g in gathers] == [(1, 22), (1, 21)]
        assert [g["full"][:2] for g in gathers] == [(1, 43), (1, 42)]
        assert result["log_probs"] == (8, 7)
        assert result["dp"] == (1, 0) and result["collect"] == (rank == 0)


def test_shard_packed_kwargs_rewrites_the_core_call():
    """Invariant: the core's whole-stream kwargs are replaced by the collator's (its boundaries win over the
    core's, the packed mask is dropped, other kwargs pass); M-RoPE (C, 1, T) position ids reach the collator as
    (1, C, T) and come back as (C, 1, T/sp); image inputs are refused naming the key."""
    seen = {}

    def collator(batch):
        seen.update({k: tuple(v.shape) for k, v in batch.items()})
        return {
            "input_ids": batch["input_ids"][..., :3],
            "position_ids": batch["position_ids"][..., :3],
            "cu_seq_lens_q": torch.tensor([0, 6]),
        }

    core = dict(
        input_ids=torch.ones(1, 6, dtype=torch.long),
        position_ids=torch.zeros(4, 1, 6, dtype=torch.long),
        attention_mask={"sdpa": "packed"},
        cu_seq_lens_q=torch.tensor([0, 2, 6]),
        verl_cu_seqlens=1,
        max_length_q=4,
        use_cache=False,
    )
    sharded, total = shard_packed_kwargs(core, collator)
    assert total == 6 and seen == {"input_ids": (1, 6), "position_ids": (1, 4, 6)}
    assert tuple(sharded["position_ids"].shape) == (4, 1, 3) and tuple(sharded["input_ids"].shape) == (1, 3)
    assert sharded["cu_seq_lens_q"].tolist() == [0, 6] and sharded["attention_mask"] is None
    assert "verl_cu_seqlens" not in sharded and "max_length_q" not in sharded and sharded["use_cache"] is False
    with pytest.raises(ValueError, match=r"veomni\.ulysses_parallel_size"):
        shard_packed_kwargs(dict(core, pixel_values=torch.zeros(1)), collator)


_SIGNATURES = """
import inspect, json
from veomni.distributed.parallel_state import init_parallel_state
from veomni.data.data_collator import SequenceParallelCollator
from veomni.distributed.sequence_parallel import gather_outputs
print(json.dumps({f.__name__: list(inspect.signature(f).parameters)
                  for f in (init_parallel_state, SequenceParallelCollator, gather_outputs)}))
"""


@pytest.mark.skipif(not os.path.exists(VEOMNI_PYTHON), reason="no real veomni environment at /tmp/venv-veomni")
def test_engine_keywords_match_the_real_veomni_0_1_12():
    """Invariant: every keyword the engine passes to VeOmni's SP entry points is a parameter of the installed
    veomni's function (inspect.signature in /tmp/venv-veomni, a subprocess: veomni cannot be imported here)."""
    run = subprocess.run([VEOMNI_PYTHON, "-c", _SIGNATURES], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    params = json.loads(run.stdout.strip().splitlines()[-1])
    kwargs = parallel_state_kwargs(
        VeOmniEngineConfig(ulysses_parallel_size=2), 4, "cpu", frozenset(params["init_parallel_state"])
    )
    assert set(kwargs) <= set(params["init_parallel_state"]) and kwargs["ulysses_size"] == 2
    assert "seq_classification" in params["SequenceParallelCollator"]
    assert {"x", "gather_dim", "padding_dim", "unpad_dim_size", "group"} <= set(params["gather_outputs"])


@pytest.mark.slow
@pytest.mark.skipif(not os.path.exists(VEOMNI_PYTHON), reason="no real veomni environment at /tmp/venv-veomni")
def test_sp_hooks_with_the_real_veomni_collator_and_gather_equal_sp_1():
    """Invariant: with the real veomni 0.1.12 (init_parallel_state, SequenceParallelCollator, gather_outputs) at
    world 2, SP 2, the engine's hooks feed each rank 22 of the 43 tokens (padded to 44), and the per-token model's
    gathered logits (1, 43, V) and dp-mean embedding gradient equal the SP 1 ones (tolerance 0: the same fp32 ops
    on the same tokens; only the order of the gradient sum over two ranks could differ, by rounding)."""
    script = os.path.join(os.path.dirname(__file__), "../../../../envs/veomni_cpu/check_sequence_parallel_hooks.py")
    repo = os.path.abspath(os.path.join(os.path.dirname(__file__), "../../../.."))
    env = dict(os.environ, PYTHONPATH=repo)
    run = subprocess.run([VEOMNI_PYTHON, script], capture_output=True, text=True, timeout=400, env=env, cwd=repo)
    assert run.returncode == 0, run.stderr[-3000:]
    results = [json.loads(line) for line in run.stdout.splitlines() if line.startswith("{")]
    assert sorted(r["sp_rank"] for r in results) == [0, 1]
    for result in results:
        assert result["fed"] == [[1, 43], [1, 22]]  # the SP 1 reference call, then this rank's slice
        assert result["out"] == [1, 43, 64]
        assert result["max_abs_diff"] == 0.0
        assert result["grad_max_abs_diff"] <= 1e-6


def _sp2_routing_rank(path: str, batch):
    """R2 through the VeOmni engine at SP 2: record the routing, replay it, replay another row's (control); the
    ids every MoE layer's experts run with on this rank, per forward (a pre-hook on the ``*MoeExperts`` modules)."""
    from verl.utils.testing.fake_veomni import install_fake_veomni
    from verl.workers.config import FSDPOptimizerConfig, HFModelConfig
    from verl.workers.engine.veomni import VeOmniEngineWithLMHead

    install_fake_veomni(_Modules())
    engine = VeOmniEngineWithLMHead(
        HFModelConfig(path=path, enable_gradient_checkpointing=False),
        VeOmniEngineConfig(ulysses_parallel_size=2),
        FSDPOptimizerConfig(lr=0.1),
    )
    engine.initialize()
    experts = [m for m in engine.module.modules() if type(m).__name__.endswith("MoeExperts")]
    calls = []
    for module in experts:
        module.register_forward_pre_hook(lambda _m, args: calls.append(args[1].detach().clone()))

    def infer(mode: str, routed=None):
        data = batch.select(deepcopy=True)
        if routed is not None:
            data.batch["routed_experts"] = routed
        data.meta_info.update(micro_batch_size=8, temperature=1.0, router_replay=mode)
        calls.clear()
        with engine.eval_mode():
            out = engine.infer_batch(data)["model_output"]
        return out, torch.stack(calls, dim=1)  # (this rank's tokens, layers, top-k)

    recorded, record_ids = infer("record")
    replayed, replay_ids = infer("replay", recorded["routed_experts"])
    other = recorded["routed_experts"][torch.tensor([1, 0, 3, 2])]
    control, _ = infer("replay", other)
    return {
        "routing": recorded["routed_experts"],
        "replay_recorded": replayed["routed_experts"],
        "record_ids": record_ids,
        "replay_ids": replay_ids,
        "log_probs": recorded["log_probs"],
        "replay_log_probs": replayed["log_probs"],
        "control_log_probs": control["log_probs"],
    }


@pytest.fixture
def tiny_attention_moe_dir(tmp_path):
    """A tiny Qwen3.5-MoE with 4 full-attention layers: the fake builds the plain HF model, whose Gated DeltaNet
    refuses packed rows without fla (VeOmni's patched one does not); attention keeps packed sequences apart."""
    from verl.models.tiny import build_tiny_model

    path = tmp_path / "tiny_attention_moe"
    build_tiny_model("qwen3_5_moe", vocab_size=128, layer_types=["full_attention"] * 4).save_pretrained(path)
    return str(path)


def test_veomni_ulysses_2_replays_each_rank_its_slice_of_the_routing(tiny_attention_moe_dir, make_batch):
    """Invariant (world 2, veomni.ulysses_parallel_size 2, R2, fake VeOmni + a tiny HF Qwen3.5-MoE): the 4 rows
    pack into T = 13+11+9+10 = 43 tokens, padded to 44, 22 a rank; the routing recorded on both ranks is the whole
    (4, 13, L, k) stream, the concatenation of what the two ranks' experts ran (rank order, pad dropped); in the
    replay each rank's experts run exactly its 22 tokens' recorded ids (100% of (token, layer) pairs) and the
    log-probs equal the recording pass's (same weights, same slices: tolerance 0); another row's routing changes
    them (control). The fake's model has no Ulysses attention, so its numbers are not SP 1's: this checks the
    routing's slicing through the engine, not a VeOmni result."""
    batch = make_batch(batch_size=4)
    mask = batch.batch["attention_mask"].bool()
    assert int(mask.sum()) == 43
    ranks = run_on_ranks(_sp2_routing_rank, world_size=2, args=(tiny_attention_moe_dir, batch))
    stream = ranks[0]["routing"][mask].long()  # (43, L, k), the packed (row-major) order
    assert [r["record_ids"].shape[0] for r in ranks] == [22, 22]
    assert torch.equal(torch.cat([r["record_ids"] for r in ranks])[:43], stream)
    assert torch.equal(torch.cat([r["replay_ids"] for r in ranks])[:43], stream)
    for r in ranks:
        assert torch.equal(r["routing"], ranks[0]["routing"])
        assert torch.equal(r["replay_recorded"][mask], r["routing"][mask])
        assert torch.equal(r["replay_log_probs"], r["log_probs"])
        assert (r["control_log_probs"] - r["log_probs"]).abs().max() > 1e-3
