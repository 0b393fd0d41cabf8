"""Actor (policy) settings: `actor_rollout_ref.actor` (`actor/actor.yaml` + `actor/dp_actor.yaml`).

Batch-size units (the most asked question about verl configs):
* `ppo_mini_batch_size` counts PROMPTS, globally. One optimizer step consumes
  `ppo_mini_batch_size * rollout_n` responses, spread over the data-parallel ranks.
  Example: 8 GPUs, SP 1, ppo_mini_batch_size=32, rollout.n=4 -> 128 responses per step, 16 per GPU.
* `ppo_micro_batch_size_per_gpu` counts RESPONSES per GPU per forward/backward; gradient accumulation runs
  16 / 4 = 4 micro-batches in the example above when it is 4.
* With `use_dynamic_bsz` micro-batches are formed by token budget instead:
  `ppo_max_token_len_per_gpu * ulysses_sequence_parallel_size` tokens per micro-batch.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import ClassVar, Optional

from verl.base_config import BaseConfig, ConfigError, require_choice, require_positive
from verl.workers.config.batch import (
    check_micro_batch_settings,
    mini_batch_responses_per_rank,
    validate_ppo_batch,
)
from verl.workers.config.common import CheckpointConfig, check_kl_estimator
from verl.workers.config.engine import (
    FSDP_STRATEGIES,
    FSDPEngineConfig,
    VeOmniEngineConfig,
    link_role_and_engine,
    refuse_unsupported_backend,
)
from verl.workers.config.optimizer import FSDPOptimizerConfig

__all__ = [
    "VeOmniActorConfig",
    "check_strategy_family",
    "LOSS_AGG_MODES",
    "ActorConfig",
    "FSDPActorConfig",
    "PolicyLossConfig",
    "RouterReplayConfig",
    "check_offload_policy",
    "check_sequence_parallel",
]

LOSS_AGG_MODES = ("token-mean", "token-sum", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm")
"""How a (batch, response_len) loss matrix is reduced to a scalar (see core_algos.agg_loss)."""


@dataclass
class PolicyLossConfig(BaseConfig):
    """`actor.policy_loss`: which registered policy loss to use and its extra coefficients."""

    loss_mode: str = "vanilla"
    """Name in core_algos' policy-loss registry: vanilla | gspo | sapo | gpg | clip_cov | kl_cov | geo_mean |
    cispo | dppo_tv | dppo_kl | bypass_mode, or a name registered by user code."""

    clip_cov_ratio: float = 0.0002
    """clip_cov: fraction of tokens whose gradient is clipped."""

    clip_cov_lb: float = 1.0
    """clip_cov: lower bound of the covariance window."""

    clip_cov_ub: float = 5.0
    """clip_cov: upper bound of the covariance window."""

    kl_cov_ratio: float = 0.0002
    """kl_cov: fraction of tokens that get the KL penalty."""

    ppo_kl_coef: float = 0.1
    """kl_cov: coefficient of the KL penalty."""


@dataclass
class RouterReplayConfig(BaseConfig):
    """`actor.router_replay`: replay the rollout's MoE routing decisions in training."""

    mode: str = "disabled"
    """disabled | R2 | R3."""

    def __post_init__(self) -> None:
        require_choice("mode", self.mode, ("disabled", "R2", "R3"))


@dataclass
class ActorConfig(BaseConfig):
    """Policy-update settings common to every actor backend (see the module docstring for batch units)."""

    STRATEGIES: ClassVar[tuple[str, ...]] = FSDP_STRATEGIES
    """The strategies this config family serves (`veomni` has its own family: model_engine=veomni)."""

    strategy: str = "fsdp"
    """fsdp (FSDP1) | fsdp2 | veomni (with model_engine=veomni). The ONE key that selects the training backend for
    actor, reference policy and (by interpolation) critic and every engine config."""

    rollout_n: int = 1
    """Responses per prompt; the YAML makes it follow actor_rollout_ref.rollout.n."""

    ppo_mini_batch_size: int = 256
    """PROMPTS per optimizer step, global (multiplied by rollout_n to get responses)."""

    ppo_micro_batch_size: Optional[int] = None
    """Deprecated global micro-batch size; use ppo_micro_batch_size_per_gpu."""

    ppo_micro_batch_size_per_gpu: Optional[int] = None
    """RESPONSES per GPU per forward/backward (gradient accumulation splits the mini-batch into these)."""

    use_dynamic_bsz: bool = False
    """Form micro-batches by token budget (ppo_max_token_len_per_gpu) instead of a fixed count."""

    ppo_max_token_len_per_gpu: int = 16384
    """Token budget per GPU per micro-batch when use_dynamic_bsz (times the Ulysses SP size)."""

    clip_ratio: float = 0.2
    """PPO clip epsilon (used for both sides when clip_ratio_low/high are not set apart)."""

    clip_ratio_low: float = 0.2
    """Lower clip epsilon: ratio >= 1 - clip_ratio_low."""

    clip_ratio_high: float = 0.2
    """Upper clip epsilon: ratio <= 1 + clip_ratio_high (DAPO clip-higher uses e.g. 0.28)."""

    tau_pos: float = 1.0
    """SAPO temperature for positive advantages."""

    tau_neg: float = 1.05
    """SAPO temperature for negative advantages."""

    freeze_vision_tower: bool = False
    """Multimodal models: do not train the vision encoder."""

    policy_loss: PolicyLossConfig = field(default_factory=PolicyLossConfig)
    """Policy-loss selection and coefficients."""

    clip_ratio_c: float = 3.0
    """Dual-clip PPO: lower bound on the loss for negative advantages (must be > 1)."""

    loss_agg_mode: str = "token-mean"
    """token-mean | token-sum | seq-mean-token-sum | seq-mean-token-mean | seq-mean-token-sum-norm."""

    loss_scale_factor: Optional[float] = None
    """seq-mean-token-sum-norm divisor; null = the response length."""

    entropy_coeff: float = 0.0
    """Entropy bonus weight: loss = pg_loss - entropy_coeff * entropy (+ kl_loss_coef * kl)."""

    calculate_entropy: bool = False
    """Compute entropy in update_actor for the actor/entropy metric even when entropy_coeff == 0."""

    skip_old_log_prob_on_policy: bool = True
    """Skip the old-log-prob pass where it is provably redundant (one optimizer step per batch and nothing else
    reads old_log_probs: verl.trainer.ppo.on_policy); old_log_probs are then the update's own forward, detached.
    False: always recompute them."""

    calculate_sum_pi_squared: bool = False
    """Compute sum_v pi(v)^2 per token (needed by the optimal_token_baseline estimator)."""

    sum_pi_squared_checkpointing: bool = False
    """Recompute sum_pi_squared in backward instead of storing it."""

    use_kl_loss: bool = False
    """Add a KL(actor || reference) term to the actor loss (GRPO style); needs the reference policy."""

    use_prefix_grouper: bool = False
    """Share the prompt prefix computation across the rollout_n responses of a prompt."""

    use_torch_compile: bool = False
    """Upstream: torch.compile the log-prob/entropy kernels. Not applied here (the chunked kernels run eagerly);
    true is reported as having no effect. Linked to fsdp_config.use_torch_compile."""

    kl_loss_coef: float = 0.001
    """Weight of the KL loss when use_kl_loss."""

    kl_loss_type: str = "low_var_kl"
    """KL estimator of the KL loss: kl|k1, abs, mse|k2, low_var_kl|k3, with optional '+' (straight-through)."""

    ppo_epochs: int = 1
    """Passes over each batch of rollouts."""

    shuffle: bool = False
    """Shuffle the responses between mini-batches."""

    data_loader_seed: int = 42
    """Seed of that shuffle."""

    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    """What the actor saves and loads."""

    use_fused_kernels: bool = False
    """Fused LM-head + log-prob path; the YAML makes it follow actor_rollout_ref.model.use_fused_kernels."""

    router_replay: RouterReplayConfig = field(default_factory=RouterReplayConfig)
    """MoE routing replay."""

    grad_clip: float = 1.0
    """Gradient-norm clipping threshold (legacy worker). Linked to optim.clip_grad (engine path)."""

    optim: FSDPOptimizerConfig = field(default_factory=FSDPOptimizerConfig)
    """Optimizer and learning-rate schedule."""

    def __post_init__(self) -> None:
        check_strategy_family("strategy", self.strategy, self.STRATEGIES)
        require_positive("rollout_n", self.rollout_n)
        require_positive("ppo_mini_batch_size", self.ppo_mini_batch_size)
        require_positive("ppo_epochs", self.ppo_epochs)
        check_micro_batch_settings(
            "ppo_micro_batch_size",
            self.ppo_micro_batch_size,
            "ppo_micro_batch_size_per_gpu",
            self.ppo_micro_batch_size_per_gpu,
        )
        if self.use_dynamic_bsz:
            if self.ppo_max_token_len_per_gpu is None or self.ppo_max_token_len_per_gpu <= 0:
                raise ConfigError(
                    "ppo_max_token_len_per_gpu",
                    f"use_dynamic_bsz=True needs a positive token budget "
                    f"per GPU, got {self.ppo_max_token_len_per_gpu!r}.",
                )
        require_choice("loss_agg_mode", self.loss_agg_mode, LOSS_AGG_MODES)
        check_kl_estimator("kl_loss_type", self.kl_loss_type)
        if self.clip_ratio_c <= 1.0:
            raise ConfigError("clip_ratio_c", f"dual-clip bound must be > 1.0, got {self.clip_ratio_c}.")
        for key in ("clip_ratio", "clip_ratio_low", "clip_ratio_high"):
            if getattr(self, key) < 0:
                raise ConfigError(key, f"must be >= 0, got {getattr(self, key)}.")
        self._link_grad_clip()

    def _link_grad_clip(self) -> None:
        """actor.grad_clip (legacy worker) and actor.optim.clip_grad (engine) are one setting."""
        if self.grad_clip == self.optim.clip_grad:
            return
        if self.optim.clip_grad == 1.0:
            self._normalize("optim", replace(self.optim, clip_grad=self.grad_clip))
        elif self.grad_clip == 1.0:
            self._normalize("grad_clip", self.optim.clip_grad)
        else:
            raise ConfigError(
                "optim.clip_grad",
                f"({self.optim.clip_grad}) contradicts {{node}}.grad_clip "
                f"({self.grad_clip}); they are one setting: set only {{node}}.grad_clip.",
            )

    @property
    def uses_entropy(self) -> bool:
        """Whether update_actor must compute entropy: for the bonus (entropy_coeff != 0) or the metric."""
        return self.calculate_entropy or self.entropy_coeff != 0

    def mini_batch_responses_per_rank(self, dp_size: int) -> int:
        """Responses per data-parallel rank in one optimizer step (see batch.mini_batch_responses_per_rank)."""
        return mini_batch_responses_per_rank(self, dp_size)

    def validate(self, n_gpus: int, train_batch_size: int, model_config: object = None) -> None:
        """Batch arithmetic that needs the cluster size (called by verl.utils.config.validate_config).

        `n_gpus` = trainer.nnodes * trainer.n_gpus_per_node; `train_batch_size` = data.train_batch_size (prompts).
        """
        validate_ppo_batch(self, n_gpus, train_batch_size)

    @property
    def ulysses_sp_size(self) -> int:
        """Ulysses SP size; 1 for backends without sequence parallelism."""
        return 1

    @property
    def engine_config(self) -> BaseConfig:
        """The training-engine settings of this role (`fsdp_config` or `veomni`), read by the engine workers."""
        raise NotImplementedError(f"{type(self).__name__} has no engine settings; use a backend subclass")


@dataclass
class FSDPActorConfig(ActorConfig):
    """Actor trained with FSDP1/FSDP2 (`actor/dp_actor.yaml`)."""

    ulysses_sequence_parallel_size: int = 1
    """Ulysses SP group size (heads are split over the group); needs use_remove_padding. Linked to
    fsdp_config.ulysses_sequence_parallel_size."""

    entropy_from_logits_with_chunking: bool = False
    """Compute entropy over token chunks instead of one full-vocabulary softmax (field report item 2)."""

    entropy_from_logits_chunk_size: int = 2048
    """Tokens per chunk of the chunked log-prob/entropy."""

    entropy_checkpointing: bool = False
    """Recompute entropy in backward instead of storing the softmax."""

    use_remove_padding: bool = True
    """Packed forward; the YAML makes it follow actor_rollout_ref.model.use_remove_padding."""

    fsdp_config: FSDPEngineConfig = field(default_factory=FSDPEngineConfig)
    """FSDP engine settings (strategy follows `strategy`)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        require_positive("entropy_from_logits_chunk_size", self.entropy_from_logits_chunk_size)
        link_role_and_engine(self, "fsdp_config")
        check_sequence_parallel(self.ulysses_sequence_parallel_size, self.use_remove_padding)
        check_offload_policy(self.fsdp_config, self.strategy)

    @property
    def ulysses_sp_size(self) -> int:
        return self.ulysses_sequence_parallel_size

    @property
    def engine_config(self) -> FSDPEngineConfig:
        return self.fsdp_config


@dataclass
class VeOmniActorConfig(ActorConfig):
    """Actor trained with the VeOmni engine (`model_engine=veomni`: `actor/veomni_actor.yaml`, engine workers only)."""

    STRATEGIES: ClassVar[tuple[str, ...]] = ("veomni",)

    strategy: str = "veomni"
    """Always veomni in this family (the engine workers look the engine up by it)."""

    use_remove_padding: bool = True
    """Packed forward; the YAML makes it follow actor_rollout_ref.model.use_remove_padding."""

    veomni: VeOmniEngineConfig = field(default_factory=VeOmniEngineConfig)
    """VeOmni engine settings (`engine/veomni.yaml`): offload, sharding, expert parallelism, kernels, entropy."""

    def __post_init__(self) -> None:
        super().__post_init__()
        check_veomni_sequence_parallel(self.veomni, self.use_remove_padding)

    @property
    def ulysses_sp_size(self) -> int:
        """VeOmni's Ulysses size: the workers dispatch rows by ``rank // sp`` (VeOmni's mesh keeps ulysses
        innermost, so its SP groups are the same consecutive ranks)."""
        return self.veomni.ulysses_parallel_size

    @property
    def engine_config(self) -> VeOmniEngineConfig:
        return self.veomni


def check_strategy_family(key: str, strategy: str, strategies: tuple[str, ...]) -> None:
    """`strategy` must be one this config family serves; `veomni` in the FSDP family names the group to select;
    an upstream backend this distribution lacks (megatron, torchtitan, ...) says so and what to use instead."""
    refuse_unsupported_backend(key, strategy)
    if strategy == "veomni" and "veomni" not in strategies:
        raise ConfigError(
            key,
            "is 'veomni', but the FSDP config family was composed: add the Hydra override model_engine=veomni "
            "(it composes actor/ref .veomni engine settings and sets the strategy).",
        )
    require_choice(key, strategy, strategies)


def check_veomni_sequence_parallel(engine: VeOmniEngineConfig, use_remove_padding: bool) -> None:
    """VeOmni's Ulysses SP shards the packed token stream (VeOmni's own sequence-parallel collator slices it),
    so ``veomni.ulysses_parallel_size > 1`` needs the packed forward; refused here, before Ray starts."""
    check_sequence_parallel(engine.ulysses_parallel_size, use_remove_padding, sp_key="veomni.ulysses_parallel_size")


def check_sequence_parallel(
    sp_size: int,
    use_remove_padding: bool,
    remove_padding_key: str = "actor_rollout_ref.model.use_remove_padding",
    sp_key: str = "ulysses_sequence_parallel_size",
) -> None:
    """Ulysses SP slices the packed token stream, so it needs the remove-padding path."""
    require_positive(sp_key, sp_size)
    if sp_size > 1 and not use_remove_padding:
        raise ConfigError(
            sp_key,
            f"({sp_size}) > 1 needs the packed forward: set {remove_padding_key}=True.",
        )


def check_offload_policy(engine: FSDPEngineConfig, strategy: str) -> None:
    """CPUOffloadPolicy exists only in FSDP2; with FSDP1 the flag would silently do nothing."""
    if engine.offload_policy and strategy != "fsdp2":
        raise ConfigError(
            "fsdp_config.offload_policy",
            f"is FSDP2-only but {{node}}.strategy is {strategy!r}: set "
            f"{{node}}.strategy=fsdp2, or use fsdp_config.param_offload with FSDP1.",
        )
