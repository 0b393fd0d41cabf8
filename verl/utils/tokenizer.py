"""Tokenizers and processors: load them from a local path (upstream ``hf_tokenizer`` / ``hf_processor``), or build
a tiny byte-level BPE tokenizer offline for tests and the CPU quickstart (``build_offline_tokenizer``).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable, Sequence

from verl.upstream_gaps import missing_name_getattr

logger = logging.getLogger(__name__)

__all__ = ["hf_tokenizer", "hf_processor", "set_pad_token_id", "build_offline_tokenizer", "CHATML_TEMPLATE"]

# ChatML, the format of Qwen chat models. Content may be a string or a list of typed parts (what RLHFDataset builds
# for multimodal rows); image/video parts render as Qwen-VL vision placeholders.
CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' }}"
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for part in message['content'] %}"
    "{% if part['type'] == 'text' %}{{ part['text'] }}"
    "{% elif part['type'] == 'image' %}{{ '<|vision_start|><|image_pad|><|vision_end|>' }}"
    "{% elif part['type'] == 'video' %}{{ '<|vision_start|><|video_pad|><|vision_end|>' }}"
    "{% endif %}{% endfor %}{% endif %}"
    "{{ '<|im_end|>\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
_PROCESSOR_CONFIGS = ("processor_config.json", "preprocessor_config.json")
BASE_SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
BYTE_ALPHABET_SIZE = 256


def set_pad_token_id(tokenizer) -> None:
    """Use EOS as padding when the tokenizer defines no pad token (left-padding prompts needs one)."""
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
        logger.warning("tokenizer has no pad token; using eos_token %r for padding", tokenizer.eos_token)


def _resolve_local(name_or_path: str) -> str:
    """Expand ``~``; a path that exists locally is returned absolute, anything else unchanged (a hub id)."""
    expanded = os.path.expanduser(name_or_path)
    return os.path.abspath(expanded) if os.path.exists(expanded) else name_or_path


def hf_tokenizer(name_or_path: str, correct_pad_token: bool = True, correct_gemma2: bool = True, **kwargs):
    """``AutoTokenizer.from_pretrained`` with a pad token guaranteed and an actionable error when it cannot load.

    ``correct_gemma2`` is accepted for upstream signature compatibility (Gemma-2 needs no correction here).
    ``kwargs`` go to ``from_pretrained`` (e.g. ``trust_remote_code``).
    """
    del correct_gemma2
    from transformers import AutoTokenizer

    from verl.utils.rope_utils import config_kwarg

    path = _resolve_local(name_or_path)
    try:
        kwargs = {**config_kwarg(path, kwargs.get("trust_remote_code", False)), **kwargs}
        tokenizer = AutoTokenizer.from_pretrained(path, **kwargs)
    except OSError as exc:
        raise OSError(
            f"Could not load a tokenizer from {name_or_path!r}: {exc}. Give actor_rollout_ref.model.path (or "
            "data.tokenizer) as a local directory containing tokenizer.json / tokenizer_config.json; hub downloads "
            "need network access and HF_HUB_OFFLINE unset."
        ) from exc
    if correct_pad_token:
        set_pad_token_id(tokenizer)
    return tokenizer


def hf_processor(name_or_path: str, **kwargs):
    """The multimodal processor at ``name_or_path``, or None for text-only models (upstream behaviour).

    A load failure is not an error: text-only model directories have no processor config. It is logged at INFO, or
    at WARNING when the directory does hold a processor config (a multimodal model that would silently train on
    text only: often ``data.trust_remote_code`` or a missing package).
    """
    from transformers import AutoProcessor

    from verl.utils.rope_utils import config_kwarg

    path = _resolve_local(name_or_path)
    try:
        kwargs = {**config_kwarg(path, kwargs.get("trust_remote_code", False)), **kwargs}
        processor = AutoProcessor.from_pretrained(path, **kwargs)
    except Exception as exc:  # noqa: BLE001 - any failure means "no processor"; the reason is logged
        has_config = any(os.path.isfile(os.path.join(path, f)) for f in _PROCESSOR_CONFIGS)
        logger.log(
            logging.WARNING if has_config else logging.INFO,
            "no processor for %s (%s: %s); treating the model as text-only",
            name_or_path,
            type(exc).__name__,
            exc,
        )
        return None
    # AutoProcessor falls back to the tokenizer for text-only models; that is not a processor.
    if processor is not None and "Processor" not in type(processor).__name__:
        return None
    return processor


def _train_byte_bpe(corpus: Sequence[str], vocab_size: int, special_tokens: list[str]):
    """A byte-level BPE ``tokenizers.Tokenizer`` trained on ``corpus`` (deterministic for a given corpus)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=special_tokens,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),  # every byte encodable: no unknown tokens
        show_progress=False,
    )
    tokenizer.train_from_iterator(list(corpus), trainer=trainer)
    return tokenizer


def build_offline_tokenizer(
    corpus: Iterable[str],
    vocab_size: int = 512,
    save_dir: str | None = None,
    extra_special_tokens: Sequence[str] = (),
):
    """Train a byte-level BPE on ``corpus`` and wrap it as a ChatML ``PreTrainedTokenizerFast`` (no network).

    Special tokens: ``<|endoftext|>`` (pad), ``<|im_start|>``, ``<|im_end|>`` (eos) plus ``extra_special_tokens``
    (e.g. ``<|vision_start|>``, ``<|image_pad|>``, ``<|vision_end|>`` for a multimodal processor). Any text
    round-trips exactly (byte fallback). ``save_dir``: also ``save_pretrained`` there, loadable by ``hf_tokenizer``.
    Trains in well under a second for a few thousand short lines.
    """
    from transformers import PreTrainedTokenizerFast

    corpus = [line for line in corpus if line]
    if not corpus:
        raise ValueError("build_offline_tokenizer: corpus is empty; give a few lines of representative text.")
    special_tokens = list(dict.fromkeys([*BASE_SPECIAL_TOKENS, *extra_special_tokens]))
    min_size = BYTE_ALPHABET_SIZE + len(special_tokens)
    if vocab_size < min_size:
        raise ValueError(f"build_offline_tokenizer: vocab_size={vocab_size} < {min_size} (256 bytes + specials).")
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=_train_byte_bpe(corpus, vocab_size, special_tokens),
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        additional_special_tokens=special_tokens[len(BASE_SPECIAL_TOKENS) :] or None,
    )
    tokenizer.chat_template = CHATML_TEMPLATE
    if save_dir is not None:
        tokenizer.save_pretrained(save_dir)
    return tokenizer


__getattr__ = missing_name_getattr(__name__)  # upstream names missing here raise with the reason (verl.upstream_gaps)
