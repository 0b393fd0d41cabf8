"""HFRollout (verl/workers/rollout/hf_rollout.py) and the rollout registry (verl/workers/rollout/base.py)."""

import importlib.util

import pytest
import torch
from tensordict import TensorDict

from verl.protocol import DataProto
from verl.workers.actor.dp_actor import DataParallelPPOActor
from verl.workers.config.actor import FSDPActorConfig
from verl.workers.config.rollout import RolloutConfig, SamplingConfig
from verl.workers.rollout import get_rollout_class
from verl.workers.rollout.hf_rollout import HFRollout

PAD = 0


def _prompts(batch_size=4, prompt_len=5, seed=0, **meta) -> DataProto:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, 120, (batch_size, prompt_len), generator=g)
    mask = torch.ones_like(ids)
    for i in range(batch_size):
        mask[i, : i % 3] = 0  # left padding
    ids = ids.masked_fill(mask == 0, PAD)
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    td = TensorDict({"input_ids": ids, "attention_mask": mask, "position_ids": pos}, batch_size=[batch_size])
    meta_info = {"eos_token_id": 127, "pad_token_id": PAD, "do_sample": True, "validate": False}
    meta_info.update(meta)
    return DataProto(batch=td, meta_info=meta_info)


def _rollout(model, **overrides) -> HFRollout:
    config = dict(name="hf", response_length=6, temperature=0.8, top_k=-1, top_p=1.0, max_num_seqs=3)
    config.update(overrides)
    return HFRollout(model, RolloutConfig(**config))


def test_registry_resolves_hf_and_explains_missing_vllm():
    """Invariant: rollout.name=hf resolves to HFRollout; vllm without the package raises an ImportError naming
    the key and the alternative; unknown names raise ValueError listing the valid ones."""
    assert get_rollout_class("hf") is HFRollout
    if importlib.util.find_spec("vllm") is None:
        with pytest.raises(ImportError, match="rollout.name=hf"):
            get_rollout_class("vllm")
    with pytest.raises(ValueError, match="valid"):
        get_rollout_class("tgi")


def test_shapes_masks_and_eos(make_model):
    """Invariant: responses are right-padded to response_length; the response mask is 1 up to and including the
    first EOS and 0 after, everything after the EOS is pad; position ids continue the prompt's; prompt columns
    of input_ids/attention_mask are the inputs unchanged."""
    model = make_model()
    prompts = _prompts(do_sample=False)
    first = _rollout(model).generate_sequences(prompts)
    # pick as EOS the token greedy decoding emits at step 2 of row 0: that row must stop there
    eos = int(first.batch["responses"][0, 2])
    out = _rollout(model).generate_sequences(_prompts(do_sample=False, eos_token_id=eos))
    td = out.batch
    b, p, r = 4, 5, 6
    assert td["responses"].shape == (b, r) and td["input_ids"].shape == (b, p + r)
    assert torch.equal(td["prompts"], prompts.batch["input_ids"])
    assert torch.equal(td["attention_mask"][:, :p], prompts.batch["attention_mask"])
    response_mask = td["attention_mask"][:, p:]
    eos_pos = (td["responses"][0] == eos).nonzero()[0].item()
    assert eos_pos <= 2
    assert response_mask[0].tolist() == [1] * (eos_pos + 1) + [0] * (r - eos_pos - 1)
    assert torch.all(td["responses"][response_mask == 0] == PAD)
    for row in range(b):
        valid = response_mask[row].bool()
        assert (td["responses"][row][valid] == eos).sum() <= 1  # at most one EOS, and it is the last valid token
    last_prompt_pos = prompts.batch["position_ids"][:, -1:]
    assert torch.equal(td["position_ids"][:, p:], last_prompt_pos + torch.arange(1, r + 1))


def test_validate_uses_val_kwargs_and_n_repeats(make_model):
    """Invariant: validate=True samples with rollout.val_kwargs (greedy by default: identical twice); meta n=k
    repeat-interleaves the prompts (k consecutive rows per prompt)."""
    model = make_model()
    rollout = _rollout(model, val_kwargs=SamplingConfig(do_sample=False))
    a = rollout.generate_sequences(_prompts(validate=True))
    b = rollout.generate_sequences(_prompts(validate=True))
    assert torch.equal(a.batch["responses"], b.batch["responses"])
    out = rollout.generate_sequences(_prompts(n=3))
    assert len(out) == 12
    assert torch.equal(out.batch["prompts"][0], out.batch["prompts"][2])
    assert torch.equal(out.batch["prompts"][3], _prompts().batch["input_ids"][1])


def test_rollout_log_probs_match_actor_log_probs(make_model):
    """Invariant: with top-k/top-p off, the rollout's processed log-probs of the sampled tokens equal the actor's
    log-probs at the same temperature (fp32: 1e-5) on every valid response token."""
    model = make_model()
    torch.manual_seed(3)
    out = _rollout(model, calculate_log_probs=True).generate_sequences(_prompts())
    out.batch["response_mask"] = out.batch["attention_mask"][:, -6:]
    out.meta_info.update(temperature=0.8, micro_batch_size=4)
    actor = DataParallelPPOActor(FSDPActorConfig(strategy="fsdp2", use_torch_compile=False), model)
    lp = actor.compute_log_prob(out)["log_probs"]
    mask = out.batch["response_mask"].bool()
    torch.testing.assert_close(out.batch["rollout_log_probs"][mask], lp[mask], rtol=0, atol=1e-5)
