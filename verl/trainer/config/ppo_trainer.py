"""The whole `ppo_trainer.yaml` tree as one typed config, and the links between its nodes.

Several keys in different nodes mean the same thing (the YAML interpolates one from the other:
`actor_rollout_ref.actor.rollout_n: ${oc.select:actor_rollout_ref.rollout.n,1}`). After conversion
they are made equal here, with the same rule everywhere (`link_keys`): the side the user changed wins,
changing both to different values raises `ConfigError` naming both keys. The FSDP strategy is stricter:
`actor_rollout_ref.actor.strategy` is the one key, and `ref.strategy` / `critic.strategy` may only repeat it
(field report item 9). With `model_engine=veomni` the actor and reference are the VeOmni family and the critic
(there is no VeOmni value engine) runs on FSDP2.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from verl.base_config import BaseConfig, ConfigError, field_default, require_choice
from verl.trainer.config.algorithm import AlgoConfig
from verl.trainer.config.data import DataConfig
from verl.trainer.config.trainer import GlobalProfilerConfig, RayKwargsConfig, TrainerConfig
from verl.workers.config import (
    ActorConfig,
    FSDPActorConfig,
    FSDPCriticConfig,
    FSDPRefConfig,
    HFModelConfig,
    RefConfig,
    RewardConfig,
    RolloutConfig,
    VeOmniActorConfig,
    VeOmniRefConfig,
)
from verl.workers.config.actor import check_sequence_parallel

__all__ = ["MODEL_ENGINES", "ActorRolloutRefConfig", "PPOTrainerConfig", "link_keys"]

MODEL_ENGINES = ("dp", "veomni")
"""Choices of the `model_engine` config group (config/model_engine/*.yaml)."""


def _get(cfg: BaseConfig, path: str) -> Any:
    for part in path.split("."):
        cfg = getattr(cfg, part)
    return cfg


def _set(cfg: BaseConfig, path: str, value: Any) -> None:
    """Set the value at dotted `path` below `cfg`: intermediate nodes are rebuilt with dataclasses.replace (re-running
    their checks, whose errors get the node's path), never mutated."""
    parts = path.split(".")
    owners = [cfg]
    for part in parts[:-1]:
        owners.append(getattr(owners[-1], part))
    new_value = value
    for depth in range(len(parts) - 1, 0, -1):
        try:
            new_value = dataclasses.replace(owners[depth], **{parts[depth]: new_value})
        except ConfigError as err:
            raise err.under(".".join(parts[:depth])) from None
    cfg._normalize(parts[0], new_value)


def _default_at(cfg: BaseConfig, path: str) -> Any:
    owner_path, _, name = path.rpartition(".")
    owner = _get(cfg, owner_path) if owner_path else cfg
    return field_default(type(owner), name)


def link_keys(cfg: BaseConfig, home: str, follower: str) -> None:
    """Make `cfg.<home>` and `cfg.<follower>` (dotted paths) equal: the side changed from its default wins."""
    home_value, follower_value = _get(cfg, home), _get(cfg, follower)
    if home_value == follower_value:
        return
    if follower_value == _default_at(cfg, follower):
        _set(cfg, follower, home_value)
    elif home_value == _default_at(cfg, home):
        _set(cfg, home, follower_value)
    else:
        raise ConfigError(
            follower,
            f"({follower_value!r}) contradicts {{node}}.{home} ({home_value!r}); it follows that key: set only "
            f"{{node}}.{home}.",
        )


def require_same_strategy(cfg: BaseConfig, actor_path: str, other_path: str) -> None:
    """`<other>.strategy` may only repeat the actor's: one key selects FSDP1/FSDP2 everywhere."""
    actor_strategy, other_strategy = _get(cfg, f"{actor_path}.strategy"), _get(cfg, f"{other_path}.strategy")
    if other_strategy != actor_strategy:
        raise ConfigError(
            f"{other_path}.strategy",
            f"({other_strategy}) contradicts {{node}}.{actor_path}.strategy ({actor_strategy}). "
            f"{{node}}.{actor_path}.strategy is the one key that selects FSDP1/FSDP2 for every component; set only "
            f"it (the YAML makes {other_path}.strategy follow it).",
        )


@dataclass
class ActorRolloutRefConfig(BaseConfig):
    """`actor_rollout_ref`: the policy model and its three roles, which share one worker group."""

    hybrid_engine: bool = True
    """Actor, rollout and reference share devices and swap memory (the only supported layout)."""

    nccl_timeout: int = 600
    """Seconds before a collective times out (nccl, hccl or gloo)."""

    model: HFModelConfig = field(default_factory=HFModelConfig)
    """The policy model."""

    actor: ActorConfig = field(default_factory=FSDPActorConfig)
    """Policy updates (FSDPActorConfig, or VeOmniActorConfig with model_engine=veomni)."""

    ref: RefConfig = field(default_factory=FSDPRefConfig)
    """Reference policy (for KL; FSDPRefConfig, or VeOmniRefConfig with model_engine=veomni)."""

    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    """Generation."""

    def __post_init__(self) -> None:
        if not self.hybrid_engine:
            raise ConfigError(
                "hybrid_engine", "only the hybrid engine (actor, rollout and ref colocated) is supported."
            )
        require_same_strategy(self, "actor", "ref")
        link_keys(self, "rollout.n", "actor.rollout_n")
        link_keys(self, "rollout.n", "ref.rollout_n")
        link_keys(self, "model.use_remove_padding", "actor.use_remove_padding")
        link_keys(self, "model.use_fused_kernels", "actor.use_fused_kernels")
        engine = "veomni" if isinstance(self.actor, VeOmniActorConfig) else "fsdp_config"
        link_keys(self, "actor.router_replay.mode", f"actor.{engine}.router_replay.mode")
        if isinstance(self.actor, VeOmniActorConfig) != isinstance(self.ref, VeOmniRefConfig):
            raise ConfigError(
                "ref",
                f"is a {type(self.ref).__name__} next to a {type(self.actor).__name__}: actor and reference come from "
                "one config family; select it with model_engine=dp|veomni instead of overriding one of them.",
            )
        if isinstance(self.ref, VeOmniRefConfig):
            # the workers dispatch actor and reference rows by one (dp, sp) layout: one Ulysses size
            link_keys(self, "actor.veomni.ulysses_parallel_size", "ref.veomni.ulysses_parallel_size")
        if isinstance(self.ref, FSDPRefConfig):
            # One (dp, sp) device mesh serves actor and reference in the legacy worker.
            link_keys(self, "actor.ulysses_sequence_parallel_size", "ref.ulysses_sequence_parallel_size")
            try:
                check_sequence_parallel(self.ref.ulysses_sequence_parallel_size, self.model.use_remove_padding)
            except ConfigError as err:
                raise err.under("ref") from None


@dataclass
class PPOTrainerConfig(BaseConfig):
    """The root of `ppo_trainer.yaml` (after the legacy reward keys are migrated into `reward`)."""

    model_engine: str = "dp"
    """Hydra config group choosing the actor/ref config family: dp (FSDP1/FSDP2) | veomni (VeOmni engine)."""

    data: DataConfig = field(default_factory=DataConfig)
    """Datasets and batch size."""

    actor_rollout_ref: ActorRolloutRefConfig = field(default_factory=ActorRolloutRefConfig)
    """Policy model, actor, reference and rollout."""

    critic: FSDPCriticConfig = field(default_factory=FSDPCriticConfig)
    """Value model (used with GAE)."""

    reward: RewardConfig = field(default_factory=RewardConfig)
    """Reward functions and managers."""

    algorithm: AlgoConfig = field(default_factory=AlgoConfig)
    """Advantage estimation and KL penalty."""

    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    """Run length, cluster size, logging, checkpoints."""

    global_profiler: GlobalProfilerConfig = field(default_factory=GlobalProfilerConfig)
    """Step profiling."""

    ray_kwargs: RayKwargsConfig = field(default_factory=RayKwargsConfig)
    """Ray options."""

    def __post_init__(self) -> None:
        require_choice("model_engine", self.model_engine, MODEL_ENGINES)
        self._check_model_engine()
        link_keys(self, "data.max_prompt_length", "actor_rollout_ref.rollout.prompt_length")
        link_keys(self, "data.max_response_length", "actor_rollout_ref.rollout.response_length")
        link_keys(self, "trainer.n_gpus_per_node", "actor_rollout_ref.rollout.n_gpus_per_node")
        link_keys(self, "actor_rollout_ref.rollout.n", "critic.rollout_n")
        link_keys(self, "actor_rollout_ref.rollout.multi_turn.tool_config_path", "data.tool_config_path")
        self._check_rollout_correction()
        self._check_router_replay()

    def _check_router_replay(self) -> None:
        """R2 records the routing in the old-log-prob forward: bypass mode has none. (Under Ulysses SP, the FSDP
        engine's or VeOmni's, the replay is cut like the input ids: ``verl.workers.core.routing.shard_routing``.)"""
        actor = self.actor_rollout_ref.actor
        mode = actor.router_replay.mode
        self._check_rollout_routing(mode)
        if mode == "disabled":
            return
        if mode == "R2" and self.algorithm.rollout_correction.bypass_mode:
            raise ConfigError(
                "actor_rollout_ref.actor.router_replay.mode",
                "(R2) records the routing in the old-log-prob forward, which algorithm.rollout_correction.bypass_mode="
                "True skips; disable one of them.",
            )

    def _check_rollout_routing(self, mode: str) -> None:
        """R3 replays the routing the rollout recorded: the rollout must record it. The HF rollout hooks the MoE
        gates during ``generate``; the vLLM rollout hooks vLLM's MoE routers
        (``verl.workers.rollout.vllm_rollout.routing``), which needs every prompt token forwarded (no prefix cache)."""
        rollout = self.actor_rollout_ref.rollout
        key = "actor_rollout_ref.rollout.enable_rollout_routing_replay"
        if mode == "R3" and not rollout.enable_rollout_routing_replay:
            raise ConfigError(
                key,
                "(False) must be True with actor_rollout_ref.actor.router_replay.mode=R3: R3 replays the routing the "
                "rollout records (or use R2, which records it in the old-log-prob forward).",
            )
        if not rollout.enable_rollout_routing_replay:
            return
        if rollout.name not in ("hf", "vllm"):
            raise ConfigError(
                key,
                f"(True) needs actor_rollout_ref.rollout.name=hf or vllm (got {rollout.name}): those rollouts record "
                "the routing of every token. Or use router_replay.mode=R2 (no rollout routing needed).",
            )
        if rollout.name == "vllm" and rollout.enable_prefix_caching:
            raise ConfigError(
                key,
                "(True) with rollout.name=vllm needs actor_rollout_ref.rollout.enable_prefix_caching=False: a cached "
                "prompt block is not forwarded again, so vLLM's routers never route it.",
            )

    def _check_rollout_correction(self) -> None:
        """Rollout correction compares against the rollout's own log-probs, so the rollout must return them; bypass
        mode owns the actor's policy loss (the trainer selects ``bypass_mode``), which must not be chosen by hand."""
        corr = self.algorithm.rollout_correction
        loss_mode = self.actor_rollout_ref.actor.policy_loss.loss_mode
        if corr.enabled and not self.actor_rollout_ref.rollout.calculate_log_probs:
            raise ConfigError(
                "actor_rollout_ref.rollout.calculate_log_probs",
                "(False) must be True with algorithm.rollout_correction (rollout_is / rollout_rs / bypass_mode): "
                "the correction compares the trainer's log-probs with the rollout's.",
            )
        if corr.bypass_mode and loss_mode not in ("vanilla", "bypass_mode"):
            raise ConfigError(
                "actor_rollout_ref.actor.policy_loss.loss_mode",
                f"({loss_mode}) cannot be combined with algorithm.rollout_correction.bypass_mode=True, whose loss is "
                "bypass_mode (choose it with algorithm.rollout_correction.loss_type=ppo_clip|reinforce).",
            )
        if loss_mode == "bypass_mode" and not corr.bypass_mode:
            raise ConfigError(
                "actor_rollout_ref.actor.policy_loss.loss_mode",
                "(bypass_mode) needs algorithm.rollout_correction.bypass_mode=True, which also makes the rollout's "
                "log-probs the old log-probs; set that key instead.",
            )

    def _check_model_engine(self) -> None:
        """The composed family matches `model_engine`; the critic follows the actor's strategy, except next to a
        VeOmni actor, where it runs on FSDP2 (no VeOmni value engine, as upstream v0.7.1); VeOmni exists only on the
        engine-worker path."""
        actor = self.actor_rollout_ref.actor
        veomni = isinstance(actor, VeOmniActorConfig)
        if veomni != (self.model_engine == "veomni"):
            raise ConfigError(
                "model_engine",
                f"({self.model_engine}) does not match the composed actor config ({type(actor).__name__}): select "
                "the family only with model_engine=dp|veomni.",
            )
        if not veomni:
            require_same_strategy(self, "actor_rollout_ref.actor", "critic")
            return
        if self.critic.strategy != "fsdp2":
            raise ConfigError(
                "critic.strategy",
                f"({self.critic.strategy}) must be fsdp2 next to actor_rollout_ref.actor.strategy=veomni: there is no "
                "VeOmni value engine, the critic is trained by FSDP2 (model_engine=veomni composes it so).",
            )
        if self.trainer.use_legacy_worker_impl == "enable":
            raise ConfigError(
                "trainer.use_legacy_worker_impl",
                "(enable) selects the FSDP workers, which cannot run actor_rollout_ref.actor.strategy=veomni: use auto "
                "or disable (the engine workers).",
            )
