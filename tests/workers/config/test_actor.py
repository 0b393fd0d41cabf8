"""Actor, reference and critic configs: per-node checks and batch arithmetic with worked numbers."""

import pytest

from verl.workers.config import (
    FSDPActorConfig,
    FSDPCriticConfig,
    FSDPOptimizerConfig,
    FSDPRefConfig,
    PolicyLossConfig,
)


def test_mapping_access_like_upstream_dictconfig():
    """Upstream user code reads actor configs like dicts."""
    cfg = FSDPActorConfig(clip_ratio_high=0.28)
    assert cfg["clip_ratio_high"] == cfg.get("clip_ratio_high") == 0.28
    assert cfg["policy_loss"]["loss_mode"] == "vanilla"
    assert "fsdp_config" in cfg and "nope" not in cfg


def test_batch_sizes_are_frozen_like_every_field():
    """No field changes units after start-up: the per-rank sizes are a ``BatchPlan`` (verl.workers.core.batch_plan),
    so the batch-size keys are frozen like every other key."""
    cfg = FSDPActorConfig(ppo_micro_batch_size_per_gpu=2)
    for key, value in (("ppo_mini_batch_size", 16), ("ppo_micro_batch_size_per_gpu", 1), ("clip_ratio", 0.3)):
        with pytest.raises(AttributeError):
            setattr(cfg, key, value)


def test_mini_batch_responses_per_rank_worked_example():
    """32 prompts * 4 responses / 8 ranks = 16 responses per rank per optimizer step."""
    assert FSDPActorConfig(ppo_mini_batch_size=32, rollout_n=4).mini_batch_responses_per_rank(8) == 16
    with pytest.raises(ValueError, match=r"\(3\) \* rollout.n \(1\) = 3 responses must be divisible by .* 2"):
        FSDPActorConfig(ppo_mini_batch_size=3).mini_batch_responses_per_rank(2)


def test_validate_with_deprecated_global_micro_batch():
    """The deprecated global micro-batch (8 over 4 ranks = 2 per GPU) is converted and must divide per-rank size."""
    # 8 prompts * 2 / 4 ranks = 4 responses per rank; 8 // 4 = 2 per GPU divides 4.
    FSDPActorConfig(ppo_mini_batch_size=8, rollout_n=2, ppo_micro_batch_size=8).validate(4, 16)
    with pytest.raises(ValueError, match=r"^ppo_micro_batch_size: \(2\) must be >= the data-parallel size \(4\)"):
        FSDPActorConfig(ppo_mini_batch_size=8, rollout_n=2, ppo_micro_batch_size=2).validate(4, 16)


def test_sequence_parallel_divides_gpus():
    """Ulysses SP 3 does not divide 4 GPUs."""
    with pytest.raises(ValueError, match=r"^ulysses_sequence_parallel_size: \(3\) must divide the number of GPUs"):
        FSDPActorConfig(ulysses_sequence_parallel_size=3, ppo_micro_batch_size_per_gpu=1).validate(4, 256)


def test_dynamic_bsz_skips_micro_batch_but_not_mini_batch():
    """With use_dynamic_bsz no micro-batch size is needed, but the mini-batch must still split over ranks."""
    FSDPActorConfig(use_dynamic_bsz=True, ppo_mini_batch_size=4).validate(2, 8)
    with pytest.raises(ValueError, match="must be divisible"):
        FSDPActorConfig(use_dynamic_bsz=True, ppo_mini_batch_size=3).validate(2, 8)


@pytest.mark.parametrize("value", ["kl", "k1", "low_var_kl", "k3+", "mse"])
def test_kl_loss_types_accepted(value):
    """Every KL estimator name of core_algos.kl_penalty (and the '+' straight-through form) is accepted."""
    assert FSDPActorConfig(kl_loss_type=value).kl_loss_type == value


def test_kl_loss_type_rejected():
    """'full' is not implemented and an unknown name lists the choices."""
    with pytest.raises(ValueError, match=r"^kl_loss_type: 'full'"):
        FSDPActorConfig(kl_loss_type="full")
    with pytest.raises(ValueError, match=r"^kl_loss_type: 'k4' is not a KL estimator"):
        FSDPActorConfig(kl_loss_type="k4")


def test_dual_clip_bound_must_exceed_one():
    """clip_ratio_c <= 1 would clip every negative-advantage token."""
    with pytest.raises(ValueError, match=r"^clip_ratio_c: dual-clip bound must be > 1.0"):
        FSDPActorConfig(clip_ratio_c=1.0)


def test_grad_clip_and_optim_clip_grad_are_one_setting():
    """actor.grad_clip (legacy worker) and optim.clip_grad (engine) agree whichever is set; both set differently fails."""
    assert FSDPActorConfig(grad_clip=0.5).optim.clip_grad == 0.5
    assert FSDPActorConfig(optim=FSDPOptimizerConfig(clip_grad=0.5)).grad_clip == 0.5
    with pytest.raises(ValueError, match=r"^optim\.clip_grad: \(0\.5\) contradicts grad_clip \(2\.0\)"):
        FSDPActorConfig(grad_clip=2.0, optim=FSDPOptimizerConfig(clip_grad=0.5))


def test_uses_entropy():
    """Entropy is computed only for the bonus or the metric (never silently)."""
    assert not FSDPActorConfig().uses_entropy
    assert FSDPActorConfig(entropy_coeff=0.01).uses_entropy
    assert FSDPActorConfig(calculate_entropy=True).uses_entropy


def test_policy_loss_defaults():
    """vanilla PPO clip by default."""
    assert PolicyLossConfig().loss_mode == "vanilla"


def test_ref_micro_batch_forms_exclusive():
    """The reference policy's two micro-batch keys are mutually exclusive too."""
    with pytest.raises(ValueError, match=r"^log_prob_micro_batch_size: \(8\) and log_prob_micro_batch_size_per_gpu"):
        FSDPRefConfig(log_prob_micro_batch_size=8, log_prob_micro_batch_size_per_gpu=2)


def test_critic_defaults_and_checks():
    """Critic lr defaults to 1e-5; its batch arithmetic uses the same rules as the actor."""
    critic = FSDPCriticConfig(ppo_mini_batch_size=8, rollout_n=4, ppo_micro_batch_size_per_gpu=4)
    assert critic.optim.lr == 1e-5
    critic.validate(2, 16)  # 8 * 4 / 2 = 16 per rank, micro 4 divides 16
    with pytest.raises(ValueError, match=r"^ppo_micro_batch_size_per_gpu: \(3\) must divide .* = 16"):
        FSDPCriticConfig(ppo_mini_batch_size=8, rollout_n=4, ppo_micro_batch_size_per_gpu=3).validate(2, 16)


def test_critic_sequence_parallel_needs_its_model_remove_padding():
    """critic SP > 1 needs critic.model.use_remove_padding (default False for the critic, as upstream v0.7)."""
    with pytest.raises(ValueError, match=r"set critic\.model\.use_remove_padding=True"):
        FSDPCriticConfig(ulysses_sequence_parallel_size=2)
