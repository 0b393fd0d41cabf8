"""Typed facades over the Ray worker groups, so readers and IDEs can follow every driver → worker call.

A ``RayWorkerGroup`` binds each ``@register``-ed worker method as an attribute at run time; these thin classes
name the methods the trainer uses, with their types, and forward to the group. Nothing here is called by a
string name.
"""

from __future__ import annotations

from verl import DataProto


class _WorkerGroupFacade:
    """What every role's group offers: its size, model initialisation and checkpoints."""

    def __init__(self, worker_group):
        self.worker_group = worker_group

    @property
    def world_size(self) -> int:
        return self.worker_group.world_size

    def init_model(self) -> None:
        self.worker_group.init_model()

    def save_checkpoint(self, local_path: str, global_step: int) -> None:
        self.worker_group.save_checkpoint(local_path, None, global_step, None)

    def load_checkpoint(self, local_path: str) -> None:
        self.worker_group.load_checkpoint(local_path, None, False)


class ActorRolloutRefGroup(_WorkerGroupFacade):
    """Methods of ``ActorRolloutRefWorker`` (legacy or engine path) that the trainer calls."""

    def generate_sequences(self, prompts: DataProto) -> DataProto:
        return self.worker_group.generate_sequences(prompts)

    def compute_log_prob(self, data: DataProto) -> DataProto:
        return self.worker_group.compute_log_prob(data)

    def compute_ref_log_prob(self, data: DataProto) -> DataProto:
        return self.worker_group.compute_ref_log_prob(data)

    def update_actor(self, data: DataProto) -> DataProto:
        return self.worker_group.update_actor(data)


class CriticGroup(_WorkerGroupFacade):
    """Methods of ``CriticWorker`` (legacy ``fsdp_workers`` or engine ``engine_workers``) that the trainer calls."""

    def compute_values(self, data: DataProto) -> DataProto:
        return self.worker_group.compute_values(data)

    def update_critic(self, data: DataProto) -> DataProto:
        return self.worker_group.update_critic(data)
