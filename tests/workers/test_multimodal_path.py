"""Image prompts through the dataset, the HF rollout and the actor's log-prob path, on the tiny Qwen3.5 VL checkpoint
with its real (offline) Qwen-VL image processor.

Invariants:
* The dataset builds 4-row position ids per sample (text row + T/H/W M-RoPE rows) before padding; with them the
  actor's response log-probs equal HF's own forward of the sample alone (HF computes M-RoPE from
  ``mm_token_type_ids`` itself: an independent reference), fp32 1e-5 — packed, padded, alone, with dynamic batch
  size, for prompts with 1 and 3 images of different sizes. With 2-D ids (the text row only) they do not (control).
* The HF rollout generates from the image: another image changes the logits ``generate`` computes.
* The rollout sees the same prompt token ids, image tokens included, as the actor's forward.
"""

from __future__ import annotations

import random

import pytest
import torch

from verl.models.tiny import VISION_TOKENS
from verl.models.tiny_vl import save_tiny_vl_checkpoint
from verl.protocol import DataProto
from verl.trainer.quickstart_geo3k import COLOURS, draw_shape
from verl.utils.dataset.preprocess import encode_image, write_parquet
from verl.utils.dataset.rl_dataset import RLHFDataset, collate_fn
from verl.utils.tokenizer import build_offline_tokenizer, hf_processor, hf_tokenizer
from verl.workers.actor.dp_actor import DataParallelPPOActor
from verl.workers.config.actor import FSDPActorConfig
from verl.workers.config.rollout import RolloutConfig
from verl.workers.core.model_forward import LogProbOptions
from verl.workers.rollout.hf_rollout import HFRollout

MAX_PROMPT = 160
RESPONSE = 6


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    out = tmp_path_factory.mktemp("tiny_vl")
    tokenizer = build_offline_tokenizer(
        ["what colour is the shape? compare the shapes. red green blue"] * 4,
        vocab_size=300,
        extra_special_tokens=list(VISION_TOKENS.values()),
    )
    save_tiny_vl_checkpoint(tokenizer, str(out))
    return out


@pytest.fixture(scope="module")
def model(checkpoint):
    from transformers import AutoModelForImageTextToText

    from verl.models.transformers.patch_registry import apply_patches

    model = AutoModelForImageTextToText.from_pretrained(checkpoint, dtype=torch.float32).eval()
    apply_patches(model, platform="cpu", report=False)
    return model


def _image(seed: int, size: tuple[int, int]):
    rng = random.Random(seed)
    return draw_shape(rng, rng.choice(list(COLOURS)), max(size)).resize(size)


ROWS = [  # (question, image sizes): 1 image, 3 images of different sizes, 1 image of another size
    ("<image>what colour is the shape?", [(32, 32)]),
    ("compare <image> the shapes <image> and <image>", [(24, 40), (32, 32), (16, 48)]),
    ("<image>what colour?", [(48, 24)]),
]


def _dataset(checkpoint, tmp_path, rows=ROWS, **config):
    records = [
        {
            "data_source": "hiyouga/geometry3k",
            "prompt": [{"role": "user", "content": question}],
            "images": [encode_image(_image(10 * i + j, size)) for j, size in enumerate(sizes)],
            "reward_model": {"style": "rule", "ground_truth": "red"},
            "extra_info": {"index": i},
        }
        for i, (question, sizes) in enumerate(rows)
    ]
    path = write_parquet(records, str(tmp_path / "train.parquet"))
    tokenizer = hf_tokenizer(str(checkpoint))
    processor = hf_processor(str(checkpoint), trust_remote_code=True)
    return RLHFDataset(path, tokenizer, {"max_prompt_length": MAX_PROMPT, **config}, processor=processor)


def _prompts(dataset) -> DataProto:
    batch = DataProto.from_single_dict(collate_fn([dataset[i] for i in range(len(dataset))]))
    batch.meta_info.update(eos_token_id=dataset.tokenizer.eos_token_id, pad_token_id=dataset.tokenizer.pad_token_id)
    return batch


def _rollout(model, **overrides) -> HFRollout:
    config = dict(name="hf", response_length=RESPONSE, temperature=1.0, top_k=-1, top_p=1.0, max_num_seqs=8)
    return HFRollout(model, RolloutConfig(**{**config, **overrides}))


def _rollout_batch(model, dataset) -> DataProto:
    """Prompts + sampled responses (the rollout's output joined with the prompt batch, as the trainer does)."""
    prompts = _prompts(dataset)
    torch.manual_seed(0)
    out = _rollout(model).generate_sequences(prompts)
    out.non_tensor_batch["multi_modal_inputs"] = prompts.non_tensor_batch["multi_modal_inputs"]
    td = out.batch
    td["response_mask"] = td["attention_mask"][:, -RESPONSE:]
    out.meta_info.update(temperature=1.0, micro_batch_size=8, use_dynamic_bsz=False)
    return out


def _hf_reference(model, batch: DataProto, row: int) -> torch.Tensor:
    """HF's own forward of one sample alone (no padding; M-RoPE computed by HF from mm_token_type_ids): log-probs
    of the valid response tokens."""
    td = batch.batch
    mask = td["attention_mask"][row].bool()
    ids = td["input_ids"][row][mask][None]
    mm = batch.non_tensor_batch["multi_modal_inputs"][row]
    types = (ids == model.config.image_token_id).long()
    logits = model(input_ids=ids, mm_token_type_ids=types, use_cache=False, **mm).logits[0]
    n = int(td["response_mask"][row].sum())
    # the n valid response tokens end the unpadded sequence; position p predicts token p + 1
    logp = torch.log_softmax(logits[-n - 1 : -1].float(), -1)
    return logp.gather(-1, td["responses"][row, :n, None]).squeeze(-1)


def _actor(model, rmpad=True, **config):
    base = dict(strategy="fsdp2", ppo_mini_batch_size=8, ppo_micro_batch_size_per_gpu=8, use_torch_compile=False)
    return DataParallelPPOActor(
        FSDPActorConfig(**{**base, **config}), model, log_prob_options=LogProbOptions(use_remove_padding=rmpad)
    )


def _max_error(model, batch, log_probs) -> float:
    errors = []
    for row in range(len(batch)):
        n = int(batch.batch["response_mask"][row].sum())
        with torch.no_grad():
            reference = _hf_reference(model, batch, row)
        errors.append((log_probs[row, :n] - reference).abs().max().item())
    return max(errors)


def test_dataset_builds_four_row_mrope_ids_per_sample(model, checkpoint, tmp_path):
    """Each item's (4, S) position ids are, on its real tokens, the text positions and HF's own get_rope_index of
    the sample alone; padding columns are 0."""
    dataset = _dataset(checkpoint, tmp_path)
    for i in range(len(dataset)):
        item = dataset[i]
        mask = item["attention_mask"].bool()
        ids = item["input_ids"][mask][None]
        mm = item["multi_modal_inputs"]
        types = (ids == model.config.image_token_id).long()
        hf, _ = model.model.get_rope_index(ids, mm_token_type_ids=types, image_grid_thw=mm["image_grid_thw"])
        assert item["position_ids"].shape == (4, MAX_PROMPT)
        assert torch.equal(item["position_ids"][1:, mask], hf[:, 0])
        assert torch.equal(item["position_ids"][0, mask], torch.arange(int(mask.sum())))
        assert not item["position_ids"][:, ~mask].any()
        expected_image_tokens = int(mm["image_grid_thw"].prod(-1).sum()) // 4  # merge 2x2
        assert int((ids == model.config.image_token_id).sum()) == expected_image_tokens


def test_actor_log_probs_equal_hf_forward_packed_padded_alone_dynamic(model, checkpoint, tmp_path):
    """Actor log-probs of image prompts' responses == HF's own forward of each sample alone (fp32, 1e-5), packed,
    padded, one sample at a time and with token-budget micro-batches; rows 0/2 have 1 image, row 1 has 3 images of
    three sizes. The control: the same path with 2-D (text-row) ids misses the reference by > 1e-3."""
    batch = _rollout_batch(model, _dataset(checkpoint, tmp_path))
    assert batch.batch["position_ids"].shape == (3, 4, MAX_PROMPT + RESPONSE)
    results = {
        "packed": _actor(model).compute_log_prob(batch)["log_probs"],
        "padded": _actor(model, rmpad=False).compute_log_prob(batch)["log_probs"],
        "alone": torch.cat([_actor(model).compute_log_prob(batch[i : i + 1])["log_probs"] for i in range(3)]),
    }
    dynamic = batch.select(deepcopy=True)
    dynamic.meta_info.update(use_dynamic_bsz=True, max_token_len=MAX_PROMPT + RESPONSE)  # one sample per micro-batch
    results["dynamic"] = _actor(model).compute_log_prob(dynamic)["log_probs"]
    for name, log_probs in results.items():
        assert _max_error(model, batch, log_probs) <= 1e-5, name

    two_d = batch.select(deepcopy=True)
    two_d.batch["position_ids"] = two_d.batch["position_ids"][:, 0].contiguous()
    assert _max_error(model, batch, _actor(model).compute_log_prob(two_d)["log_probs"]) > 1e-3


def _prefill_capture(model):
    """Record the (input_ids, logits) of every forward call; generate's first call is the prefill."""
    calls = []

    def hook(_module, args, kwargs, output):
        calls.append((kwargs.get("input_ids"), output.logits.detach().clone()))

    return calls, model.register_forward_hook(hook, with_kwargs=True)


def test_hf_rollout_generates_from_the_image(model, checkpoint, tmp_path):
    """The prefill logits of generate change when only the image changes (and are identical for the same image):
    the pixel values reach generate and the vision tower feeds the decoder."""
    rows = [("<image>what colour is the shape?", [(32, 32)])]
    prompts = _prompts(_dataset(checkpoint, tmp_path, rows))
    other = prompts.select(deepcopy=True)
    mm = dict(other.non_tensor_batch["multi_modal_inputs"][0])
    mm["pixel_values"] = -mm["pixel_values"]  # same grid, same tokens, another image
    other.non_tensor_batch["multi_modal_inputs"][0] = mm
    logits = []
    for batch in (prompts, prompts, other):
        calls, handle = _prefill_capture(model)
        try:
            _rollout(model, do_sample=False).generate_sequences(batch)
        finally:
            handle.remove()
        logits.append(calls[0][1][:, -1])
    assert torch.equal(logits[0], logits[1])
    assert (logits[0] - logits[2]).abs().max().item() > 1e-3


def test_rollout_and_actor_see_the_same_image_tokens(model, checkpoint, tmp_path):
    """The token ids generate's prefill receives are the dataset's prompt ids (image tokens included), and the
    actor's (padded) forward receives the same prompt ids followed by the response."""
    dataset = _dataset(checkpoint, tmp_path)
    prompts = _prompts(dataset)
    calls, handle = _prefill_capture(model)
    try:
        torch.manual_seed(0)
        out = _rollout(model).generate_sequences(prompts)
    finally:
        handle.remove()
    rollout_ids = calls[0][0]
    assert torch.equal(rollout_ids, prompts.batch["input_ids"])
    image = model.config.image_token_id
    # merged tokens per image = (W / 8) x (H / 8) (4-pixel patches, 2x2 merge): 32x32 -> 16; 24x40 -> 3 x 5 = 15,
    # 16x48 -> 2 x 6 = 12; 48x24 -> 6 x 3 = 18
    assert (rollout_ids == image).sum(-1).tolist() == [16, 15 + 16 + 12, 18]
    assert not (out.batch["responses"] == image).any()  # a response never holds a placeholder

    out.non_tensor_batch["multi_modal_inputs"] = prompts.non_tensor_batch["multi_modal_inputs"]
    out.batch["response_mask"] = out.batch["attention_mask"][:, -RESPONSE:]
    out.meta_info.update(temperature=1.0, micro_batch_size=8, use_dynamic_bsz=False)
    calls, handle = _prefill_capture(model)
    try:
        _actor(model, rmpad=False).compute_log_prob(out)
    finally:
        handle.remove()
    assert torch.equal(calls[0][0][:, :MAX_PROMPT], rollout_ids)


def _row_error(checkpoint, tmp_path, question, images, match):
    record = {"data_source": "hiyouga/geometry3k", "prompt": [{"role": "user", "content": question}]}
    record.update(images=images, reward_model={"style": "rule", "ground_truth": "1"})
    rows = [
        {**record, "images": [encode_image(_image(0, (32, 32)))], "prompt": [{"role": "user", "content": "<image>ok"}]},
        record,
    ]
    path = write_parquet(rows, str(tmp_path / "bad.parquet"))
    tokenizer = hf_tokenizer(str(checkpoint))
    dataset = RLHFDataset(
        path,
        tokenizer,
        {"max_prompt_length": MAX_PROMPT},
        processor=hf_processor(str(checkpoint), trust_remote_code=True),
    )
    dataset[0]
    with pytest.raises(ValueError, match=match):
        dataset[1]


def test_bad_multimodal_rows_name_the_row(checkpoint, tmp_path):
    """A missing image, more <image> markers than images and an undecodable image each raise a ValueError naming
    the file and row (row 1; row 0 is fine)."""
    good = encode_image(_image(0, (32, 32)))
    _row_error(
        checkpoint,
        tmp_path,
        "<image>what colour?",
        None,
        r"bad.parquet row 1: the prompt has 1 <image> marker\(s\) but the row has 0 'images'",
    )
    _row_error(
        checkpoint,
        tmp_path,
        "<image> and <image>",
        [good],
        r"bad.parquet row 1: the prompt has 2 <image> marker\(s\) but the row has 1 'images'",
    )
    _row_error(
        checkpoint,
        tmp_path,
        "<image>what?",
        [{"bytes": b"not an image", "path": None}],
        r"bad.parquet row 1: cannot read media",
    )


def test_rollout_never_samples_an_image_placeholder(model, checkpoint, tmp_path):
    """A response holding ``<|image_pad|>`` would break the next forward (one more image slot than image features).
    The LM head is edited so that the placeholder's logit is 3x the greedy first token's (positive) logit: without
    the rollout's suppression greedy decoding would emit it first; with it, it never appears."""
    from transformers import AutoModelForImageTextToText

    from verl.models.transformers.patch_registry import apply_patches

    prompts = _prompts(_dataset(checkpoint, tmp_path, ROWS[:1]))
    # a fresh copy to edit (deepcopy of a patched, hooked module recursed once the whole suite had run before it)
    edited = AutoModelForImageTextToText.from_pretrained(checkpoint, dtype=torch.float32).eval()
    apply_patches(edited, platform="cpu", report=False)
    first = _rollout(edited, do_sample=False).generate_sequences(prompts).batch["responses"][0, 0]
    head = edited.get_output_embeddings().weight
    with torch.no_grad():
        head[model.config.image_token_id] = 3 * head[first]
    calls, handle = _prefill_capture(edited)
    try:
        out = _rollout(edited, do_sample=False).generate_sequences(prompts)
    finally:
        handle.remove()
    prefill = calls[0][1][0, -1]
    assert prefill.argmax().item() == model.config.image_token_id  # the placeholder is the model's top choice
    assert not (out.batch["responses"] == model.config.image_token_id).any()
