"""When the old-log-prob pass (step 3) can be skipped: ``old_log_probs`` := the update's own first forward, detached.

PPO's ratio ``exp(log π_θ − log π_old)`` needs π_old = the policy that sampled the batch, evaluated by the actor.
When the update makes exactly one optimizer step over the whole batch (one mini-batch, one epoch), every
micro-batch of it runs its forward *before* that step, i.e. with the weights that the old-log-prob pass would
use: the update's forward *is* the old log-prob, and the separate no-grad pass is pure overhead (upstream's actor
already takes ``log_prob.detach()`` as ``old_log_prob`` in that case, but still pays for the pass). The skip is
only exact when nothing else reads ``old_log_probs`` before the update and train-mode and eval-mode forwards
agree (no active dropout; the actor checks that and raises otherwise). Anything else keeps the pass:

* ``actor.ppo_epochs > 1`` or ``ppo_mini_batch_size < data.train_batch_size``: later mini-batches and epochs run
  after an optimizer step, so their forward is no longer π_old;
* ``algorithm.use_kl_in_reward``: the reward KL uses ``old_log_probs`` before the update;
* an advantage estimator that takes ``old_log_probs``;
* ``algorithm.rollout_correction`` (IS weights, rejection, bypass) or ``rollout.calculate_log_probs`` (the
  rollout-vs-actor gap metrics): they compare the rollout's log-probs against ``old_log_probs``;
* MoE router replay (``actor.router_replay.mode``, or its engine-scoped spelling): R2 records the routing in the
  old-log-prob pass for the update to replay;
* the engine worker path (``trainer.use_legacy_worker_impl=disable`` or veomni): its update takes
  ``old_log_probs`` from the batch only.

``actor_rollout_ref.actor.skip_old_log_prob_on_policy=False`` always runs the pass.
"""

from __future__ import annotations

import inspect
from typing import Any

__all__ = ["old_log_prob_skip_blocker"]


def old_log_prob_skip_blocker(config: Any) -> str | None:
    """``None`` when the old-log-prob pass may be skipped for this config, else the reason (a config key)."""
    actor = config.actor_rollout_ref.actor
    algorithm = config.algorithm
    checks = [
        (not actor.get("skip_old_log_prob_on_policy", True), "actor.skip_old_log_prob_on_policy=False"),
        (actor.ppo_epochs != 1, f"actor.ppo_epochs={actor.ppo_epochs}"),
        (
            actor.ppo_mini_batch_size < config.data.train_batch_size,
            f"actor.ppo_mini_batch_size={actor.ppo_mini_batch_size} < data.train_batch_size "
            f"{config.data.train_batch_size} (several optimizer steps per batch)",
        ),
        (bool(algorithm.use_kl_in_reward), "algorithm.use_kl_in_reward=True"),
        (_estimator_reads_old_log_probs(algorithm.adv_estimator), f"adv_estimator={algorithm.adv_estimator}"),
        (_rollout_correction_on(algorithm), "algorithm.rollout_correction is active"),
        (bool(config.actor_rollout_ref.rollout.get("calculate_log_probs", False)), "rollout.calculate_log_probs"),
        (_router_replay_on(actor), "actor.router_replay.mode is set (the old-log-prob pass records the routing)"),
        (not _legacy_worker_path(config), "the engine worker path"),
    ]
    return next((reason for blocked, reason in checks if blocked), None)


def _estimator_reads_old_log_probs(name: str) -> bool:
    from verl.trainer.ppo import core_algos

    return "old_log_probs" in inspect.signature(core_algos.get_adv_estimator_fn(name)).parameters


def _rollout_correction_on(algorithm: Any) -> bool:
    corr = algorithm.get("rollout_correction")
    if corr is None:
        return False
    return bool(corr.get("rollout_is") or corr.get("rollout_rs") or corr.get("bypass_mode"))


def _router_replay_on(actor: Any) -> bool:
    nodes = [actor.get("router_replay")] + [
        (actor.get(e) or {}).get("router_replay") for e in ("fsdp_config", "veomni")
    ]
    return any(node is not None and node.get("mode", "disabled") != "disabled" for node in nodes)


def _legacy_worker_path(config: Any) -> bool:
    """The same rule as ``main_ppo``'s worker choice: the legacy FSDP workers unless disabled or veomni."""
    legacy = config.trainer.get("use_legacy_worker_impl", "auto")
    strategy = config.actor_rollout_ref.actor.strategy
    return not (legacy == "disable" or (legacy == "auto" and strategy == "veomni"))
