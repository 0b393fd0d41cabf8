"""Weight sync into the REAL vLLM engine (its CPU build, `.venv-vllm`): exact on a platform that post-processes.

vLLM's CPU build repacks the routed experts after loading (and, on CPUs with AVX-512, hands linear weights to
oneDNN), so writing trained weights into the live parameters leaves the engine computing with a policy that is
neither the old nor the new one. The sync under test loads each block into canonical parameters and re-runs the
layers' post-load processing (verl.utils.vllm.canonical_reload).

Invariants, for the tiny Qwen3.5 dense and MoE (vLLM profile; fp32 actor, bf16 engine):
* identity: pushing the engine's own checkpoint weights changes its prompt log-probs by <= 1e-6;
* update: after one real actor update (DataParallelPPOActor.update_policy, AdamW) by a plain module, FSDP2 at world
  size 1, FSDP1 and FSDP2 at world size 2 (gloo), the synced engine equals a fresh engine built from the actor's
  exported HF checkpoint: prompt log-probs <= 1e-6, and every engine parameter bitwise (reported per parameter group);
* controls, so the tolerances can fail: the update moves log-probs by > 0.01; a sync that leaves out one decoder
  layer's weights differs from the fresh engine by > 1e-3; for the MoE, the old live-parameter path (no recorded
  layout) drifts by > 1e-3 on an identity push (the bug this fixes, reproduced on the real engine); a layer that gets
  only part of its tensors is refused with an error naming it.

Tolerance: one process, same weights, same kernels: bf16 CPU kernels are deterministic, so equality is exact (0.0
measured); 1e-6 only absorbs float formatting. The ranks' weight streams are recorded on rank 0 and replayed into the
engine in this process: every rank of a real run pushes the same full tensors into its own engine.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

pytestmark = [pytest.mark.vllm]

KINDS = ("qwen3_5", "qwen3_5_moe")
SETUPS = (("plain", 1), ("fsdp2", 1), ("fsdp", 2), ("fsdp2", 2))
EXACT = 1e-6
NUM_PROMPTS, PROMPT_LEN = 4, 24


# ------------------------------------------------------------------------------------------------ checkpoints
@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory) -> dict[str, str]:
    from verl.models.tiny import save_tiny_checkpoint
    from verl.trainer.quickstart import build_char_tokenizer

    out = {}
    for kind in KINDS:
        path = tmp_path_factory.mktemp(kind)
        save_tiny_checkpoint(kind, build_char_tokenizer(path), str(path), seed=0, profile="vllm")
        out[kind] = str(path)
    return out


def _prompts(vocab: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(0)
    return torch.randint(4, vocab, (NUM_PROMPTS, PROMPT_LEN), generator=g).tolist()


def _update_batch(vocab: int, rank: int, world_size: int):
    """16 rollout rows (prompt 6, response 8) with random advantages; this rank's contiguous share."""
    from tensordict import TensorDict

    from verl.protocol import DataProto

    g = torch.Generator().manual_seed(1)
    rows, prompt_len, response_len = 16, 6, 8
    input_ids = torch.randint(4, vocab, (rows, prompt_len + response_len), generator=g)
    mask = torch.ones_like(input_ids)
    response_mask = mask[:, prompt_len:].clone()
    td = TensorDict(
        {
            "input_ids": input_ids,
            "attention_mask": mask,
            "position_ids": torch.arange(prompt_len + response_len).expand(rows, -1).clone(),
            "responses": input_ids[:, prompt_len:],
            "response_mask": response_mask,
            "advantages": torch.randn(rows, response_len, generator=g),
            "old_log_probs": -torch.rand(rows, response_len, generator=g) * 4,
        },
        batch_size=[rows],
    )
    share = rows // world_size
    return DataProto(batch=td[rank * share : (rank + 1) * share], meta_info={"temperature": 1.0})


def _update_and_export(checkpoints: dict[str, str], setups: list[str], out_dir: str) -> None:
    """On every rank: one PPO update per (kind, strategy), then the sync stream (rank 0 keeps it) and the HF export."""
    import torch.distributed as dist
    from transformers import AutoModelForCausalLM

    from verl.models.transformers.patch_registry import apply_patches
    from verl.utils.checkpoint.hf_export import save_hf_model
    from verl.utils.fsdp_utils import adapter_for, create_device_mesh, get_fsdp_adapter
    from verl.workers.actor.dp_actor import DataParallelPPOActor
    from verl.workers.config.actor import FSDPActorConfig
    from verl.workers.sharding_manager.vllm_weight_sync import iter_vllm_weights

    rank, world_size = dist.get_rank(), dist.get_world_size()
    fp32 = {"param_dtype": torch.float32, "reduce_dtype": torch.float32, "buffer_dtype": torch.float32}
    for kind, checkpoint in checkpoints.items():
        for strategy in setups:
            model = AutoModelForCausalLM.from_pretrained(checkpoint, dtype=torch.float32)
            apply_patches(model, platform="cpu", report=False)  # varlen GDN: what the workers apply (packed forward)
            vocab = model.config.vocab_size
            if strategy != "plain":
                mesh = create_device_mesh(world_size, -1)
                model = get_fsdp_adapter(strategy).wrap(model, mesh=mesh, dtypes=fp32, wrap_policy=None)
            config = FSDPActorConfig(
                strategy="fsdp2",
                ppo_mini_batch_size=16 // world_size,
                ppo_micro_batch_size_per_gpu=4,
                use_torch_compile=False,
            )
            actor = DataParallelPPOActor(config, model, torch.optim.AdamW(model.parameters(), lr=1e-2))
            batch = _update_batch(vocab, rank, world_size)
            batch.meta_info.update(micro_batch_size=4, use_dynamic_bsz=False)
            actor.update_policy(batch)
            stream = [(name, tensor.cpu()) for name, tensor in iter_vllm_weights(model, dtype=torch.bfloat16)]
            adapter = adapter_for(model)
            full = adapter.full_state_dict(model) if adapter is not None else model.state_dict()
            tag = f"{kind}-{strategy}-ws{world_size}"
            if rank == 0:
                save_hf_model(model, full, os.path.join(out_dir, tag))
                torch.save(stream, os.path.join(out_dir, f"{tag}.stream.pt"))
            dist.barrier()


@pytest.fixture(scope="module")
def updates(checkpoints, tmp_path_factory) -> Path:
    from verl.utils.testing.dist import run_on_ranks

    out = tmp_path_factory.mktemp("updates")
    for world_size in (1, 2):  # one spawn per world size covers every kind and strategy
        setups = [strategy for strategy, ws in SETUPS if ws == world_size]
        run_on_ranks(_update_and_export, world_size=world_size, args=(checkpoints, setups, str(out)), timeout_s=600)
    return out


# ------------------------------------------------------------------------------------------------ helpers
def _engine_state(rollout) -> dict[str, torch.Tensor]:
    return {name: p.detach().clone() for name, p in rollout.vllm_model.named_parameters()}


def _group(name: str) -> str:
    for key, group in (
        ("experts", "routed experts"),
        ("shared_expert", "shared expert"),
        ("mlp.gate", "router"),
        ("linear_attn", "gated deltanet"),
        ("self_attn", "full attention"),
        ("norm", "norms"),
        ("embed_tokens", "embedding"),
        ("lm_head", "lm head"),
        ("mlp", "dense mlp"),
    ):
        if key in name:
            return group
    return "other"


def _per_group_max_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> dict[str, float]:
    assert a.keys() == b.keys()
    out: dict[str, float] = {}
    for name in a:
        diff = (a[name].float() - b[name].float()).abs().max().item() if a[name].numel() else 0.0
        out[_group(name)] = max(out.get(_group(name), 0.0), diff)
    return out


def _without(stream, needle: str):
    return [(name, tensor) for name, tensor in stream if needle not in name]


# ------------------------------------------------------------------------------------------------ the test
def _fresh_engines(kind: str, updates: Path, prompts) -> dict[str, tuple[torch.Tensor, dict]]:
    """Log-probs and parameters of a fresh engine built from each setup's export, one at a time BEFORE the synced
    engine: engines of one process share vLLM's parallel state (see release_vllm_rollout)."""
    from verl.utils.testing.vllm import build_vllm_rollout, prompt_log_probs, release_vllm_rollout

    expected, by_content = {}, {}
    for strategy, world_size in SETUPS:
        tag = f"{kind}-{strategy}-ws{world_size}"
        content = _digest(torch.load(updates / f"{tag}.stream.pt"))
        if content not in by_content:  # setups that trained bitwise-equal weights share one fresh engine
            fresh = build_vllm_rollout(str(updates / tag))
            by_content[content] = (prompt_log_probs(fresh.llm, prompts), _engine_state(fresh))
            release_vllm_rollout(fresh)
        expected[tag] = by_content[content]
    return expected


def _digest(stream) -> str:
    import hashlib

    digest = hashlib.sha256()
    for name, tensor in stream:
        digest.update(name.encode())
        digest.update(tensor.contiguous().view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


@pytest.mark.parametrize("kind", KINDS)
def test_sync_into_the_real_engine_is_exact(kind, checkpoints, updates, capsys, request):
    from transformers import AutoModelForCausalLM

    from verl.utils.testing.vllm import build_vllm_rollout, prompt_log_probs, release_vllm_rollout
    from verl.utils.vllm.canonical_reload import CANONICAL_LAYOUT_ATTR
    from verl.workers.sharding_manager.vllm_weight_sync import iter_vllm_weights

    hf = AutoModelForCausalLM.from_pretrained(checkpoints[kind], dtype=torch.float32)
    prompts = _prompts(hf.config.vocab_size)
    expected = _fresh_engines(kind, updates, prompts)
    engine = build_vllm_rollout(checkpoints[kind])
    request.addfinalizer(lambda: release_vllm_rollout(engine))  # also on failure: the next engine needs the state
    base = prompt_log_probs(engine.llm, prompts)
    report = [f"[{kind}]"]

    # identity: the engine's own weights pushed back
    engine.load_weights(iter_vllm_weights(hf, dtype=torch.bfloat16))
    identity = (prompt_log_probs(engine.llm, prompts) - base).abs().max().item()
    report.append(f"identity sync: max |dlogp| = {identity:.3g}")
    assert identity <= EXACT

    for strategy, world_size in SETUPS:
        tag = f"{kind}-{strategy}-ws{world_size}"
        engine.load_weights(torch.load(updates / f"{tag}.stream.pt"))
        synced = prompt_log_probs(engine.llm, prompts)
        fresh_log_probs, fresh_state = expected[tag]
        moved = (synced - base).abs().max().item()
        diff = (synced - fresh_log_probs).abs().max().item()
        groups = _per_group_max_diff(_engine_state(engine), fresh_state)
        report.append(f"{strategy} ws{world_size}: update moved {moved:.3g}, synced vs fresh {diff:.3g}, {groups}")
        assert moved > 0.01, "the update must change the policy, or equality proves nothing"
        assert diff <= EXACT, tag
        assert all(v == 0.0 for v in groups.values()), (tag, groups)

    # control: the base weights again, except decoder layer 1 -> layer 1 keeps the last update's values
    engine.load_weights(_without(list(iter_vllm_weights(hf, dtype=torch.bfloat16)), ".layers.1."))
    missed = (prompt_log_probs(engine.llm, prompts) - base).abs().max().item()
    report.append(f"control, layer 1 left out: differs from the fresh engine by {missed:.3g}")
    assert missed > 1e-3

    # a layer that receives only part of its tensors is refused, naming the layer
    partial = _without(list(iter_vllm_weights(hf, dtype=torch.bfloat16)), "layers.2.linear_attn.in_proj_z")
    with pytest.raises(RuntimeError, match=r"layers\.2\.linear_attn\.in_proj_qkvz.*received only part"):
        engine.load_weights(partial)

    if kind == "qwen3_5_moe":  # the old path: the live parameters, no re-processing
        engine.load_weights(iter_vllm_weights(hf, dtype=torch.bfloat16))
        assert (prompt_log_probs(engine.llm, prompts) - base).abs().max().item() <= EXACT
        delattr(engine.vllm_model, CANONICAL_LAYOUT_ATTR)
        if any(p.numel() == 0 for p in engine.vllm_model.parameters()):
            # this CPU's GEMM dispatch (oneDNN / AVX-512-BF16 / zentorch) emptied the weights it repacked: the
            # live-parameter path cannot write them, and says so instead of vLLM's bare shape assertion
            with pytest.raises(RuntimeError, match="replaced .* by empty placeholders"):
                engine.load_weights(iter_vllm_weights(hf, dtype=torch.bfloat16))
            report.append("control, live-parameter sync (no layout): refused, the engine repacked its weights")
        else:
            engine.load_weights(iter_vllm_weights(hf, dtype=torch.bfloat16))
            drift = (prompt_log_probs(engine.llm, prompts) - base).abs().max().item()
            report.append(f"control, live-parameter sync (no layout): identity push drifts by {drift:.3g}")
            assert drift > 1e-3
    with capsys.disabled():
        print("\n" + "\n  ".join(report))
