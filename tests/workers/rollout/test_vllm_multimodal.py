"""The real vLLM engine (its CPU build, ``.venv-vllm``) as the rollout of image prompts: the tiny Qwen3.5 VL model in
the ``vllm`` profile, prompts from ``RLHFDataset`` with the tiny VL processor, through ``vLLMRollout``.

Invariants:
* vLLM expands each image into exactly the prompt token ids the actor sees (the dataset's processor output): checked
  on token ids, for prompts with 1 and 3 images of different sizes.
* vLLM's sampled-token log-probs on image prompts match the actor model's (HF fp32 teacher forcing with the same
  pixel values) within the bf16 bound of ``test_vllm_rollout_engine.py``: mean <= 2 m_bf16, max <= 3 x_bf16,
  where m/x are the mean/max deviation of the HF model run in bf16 from its fp32 self on the same tokens.
* The image reaches the engine: another image changes the sampled-token log-probs.
* The rollout refuses (naming the row) engine prompt ids that differ from the actor's, e.g. images that vLLM's
  processor expands into another number of tokens.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from verl.protocol import DataProto

pytestmark = [pytest.mark.vllm]

MAX_PROMPT, RESPONSE = 160, 6  # MAX_PROMPT: the conftest's image_prompts


@pytest.fixture(scope="module")
def checkpoint(tiny_vl_vllm_checkpoint):
    return tiny_vl_vllm_checkpoint


@pytest.fixture(scope="module")
def rollout(checkpoint):
    from verl.utils.testing.vllm import cpu_engine_rollout_config, release_vllm_rollout
    from verl.workers.config import HFModelConfig
    from verl.workers.rollout.vllm_rollout import vLLMRollout

    # vLLM's multimodal input processing needs the tokenizer (rollout.skip_tokenizer_init, True by default)
    config = cpu_engine_rollout_config(
        prompt_length=MAX_PROMPT, response_length=RESPONSE, temperature=1.0, skip_tokenizer_init=False
    )
    engine = vLLMRollout(config, HFModelConfig(path=checkpoint, trust_remote_code=True))
    yield engine
    release_vllm_rollout(engine)


def _teacher_forced(model, batch: DataProto, out: DataProto) -> torch.Tensor:
    """(B, R) log-probs of the sampled responses under ``model`` (HF forward with the rows' pixel values)."""
    rows = []
    for row in range(len(out)):
        mask = out.batch["attention_mask"][row].bool()
        ids = out.batch["input_ids"][row][mask][None]
        mm = {
            k: v.to(model.dtype) if v.is_floating_point() else v
            for k, v in batch.non_tensor_batch["multi_modal_inputs"][row].items()
        }
        types = (ids == model.config.image_token_id).long()
        with torch.no_grad():
            logits = model(input_ids=ids, mm_token_type_ids=types, use_cache=False, **mm).logits[0].float()
        n = int(out.batch["attention_mask"][row, -RESPONSE:].sum())
        logp = torch.log_softmax(logits[-n - 1 : -1], -1).gather(-1, out.batch["responses"][row, :n, None])
        rows.append(torch.nn.functional.pad(logp.squeeze(-1), (0, RESPONSE - n)))
    return torch.stack(rows)


def test_vllm_sees_the_actor_image_tokens(rollout, checkpoint, image_prompts):
    """The prompt ids vLLM builds from raw_prompt_ids + images equal the dataset's (the actor's) unpadded ids."""
    from verl.workers.rollout.vllm_rollout.vllm_rollout import _requests

    batch = image_prompts(checkpoint)
    from vllm import SamplingParams

    outputs = rollout.llm.generate(_requests(batch), SamplingParams(max_tokens=1), use_tqdm=False)
    for row, output in enumerate(outputs):
        mask = batch.batch["attention_mask"][row].bool()
        assert output.prompt_token_ids == batch.batch["input_ids"][row][mask].tolist()


def test_vllm_image_log_probs_within_the_bf16_bound(rollout, checkpoint, image_prompts):
    """Sampled-token log-probs of vLLM vs the HF actor model (fp32) on 1- and 3-image prompts: within the bf16
    bound; another image (control) moves them."""
    from transformers import AutoModelForImageTextToText

    batch = image_prompts(checkpoint)
    torch.manual_seed(0)
    out = rollout.generate_sequences(batch)
    mask = out.batch["attention_mask"][:, -RESPONSE:].bool()
    fp32 = _teacher_forced(AutoModelForImageTextToText.from_pretrained(checkpoint, dtype=torch.float32), batch, out)
    bf16 = _teacher_forced(AutoModelForImageTextToText.from_pretrained(checkpoint, dtype=torch.bfloat16), batch, out)
    gap = (out.batch["rollout_log_probs"] - fp32).abs()[mask]
    bf16_gap = (bf16 - fp32).abs()[mask]
    print(f"\n[vllm image log-probs] |dlogp| mean {gap.mean():.4f} max {gap.max():.4f}; bf16 {bf16_gap.mean():.4f}")
    assert gap.mean() <= 2 * bf16_gap.mean() and gap.max() <= 3 * bf16_gap.max()

    # control: the same responses under other images (same sizes, so the same token ids) are far from vLLM's
    # log-probs, so vLLM's agreement with the right images is no accident of the image mattering little
    actor = AutoModelForImageTextToText.from_pretrained(checkpoint, dtype=torch.float32)
    moved = _teacher_forced(actor, image_prompts(checkpoint, seed=1), out)
    other_gap = (out.batch["rollout_log_probs"] - moved).abs()[mask]
    print(f"[vllm image log-probs] vs other images: mean {other_gap.mean():.4f}")
    assert other_gap.mean() > 3 * gap.mean()


def test_engine_prompt_ids_that_differ_from_the_actor_are_refused(rollout, checkpoint, image_prompts):
    """An image the engine would expand into another number of tokens than the actor's prompt holds (here: row 0's
    image enlarged to 40x40 after the dataset processed it at 32x32: 5x5 merged tokens instead of 4x4) fails the
    batch with an error naming the row, instead of sampling from a sequence the actor never sees."""
    batch = image_prompts(checkpoint)
    data = list(batch.non_tensor_batch["multi_modal_data"])
    data[0] = {"image": [data[0]["image"][0].resize((40, 40))]}
    batch.non_tensor_batch["multi_modal_data"] = np.array(data, dtype=object)
    # the actor's row 0: 42 ids with 16 image tokens; vLLM's: 42 - 16 + 25 = 51
    with pytest.raises(RuntimeError, match=r"prompt row 0 with images: vLLM built 51 prompt tokens, .* have 42"):
        rollout.generate_sequences(batch)
