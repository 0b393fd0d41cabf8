"""Vision-tower weight sync into the REAL vLLM engine (its CPU build, ``.venv-vllm``): the tiny Qwen3.5 VL model
(``vllm`` profile), the actor loaded as the workers load it (``verl.utils.model.load_causal_lm``), the stream of
``iter_vllm_weights`` pushed through ``vLLMRollout.load_weights`` (the call the sharding manager makes).

The engine under test starts from random weights (``load_format=dummy``, as ``quickstart_cpu_vllm`` does) and has
already run the image prompts once, so its caches hold values of the old weights. Invariants:

* identity: after a sync of the actor's weights, every vision-tower parameter of the engine (patch embedding,
  position grid, every block, the merger) is bitwise the one of a fresh engine loaded from the same checkpoint, and so
  are the language model's; image-prompt and text-prompt log-probs equal the fresh engine's (<= 1e-6; 0.0 measured);
* update: one AdamW step on the actor's vision tower only (a cross-entropy loss through HF's multimodal forward on
  the image prompts); after the sync the engine's parameters are bitwise those of a fresh engine built from the
  updated actor's exported checkpoint, and so are its image-prompt log-probs (<= 1e-6), which moved (> 0.01) while
  the text-only prompt's did not (<= 1e-6: only the vision tower changed);
* control, so the equalities can fail: before that sync the engine still computes the old image-prompt log-probs
  (> 0.01 from the updated fresh engine's).

"As the engine computes with it": vLLM's CPU build repacks most linear weights into a GEMM backend's handle and
leaves empty parameters; :func:`verl.utils.testing.vllm.engine_weights` reads them back through the kernel (exact:
identity input). A fresh engine's read-back is checked against the checkpoint's own tensors (bf16), so the
comparison of two engines is not a comparison of two empty placeholders.

Tolerance: one process, same kernels; bf16 CPU kernels are deterministic, so equality is exact; 1e-6 only absorbs
float formatting. The fresh engines run first and are released (engines of one process share vLLM's parallel
state, see ``release_vllm_rollout``).
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest
import torch

pytestmark = [pytest.mark.vllm]

EXACT = 1e-6
MAX_PROMPT = 160  # the conftest's image prompts fit
TEXT_PROMPT = "what colour is the shape? red green blue"


def _engine_config() -> dict:
    # vLLM's multimodal input processing needs the tokenizer (rollout.skip_tokenizer_init, True by default)
    return {"prompt_length": MAX_PROMPT, "response_length": 4, "skip_tokenizer_init": False}


def _load_actor(path: str) -> torch.nn.Module:
    from verl.utils.model import load_causal_lm, load_hf_config

    config = load_hf_config(path, trust_remote_code=True, override_config={}, attn_implementation="sdpa")
    return load_causal_lm(path, config, dtype=torch.float32, trust_remote_code=True)


def _vision_step(actor: torch.nn.Module, batch) -> None:
    """One AdamW step (lr 1e-2) on the vision tower only: cross-entropy of each image prompt's tokens, through HF's
    multimodal forward with the rows' pixel values (the gradient reaches the tower through the image tokens)."""
    from verl.utils.model import find_vision_tower

    optimizer = torch.optim.AdamW(find_vision_tower(actor).parameters(), lr=1e-2)
    loss = torch.zeros(())
    for row in range(len(batch)):
        mask = batch.batch["attention_mask"][row].bool()
        ids = batch.batch["input_ids"][row][mask][None]
        types = (ids == actor.config.image_token_id).long()
        mm = batch.non_tensor_batch["multi_modal_inputs"][row]
        loss = loss + actor(input_ids=ids, labels=ids, mm_token_type_ids=types, use_cache=False, **mm).loss
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()


def _requests(batch, tokenizer) -> tuple[list[dict], list[dict]]:
    """(image requests as the rollout builds them, one text-only request)."""
    from verl.workers.rollout.vllm_rollout.vllm_rollout import _requests as rollout_requests

    return rollout_requests(batch), [{"prompt_token_ids": tokenizer.encode(TEXT_PROMPT)}]


def _observe(engine, image_requests, text_requests) -> dict:
    """What two engines holding the same weights must agree on."""
    from verl.utils.testing.vllm import engine_weights, request_log_probs
    from verl.utils.vllm.loader import persistent_buffers

    return {
        "weights": engine_weights(engine.vllm_model),  # parameters and persistent buffers
        "buffers": sorted(persistent_buffers(engine.vllm_model)),
        "image": torch.cat(request_log_probs(engine.llm, image_requests)),
        "text": torch.cat(request_log_probs(engine.llm, text_requests)),
    }


_VISION_GROUPS = (
    (r"^visual\.patch_embed\.", "patch embed"),
    (r"^visual\.pos_embed\.", "position grid"),
    (r"^visual\.blocks\.(\d+)\.", "block {}"),
    (r"^visual\.merger\.", "merger"),
    (r"^visual\.input_norm\.", "image normalisation buffers"),
)


def _group(name: str) -> str:
    for pattern, label in _VISION_GROUPS:
        match = re.match(pattern, name)
        if match:
            return label.format(*match.groups())
    return "other vision" if name.startswith("visual.") else "language model"


def _per_group_max_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> dict[str, float]:
    assert a.keys() == b.keys()
    out: dict[str, float] = {}
    for name in a:
        assert a[name].shape == b[name].shape, name
        diff = (a[name].float() - b[name].float()).abs().max().item() if a[name].numel() else 0.0
        out[_group(name)] = max(out.get(_group(name), 0.0), diff)
    return out


def _max(a: torch.Tensor, b: torch.Tensor) -> float:
    return (a - b).abs().max().item()


@pytest.fixture(scope="module")
def setup(tiny_vl_vllm_checkpoint, image_prompts, tmp_path_factory) -> dict:
    """The actor's weight streams before and after the vision step, the updated checkpoint, and what fresh engines
    built from the two checkpoints observe (built and released here, before the engine under test)."""
    from verl.utils.checkpoint.hf_export import save_hf_model
    from verl.utils.testing.vllm import build_vllm_rollout, release_vllm_rollout
    from verl.utils.tokenizer import hf_tokenizer
    from verl.workers.sharding_manager.vllm_weight_sync import iter_vllm_weights

    checkpoint = tiny_vl_vllm_checkpoint
    batch = image_prompts(checkpoint)
    image_requests, text_requests = _requests(batch, hf_tokenizer(checkpoint))
    actor = _load_actor(checkpoint)
    before = [(n, t.clone()) for n, t in iter_vllm_weights(actor, dtype=torch.bfloat16)]
    _vision_step(actor, batch)
    after = [(n, t.clone()) for n, t in iter_vllm_weights(actor, dtype=torch.bfloat16)]
    changed = {n for (n, t0), (_, t1) in zip(before, after, strict=True) if not torch.equal(t0, t1)}
    assert changed and all(n.startswith("model.visual.") for n in changed), sorted(changed)[:5]

    updated = Path(tmp_path_factory.mktemp("updated")) / "model"
    shutil.copytree(checkpoint, updated)  # tokenizer and processor files; the weights are overwritten next
    save_hf_model(actor, actor.state_dict(), str(updated))
    fresh = {}
    for tag, path in (("initial", checkpoint), ("updated", str(updated))):
        engine = build_vllm_rollout(path, **_engine_config())
        fresh[tag] = _observe(engine, image_requests, text_requests)
        release_vllm_rollout(engine)
    reference = {name: tensor for name, tensor in before}
    return {
        "before": before,
        "after": after,
        "fresh": fresh,
        "checkpoint_weights": reference,
        "requests": (image_requests, text_requests),
        "checkpoint": checkpoint,
    }


def test_fresh_engine_reads_back_the_checkpoint_vision_weights(setup):
    """The read-back of a fresh engine's vision tower is the checkpoint's tensors in the engine dtype (bf16): the
    engine-vs-engine comparisons below compare real values, the repacked linear weights included."""
    weights = setup["fresh"]["initial"]["weights"]
    buffers = setup["fresh"]["initial"]["buffers"]
    vision = {name: w for name, w in weights.items() if name.startswith("visual.") and name not in buffers}
    # HF model.visual.X is vLLM visual.X (qkv is fused in both); every HF vision tensor has its engine twin
    hf = {
        name[len("model.") :]: t for name, t in setup["checkpoint_weights"].items() if name.startswith("model.visual.")
    }
    assert sorted(vision) == sorted(hf)
    repacked = [name for name, w in vision.items() if name.endswith(".weight") and w.dim() == 2 and "norm" not in name]
    assert len(repacked) >= 2 * 4 + 2  # 2 blocks x (qkv, proj, fc1, fc2) + the merger's fc1, fc2
    for name, tensor in hf.items():
        assert torch.equal(vision[name], tensor.to(vision[name].dtype)), name


def test_vision_tower_sync_is_exact(setup, request, capsys):
    from verl.utils.testing.vllm import build_vllm_rollout, release_vllm_rollout

    image_requests, text_requests = setup["requests"]
    initial, updated = setup["fresh"]["initial"], setup["fresh"]["updated"]
    engine = build_vllm_rollout(setup["checkpoint"], load_format="dummy", **_engine_config())
    request.addfinalizer(lambda: release_vllm_rollout(engine))
    dummy = _observe(engine, image_requests, text_requests)  # also fills the engine's caches with old values
    report = [f"dummy start vs checkpoint: image log-probs differ by {_max(dummy['image'], initial['image']):.3g}"]

    # identity: the actor's initial weights -> a fresh engine of the checkpoint
    engine.load_weights(iter(setup["before"]))
    synced = _observe(engine, image_requests, text_requests)
    groups = _per_group_max_diff(synced["weights"], initial["weights"])
    identity = (_max(synced["image"], initial["image"]), _max(synced["text"], initial["text"]))
    report.append(f"identity sync vs fresh engine: image |dlogp| {identity[0]:.3g}, text {identity[1]:.3g}, {groups}")
    assert _max(dummy["image"], initial["image"]) > 0.01, "the dummy start must differ, or the sync proves nothing"
    assert all(v == 0.0 for v in groups.values()), groups
    assert max(identity) <= EXACT

    # control: the actor has been updated, nothing synced yet -> the engine still computes the old policy
    stale = _observe(engine, image_requests, text_requests)
    assert _max(stale["image"], initial["image"]) <= EXACT
    assert _max(stale["image"], updated["image"]) > 0.01, "the update must change image log-probs"

    # update: the vision-step actor's weights -> a fresh engine of its exported checkpoint
    engine.load_weights(iter(setup["after"]))
    synced = _observe(engine, image_requests, text_requests)
    groups = _per_group_max_diff(synced["weights"], updated["weights"])
    moved = _max(synced["image"], initial["image"])
    diff = (_max(synced["image"], updated["image"]), _max(synced["text"], initial["text"]))
    report.append(
        f"update sync: image log-probs moved {moved:.3g}; vs fresh engine image {diff[0]:.3g}, text (vs initial) "
        f"{diff[1]:.3g}; {groups}"
    )
    assert moved > 0.01
    assert all(v == 0.0 for v in groups.values()), groups
    assert max(diff) <= EXACT
    with capsys.disabled():
        print("\n[vllm vision sync]\n  " + "\n  ".join(report))
