"""Grad norm, collectives over dicts of tensors and distributed statistics (upstream `verl_F` names).

All collectives take an explicit process group (None = the default group) and work with any backend
(gloo on CPU, nccl/hccl on accelerators); tensors stay on the device they are on.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Union

import torch
import torch.distributed as dist
from torch import nn

if TYPE_CHECKING:
    from tensordict import TensorDict

__all__ = [
    "allgather_dict_into_dict",
    "allgather_dict_tensors",
    "broadcast_dict_tensor",
    "compute_grad_norm",
    "distributed_masked_mean",
    "distributed_mean_max_min_std",
    "split_dict_tensor_into_batches",
]

TensorMap = Union[dict[str, torch.Tensor], "TensorDict"]


def _is_tensordict(value: Any) -> bool:
    # tensordict costs ~2 s to import; only look it up when a caller may actually hold one
    from tensordict import TensorDict

    return isinstance(value, TensorDict)


def compute_grad_norm(model: nn.Module) -> float:
    """Sum of squared gradient entries over all parameters (upstream returns the *squared* L2 norm; keep it)."""
    total = 0.0
    for param in model.parameters():
        if param.grad is not None:
            total += torch.sum(torch.square(param.grad.detach().float())).item()
    return total


def broadcast_dict_tensor(tensors: TensorMap, src: int, group: dist.ProcessGroup | None) -> None:
    """Broadcast every tensor in place from rank `src`, in sorted key order (identical on every rank)."""
    for key in sorted(tensors.keys()):
        dist.broadcast(tensors[key], src=src, group=group, async_op=False)


def allgather_dict_tensors(tensors: TensorMap, size: int, group: dist.ProcessGroup | None, dim: int = 0) -> TensorMap:
    """All-gather each tensor from the `size` ranks of `group` and concatenate along `dim`.

    A TensorDict input gives a TensorDict with batch size `batch_size[0] * size` (upstream semantics: gather on
    dim 0); a dict gives a dict.
    """
    is_tensordict = _is_tensordict(tensors)
    source = tensors.to_dict() if is_tensordict else tensors
    output = {}
    for key in sorted(source.keys()):
        value = source[key]
        parts = [torch.empty_like(value) for _ in range(size)]
        dist.all_gather(parts, value.contiguous(), group=group, async_op=False)
        output[key] = torch.cat(parts, dim=dim)
    if is_tensordict:
        from tensordict import TensorDict

        return TensorDict(source=output, batch_size=[tensors.batch_size[0] * size])
    return output


def allgather_dict_into_dict(data: dict, group: dist.ProcessGroup | None = None) -> dict[str, list]:
    """All-gather a picklable dict from every rank into {key: [value of rank 0, value of rank 1, ...]}."""
    if not isinstance(data, dict):
        raise TypeError(f"allgather_dict_into_dict expects a dict, got {type(data).__name__}.")
    gathered: list[dict | None] = [None] * dist.get_world_size(group=group)
    dist.all_gather_object(gathered, data, group=group)
    merged: dict[str, list] = {}
    for rank_data in gathered:
        for key, value in rank_data.items():
            merged.setdefault(key, []).append(value)
    return merged


def split_dict_tensor_into_batches(tensors: TensorDict, batch_size: int) -> list[TensorDict]:
    """Split a TensorDict into equal batches of `batch_size` rows; the batch size must divide evenly."""
    total = tensors.batch_size[0]
    if batch_size <= 0 or total % batch_size != 0:
        raise ValueError(
            f"cannot split a batch of {total} rows into batches of {batch_size}: it must divide evenly "
            "(check the mini/micro batch size config keys)."
        )
    return list(tensors.split(batch_size))


def distributed_mean_max_min_std(
    local_tensor: torch.Tensor, compute_max: bool = True, compute_min: bool = True, compute_std: bool = True
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None, torch.Tensor | None]:
    """(mean, max, min, std) of the elements of `local_tensor` over all ranks of the default group.

    std is the unbiased (n - 1) standard deviation around the global mean; disabled statistics are None.
    """
    local_sum = torch.sum(local_tensor)
    count = torch.tensor(local_tensor.numel(), device=local_tensor.device, dtype=local_sum.dtype)
    dist.all_reduce(local_sum, op=dist.ReduceOp.SUM)
    dist.all_reduce(count, op=dist.ReduceOp.SUM)
    mean = local_sum / count
    maximum = minimum = std = None
    if compute_max:
        maximum = torch.max(local_tensor)
        dist.all_reduce(maximum, op=dist.ReduceOp.MAX)
    if compute_min:
        minimum = torch.min(local_tensor)
        dist.all_reduce(minimum, op=dist.ReduceOp.MIN)
    if compute_std:
        square_diff = torch.sum((local_tensor - mean) ** 2)
        dist.all_reduce(square_diff, op=dist.ReduceOp.SUM)
        std = torch.sqrt(square_diff / (count - 1))
    return mean, maximum, minimum, std


def distributed_masked_mean(local_tensor: torch.Tensor, local_mask: torch.Tensor) -> torch.Tensor:
    """sum(x * mask) / sum(mask) over all ranks of the default group."""
    local_sum = torch.sum(local_tensor * local_mask)
    local_count = torch.sum(local_mask).to(local_sum.dtype)
    dist.all_reduce(local_sum, op=dist.ReduceOp.SUM)
    dist.all_reduce(local_count, op=dist.ReduceOp.SUM)
    return local_sum / local_count
