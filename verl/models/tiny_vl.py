"""A tiny Qwen3.5 vision-language checkpoint with an offline image processor, saved as an ordinary HF directory.

The model is ``verl.models.tiny``'s ``qwen3_5_vl`` / ``qwen3_5_moe_vl`` (the real ``Qwen3_5VisionModel``: Conv3d
patch embedding over 2 frames x 4x4-pixel patches, learned position grid, 2 blocks, 2x2 patch merger). The processor
is HF's own Qwen-VL image processor (the PIL backend ``Qwen2VLImageProcessorPil``: resize to a multiple of
patch x merge = 8 pixels, CLIP normalisation, temporal duplication, patch flattening) driven by HF's own
``Qwen3VLProcessor`` call path (each ``<|image_pad|>`` expands to ``grid.prod() / merge²`` tokens,
``mm_token_type_ids`` returned).

Why a subclass: ``Qwen3VLProcessor.__init__`` requires a video processor, and every HF video processor needs
``torchvision``, which the CPU environment does not install. :class:`TinyQwen3_5VLProcessor` is the same processor
with the video slot removed (videos are refused); everything else is the HF class's code. The saved directory names
it through ``auto_map`` with a one-line ``processing_tiny_qwen3_5_vl.py`` that imports it from this module, so
``AutoProcessor.from_pretrained(path, trust_remote_code=True)`` (upstream's ``hf_processor`` with
``actor_rollout_ref.model.trust_remote_code=True``) loads it.
"""

from __future__ import annotations

import json
import os

from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil
from transformers.models.qwen3_vl.processing_qwen3_vl import Qwen3VLProcessor
from transformers.processing_utils import ProcessorMixin

from verl.models.tiny import VISION_TOKENS, save_tiny_checkpoint
from verl.utils.tokenizer import CHATML_TEMPLATE

__all__ = ["TinyQwen3_5VLProcessor", "build_tiny_vl_processor", "save_tiny_vl_checkpoint", "IMAGE_PIXELS"]

# The image processor's pixel budget: at least 8x8 patches' worth (one merged token) and at most 64x64 pixels
# (8x8 patches of 4 pixels -> 16 merged tokens), so a prompt with three images stays short on the CPU.
IMAGE_PIXELS = {"shortest_edge": 8 * 8, "longest_edge": 64 * 64}
_SHIM_FILE = "processing_tiny_qwen3_5_vl.py"
_SHIM = (
    '"""Loads verl.models.tiny_vl.TinyQwen3_5VLProcessor (auto_map of processor_config.json)."""\n\n'
    "from verl.models.tiny_vl import TinyQwen3_5VLProcessor  # noqa: F401\n"
)


class TinyQwen3_5VLProcessor(Qwen3VLProcessor):
    """``Qwen3VLProcessor`` for images only (module docstring): image processor + tokenizer, no video processor."""

    def __init__(self, image_processor=None, tokenizer=None, chat_template=None, **kwargs):
        ProcessorMixin.__init__(self, image_processor, tokenizer, chat_template=chat_template)
        for name in ("image", "video", "vision_start", "vision_end"):
            token = VISION_TOKENS[f"{name}_token_id"]
            setattr(self, f"{name}_token", token)
            setattr(self, f"{name}_token_id", tokenizer.convert_tokens_to_ids(token))

    def __call__(self, images=None, text=None, videos=None, **kwargs):
        if videos is not None:
            raise ValueError(
                "TinyQwen3_5VLProcessor handles images only (HF video processors need torchvision); drop the "
                "'videos' column (data.video_key) or use the model's own processor"
            )
        return super().__call__(images=images, text=text, **kwargs)


def build_tiny_vl_processor(tokenizer, *, patch_size: int = 4, merge_size: int = 2) -> TinyQwen3_5VLProcessor:
    """The processor of the tiny VL model (patch and merge sizes of ``verl.models.tiny``'s vision config)."""
    image_processor = Qwen2VLImageProcessorPil(
        patch_size=patch_size, temporal_patch_size=2, merge_size=merge_size, size=dict(IMAGE_PIXELS)
    )
    return TinyQwen3_5VLProcessor(
        image_processor=image_processor, tokenizer=tokenizer, chat_template=tokenizer.chat_template or CHATML_TEMPLATE
    )


def save_tiny_vl_checkpoint(
    tokenizer,
    out_dir: str,
    *,
    kind: str = "qwen3_5_vl",
    seed: int = 0,
    profile: str = "default",
    video_processor: bool = False,
) -> str:
    """Save the tiny VL model ``kind``, ``tokenizer`` (which must hold the :data:`VISION_TOKENS`) and the processor
    under ``out_dir`` as one HF directory loadable by ``hf_processor(out_dir, trust_remote_code=True)``.

    ``video_processor``: also write HF's ``Qwen3VLVideoProcessor`` config (same patch/merge sizes). vLLM's Qwen-VL
    input processing loads one even for image-only prompts; it needs torchvision, so only where that imports (the
    vLLM environment)."""
    if not kind.endswith("_vl"):
        raise ValueError(f"save_tiny_vl_checkpoint: kind {kind!r} has no vision tower; use qwen3_5_vl or *_moe_vl")
    save_tiny_checkpoint(kind, tokenizer, out_dir, seed=seed, profile=profile)
    build_tiny_vl_processor(tokenizer).save_pretrained(out_dir)
    _register_auto_class(out_dir)
    if video_processor:
        from transformers.models.qwen3_vl.video_processing_qwen3_vl import Qwen3VLVideoProcessor

        size = {"shortest_edge": IMAGE_PIXELS["shortest_edge"], "longest_edge": 2 * IMAGE_PIXELS["longest_edge"]}
        Qwen3VLVideoProcessor(patch_size=4, temporal_patch_size=2, merge_size=2, size=size).save_pretrained(out_dir)
    return out_dir


def _register_auto_class(out_dir: str) -> None:
    """Point ``AutoProcessor`` at :class:`TinyQwen3_5VLProcessor` (``auto_map`` + the shim file)."""
    with open(os.path.join(out_dir, _SHIM_FILE), "w") as f:
        f.write(_SHIM)
    path = os.path.join(out_dir, "processor_config.json")
    with open(path) as f:
        config = json.load(f)
    config["auto_map"] = {"AutoProcessor": f"{_SHIM_FILE[:-3]}.TinyQwen3_5VLProcessor"}
    with open(path, "w") as f:
        json.dump(config, f, indent=2)
