"""Step 6 of the RL loop, on the driver: from token-level scores to advantages.

``compute_response_mask`` (the response part of ``attention_mask``), ``apply_kl_penalty`` (``algorithm.use_kl_in_reward``:
the reward minus beta times the per-token KL to the reference, with the adaptive controller's update) and
``compute_advantage`` (the registered estimator named by ``algorithm.adv_estimator``, given the batch fields its
signature asks for). Plain functions of a ``DataProto``: the trainer calls them between the worker steps, and
upstream's import path ``verl.trainer.ppo.ray_trainer`` re-exports them.
"""

from __future__ import annotations

import inspect

import torch

from verl import DataProto
from verl.trainer.ppo import core_algos

__all__ = ["apply_kl_penalty", "compute_advantage", "compute_response_mask"]


def compute_response_mask(data: DataProto) -> torch.Tensor:
    """(bs, response_len) mask of valid response tokens: the response part of ``attention_mask``."""
    response_length = data.batch["responses"].shape[-1]
    return data.batch["attention_mask"][:, -response_length:]


def _require_mask_sources(data: DataProto) -> None:
    missing = [key for key in ("responses", "attention_mask") if key not in data.batch.keys()]
    if missing:
        raise ValueError(
            f"compute_advantage: the batch has no 'response_mask' and no {missing} to derive it from; pass a batch "
            "from the rollout (it carries responses and attention_mask) or set batch['response_mask']"
        )


def apply_kl_penalty(data: DataProto, kl_ctrl, kl_penalty: str = "kl") -> tuple[DataProto, dict[str, float]]:
    """``token_level_rewards = token_level_scores - β·KL(old ‖ ref)`` per token, then update β (adaptive control).

    Returns the data (modified in place) and the metrics ``actor/reward_kl_penalty`` (mean KL per sequence) and
    ``actor/reward_kl_penalty_coeff`` (β used).
    """
    response_mask = data.batch["response_mask"]
    kld = core_algos.kl_penalty(data.batch["old_log_probs"], data.batch["ref_log_prob"], kl_penalty=kl_penalty)
    kld = kld * response_mask
    beta = kl_ctrl.value
    data.batch["token_level_rewards"] = data.batch["token_level_scores"] - beta * kld
    # Mean over tokens of each sequence, then over the batch: the quantity the adaptive controller targets.
    current_kl = (kld.sum(-1) / response_mask.sum(-1).clamp(min=1)).mean().item()
    kl_ctrl.update(current_kl=current_kl, n_steps=data.batch.batch_size[0])
    return data, {"actor/reward_kl_penalty": current_kl, "actor/reward_kl_penalty_coeff": beta}


def compute_advantage(
    data: DataProto,
    adv_estimator,
    gamma: float = 1.0,
    lam: float = 1.0,
    num_repeat: int = 1,
    norm_adv_by_std_in_grpo: bool = True,
    config=None,
) -> DataProto:
    """Run the registered estimator named ``adv_estimator``; writes ``advantages`` and ``returns`` into the batch.

    Every estimator is looked up in the registry; it receives the arguments its signature names among
    ``token_level_rewards, response_mask, values, index (=uid), reward_baselines, gamma, lam,
    norm_adv_by_std_in_grpo, config`` — so user-registered estimators work without changes here.

    A batch without ``response_mask`` gets it from ``attention_mask`` (:func:`compute_response_mask`), written into
    the batch, as upstream does for trainers that call this before computing the mask; a batch with neither
    ``response_mask`` nor ``attention_mask``/``responses`` raises ValueError naming the missing keys.
    """
    if "response_mask" not in data.batch.keys():
        _require_mask_sources(data)
        data.batch["response_mask"] = compute_response_mask(data)
    estimator = core_algos.get_adv_estimator_fn(adv_estimator)
    available = {
        "token_level_rewards": data.batch["token_level_rewards"],
        "response_mask": data.batch["response_mask"],
        "index": data.non_tensor_batch.get("uid"),
        "gamma": gamma,
        "lam": lam,
        "norm_adv_by_std_in_grpo": norm_adv_by_std_in_grpo,
        "config": config,
    }
    for key in ("values", "reward_baselines", "old_log_probs", "sum_pi_squared", "rollout_is_weights"):
        if key in data.batch.keys():
            available[key] = data.batch[key]
    parameters = inspect.signature(estimator).parameters
    missing = [
        name
        for name, p in parameters.items()
        if p.default is inspect.Parameter.empty and p.kind is p.POSITIONAL_OR_KEYWORD and name not in available
    ]
    if missing:
        raise ValueError(
            f"algorithm.adv_estimator={adv_estimator!r} needs {missing}, which this batch does not have "
            "(e.g. 'values' needs a critic: set critic.enable=True)"
        )
    kwargs = {name: available[name] for name in parameters if name in available}
    advantages, returns = estimator(**kwargs)
    data.batch["advantages"] = advantages
    data.batch["returns"] = returns
    return data
