"""LocalWorkerGroup runs the full group-method path (dispatch -> execute -> collect -> unpad) in-process.

Each rank's worker adds ``1000 * rank`` to the rows it receives, so the output shows which rank handled
which row.
"""

import os

import torch

from verl import DataProto
from verl.single_controller.base import ClassWithInitArgs, Worker
from verl.single_controller.base.decorator import (
    Dispatch,
    Execute,
    make_nd_compute_dataproto_dispatch_fn,
    register,
)
from verl.single_controller.local import LocalWorkerGroup


class MarkWorker(Worker):
    def __init__(self, offset: int = 0):
        super().__init__()
        self.offset = offset
        # mesh "pair": both ranks form one dp group (like tp=2); only rank 0 returns output
        self._register_dispatch_collect_info("pair", dp_rank=0, is_collect=self.rank == 0)

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def mark(self, data: DataProto) -> DataProto:
        data.batch["y"] = data.batch["y"] + 1000 * self.rank + self.offset
        return data

    @register(dispatch_mode=make_nd_compute_dataproto_dispatch_fn("pair"))
    def mark_pair(self, data: DataProto) -> DataProto:
        return self.mark(data)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def env_rank(self) -> str:
        return os.environ["RANK"]

    @register(dispatch_mode=Dispatch.ALL_TO_ALL, execute_mode=Execute.RANK_ZERO)
    async def whoami(self) -> int:
        return self.rank


def rows(n, padding=False):
    return DataProto.from_dict(tensors={"y": torch.arange(n)}, auto_padding=padding)


def test_local_group_dispatches_like_ray():
    """2 ranks: DP split, per-call rank env, rank-zero async execution, nd mesh with one collector."""
    wg = LocalWorkerGroup(ClassWithInitArgs(MarkWorker, offset=10), world_size=2)
    assert wg.world_size == 2
    # rows 0,1 -> rank 0 (+10); rows 2,3 -> rank 1 (+1010)
    assert wg.mark(rows(4)).batch["y"].tolist() == [10, 11, 1012, 1013]
    assert wg.env_rank() == ["0", "1"]
    assert wg.whoami() == 0
    # mesh "pair": both ranks get all 4 rows, only rank 0's output is kept
    assert wg.mark_pair(rows(4)).batch["y"].tolist() == [10, 11, 12, 13]


def test_local_group_strips_auto_padding():
    """3 padded rows on 2 ranks: shards [0,1] and [2,2(pad)]; the pad row is removed from the output."""
    wg = LocalWorkerGroup(ClassWithInitArgs(MarkWorker), world_size=2)
    out = wg.mark(rows(3, padding=True))
    assert out.batch["y"].tolist() == [0, 1, 1002]
