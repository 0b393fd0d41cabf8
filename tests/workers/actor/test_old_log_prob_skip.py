"""The old-log-prob skip (verl/trainer/ppo/on_policy.py): without step 3 the update takes old_log_probs from its own
first forward, detached; that must give the same losses and gradients as recomputing them first."""

import copy
from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir

import verl
from verl.trainer.ppo.on_policy import old_log_prob_skip_blocker
from verl.workers.actor.dp_actor import DataParallelPPOActor
from verl.workers.config.actor import FSDPActorConfig

CONFIG_DIR = str(Path(verl.__file__).parent / "trainer" / "config")


def _config(**overrides) -> FSDPActorConfig:
    base = dict(
        strategy="fsdp2",
        ppo_mini_batch_size=8,
        ppo_micro_batch_size_per_gpu=2,
        use_torch_compile=False,
        grad_clip=1e9,
    )
    base.update(overrides)
    return FSDPActorConfig(**base)


class RecordingSGD(torch.optim.SGD):
    """SGD that keeps a copy of every gradient it stepped with (the update zeroes them afterwards)."""

    def step(self, closure=None):
        self.grads = [p.grad.detach().clone() for g in self.param_groups for p in g["params"]]
        return super().step(closure)


def _update(model, batch, **overrides):
    model = copy.deepcopy(model)
    optimizer = RecordingSGD(model.parameters(), lr=0.1)
    metrics = DataParallelPPOActor(_config(**overrides), model, optimizer).update_policy(batch)
    return optimizer.grads, metrics


def test_skip_gives_the_recomputed_losses_and_gradients(make_model, make_batch):
    """Invariant: (a) upstream's order — compute_log_prob (eval mode, its own micro-batches of 3) then the update
    with those old_log_probs — and (b) the update on a batch without old_log_probs give the same pg_loss, entropy
    metric and per-parameter gradients (fp32, two forwards of the same weights: 1e-6). Independent check of (b):
    with old = logp the ratio is exactly 1, so the clipped loss is -A·ratio and its gradient is that of
    -sum(A·logp·mask)/sum(mask) (token-mean), written out here from the model's plain padded forward."""
    model, batch = make_model(), make_batch()
    recompute = copy.deepcopy(batch)
    recompute.meta_info.update(micro_batch_size=3, use_dynamic_bsz=False)
    old = DataParallelPPOActor(_config(), copy.deepcopy(model)).compute_log_prob(recompute, calculate_entropy=True)
    recompute.batch["old_log_probs"] = old["log_probs"]
    grads_a, metrics_a = _update(model, recompute, calculate_entropy=True)

    skipped = copy.deepcopy(batch)
    skipped.batch.pop("old_log_probs")
    grads_b, metrics_b = _update(model, skipped)  # entropy comes without calculate_entropy: it replaces step 3's

    assert metrics_b["actor/pg_loss"] == pytest.approx(metrics_a["actor/pg_loss"], abs=1e-6)
    assert metrics_b["actor/entropy"] == pytest.approx(metrics_a["actor/entropy"], abs=1e-6)
    assert metrics_b["actor/ppo_kl"] == [0.0]  # old == new exactly
    for ga, gb in zip(grads_a, grads_b, strict=True):
        torch.testing.assert_close(gb, ga, rtol=0, atol=1e-6)

    ref = copy.deepcopy(model)
    td = batch.batch
    r = td["responses"].shape[1]
    logits = ref(input_ids=td["input_ids"], attention_mask=td["attention_mask"], position_ids=td["position_ids"])
    logp = torch.log_softmax(logits.logits[:, -r - 1 : -1].float() / 0.7, -1)
    lp = logp.gather(-1, td["responses"].unsqueeze(-1)).squeeze(-1)
    mask = td["response_mask"].float()
    (-(td["advantages"] * lp * mask).sum() / mask.sum()).backward()
    for p, gb in zip(ref.parameters(), grads_b, strict=True):
        torch.testing.assert_close(gb, p.grad, rtol=0, atol=1e-5)
    assert max(g.abs().max().item() for g in grads_b) > 1e-3  # not a vacuous all-zero gradient


def test_skip_refused_when_the_update_takes_several_steps(make_model, make_batch):
    """Two mini-batches of 4: the second forward runs after an optimizer step, so it is not pi_old; the actor
    refuses a batch without old_log_probs and names the key."""
    batch = make_batch()
    batch.batch.pop("old_log_probs")
    with pytest.raises(ValueError, match="skip_old_log_prob_on_policy=False"):
        _update(make_model(), batch, ppo_mini_batch_size=4)
    with pytest.raises(ValueError, match="2 epoch"):
        _update(make_model(), batch, ppo_epochs=2)


def test_skip_refused_with_active_dropout(make_model, make_batch):
    """Attention dropout makes the training forward differ from the eval-mode old-log-prob pass."""
    model = make_model()
    model.config.attention_dropout = 0.1
    batch = make_batch()
    batch.batch.pop("old_log_probs")
    with pytest.raises(ValueError, match=r"active dropout \(config.attention_dropout"):
        _update(model, batch)


def _compose(config_name, *overrides):
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base=None):
        return compose(config_name=config_name, overrides=list(overrides))


@pytest.mark.parametrize(
    ("overrides", "reason"),
    [
        ((), None),  # the quickstart: 1 mini-batch, 1 epoch, GRPO without KL in the reward
        (("actor_rollout_ref.actor.skip_old_log_prob_on_policy=False",), "skip_old_log_prob_on_policy=False"),
        (("actor_rollout_ref.actor.ppo_epochs=2",), "ppo_epochs=2"),
        (("actor_rollout_ref.actor.ppo_mini_batch_size=4",), "ppo_mini_batch_size=4 < data.train_batch_size 8"),
        (("algorithm.use_kl_in_reward=True",), "use_kl_in_reward"),
        (("algorithm.adv_estimator=optimal_token_baseline",), "adv_estimator=optimal_token_baseline"),
        (("algorithm.rollout_correction.rollout_is=token",), "rollout_correction"),
        (("actor_rollout_ref.rollout.calculate_log_probs=True",), "calculate_log_probs"),
        (("actor_rollout_ref.actor.router_replay.mode=R2",), "router_replay.mode"),
        (("actor_rollout_ref.actor.fsdp_config.router_replay.mode=R2",), "router_replay.mode"),
        (("trainer.use_legacy_worker_impl=disable",), "engine worker path"),
    ],
)
def test_skip_only_where_exact(overrides, reason):
    """The trainer skips step 3 for the quickstart config and keeps it wherever old_log_probs are read before the
    update or the update takes several optimizer steps."""
    blocker = old_log_prob_skip_blocker(_compose("quickstart_cpu", *overrides))
    assert blocker is None if reason is None else reason in blocker
