"""Packed multimodal Qwen3.5: per-sample M-RoPE, 4-row position ids, images in sample order.

The rules followed: docs/qwen3_5.md, "M-RoPE for packed rows".

Two samples with images of different grids (4x4 and 4x6 patches -> 4 and 6 merged tokens) and a text-only sample
are run alone through HF's own multimodal forward (HF computes the M-RoPE ids itself: an independent reference),
left-padded in a batch, and packed into one row.
"""

import pytest
import torch

from verl.models.tiny import build_tiny_model
from verl.models.transformers.packed_forward import forward_packed, forward_padded
from verl.models.transformers.patch_registry import apply_patches
from verl.utils.packing import pack_padded_batch, pack_values, unpack_to_padded
from verl.utils.rope_utils import get_mrope_position_ids, get_packed_mrope_position_ids

pytestmark = pytest.mark.tf_compat

VOCAB = 256
IMAGE, START, END = VOCAB - 4, VOCAB - 2, VOCAB - 1  # tiny_qwen3_5_vl_config's default special ids
PATCH_VALUES = 3 * 2 * 4 * 4  # channels x temporal patch x patch x patch


def _sample(gen, prefix, grid, suffix):
    """ids (L,), mm_token_type_ids (L,), pixel_values (t*h*w, 96) | None, grid (1, 3) | None."""
    text = lambda n: torch.randint(0, VOCAB - 4, (n,), generator=gen)  # noqa: E731
    if grid is None:
        ids = text(prefix + suffix)
        return ids, torch.zeros_like(ids), None, None
    t, h, w = grid
    n_image = t * h * w // 4
    ids = torch.cat(
        [text(prefix), torch.tensor([START]), torch.full((n_image,), IMAGE), torch.tensor([END]), text(suffix)]
    )
    types = (ids == IMAGE).long()
    pixels = torch.randn(t * h * w, PATCH_VALUES, generator=gen)
    return ids, types, pixels, torch.tensor([grid])


def _samples():
    gen = torch.Generator().manual_seed(0)
    return [_sample(gen, 5, (1, 4, 4), 9), _sample(gen, 3, None, 8), _sample(gen, 7, (1, 4, 6), 4)]


def _padded(samples):
    width = max(len(s[0]) for s in samples) + 2
    ids = torch.zeros(len(samples), width, dtype=torch.long)
    mask, types = torch.zeros_like(ids), torch.zeros_like(ids)
    for row, (seq, seq_types, _, _) in enumerate(samples):
        ids[row, width - len(seq) :], types[row, width - len(seq) :], mask[row, width - len(seq) :] = seq, seq_types, 1
    pixels = torch.cat([s[2] for s in samples if s[2] is not None])
    grids = torch.cat([s[3] for s in samples if s[3] is not None])
    return ids, mask, types, pixels, grids


def _logprobs(logits, ids):
    return torch.log_softmax(logits[:-1].float(), -1).gather(-1, ids[1:, None]).squeeze(-1)


def _model(kind):
    model = build_tiny_model(kind, VOCAB, 0)
    with torch.no_grad():
        for module in model.modules():
            if hasattr(module, "A_log"):
                module.A_log.fill_(torch.log(torch.tensor(0.05)).item())
    apply_patches(model, platform="cpu", report=False)
    return model


def _alone(model, sample):
    ids, types, pixels, grid = sample
    extra = {} if pixels is None else dict(pixel_values=pixels, image_grid_thw=grid, mm_token_type_ids=types[None])
    return _logprobs(model(input_ids=ids[None], use_cache=False, **extra).logits[0], ids)


def _packed_and_padded(model, samples):
    ids, mask, types, pixels, grids = _padded(samples)
    merge = model.config.vision_config.spatial_merge_size
    pos = get_packed_mrope_position_ids(types, mask, grids, spatial_merge_size=merge)
    mm = dict(pixel_values=pixels, image_grid_thw=grids)
    packed = pack_padded_batch(ids, mask, pos)
    packed_logits = forward_packed(model, packed, mm_token_type_ids=pack_values(types, packed), **mm)
    packed_logits = unpack_to_padded(packed_logits, packed)
    padded_logits = forward_padded(model, ids, mask, pos, mm_token_type_ids=types, **mm)
    per_seq = lambda logits: [_logprobs(logits[r][mask[r].bool()], s[0]) for r, s in enumerate(samples)]  # noqa: E731
    return per_seq(packed_logits), per_seq(padded_logits)


@pytest.mark.parametrize("kind", ["qwen3_5_vl", "qwen3_5_moe_vl"])
def test_multimodal_logprobs_alone_equal_padded_equal_packed(kind):
    """Invariant: with per-sample M-RoPE ids (4 rows) and images concatenated in sample order, every sample's
    log-probs equal HF's own single-sample forward, padded and packed (fp32, 1e-5)."""
    model = _model(kind)
    samples = _samples()
    with torch.no_grad():
        alone = [_alone(model, s) for s in samples]
        packed, padded = _packed_and_padded(model, samples)
    for a, k, p in zip(alone, packed, padded):
        assert (a - k).abs().max().item() <= 1e-5
        assert (a - p).abs().max().item() <= 1e-5


def test_multimodal_gradients_match_samples_alone():
    """Invariant: packed multimodal gradients (vision tower included) equal the sum over samples run alone,
    relative 1e-4 per parameter tensor."""
    model = _model("qwen3_5_vl").train()
    samples = _samples()
    model.zero_grad()
    sum(_alone(model, s).sum() for s in samples).backward()
    ref = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad()
    packed, _ = _packed_and_padded(model, samples)  # only the packed log-probs are backpropagated
    sum(lp.sum() for lp in packed).backward()
    grads = {n: p.grad for n, p in model.named_parameters() if p.grad is not None}
    assert grads.keys() == ref.keys() and any("visual" in n for n in grads)
    for name, g in grads.items():
        assert ((g - ref[name]).abs().max() / ref[name].abs().max().clamp(min=1e-8)).item() <= 1e-4, name


def test_three_row_mrope_ids_leak_and_are_refused():
    """Control: the 3-row M-RoPE ids (no text row) disable HF's packed-mask detection, so a packed row leaks; verl
    refuses them with a ValueError that says to use 4 rows."""
    model = _model("qwen3_5_vl")
    samples = _samples()
    ids, mask, types, pixels, grids = _padded(samples)
    pos = get_packed_mrope_position_ids(types, mask, grids, spatial_merge_size=2)
    packed = pack_padded_batch(ids, mask, pos[1:])
    with torch.no_grad():
        leaky = model(
            input_ids=packed.input_ids,
            position_ids=packed.position_ids,
            pixel_values=pixels,
            image_grid_thw=grids,
            use_cache=False,
            verl_cu_seqlens=packed.cu_seqlens,  # GDN boundaries given: only attention can leak here
        ).logits
        alone = _alone(model, samples[2])
    leaky = unpack_to_padded(leaky, packed)
    assert (_logprobs(leaky[2][mask[2].bool()], samples[2][0]) - alone).abs().max().item() > 1e-2
    with pytest.raises(ValueError, match="4 rows"):
        forward_packed(model, packed, pixel_values=pixels, image_grid_thw=grids)


def test_mrope_ids_match_hf_get_rope_index():
    """get_mrope_position_ids equals HF's get_rope_index for each sample (images, a 2-frame video split into frames
    by timestamp text, text-only), and the packed helper puts them into rows 1-3 behind a restarting text row."""
    model = build_tiny_model("qwen3_5_vl", VOCAB, 0)
    gen = torch.Generator().manual_seed(3)
    ids, types, _, grid = _sample(gen, 4, (1, 4, 6), 3)
    video_types = torch.tensor([0, 0, 2, 2, 2, 2, 0, 0, 2, 2, 2, 2, 0])  # 2 frames of 4 tokens, timestamps between
    video_grid = torch.tensor([[2, 4, 4]])
    cases = [
        (ids, types, grid, None),
        (video_types, video_types, None, video_grid),
        (ids, torch.zeros_like(ids), None, None),
    ]
    for seq, seq_types, image_grid, vid_grid in cases:
        hf, _ = model.model.get_rope_index(
            seq[None], mm_token_type_ids=seq_types[None], image_grid_thw=image_grid, video_grid_thw=vid_grid
        )
        ours = get_mrope_position_ids(seq_types, image_grid, vid_grid, spatial_merge_size=2)
        assert torch.equal(ours, hf[:, 0])
    _, mask, batch_types, _, grids = _padded(_samples())
    four = get_packed_mrope_position_ids(batch_types, mask, grids, spatial_merge_size=2)
    assert four.shape == (4, 3, mask.shape[1])
    row2 = mask[2].bool()
    assert four[0, 2, row2].tolist() == list(range(int(row2.sum())))
    assert torch.equal(four[1:, 2, row2], get_mrope_position_ids(batch_types[2][row2], grids[1:], None))
