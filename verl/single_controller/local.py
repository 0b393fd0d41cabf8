"""``LocalWorkerGroup``: run a worker group inside the driver process, for step-debugging.

Same ``@register`` dispatch / collect as the Ray backend, but every rank's worker is a plain object in this
process, so breakpoints and stack traces reach into worker code:

    wg = LocalWorkerGroup(ClassWithInitArgs(ActorWorker, config), world_size=1)
    wg.init_model()
    out = wg.compute_log_prob(batch)       # dispatch -> ActorWorker.compute_log_prob -> collect

Each call runs with that rank's ``RANK`` / ``WORLD_SIZE`` / ``LOCAL_RANK`` / ``MASTER_ADDR`` / ``MASTER_PORT``
in ``os.environ`` (restored afterwards), on deep copies of its arguments (as if they had crossed a process
boundary). Ranks run one after another, so with ``world_size > 1`` collectives
between ranks cannot work (they would wait for each other forever): use ``world_size=1`` for anything that
calls ``torch.distributed``, and ``world_size > 1`` only to exercise dispatch logic.
"""

from __future__ import annotations

import asyncio
import copy
import inspect
import os
from typing import Any
from unittest import mock

from verl.single_controller.base.worker import get_free_port
from verl.single_controller.base.worker_group import ClassWithInitArgs, WorkerGroup

__all__ = ["LocalWorkerGroup"]


class LocalWorkerGroup(WorkerGroup):
    """A worker group whose workers live in this process (see the module docstring)."""

    def __init__(self, cls_with_init: ClassWithInitArgs, world_size: int = 1) -> None:
        if world_size < 1:
            raise ValueError(f"world_size must be >= 1, got {world_size}")
        super().__init__(resource_pool=None)
        self.cls_with_init = cls_with_init
        self._master_addr, self._master_port = "127.0.0.1", str(get_free_port())
        self._envs = [self._rank_env(rank, world_size) for rank in range(world_size)]
        for env in self._envs:
            with mock.patch.dict(os.environ, env):
                self._workers.append(cls_with_init())
        self._worker_names = [f"local_{type(w).__name__}_{rank}" for rank, w in enumerate(self._workers)]
        self._bind_worker_method(cls_with_init.cls)

    def _rank_env(self, rank: int, world_size: int) -> dict[str, str]:
        return {
            "RANK": str(rank),
            "WORLD_SIZE": str(world_size),
            "LOCAL_RANK": str(rank),
            "LOCAL_WORLD_SIZE": str(world_size),
            "MASTER_ADDR": self._master_addr,
            "MASTER_PORT": self._master_port,
        }

    @property
    def workers(self) -> list[Any]:
        return self._workers

    @property
    def worker_names(self) -> list[str]:
        return self._worker_names

    def _call(self, rank: int, method_name: str, args: tuple, kwargs: dict) -> Any:
        # Deep copies stand in for the process boundary: as under Ray, a worker that mutates its input (or
        # another rank's shard, which may be the same object) cannot change what the driver or other ranks see.
        args, kwargs = copy.deepcopy((args, kwargs))
        with mock.patch.dict(os.environ, self._envs[rank]):
            result = getattr(self._workers[rank], method_name)(*args, **kwargs)
            result = asyncio.run(result) if inspect.iscoroutine(result) else result
        return copy.deepcopy(result)

    def execute_all_async(self, method_name: str, *args, **kwargs) -> list:
        calls = self._per_rank_calls(args, kwargs)
        return [self._call(rank, method_name, a, k) for rank, (a, k) in enumerate(calls)]

    def execute_rank_zero_async(self, method_name: str, *args, **kwargs) -> Any:
        return self._call(0, method_name, args, kwargs)
