"""Tiny Qwen3.5 models for tests, the CPU quickstart and benchmarks.

Same architecture as Qwen3.5-35B-A3B (docs/qwen3_5.md, "Architecture and size"), scaled down: hidden 64, layers
mixing Gated DeltaNet and gated full attention (``[L, L, L, F]``), grouped value heads in the GDN (2 q/k heads, 4 v
heads), partial interleaved M-RoPE, a few experts with a shared expert for the MoE kind, and a 2-block vision tower
for the ``*_vl`` kinds. A forward + backward on a few hundred tokens takes well under a second on one CPU core.

Kinds: ``"qwen3_5"`` (dense, ``Qwen3_5ForCausalLM``), ``"qwen3_5_moe"`` (``Qwen3_5MoeForCausalLM``),
``"qwen3_5_vl"`` and ``"qwen3_5_moe_vl"`` (``...ForConditionalGeneration`` with the vision tower).

Profiles: ``"default"`` (the smallest widths) and ``"vllm"``, the widths vLLM's CPU kernels accept: its attention
takes head dims 32, 64, 80, ... (not 16) and its CPU Gated DeltaNet kernel linear key/value head dims of 128 (not 32),
so ``head_dim=64`` and ``linear_{key,value}_head_dim=128`` (M-RoPE sections scaled to the 16 rotary frequencies).
The ``vllm`` profile is what the tests, the quickstart and the GPU check run the real vLLM engine on.
"""

from __future__ import annotations

import os

import torch
import torch.nn as nn

from verl.utils.rope_utils import normalize_rope_validation_keys

__all__ = [
    "TINY_KINDS",
    "TINY_PROFILES",
    "VISION_TOKENS",
    "build_tiny_model",
    "save_tiny_checkpoint",
    "tiny_config",
    "tiny_qwen3_5_config",
    "tiny_qwen3_5_moe_config",
    "tiny_qwen3_5_vl_config",
]

TINY_KINDS = ("qwen3_5", "qwen3_5_moe", "qwen3_5_vl", "qwen3_5_moe_vl")
# The processor's special tokens, in the order of the config fields that hold their ids.
VISION_TOKENS = {
    "image_token_id": "<|image_pad|>",
    "video_token_id": "<|video_pad|>",
    "vision_start_token_id": "<|vision_start|>",
    "vision_end_token_id": "<|vision_end|>",
}


# Field overrides per profile (see the module docstring).
TINY_PROFILES: dict[str, dict] = {
    "default": {},
    "vllm": {
        "head_dim": 64,
        "linear_key_head_dim": 128,
        "linear_value_head_dim": 128,
        # rotary over half of head_dim 64 = 32 dims = 16 frequencies, split 8/4/4 over the T/H/W M-RoPE axes
        "rope_parameters": {
            "rope_type": "default",
            "rope_theta": 10_000.0,
            "partial_rotary_factor": 0.5,
            "mrope_section": [8, 4, 4],
            "mrope_interleaved": True,
        },
    },
}


def _profile(profile: str) -> dict:
    if profile not in TINY_PROFILES:
        raise ValueError(f"unknown tiny model profile {profile!r}; valid: {sorted(TINY_PROFILES)}")
    return dict(TINY_PROFILES[profile])


def _text_kwargs(vocab_size: int, layer_types: list[str] | None, overrides: dict) -> dict:
    layer_types = layer_types or ["linear_attention"] * 3 + ["full_attention"]
    kwargs = dict(
        vocab_size=vocab_size,
        hidden_size=64,
        num_hidden_layers=len(layer_types),
        layer_types=list(layer_types),
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        linear_num_key_heads=2,
        linear_num_value_heads=4,
        linear_key_head_dim=16,
        linear_value_head_dim=16,
        linear_conv_kernel_dim=4,
        hidden_act="silu",
        max_position_embeddings=4096,
        rms_norm_eps=1e-6,
        tie_word_embeddings=False,
        # rotary over half of head_dim 16 = 8 dims = 4 frequencies, split 2/1/1 over the T/H/W M-RoPE axes
        rope_parameters={
            "rope_type": "default",
            "rope_theta": 10_000.0,
            "partial_rotary_factor": 0.5,
            "mrope_section": [2, 1, 1],
            "mrope_interleaved": True,
        },
    )
    kwargs.update(overrides)
    return kwargs


def tiny_qwen3_5_config(
    vocab_size: int = 512, *, layer_types: list[str] | None = None, profile: str = "default", **overrides
):
    """Dense tiny Qwen3.5 text config (``Qwen3_5TextConfig``); ``overrides`` replace any field."""
    from transformers import Qwen3_5TextConfig

    kwargs = _text_kwargs(vocab_size, layer_types, {"intermediate_size": 128, **_profile(profile), **overrides})
    return Qwen3_5TextConfig(**normalize_rope_validation_keys(kwargs))


def tiny_qwen3_5_moe_config(
    vocab_size: int = 512, *, layer_types: list[str] | None = None, profile: str = "default", **overrides
):
    """Tiny Qwen3.5-MoE text config: 4 experts, top-2, expert/shared-expert width 32."""
    from transformers import Qwen3_5MoeTextConfig

    moe = dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32, shared_expert_intermediate_size=32)
    kwargs = _text_kwargs(vocab_size, layer_types, {**moe, **_profile(profile), **overrides})
    return Qwen3_5MoeTextConfig(**normalize_rope_validation_keys(kwargs))


def _tiny_vision_config(moe: bool, out_hidden_size: int) -> dict:
    # patch 4 (x temporal 2 x 3 channels = 96 values per patch), 2x2 merge, an 8x8 learned position grid
    return dict(
        model_type="qwen3_5_moe_vision" if moe else "qwen3_5_vision",
        depth=2,
        hidden_size=32,
        intermediate_size=64,
        num_heads=2,
        in_channels=3,
        patch_size=4,
        temporal_patch_size=2,
        spatial_merge_size=2,
        out_hidden_size=out_hidden_size,
        num_position_embeddings=64,
        hidden_act="gelu_pytorch_tanh",
    )


def tiny_qwen3_5_vl_config(vocab_size: int = 512, *, moe: bool = False, token_ids: dict | None = None, **overrides):
    """Tiny multimodal config (``Qwen3_5Config`` / ``Qwen3_5MoeConfig``) with a 2-block vision tower.

    ``token_ids`` maps the fields of :data:`VISION_TOKENS` to ids; by default the last 4 ids of the vocabulary.
    """
    from transformers import Qwen3_5Config, Qwen3_5MoeConfig

    text = (tiny_qwen3_5_moe_config if moe else tiny_qwen3_5_config)(vocab_size, **overrides)
    ids = token_ids or {name: vocab_size - 4 + i for i, name in enumerate(VISION_TOKENS)}
    config_cls = Qwen3_5MoeConfig if moe else Qwen3_5Config
    return config_cls(
        text_config=text.to_dict(),
        vision_config=_tiny_vision_config(moe, text.hidden_size),
        tie_word_embeddings=False,
        **ids,
    )


def tiny_config(kind: str, vocab_size: int = 512, **overrides):
    """The config of a tiny model ``kind`` (one of :data:`TINY_KINDS`)."""
    if kind == "qwen3_5":
        return tiny_qwen3_5_config(vocab_size, **overrides)
    if kind == "qwen3_5_moe":
        return tiny_qwen3_5_moe_config(vocab_size, **overrides)
    if kind in ("qwen3_5_vl", "qwen3_5_moe_vl"):
        return tiny_qwen3_5_vl_config(vocab_size, moe=kind == "qwen3_5_moe_vl", **overrides)
    raise ValueError(f"unknown tiny model kind {kind!r}; valid: {TINY_KINDS}")


def _model_class(kind: str):
    import transformers

    names = {
        "qwen3_5": "Qwen3_5ForCausalLM",
        "qwen3_5_moe": "Qwen3_5MoeForCausalLM",
        "qwen3_5_vl": "Qwen3_5ForConditionalGeneration",
        "qwen3_5_moe_vl": "Qwen3_5MoeForConditionalGeneration",
    }
    return getattr(transformers, names[kind])


def build_tiny_model(
    kind: str,
    vocab_size: int = 512,
    seed: int = 0,
    *,
    attn_implementation: str = "sdpa",
    dtype: torch.dtype = torch.float32,
    **overrides,
) -> nn.Module:
    """A randomly initialised tiny model (deterministic for a given ``seed``), in ``eval()`` mode, unpatched.

    ``overrides`` are config fields, plus ``profile`` (module docstring) and ``layer_types``."""
    config = tiny_config(kind, vocab_size, **overrides)
    config._attn_implementation = attn_implementation
    for sub in ("text_config", "vision_config"):
        if getattr(config, sub, None) is not None:
            getattr(config, sub)._attn_implementation = attn_implementation
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = _model_class(kind)(config)
    return model.to(dtype).eval()


def _vision_token_ids(tokenizer) -> dict:
    ids = {name: tokenizer.convert_tokens_to_ids(token) for name, token in VISION_TOKENS.items()}
    missing = [VISION_TOKENS[name] for name, i in ids.items() if i is None or i == tokenizer.unk_token_id]
    if missing:
        raise ValueError(
            f"save_tiny_checkpoint: the tokenizer has no {missing} token(s), which a multimodal model needs; build "
            "it with these special tokens (verl.utils.tokenizer.build_offline_tokenizer(..., special_tokens=...))"
        )
    return ids


def save_tiny_checkpoint(kind: str, tokenizer, out_dir: str, *, seed: int = 0, profile: str = "default") -> str:
    """Save a tiny model ``kind`` (``profile``: see the module docstring) sized to ``tokenizer`` and the tokenizer
    as an ordinary HF checkpoint directory.

    The vocabulary size is ``len(tokenizer)``; bos/eos/pad ids come from the tokenizer, and for the ``*_vl`` kinds
    the image/video/vision-start/end ids too. Returns ``out_dir``.
    """
    vocab_size = len(tokenizer)
    overrides = {name: getattr(tokenizer, name) for name in ("bos_token_id", "eos_token_id", "pad_token_id")}
    overrides = {k: v for k, v in overrides.items() if v is not None}
    overrides["profile"] = profile
    if kind.endswith("_vl"):
        model = build_tiny_model(kind, vocab_size, seed, token_ids=_vision_token_ids(tokenizer), **overrides)
    else:
        model = build_tiny_model(kind, vocab_size, seed, **overrides)
    os.makedirs(out_dir, exist_ok=True)
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    return out_dir
