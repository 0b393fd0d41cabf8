"""build_fsdp_model (verl/workers/core/fsdp_model.py): option checks that run before any model is loaded."""

import re

import pytest

from verl.workers.config import FSDPEngineConfig
from verl.workers.core.fsdp_model import build_fsdp_model


@pytest.mark.parametrize(
    "role, value_head, key",
    [
        ("actor_rollout_ref.actor", False, "actor_rollout_ref.actor.fsdp_config"),
        ("critic", True, "critic.model.fsdp_config"),
    ],
)
def test_offload_policy_with_fsdp1_is_refused_before_loading(role, value_head, key):
    """Invariant: an fsdp_config asking FSDP1 for offload_policy (an engine config bypasses the role-level check)
    raises a ValueError naming the role's full key, before the model path is even read (model_config=None)."""
    with pytest.raises(ValueError, match="^" + re.escape(f"{key}.offload_policy=True is FSDP2-only")):
        build_fsdp_model(
            None, FSDPEngineConfig(offload_policy=True), strategy="fsdp", mesh=None, value_head=value_head, role=role
        )


@pytest.fixture
def one_rank(tmp_path):
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/pg", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def _image_batch(vocab: int):
    """One sample: 3 text tokens, <vision_start>, 4 image tokens (a 1x4x4 patch grid merged 2x2), <vision_end>,
    3 text tokens; pixel rows = 1*4*4 patches of 3 channels x 2 frames x 4 x 4 pixels."""
    import torch

    from verl.models.tiny import VISION_TOKENS

    ids = dict(zip(VISION_TOKENS, range(vocab - 4, vocab), strict=True))
    text = torch.tensor([5, 6, 7])
    seq = torch.cat(
        [
            text,
            torch.tensor([ids["vision_start_token_id"]]),
            torch.full((4,), ids["image_token_id"]),
            torch.tensor([ids["vision_end_token_id"]]),
            text,
        ]
    )[None]
    return dict(
        input_ids=seq,
        attention_mask=torch.ones_like(seq),
        pixel_values=torch.randn(16, 3 * 2 * 4 * 4, generator=torch.Generator().manual_seed(0)),
        image_grid_thw=torch.tensor([[1, 4, 4]]),
        mm_token_type_ids=(seq == ids["image_token_id"]).long(),
    )


@pytest.mark.usefixtures("one_rank")
@pytest.mark.parametrize("strategy", ["fsdp", "fsdp2"])
@pytest.mark.parametrize("freeze", [True, False])
def test_freeze_vision_tower_trains_only_the_language_model(tmp_path, strategy, freeze):
    """Invariant (actor.freeze_vision_tower): with the flag the vision encoder's parameters are frozen before
    sharding (FSDP1 keeps original parameters so one flat parameter does not mix frozen and trainable tensors),
    and a forward/backward over an image sample gives gradients to the language model and none to the vision
    tower; without it the vision tower gets gradients too (so the check can fail)."""
    from verl.models.tiny import build_tiny_model
    from verl.utils.fsdp_utils import create_device_mesh
    from verl.workers.config import FSDPOptimizerConfig, HFModelConfig

    vocab = 128
    path = tmp_path / "tiny_vl"
    build_tiny_model("qwen3_5_vl", vocab_size=vocab).save_pretrained(path)
    built = build_fsdp_model(
        HFModelConfig(
            path=str(path), enable_gradient_checkpointing=False, override_config={"attn_implementation": "eager"}
        ),
        FSDPEngineConfig(strategy=strategy, mixed_precision={"param_dtype": "fp32"}),
        strategy=strategy,
        mesh=create_device_mesh(1, -1),
        optim_config=FSDPOptimizerConfig(lr=1e-3),
        freeze_vision_tower=freeze,
    )
    out = built.module(**_image_batch(vocab))
    out.logits.float().pow(2).mean().backward()
    params = dict(built.module.named_parameters())
    vision = {n: p for n, p in params.items() if ".visual." in n}
    language = {n: p for n, p in params.items() if ".visual." not in n}
    assert vision and language
    assert all(p.requires_grad != freeze for p in vision.values())
    assert all(p.requires_grad for p in language.values())
    vision_grads = [p.grad is not None and bool(p.grad.abs().sum() > 0) for p in vision.values()]
    assert not any(vision_grads) if freeze else all(vision_grads)
    assert sum(p.grad is not None for p in language.values()) >= len(language) - 2  # (unused special rows aside)


def test_freeze_vision_tower_on_a_text_model_names_the_key(tmp_path):
    """Freezing a tower that does not exist would silently do nothing: refused naming the key."""
    import torch

    from verl.base_config import ConfigError
    from verl.utils.model import freeze_vision_tower

    with pytest.raises(ConfigError, match=r"actor_rollout_ref\.actor\.freeze_vision_tower: is set but .* no vision"):
        freeze_vision_tower(torch.nn.Linear(2, 2))


def _gdn_kernel_spy(monkeypatch) -> list:
    """Record the ``cu_seqlens`` every call of the project's gated-delta-rule kernel receives (patched GDN layers
    look the kernel up in ``verl.models.transformers.qwen3_5`` at call time)."""
    from verl.models.transformers import qwen3_5

    seen, real = [], qwen3_5.chunk_gated_delta_rule

    def spy(*args, cu_seqlens=None, **kwargs):
        seen.append(None if cu_seqlens is None else cu_seqlens.tolist())
        return real(*args, cu_seqlens=cu_seqlens, **kwargs)

    monkeypatch.setattr(qwen3_5, "chunk_gated_delta_rule", spy)
    return seen


@pytest.mark.usefixtures("one_rank")
@pytest.mark.parametrize("strategy", ["fsdp", "fsdp2"])
def test_worker_built_qwen3_5_moe_trains_on_the_projects_gdn_kernel(tmp_path, monkeypatch, strategy):
    """Invariant: a Qwen3.5-MoE built exactly as the workers build it (``from_pretrained`` of a saved checkpoint,
    the patch registry, gradient checkpointing, FSDP wrap, then ``train()`` as the update does) runs every Gated
    DeltaNet layer through the project's varlen kernel with the packed batch's ``cu_seqlens``, and its packed
    log-probs equal each sequence run alone (fp32, 1e-5).

    This is the path transformers 5.25 broke: ``from_pretrained`` enables its hub-kernel layer and ``train()``
    re-kernelizes, which popped the instance-level forward the old patch installed (a model built with
    ``from_config`` kept it, so the model tests did not see it). Without the patch on the call path the spy sees
    no call and, on the CPU, HF's own kernel refuses packed input (or leaks across sequences without the check)."""
    import torch

    from verl.models.tiny import build_tiny_model
    from verl.models.transformers.packed_forward import forward_packed
    from verl.models.transformers.patch_registry import get_patch_status
    from verl.utils.fsdp_utils import create_device_mesh
    from verl.utils.packing import pack_padded_batch
    from verl.workers.config import FSDPOptimizerConfig, HFModelConfig

    path = tmp_path / "tiny_moe"
    build_tiny_model("qwen3_5_moe", vocab_size=128).save_pretrained(path)
    built = build_fsdp_model(
        HFModelConfig(path=str(path), enable_gradient_checkpointing=True),
        FSDPEngineConfig(strategy=strategy, mixed_precision={"param_dtype": "fp32"}),
        strategy=strategy,
        mesh=create_device_mesh(1, -1),
        optim_config=FSDPOptimizerConfig(lr=1e-3),
    )
    status = get_patch_status(built.module.module if strategy == "fsdp" else built.module)["qwen3_5-varlen-gdn"]
    assert status.state == "applied" and status.probed
    seen = _gdn_kernel_spy(monkeypatch)
    built.module.train()
    lengths = (6, 3, 7)
    ids = torch.randint(1, 100, (3, 7), generator=torch.Generator().manual_seed(0))
    mask = (torch.arange(7)[None] < torch.tensor(lengths)[:, None]).long()
    packed = pack_padded_batch(ids, mask)
    logits = forward_packed(built.module, packed)
    logits.float().pow(2).mean().backward()  # the backward recomputes the checkpointed layers
    layers = sum(t == "linear_attention" for t in built.hf_config.get_text_config().layer_types)
    assert seen and seen == [[0, 6, 9, 16]] * len(seen) and len(seen) >= 2 * layers  # forward + recomputation
    with torch.no_grad():
        packed_logits = forward_packed(built.module, packed)[0]
        for row, (start, length) in enumerate(zip((0, 6, 9), lengths)):
            alone = forward_packed(
                built.module, pack_padded_batch(ids[row : row + 1, :length], mask[row : row + 1, :length])
            )
            torch.testing.assert_close(packed_logits[start : start + length], alone[0], atol=1e-5, rtol=0)
