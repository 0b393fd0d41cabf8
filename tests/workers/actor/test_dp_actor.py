"""DataParallelPPOActor (verl/workers/actor/dp_actor.py) over the shared core, single process."""

import copy
import math

import pytest
import torch

from verl.trainer.ppo import core_algos
from verl.utils.activation_offload import enable_activation_offloading
from verl.workers.actor.dp_actor import DataParallelPPOActor
from verl.workers.config.actor import FSDPActorConfig
from verl.workers.core.model_forward import LogProbOptions


def _config(**overrides) -> FSDPActorConfig:
    base = dict(
        strategy="fsdp2",
        ppo_mini_batch_size=8,
        ppo_micro_batch_size_per_gpu=2,
        ppo_max_token_len_per_gpu=64,
        use_torch_compile=False,
        grad_clip=1.0,
    )
    base.update(overrides)
    return FSDPActorConfig(**base)


def _naive_log_probs(model, batch, temperature):
    """Reference: full padded forward, full-vocabulary log_softmax of logits / T, gather the response tokens."""
    td = batch.batch
    r = td["responses"].shape[1]
    logits = model(input_ids=td["input_ids"], attention_mask=td["attention_mask"], position_ids=td["position_ids"])
    logits = logits.logits[:, -r - 1 : -1] / temperature
    logp = torch.log_softmax(logits.float(), -1)
    lp = logp.gather(-1, td["responses"].unsqueeze(-1)).squeeze(-1)
    ent = -(logp.exp() * logp).sum(-1)
    return lp, ent


@pytest.mark.parametrize("fused", [True, False])
def test_compute_log_prob_packed_equals_padded(make_model, make_batch, fused):
    """Invariant: the response log-probs and entropy are the same whether the batch runs packed (remove padding)
    or padded, with the fused LM head or chunked logits, and equal the naive full-softmax reference
    (fp32: 1e-5) on every valid response token; both layouts return 0 where the predicting position is padding
    and agree everywhere else too."""
    model = make_model()
    batch = make_batch()
    batch.meta_info.update(micro_batch_size=3, use_dynamic_bsz=False)
    results = {}
    for rmpad in (True, False):
        options = LogProbOptions(use_remove_padding=rmpad, entropy_from_logits_with_chunking=not fused, chunk_size=5)
        actor = DataParallelPPOActor(_config(), model, log_prob_options=options)
        results[rmpad] = actor.compute_log_prob(batch, calculate_entropy=True)
    mask = batch.batch["response_mask"].bool()
    r = mask.shape[1]
    predicting_pad = batch.batch["attention_mask"][:, -r - 1 : -1] == 0
    with torch.no_grad():
        ref_lp, ref_ent = _naive_log_probs(model, batch, 0.7)
    for out in results.values():
        torch.testing.assert_close(out["log_probs"][mask], ref_lp[mask], rtol=0, atol=1e-5)
        torch.testing.assert_close(out["entropys"][mask], ref_ent[mask], rtol=0, atol=1e-5)
        assert torch.all(out["log_probs"][predicting_pad] == 0) and predicting_pad.any()
    torch.testing.assert_close(results[True]["log_probs"], results[False]["log_probs"], rtol=0, atol=1e-5)


def test_compute_log_prob_dynamic_bsz_restores_order(make_model, make_batch):
    """Invariant: token-budget micro-batches (reordered by sequence length) return rows in the input order."""
    model = make_model()
    batch = make_batch()
    actor = DataParallelPPOActor(_config(), model)
    batch.meta_info.update(micro_batch_size=8, use_dynamic_bsz=False)
    fixed = actor.compute_log_prob(batch)["log_probs"]
    batch.meta_info.update(use_dynamic_bsz=True, max_token_len=30)
    dynamic = actor.compute_log_prob(batch)
    assert set(dynamic) == {"log_probs"}  # no entropy unless asked for
    torch.testing.assert_close(dynamic["log_probs"], fixed, rtol=0, atol=1e-5)


def _update(model, batch, **config_overrides):
    actor_model = copy.deepcopy(model)
    optimizer = torch.optim.SGD(actor_model.parameters(), lr=1.0)
    actor = DataParallelPPOActor(_config(**config_overrides), actor_model, optimizer)
    metrics = actor.update_policy(batch)
    return actor_model, metrics


@pytest.mark.parametrize("loss_agg_mode", ["token-mean", "seq-mean-token-mean"])
def test_update_policy_micro_batch_invariance(make_model, make_batch, loss_agg_mode):
    """Invariant (micro-batch x grad-accum): one mini-batch of 8 rows split into 1, 2 or 4 micro-batches, or into
    token-budget micro-batches (use_dynamic_bsz), gives the same weights after the SGD step (lr 1: weight change =
    clipped gradient; 1e-5) and the same summed pg_loss, because every micro-batch loss is normalised by the
    mini-batch's global token/sequence count."""
    model, batch = make_model(), make_batch()
    settings = [dict(ppo_micro_batch_size_per_gpu=m) for m in (8, 4, 2)]
    settings += [dict(use_dynamic_bsz=True, ppo_max_token_len_per_gpu=t) for t in (26, 60)]
    runs = [
        _update(model, batch, loss_agg_mode=loss_agg_mode, kl_loss_coef=0.1, use_kl_loss=True, **s) for s in settings
    ]
    ref_model, ref_metrics = runs[0]
    moved = max((p - q).abs().max().item() for p, q in zip(ref_model.parameters(), model.parameters()))
    assert moved > 1e-3  # the step did change the weights
    for trained, metrics in runs[1:]:
        for p, q in zip(trained.parameters(), ref_model.parameters()):
            torch.testing.assert_close(p, q, rtol=0, atol=1e-5)
        for key in ("actor/pg_loss", "actor/kl_loss", "actor/grad_norm"):
            assert metrics[key] == pytest.approx(ref_metrics[key], abs=1e-5), key


def test_update_policy_matches_hand_computed_gradient(make_model, make_batch):
    """Invariant: with one micro-batch, the actor's gradient equals autograd of the vanilla PPO loss written out
    by hand from the naive log-probs (token-mean over the mini-batch): ratio = exp(logp - old), loss = mean over
    valid tokens of max(-A*ratio, -A*clip(ratio, 0.8, 1.2)); grad_clip is large so no clipping happens."""
    model, batch = make_model(), make_batch()
    trained, _ = _update(model, batch, ppo_micro_batch_size_per_gpu=8, grad_clip=1e9)
    ref = copy.deepcopy(model)
    lp, _ = _naive_log_probs(ref, batch, 0.7)
    td = batch.batch
    ratio = torch.exp(lp - td["old_log_probs"])
    adv, mask = td["advantages"], td["response_mask"].float()
    losses = torch.maximum(-adv * ratio, -adv * ratio.clamp(0.8, 1.2))
    ((losses * mask).sum() / mask.sum()).backward()
    for p_ref, p_new, p_old in zip(ref.parameters(), trained.parameters(), model.parameters()):
        torch.testing.assert_close(p_old - p_new, p_ref.grad, rtol=0, atol=1e-5)


def test_entropy_only_when_needed_and_never_faked(make_model, make_batch):
    """Invariant (field-report item 2): without entropy_coeff or calculate_entropy no entropy is computed and no
    actor/entropy metric exists (never a placeholder 0); with calculate_entropy the metric equals the token-mean
    of the naive entropy at the weights before the step (1e-5)."""
    model, batch = make_model(), make_batch()
    _, metrics = _update(model, batch)
    assert "actor/entropy" not in metrics
    _, metrics = _update(model, batch, calculate_entropy=True, ppo_micro_batch_size_per_gpu=4)
    with torch.no_grad():
        _, ent = _naive_log_probs(model, batch, 0.7)
    expected = core_algos.agg_loss(ent, batch.batch["response_mask"], "token-mean").item()
    assert metrics["actor/entropy"] == pytest.approx([expected], abs=1e-5)


def test_non_finite_gradient_skips_the_step(make_model, make_batch):
    """Invariant: a NaN in the loss inputs makes the grad norm non-finite; the optimizer step is skipped (weights
    and AdamW state untouched), reported as actor/skipped_steps=1 with a non-finite actor/grad_norm, and the next
    mini-batch with finite inputs steps normally."""
    model, batch = make_model(), make_batch(batch_size=8)
    batch.batch["advantages"][1, 2] = float("nan")  # first mini-batch (rows 0-3) only
    trained = copy.deepcopy(model)
    optimizer = torch.optim.AdamW(trained.parameters(), lr=1e-2)
    actor = DataParallelPPOActor(_config(ppo_mini_batch_size=4, ppo_micro_batch_size_per_gpu=4), trained, optimizer)
    metrics = actor.update_policy(batch)
    assert metrics["actor/skipped_steps"] == [1.0, 0.0]
    assert not math.isfinite(metrics["actor/grad_norm"][0]) and math.isfinite(metrics["actor/grad_norm"][1])
    assert all(torch.isfinite(p).all() for p in trained.parameters())
    # exactly one AdamW step happened: every parameter's step counter is 1
    assert {int(s["step"]) for s in optimizer.state.values()} == {1}


def test_activation_offload_step_equals_plain_step(make_model, make_batch):
    """Invariant (field-report item 3): a PPO step with activation offload (and gradient checkpointing) equals
    the step without (exact), on the fused and on the chunked log-prob path: temperature scaling is out of
    place, which the offload's view outputs require (tests/utils/test_activation_offload.py shows the in-place
    failure)."""
    model, batch = make_model(), make_batch()
    for chunked in (False, True):
        plain, _ = _update(model, batch, entropy_coeff=0.01, entropy_from_logits_with_chunking=chunked)
        offloaded = copy.deepcopy(model)
        offloaded.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        handle = enable_activation_offloading(offloaded, "fsdp2", enable_ckpt=True)
        trained, _ = _update(offloaded, batch, entropy_coeff=0.01, entropy_from_logits_with_chunking=chunked)
        assert handle.offloader.num_offloaded > 0  # the copy made by _update shares the hooks: offload engaged
        for p, q in zip(trained.parameters(), plain.parameters()):
            torch.testing.assert_close(p, q, rtol=0, atol=1e-6)


def test_missing_temperature_is_a_clear_error(make_model, make_batch):
    """Invariant: a batch without meta_info['temperature'] raises a ValueError naming the key."""
    batch = make_batch()
    batch.meta_info.clear()
    actor = DataParallelPPOActor(_config(), make_model())
    with pytest.raises(ValueError, match="temperature"):
        actor.compute_log_prob(batch)


@pytest.mark.parametrize("kind", ["qwen3_5", "qwen3_5_moe"])
def test_qwen3_5_log_probs_packed_equals_padded(make_batch, kind):
    """Invariant: for the tiny Qwen3.5 dense and MoE models (Gated DeltaNet + gated attention, varlen patch
    applied), packed and padded log-probs/entropy agree on every valid response token (fp32: 1e-5), fused and
    chunked."""
    from verl.models.tiny import build_tiny_model
    from verl.models.transformers.patch_registry import apply_patches

    model = build_tiny_model(kind, vocab_size=128)
    apply_patches(model, platform="cpu", report=False)
    batch = make_batch()
    batch.meta_info.update(micro_batch_size=4)
    mask = batch.batch["response_mask"].bool()
    outs = []
    for rmpad in (True, False):
        for chunked in (True, False):
            options = LogProbOptions(use_remove_padding=rmpad, entropy_from_logits_with_chunking=chunked)
            actor = DataParallelPPOActor(_config(), model, log_prob_options=options)
            outs.append(actor.compute_log_prob(batch, calculate_entropy=True))
    for out in outs[1:]:
        for key in ("log_probs", "entropys"):
            torch.testing.assert_close(out[key][mask], outs[0][key][mask], rtol=0, atol=1e-5)
