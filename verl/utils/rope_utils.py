"""RoPE helpers for Qwen3.5: robust config keys (field-report item 8) and M-RoPE position ids for packing.

**Set-typed config keys.** ``Qwen3_5(Moe)TextConfig.ignore_keys_at_rope_validation`` is a Python ``set``, and
transformers 5.4.0's rope validation does ``received_keys -= ignore_keys`` and ``ignore_keys | {...}`` with it.
The same key arriving as a list — from JSON (which has no sets), from ``from_dict``, or from vLLM 0.17/0.18's own
config class — raises ``TypeError: unsupported operand type(s) for -=: 'set' and 'list'`` (fixed in 5.5 and
5.10.1). :func:`normalize_rope_validation_keys` turns such values back into sets wherever they appear in a config
dict, and :func:`load_hf_config` applies it before building a config from a checkpoint. It is the one config loader
of the package: the workers (``verl.utils.model.load_hf_config``, ``HFModelConfig.hf_config``), the generation
config fallback and the checkpoint exporter all read a checkpoint's config through it.

**M-RoPE position ids for packing.** A packed multimodal row needs 4-row position ids: a text row restarting at 0 per
sequence (HF uses it for the packed mask / flash-attention boundaries), then the 3 M-RoPE rows (T, H, W), computed
*per sample* (vision positions cannot be computed over a packed row; docs/qwen3_5.md, "M-RoPE for packed rows").
"""

from __future__ import annotations

import itertools
import json
import os
from collections.abc import Mapping

import torch

__all__ = [
    "SET_TYPED_CONFIG_KEYS",
    "normalize_rope_validation_keys",
    "load_hf_config",
    "config_kwarg",
    "get_mrope_position_ids",
    "get_packed_mrope_position_ids",
]

# Config attributes that transformers declares as sets and combines with set operators.
SET_TYPED_CONFIG_KEYS = ("ignore_keys_at_rope_validation",)


def normalize_rope_validation_keys(config: Mapping) -> dict:
    """Return a copy of a config dict in which every set-typed key (at any nesting depth: ``text_config``,
    ``vision_config``, ...) holding a list or tuple holds a set instead. Other values are unchanged."""
    out = {}
    for key, value in config.items():
        if key in SET_TYPED_CONFIG_KEYS and isinstance(value, (list, tuple, set, frozenset)):
            out[key] = set(value)
        elif isinstance(value, Mapping):
            out[key] = normalize_rope_validation_keys(value)
        else:
            out[key] = value
    return out


def _has_set_typed_keys(config: Mapping) -> bool:
    return any(
        key in SET_TYPED_CONFIG_KEYS or (isinstance(value, Mapping) and _has_set_typed_keys(value))
        for key, value in config.items()
    )


def load_hf_config(name_or_path: str, **kwargs):
    """``AutoConfig.from_pretrained`` that also accepts list-typed set keys (field-report item 8).

    Only when the checkpoint's config.json carries such a key is it rebuilt through
    ``CONFIG_MAPPING[model_type].from_dict`` from the normalised dict; otherwise this is exactly AutoConfig.
    """
    from transformers import AutoConfig, PretrainedConfig
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    config_dict, _ = PretrainedConfig.get_config_dict(name_or_path)
    model_type = config_dict.get("model_type")
    if not _has_set_typed_keys(config_dict) or model_type not in CONFIG_MAPPING:
        return AutoConfig.from_pretrained(name_or_path, **kwargs)
    kwargs.pop("trust_remote_code", None)  # a model type of CONFIG_MAPPING is built into transformers
    return CONFIG_MAPPING[model_type].from_dict(normalize_rope_validation_keys(config_dict), **kwargs)


def config_kwarg(name_or_path: str, trust_remote_code: bool = False) -> dict:
    """``{"config": ...}`` for ``AutoTokenizer`` / ``AutoProcessor.from_pretrained`` when ``name_or_path`` is a
    model directory whose config.json carries set-typed keys, else ``{}``.

    Both auto classes read the model config with plain ``AutoConfig`` when not given one, which raises the
    set/list TypeError on transformers 5.4.0 (and ``hf_processor`` would then silently fall back to text-only).
    """
    config_file = os.path.join(os.path.expanduser(name_or_path), "config.json")
    if not os.path.isfile(config_file):
        return {}
    with open(config_file, encoding="utf-8") as f:
        if not _has_set_typed_keys(json.load(f)):
            return {}
    return {"config": load_hf_config(name_or_path, trust_remote_code=trust_remote_code)}


def _vision_positions(start: int, grid_thw: list[int], merge: int) -> torch.Tensor:
    """``(3, t*h*w/merge²)`` T/H/W positions of one image (or one video frame) placed at ``start``."""
    t, h, w = grid_thw[0], grid_thw[1] // merge, grid_thw[2] // merge
    tt, hh, ww = torch.meshgrid(torch.arange(t), torch.arange(h), torch.arange(w), indexing="ij")
    return torch.stack([tt, hh, ww]).reshape(3, -1) + start


def get_mrope_position_ids(
    mm_token_type_ids: torch.Tensor,
    image_grid_thw: torch.Tensor | None = None,
    video_grid_thw: torch.Tensor | None = None,
    *,
    spatial_merge_size: int = 2,
) -> torch.Tensor:
    """M-RoPE position ids of ONE sample, as Qwen3.5's ``get_rope_index`` computes them (transformers >= 5.3).

    Text runs count on from the current position on all three axes; an image run gets its (t, h, w) grid
    coordinates (after the spatial merge) offset by the current position, which then advances by
    ``max(h, w) / merge``. Videos are split into single frames (Qwen3.5 separates frames with timestamp text).

    Args:
        mm_token_type_ids: ``(L,)`` 0 text, 1 image, 2 video, for the real tokens of the sample (no padding).
        image_grid_thw: ``(n_images, 3)`` patch grids of this sample's images, in order.
        video_grid_thw: ``(n_videos, 3)`` likewise for videos.
        spatial_merge_size: the vision config's ``spatial_merge_size``.

    Returns:
        ``(3, L)`` int64.
    """
    frames = []
    if video_grid_thw is not None:
        for t, h, w in video_grid_thw.tolist():
            frames += [[1, h, w]] * t
    grids = {1: iter(image_grid_thw.tolist() if image_grid_thw is not None else []), 2: iter(frames)}
    pieces, current = [], 0
    for modality, run in itertools.groupby(mm_token_type_ids.tolist()):
        length = len(list(run))
        if modality == 0:
            pieces.append(torch.arange(current, current + length).expand(3, -1))
            current += length
            continue
        grid = next(grids[modality], None)
        if grid is None:
            raise ValueError(f"mm_token_type_ids has more {'image' if modality == 1 else 'video'} runs than grids")
        pieces.append(_vision_positions(current, grid, spatial_merge_size))
        current += max(grid[1], grid[2]) // spatial_merge_size
    positions = torch.cat(pieces, dim=1) if pieces else torch.zeros(3, 0, dtype=torch.long)
    if positions.shape[1] != mm_token_type_ids.numel():
        raise ValueError(
            f"image/video grids cover {positions.shape[1]} tokens but the sample has {mm_token_type_ids.numel()}; "
            "each image run must have t*h*w/merge² placeholder tokens"
        )
    return positions.to(mm_token_type_ids.device)


def get_packed_mrope_position_ids(
    mm_token_type_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    image_grid_thw: torch.Tensor | None = None,
    video_grid_thw: torch.Tensor | None = None,
    *,
    spatial_merge_size: int = 2,
) -> torch.Tensor:
    """4-row position ids ``(4, B, S)`` of a padded multimodal batch, ready for ``pack_padded_batch``.

    Row 0 is the text position (``cumsum(mask) - 1``, restarting at 0 per sample); rows 1-3 are each sample's own
    M-RoPE ids. Grids are consumed in sample order (the order of ``pixel_values`` / ``image_grid_thw``). Padding
    positions hold 0.
    """
    batch, seqlen = attention_mask.shape
    mask = attention_mask.bool()
    out = torch.zeros(4, batch, seqlen, dtype=torch.long, device=attention_mask.device)
    out[0] = (mask.long().cumsum(-1) - 1).clamp(min=0)
    images, videos = (
        _split_grids(mm_token_type_ids, mask, image_grid_thw, 1),
        _split_grids(mm_token_type_ids, mask, video_grid_thw, 2),
    )
    for row in range(batch):
        types = mm_token_type_ids[row][mask[row]]
        out[1:, row, mask[row]] = get_mrope_position_ids(
            types, images[row], videos[row], spatial_merge_size=spatial_merge_size
        ).to(out.device)
    out[0] = out[0] * mask
    return out


def _split_grids(types: torch.Tensor, mask: torch.Tensor, grids: torch.Tensor | None, modality: int) -> list:
    """Assign the batch's grids to its samples: sample i gets as many as it has runs of ``modality``."""
    if grids is None:
        return [None] * types.shape[0]
    out, start = [], 0
    for row in range(types.shape[0]):
        runs = sum(1 for key, _ in itertools.groupby(types[row][mask[row]].tolist()) if key == modality)
        if modality == 2:  # a video's frames are separate runs (timestamp text between them)
            count, frames = 0, 0
            while frames < runs:
                frames += int(grids[start + count][0])
                count += 1
            runs = count
        out.append(grids[start : start + runs] if runs else None)
        start += runs
    return out
