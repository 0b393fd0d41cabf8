"""What the role workers of both paths share (verl/workers/core/roles.py)."""

import pytest
import torch
from omegaconf import OmegaConf

from verl.protocol import DataProto
from verl.trainer.config.ppo_trainer import ActorRolloutRefConfig
from verl.workers.config import FSDPCriticConfig
from verl.workers.core.roles import WorkerRoles, actor_rollout_ref_config, critic_config, generate_sequences


@pytest.mark.parametrize(
    "role, expected",
    [
        ("actor", (True, False, False)),
        ("rollout", (False, True, False)),
        ("ref", (False, False, True)),
        ("actor_rollout", (True, True, False)),
        ("actor_rollout_ref", (True, True, True)),
    ],
)
def test_role_parsing(role, expected):
    roles = WorkerRoles.parse(role)
    assert (roles.is_actor, roles.is_rollout, roles.is_ref) == expected


def test_unknown_role_and_missing_role_name_the_problem():
    with pytest.raises(ValueError, match=r"role='critic' is not one of"):
        WorkerRoles.parse("critic")
    with pytest.raises(RuntimeError, match=r"update_actor needs a worker with the actor role; .* 'ref'"):
        WorkerRoles.parse("ref").require(False, "update_actor", "actor")


def test_typed_configs_pass_through_and_dict_configs_convert_once():
    """Invariant: a dataclass is used as is; a DictConfig node becomes the dataclass (rollout.n linked into the
    actor's rollout_n by ActorRolloutRefConfig)."""
    typed = ActorRolloutRefConfig()
    assert actor_rollout_ref_config(typed) is typed
    converted = actor_rollout_ref_config(OmegaConf.create({"rollout": {"n": 3}}))
    assert isinstance(converted, ActorRolloutRefConfig) and converted.actor.rollout_n == 3
    assert isinstance(critic_config(OmegaConf.create({"ppo_mini_batch_size": 2})), FSDPCriticConfig)


def test_critic_refuses_an_hf_export():
    with pytest.raises(ValueError, match="critic.checkpoint.save_contents contains 'hf_model'"):
        critic_config(OmegaConf.create({"checkpoint": {"save_contents": ["model", "hf_model"]}}))


class _Rollout:
    def generate_sequences(self, prompts):
        sample = torch.rand(len(prompts), 3)  # what the sampler draws from the seeded generator
        return DataProto.from_dict(tensors={"responses": sample}, meta_info=dict(prompts.meta_info))


class _ShardingManager:
    def __init__(self):
        self.entered = 0

    def __enter__(self):
        self.entered += 1

    def __exit__(self, *exc):
        return False

    def preprocess_data(self, data):
        return data

    def postprocess_data(self, data):
        return data


class _Tokenizer:
    eos_token_id, pad_token_id = 2, 0


def _generate(step: int, dp_rank: int) -> DataProto:
    prompts = DataProto.from_dict(tensors={"input_ids": torch.ones(2, 4, dtype=torch.long)})
    prompts.meta_info["global_steps"] = step
    return generate_sequences(_Rollout(), _ShardingManager(), prompts, _Tokenizer(), 1, dp_rank)


def test_generate_sequences_is_seeded_per_step_and_rank_and_reports_the_sync():
    """Invariant: the same (seed, step, dp rank) samples the same responses whatever the global RNG did before;
    another rank or step samples others; eos/pad ids come from the tokenizer; the weight-sync time is reported."""
    first = _generate(step=3, dp_rank=0)
    torch.rand(5)  # the trainer's RNG moves on between calls
    again = _generate(step=3, dp_rank=0)
    assert torch.equal(first.batch["responses"], again.batch["responses"])
    assert not torch.equal(first.batch["responses"], _generate(step=3, dp_rank=1).batch["responses"])
    assert not torch.equal(first.batch["responses"], _generate(step=4, dp_rank=0).batch["responses"])
    assert (first.meta_info["eos_token_id"], first.meta_info["pad_token_id"]) == (2, 0)
    assert first.meta_info["metrics"]["timing_s/update_weights"] >= 0
    assert first.batch["responses"].device.type == "cpu"
