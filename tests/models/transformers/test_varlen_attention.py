"""The memory-lean packed attention patch (``varlen-attention-<platform>``) on the tiny Qwen3.5-MoE.

Invariants:

* the patched packed forward equals the mask path (the same model with the patch disabled: HF's sdpa with its
  block-diagonal mask): logits and parameter gradients (fp32, 1e-5, relative for gradients above 1); its logits
  equal HF's forward of every sequence alone (1e-5);
* a long-sequence actor update (``DataParallelPPOActor.update_policy``, gradient checkpointing on) creates no
  tensor with ``T^2`` or more elements: no op output (TorchDispatchMode) and no tensor saved for backward
  (saved_tensors_hooks). The same step with the patch disabled does create one (the detector's positive control:
  the ``(1, 1, T, T)`` mask), so the check cannot pass vacuously.
"""

from __future__ import annotations

import copy

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from tests.workers.conftest import rollout_batch
from verl.models.tiny import build_tiny_model
from verl.models.transformers.packed_forward import forward_packed
from verl.models.transformers.patch_registry import apply_patches, get_patch_status
from verl.models.transformers.varlen_attention import apply_varlen_attention
from verl.utils.packing import pack_padded_batch
from verl.workers.actor.dp_actor import DataParallelPPOActor
from verl.workers.config.actor import FSDPActorConfig

VOCAB = 256
PATCH = "varlen-attention-cpu"


def _model(*, lean: bool, long_segments: str = "sdpa"):
    """The tiny Qwen3.5-MoE with the CPU patches; ``lean=False`` disables the varlen attention (the mask path).
    The CPU platform's patch runs long segments with sdpa; ``long_segments="chunked"`` installs the blocked kernel
    (the simulated NPU's strategy) in its place."""
    model = build_tiny_model("qwen3_5_moe", vocab_size=VOCAB)
    apply_patches(model, platform="cpu", report=False, disabled=() if lean and long_segments == "sdpa" else (PATCH,))
    if lean and long_segments != "sdpa":
        apply_varlen_attention(model, long_segments=long_segments)
    else:
        assert get_patch_status(model)[PATCH].state == ("applied" if lean else "skipped")
    return model


def _batch(lengths: list[int], seed: int = 0):
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, VOCAB, (len(lengths), max(lengths)), generator=generator)
    mask = (torch.arange(max(lengths))[None] < torch.tensor(lengths)[:, None]).long()
    return ids, mask


def _packed_logits_and_grads(model, packed):
    model.zero_grad(set_to_none=True)
    logits = forward_packed(model, packed)[0]
    weight = torch.linspace(-1, 1, logits.numel()).view_as(logits)
    (logits * weight).sum().backward()
    return logits.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("count", [1, 5, 50])
@pytest.mark.parametrize("long_segments", ["sdpa", "chunked"])
def test_packed_forward_equals_mask_path_and_alone(count: int, long_segments: str):
    """1, 5 and 50 packed sequences (3..40 tokens): logits and every parameter gradient of a weighted logit sum
    equal the mask path's; logits equal HF's forward of each sequence alone (no packing, no patch involved)."""
    generator = torch.Generator().manual_seed(count)
    lengths = torch.randint(3, 41, (count,), generator=generator).tolist()
    ids, mask = _batch(lengths, seed=count)
    packed = pack_padded_batch(ids, mask)
    lean, reference = _model(lean=True, long_segments=long_segments), _model(lean=False)
    logits, grads = _packed_logits_and_grads(lean, packed)
    ref_logits, ref_grads = _packed_logits_and_grads(reference, packed)
    assert (logits - ref_logits).abs().max().item() <= 1e-5
    assert grads.keys() == ref_grads.keys() and grads
    for name, grad in grads.items():
        # 1e-5 relative to the gradient's scale: embedding/LM-head gradients sum T x V weighted terms and reach ~5
        scale = max(1.0, ref_grads[name].abs().max().item())
        assert (grad - ref_grads[name]).abs().max().item() <= 1e-5 * scale, name
    plain = build_tiny_model("qwen3_5_moe", vocab_size=VOCAB)  # HF's own forward, unpatched
    offsets = packed.cu_seqlens.tolist()
    with torch.no_grad():
        for row, (a, b) in enumerate(zip(offsets[:-1], offsets[1:])):
            alone = plain(input_ids=ids[row : row + 1, : lengths[row]], use_cache=False).logits[0]
            assert (logits[a:b] - alone).abs().max().item() <= 1e-5, f"sequence {row}"


class _LargestTensors(TorchDispatchMode):
    """Records the largest op output and the largest tensor saved for backward (numel)."""

    def __init__(self):
        super().__init__()
        self.largest_output = (0, "")
        self.largest_saved = (0, ())

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        result = func(*args, **(kwargs or {}))
        for out in result if isinstance(result, (tuple, list)) else (result,):
            if isinstance(out, torch.Tensor) and out.numel() > self.largest_output[0]:
                self.largest_output = (out.numel(), f"{func} -> {tuple(out.shape)}")
        return result

    def saved(self, tensor: torch.Tensor) -> torch.Tensor:
        if tensor.numel() > self.largest_saved[0]:
            self.largest_saved = (tensor.numel(), tuple(tensor.shape))
        return tensor


def _long_sequence_update(model, tokens: int) -> tuple[_LargestTensors, int]:
    """One actor update (fwd, bwd, optimizer step) on two sequences packed into one row of ``tokens`` tokens
    (a single sequence would need no mask at all: HF runs it with ``is_causal``)."""
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.train()
    batch = rollout_batch(batch_size=2, prompt_len=16, response_len=tokens // 2 - 16, vocab=VOCAB)
    config = FSDPActorConfig(
        strategy="fsdp2",
        ppo_mini_batch_size=2,
        ppo_micro_batch_size_per_gpu=2,
        use_torch_compile=False,
        ppo_max_token_len_per_gpu=tokens,
    )
    actor = DataParallelPPOActor(config, model, torch.optim.SGD(model.parameters(), lr=1e-3))
    recorder = _LargestTensors()
    with torch.autograd.graph.saved_tensors_hooks(recorder.saved, lambda t: t), recorder:
        actor.update_policy(batch)
    return recorder, int(batch.batch["attention_mask"].sum())  # T: the packed row (row 1 has two pads)


TOKENS = 2048


@pytest.mark.parametrize("long_segments", ["sdpa", "chunked"])
def test_long_sequence_update_has_no_quadratic_tensor(long_segments: str):
    """T = 2,048 in two ~1,024-token sequences (longer than one 512-token chunk: the long-segment path), vocab 256
    (even full logits are T^2 / 8): nothing reaches T^2 (T = 2,046 packed tokens: 4,186,116 elements)."""
    recorder, total = _long_sequence_update(_model(lean=True, long_segments=long_segments), TOKENS)
    assert recorder.largest_output[0] < total**2, recorder.largest_output
    assert recorder.largest_saved[0] < total**2, recorder.largest_saved
    assert recorder.largest_saved[0] > 0  # the hooks did see the saved tensors


def test_mask_path_update_has_quadratic_tensor():
    """Positive control: the same update with the patch disabled materialises the (1, 1, T, T) mask."""
    recorder, total = _long_sequence_update(_model(lean=False), TOKENS)
    assert recorder.largest_output[0] >= total**2, recorder.largest_output


def test_padded_and_generation_paths_keep_the_configured_attention():
    """Without cu_seqlens (a padded batch with a padding mask) the patched model is HF's model: same logits."""
    lean, plain = _model(lean=True), build_tiny_model("qwen3_5_moe", vocab_size=VOCAB)
    ids, mask = _batch([7, 12, 3])
    with torch.no_grad():
        a = lean(input_ids=ids, attention_mask=mask, use_cache=False).logits
        b = copy.deepcopy(plain)(input_ids=ids, attention_mask=mask, use_cache=False).logits
    valid = mask.bool()
    assert (a[valid] - b[valid]).abs().max().item() <= 1e-5


def _sp_rank(rank: int, init_file: str, out_dir: str) -> None:
    """Both SP 2 ranks: one packed forward + backward of two ~1,024-token sequences with the lean attention and
    with the mask path, recording the largest tensors of each."""
    import json
    import os

    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=2)
    group = dist.new_group([0, 1])
    ids, mask = _batch([TOKENS // 2, TOKENS // 2 - 2])
    packed = pack_padded_batch(ids, mask)
    result = {}
    try:
        for lean in (True, False):
            model = _model(lean=lean)
            recorder = _LargestTensors()
            with torch.autograd.graph.saved_tensors_hooks(recorder.saved, lambda t: t), recorder:
                forward_packed(model, packed, return_hidden=True, ulysses_group=group).sum().backward()
            result["lean" if lean else "mask"] = [recorder.largest_output[0], recorder.largest_saved[0]]
        result["tokens"] = packed.total_tokens
        with open(os.path.join(out_dir, f"{rank}.json"), "w") as f:
            json.dump(result, f)
    finally:
        dist.destroy_process_group()


@pytest.mark.dist
def test_ulysses_sp2_has_no_quadratic_tensor(tmp_path):
    """SP 2 (the all-to-all swaps to heads and the attention sees the whole 2,046-token stream): no op output or
    saved tensor reaches T^2 with the lean attention; the mask path (Ulysses' whole-stream mask) does."""
    import json

    from verl.utils.testing.dist import spawn

    spawn(_sp_rank, args=(str(tmp_path / "init"), str(tmp_path)), nprocs=2)
    for rank in range(2):
        result = json.loads((tmp_path / f"{rank}.json").read_text())
        total = result["tokens"]
        assert max(result["lean"]) < total**2, result
        assert result["mask"][0] >= total**2, result
