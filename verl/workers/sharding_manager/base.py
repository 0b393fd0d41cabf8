"""``BaseShardingManager``: a context around generation plus batch pre/post-processing hooks (upstream name)."""

from __future__ import annotations

from verl.protocol import DataProto

__all__ = ["BaseShardingManager"]


class BaseShardingManager:
    """Entering makes the trained weights usable by the rollout; leaving gives the memory back to training.

    ``preprocess_data`` / ``postprocess_data`` adapt a data-parallel shard to the rollout's layout (e.g. gather
    over an inference tensor-parallel group); the identity here.
    """

    def __enter__(self) -> BaseShardingManager:
        return self

    def __exit__(self, exc_type, exc_value, traceback) -> None:
        return None

    def preprocess_data(self, data: DataProto) -> DataProto:
        return data

    def postprocess_data(self, data: DataProto) -> DataProto:
        return data
