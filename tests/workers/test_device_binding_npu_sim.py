"""Which device a worker binds before it joins its process group, on both worker paths (simulated Ascend).

Invariant: a worker of local rank ``r`` binds device ``r`` when its process sees the whole node (Ray told not to
set ``ASCEND_RT_VISIBLE_DEVICES``: ``RAY_EXPERIMENTAL_NOSET_ASCEND_RT_VISIBLE_DEVICES=1``, as the Ascend recipes
export, or torchrun), and device 0 when Ray gave the process its one device (the variable names one id). The
legacy path used to bind device 0 in the first case (every rank of a node on one NPU) and the engine path device
``r`` in the second (an invalid ordinal for every local rank but 0); both now start through
``verl.workers.core.process_group.init_process_group``, called here with the coordinates from the environment and
with explicit ones.
"""

from __future__ import annotations

import os
import socket

import pytest

from verl.utils.testing.dist import spawn


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _bind_on_both_paths(rank: int, ports: tuple[int, int], visible: int, local_rank: int, expected: int) -> None:
    import torch.distributed as dist

    from verl.utils.platform.npu_sim import simulated_ascend

    os.environ.pop("VERL_PLATFORM", None)
    os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK=str(local_rank), LOCAL_WORLD_SIZE=str(local_rank + 1))
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    with simulated_ascend(device_count=visible):
        from verl.utils.device import get_device_id, get_torch_device
        from verl.workers.core.process_group import init_process_group

        os.environ["MASTER_PORT"] = str(ports[0])
        init_process_group()  # coordinates from RANK / WORLD_SIZE / LOCAL_RANK
        assert get_device_id() == expected, f"env coordinates bound npu:{get_device_id()}, expected npu:{expected}"
        dist.destroy_process_group()
        get_torch_device().set_device(0)
        os.environ["MASTER_PORT"] = str(ports[1])
        init_process_group(rank=0, world_size=1, local_rank=local_rank)
        assert get_device_id() == expected, f"explicit coordinates bound npu:{get_device_id()}, expected npu:{expected}"
        dist.destroy_process_group()


@pytest.mark.parametrize(
    "visible, local_rank, expected",
    [(4, 2, 2), (1, 2, 0), (1, 0, 0)],
    ids=["whole-node-visible", "ray-assigned-device", "single-device"],
)
def test_both_worker_paths_bind_the_local_ranks_device(visible, local_rank, expected):
    spawn(_bind_on_both_paths, args=((_free_port(), _free_port()), visible, local_rank, expected), nprocs=1)


def test_local_rank_beyond_the_visible_devices_is_refused(npu_sim):
    """Two visible devices, LOCAL_RANK=3: the error names LOCAL_RANK, the count and the visible-devices variable."""
    import torch

    from verl.utils.device import get_local_device_index
    from verl.utils.platform.npu_sim import install

    before = torch.npu.device_count()
    install(device_count=2)
    try:
        with pytest.raises(RuntimeError, match=r"LOCAL_RANK=3 but this process sees 2 npu device\(s\) \(ASCEND_RT"):
            get_local_device_index(3)
        assert get_local_device_index(1) == 1
    finally:
        install(device_count=before)
