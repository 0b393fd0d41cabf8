"""What the role workers of both paths do alike: parse the role, take the typed config, generate, check the critic.

The legacy (``fsdp_workers``) and engine (``engine_workers``) ``ActorRolloutRefWorker``/``CriticWorker`` are RPC
surfaces over these functions and the update loop, so a role means the same on both paths.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from verl.protocol import DataProto
from verl.single_controller.base.decorator import Dispatch, register
from verl.utils.config import omega_conf_to_dataclass
from verl.utils.debug.performance import timed
from verl.utils.device import get_platform
from verl.workers.config.critic import FSDPCriticConfig
from verl.workers.rollout.base import generation_seed

if TYPE_CHECKING:
    from verl.trainer.config.ppo_trainer import ActorRolloutRefConfig

__all__ = ["CheckpointRPC", "WorkerRoles", "actor_rollout_ref_config", "critic_config", "generate_sequences"]

ROLES = ("actor", "rollout", "ref", "actor_rollout", "actor_rollout_ref")


@dataclass(frozen=True)
class WorkerRoles:
    """Which of actor (training), rollout (generation) and reference policy one ``ActorRolloutRefWorker`` plays."""

    name: str
    is_actor: bool
    is_rollout: bool
    is_ref: bool

    @classmethod
    def parse(cls, role: str) -> WorkerRoles:
        if role not in ROLES:
            raise ValueError(f"ActorRolloutRefWorker role={role!r} is not one of {ROLES}")
        parts = role.split("_")
        return cls(role, "actor" in parts, "rollout" in parts, "ref" in parts)

    def require(self, condition: bool, method: str, needed: str) -> None:
        if not condition:
            raise RuntimeError(f"{method} needs a worker with the {needed} role; this worker's role is {self.name!r}")


class CheckpointRPC:
    """``save_checkpoint`` / ``load_checkpoint`` of a role worker (both paths): :meth:`_checkpointer` names what
    saves (checkpoint manager, engine) and the scope it needs (the legacy placement: state on the device)."""

    def _checkpointer(self, method: str) -> tuple[Any, contextlib.AbstractContextManager]:
        raise NotImplementedError

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def save_checkpoint(
        self, local_path: str, hdfs_path: str | None = None, global_step: int = 0, max_ckpt_to_keep: int | None = None
    ) -> None:
        """Model/optimizer/lr-schedule/RNG (+ HF export with ``hf_model``) of the trained model, atomically."""
        owner, scope = self._checkpointer("save_checkpoint")
        with scope:
            owner.save_checkpoint(local_path, hdfs_path, global_step, max_ckpt_to_keep)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def load_checkpoint(self, local_path: str, hdfs_path: str | None = None, del_local_after_load: bool = False):
        owner, scope = self._checkpointer("load_checkpoint")
        with scope:
            owner.load_checkpoint(local_path, hdfs_path, del_local_after_load)


def actor_rollout_ref_config(config: Any) -> ActorRolloutRefConfig:
    """The typed ``actor_rollout_ref`` config: a dataclass passes through, a DictConfig node is converted once."""
    from verl.trainer.config.ppo_trainer import ActorRolloutRefConfig

    return omega_conf_to_dataclass(config, ActorRolloutRefConfig)


def critic_config(config: Any) -> FSDPCriticConfig:
    """The typed ``critic`` config (converted once from a DictConfig node), refusing an HF export it cannot do."""
    config = omega_conf_to_dataclass(config, FSDPCriticConfig)
    if "hf_model" in config.checkpoint.save_contents:
        raise ValueError(
            "critic.checkpoint.save_contents contains 'hf_model', but the value model (a causal LM with a one-unit "
            "head) has no HF export; remove 'hf_model' (the sharded checkpoint resumes the critic)"
        )
    return config


def generate_sequences(
    rollout: Any, sharding_manager: Any, prompts: DataProto, tokenizer: Any, base_seed: int, dp_rank: int
) -> DataProto:
    """Responses for one rank's prompts (on the device), sampled from the device generator seeded with
    :func:`generation_seed` for this step and dp rank (restored afterwards); entering the sharding manager syncs
    the trained weights into the rollout (``timing_s/update_weights``). Returns the output on the CPU."""
    prompts = prompts.to(get_platform().device())
    prompts.meta_info.setdefault("eos_token_id", tokenizer.eos_token_id)
    prompts.meta_info.setdefault("pad_token_id", tokenizer.pad_token_id)
    seed = generation_seed(base_seed, prompts.meta_info, dp_rank)
    seconds: dict[str, float] = {}
    with contextlib.ExitStack() as stack:
        with timed(seconds, "update_weights"):
            stack.enter_context(sharding_manager)
        stack.enter_context(get_platform().fork_rng(seed))
        prompts = sharding_manager.preprocess_data(prompts)
        output = sharding_manager.postprocess_data(rollout.generate_sequences(prompts))
    output.meta_info["metrics"] = {"timing_s/update_weights": seconds["update_weights"]}
    return output.to("cpu")
