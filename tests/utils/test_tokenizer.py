"""Offline tokenizer builder and hf_tokenizer/hf_processor loading from a local directory."""

import pytest

from verl.utils.tokenizer import build_offline_tokenizer, hf_processor, hf_tokenizer

CORPUS = [f"Tom has {i} apples and buys {i + 3} more. How many? #### {2 * i + 3}" for i in range(200)]


@pytest.fixture(scope="module")
def tokenizer():
    return build_offline_tokenizer(CORPUS, vocab_size=400)


def test_round_trip_is_exact_for_any_text(tokenizer):
    """Byte-level BPE: decode(encode(s)) == s, also for characters never seen in the corpus."""
    text = "Zoë paid €3.50 for 🍎 — 12/4 = 3?"
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    assert tokenizer.decode(ids) == text
    assert max(ids) < len(tokenizer) <= 400


def test_chatml_template_and_special_tokens(tokenizer):
    """The ChatML template renders role headers; specials are single ids; eos=<|im_end|>, pad=<|endoftext|>."""
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": "2+2?"}], add_generation_prompt=True, tokenize=False
    )
    assert text == "<|im_start|>user\n2+2?<|im_end|>\n<|im_start|>assistant\n"
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    assert ids.count(tokenizer.convert_tokens_to_ids("<|im_start|>")) == 2
    assert tokenizer.eos_token == "<|im_end|>" and tokenizer.pad_token == "<|endoftext|>"
    assert tokenizer.pad_token_id != tokenizer.eos_token_id


def test_saved_tokenizer_loads_through_hf_tokenizer(tmp_path):
    """save_dir output reloads with hf_tokenizer and encodes identically; hf_processor says text-only (None)."""
    built = build_offline_tokenizer(
        CORPUS, vocab_size=300, save_dir=str(tmp_path), extra_special_tokens=["<|image_pad|>"]
    )
    loaded = hf_tokenizer(str(tmp_path))
    text = "Tom has 7 apples <|image_pad|>"
    assert loaded(text)["input_ids"] == built(text)["input_ids"]
    assert loaded.convert_tokens_to_ids("<|image_pad|>") == built.convert_tokens_to_ids("<|image_pad|>")
    assert loaded.chat_template == built.chat_template
    assert hf_processor(str(tmp_path)) is None


def test_bad_arguments_and_missing_path(tmp_path):
    """Empty corpus / too-small vocab -> ValueError; a missing path -> OSError naming the config key to fix."""
    with pytest.raises(ValueError, match="corpus is empty"):
        build_offline_tokenizer(["", ""])
    with pytest.raises(ValueError, match="vocab_size=100"):
        build_offline_tokenizer(CORPUS, vocab_size=100)
    with pytest.raises(OSError, match="actor_rollout_ref.model.path"):
        hf_tokenizer(str(tmp_path / "no_such_model"))
