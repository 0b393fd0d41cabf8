"""Balanced partitions of sequences by length: dynamic micro-batches (`use_dynamic_bsz`) and DP balancing.

With `use_dynamic_bsz=True` a worker splits its batch into micro-batches by a token budget
(`actor_rollout_ref.actor.ppo_max_token_len_per_gpu`, `*.log_prob_max_token_len_per_gpu`,
`critic.ppo_max_token_len_per_gpu`, each times the Ulysses SP size) instead of by a fixed count:

    n = max(ceil(total_tokens / max_token_len), min_num_micro_batch)   -> MAX over the DP group
    partitions = Karmarkar-Karp(workload(seqlen), n)                   -> each within the token budget
    micro_batches = [batch[p] for p in partitions];  restore_dynamic_batch(outputs, partitions) undoes the order

Upstream names: `karmarkar_karp`, `greedy_partition`, `get_seqlen_balanced_partitions`, `log_seqlen_unbalance`,
`calculate_workload`, `ceildiv`, `roundup_divisible`, `rearrange_micro_batches`, `get_reverse_idx`,
`prepare_dynamic_batch`, `restore_dynamic_batch`. Unlike upstream, a micro-batch never exceeds the token budget
when the count can be raised to fit (upstream only sets the count to ceil(total / budget), which a partition
can overshoot), and user errors raise ValueError naming the config key.
"""

from __future__ import annotations

import heapq
import itertools
import logging
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from tensordict import TensorDict

logger = logging.getLogger(__name__)

__all__ = [
    "balance_batch",
    "calculate_workload",
    "ceildiv",
    "get_reverse_idx",
    "get_seqlen_balanced_partitions",
    "greedy_partition",
    "karmarkar_karp",
    "log_seqlen_unbalance",
    "prepare_dynamic_batch",
    "rearrange_micro_batches",
    "restore_dynamic_batch",
    "roundup_divisible",
]

MAX_TOKEN_LEN_KEYS = (
    "actor_rollout_ref.actor.ppo_max_token_len_per_gpu (update), "
    "actor_rollout_ref.rollout/ref.log_prob_max_token_len_per_gpu (log-probs), critic.ppo_max_token_len_per_gpu"
)


def ceildiv(a: int, b: int) -> int:
    """ceil(a / b) for integers: ceildiv(7, 3) = 3, ceildiv(6, 3) = 2."""
    return -(a // -b)


def roundup_divisible(a: int, b: int) -> int:
    """Smallest multiple of b that is >= a: roundup_divisible(7, 4) = 8."""
    return ceildiv(a, b) * b


def calculate_workload(seqlen_list: torch.Tensor) -> torch.Tensor:
    """Relative cost of a sequence: 24576 * s + s^2.

    FLOPs of a dense block ~ 12 h^2 s (linear layers) + 2 h s^2 (attention); divided by 2h with h = 4096 this is
    24576 s + s^2, so long sequences weigh more than their token count.
    """
    return 24576 * seqlen_list + seqlen_list**2


# ----------------------------------------------------------------------------------------------------------------
# partitioning
# ----------------------------------------------------------------------------------------------------------------


@dataclass
class _PartialPartition:
    """k subsets (index lists) with their sums, kept sorted by sum, largest first."""

    sums: list[int]
    subsets: list[list[int]]

    @property
    def spread(self) -> int:
        return self.sums[0] - self.sums[-1]

    def merged_with(self, other: _PartialPartition) -> _PartialPartition:
        """Pair this partition's largest subset with the other's smallest, and so on (the differencing step)."""
        k = len(self.sums)
        pairs = [(self.sums[i] + other.sums[k - 1 - i], self.subsets[i] + other.subsets[k - 1 - i]) for i in range(k)]
        pairs.sort(key=lambda pair: (pair[0], len(pair[1])), reverse=True)
        return _PartialPartition([s for s, _ in pairs], [items for _, items in pairs])


def _initial_partitions(seqlen_list: list[int], k: int, equal_size: bool) -> list[_PartialPartition]:
    """One partial partition per item, or (equal_size) per group of k consecutive sorted items."""
    order = sorted(range(len(seqlen_list)), key=lambda i: (seqlen_list[i], i))
    if not equal_size:
        return [_PartialPartition([seqlen_list[i]] + [0] * (k - 1), [[i]] + [[] for _ in range(k - 1)]) for i in order]
    partials = []
    for start in range(0, len(order), k):
        group = sorted(order[start : start + k], key=lambda i: (seqlen_list[i], i), reverse=True)
        partials.append(_PartialPartition([seqlen_list[i] for i in group], [[i] for i in group]))
    return partials


def _check_partition_args(seqlen_list: list[int], k_partitions: int, equal_size: bool) -> None:
    if k_partitions < 1:
        raise ValueError(f"k_partitions must be >= 1, got {k_partitions}.")
    if len(seqlen_list) < k_partitions:
        raise ValueError(f"cannot split {len(seqlen_list)} items into {k_partitions} non-empty partitions.")
    if equal_size and len(seqlen_list) % k_partitions != 0:
        raise ValueError(
            f"equal_size partitions need the item count {len(seqlen_list)} to be divisible by {k_partitions} "
            "(e.g. the batch size by the DP world size)."
        )


def karmarkar_karp(seqlen_list: list[int], k_partitions: int, equal_size: bool) -> list[list[int]]:
    """Largest differencing method (Karmarkar-Karp) for balanced k-way partitioning of `seqlen_list`.

    Repeatedly merges the two partial partitions with the largest spread (max - min subset sum), pairing large
    subsets with small ones. Returns k index lists; with equal_size each holds len / k items.
    """
    _check_partition_args(seqlen_list, k_partitions, equal_size)
    tie = itertools.count()  # deterministic order among equal spreads
    heap = [(-p.spread, next(tie), p) for p in _initial_partitions(seqlen_list, k_partitions, equal_size)]
    heapq.heapify(heap)
    while len(heap) > 1:
        _, _, first = heapq.heappop(heap)
        _, _, second = heapq.heappop(heap)
        merged = first.merged_with(second)
        heapq.heappush(heap, (-merged.spread, next(tie), merged))
    return heap[0][2].subsets


def greedy_partition(seqlen_list: list[int], k_partitions: int, equal_size: bool) -> list[list[int]]:
    """Assign items in order to the currently lightest partition (equal_size adds a bias so counts stay equal)."""
    _check_partition_args(seqlen_list, k_partitions, equal_size)
    bias = sum(seqlen_list) + 1 if equal_size else 0
    partitions: list[list[int]] = [[] for _ in range(k_partitions)]
    sums = [0] * k_partitions
    for i, seqlen in enumerate(seqlen_list):
        lightest = min(range(k_partitions), key=lambda j: sums[j])
        partitions[lightest].append(i)
        sums[lightest] += seqlen + bias
    return partitions


def get_seqlen_balanced_partitions(seqlen_list: list[int], k_partitions: int, equal_size: bool) -> list[list[int]]:
    """Karmarkar-Karp partitions of item indices with balanced sums; each partition non-empty and sorted.

    Raises ValueError for fewer items than partitions, or equal_size with a count not divisible by k.
    """
    partitions = karmarkar_karp(seqlen_list, k_partitions, equal_size)
    # internal invariants of the algorithm (not user input): complete, disjoint, non-empty
    assert sorted(itertools.chain.from_iterable(partitions)) == list(range(len(seqlen_list)))
    assert all(partitions), "Karmarkar-Karp produced an empty partition"
    return [sorted(p) for p in partitions]


def log_seqlen_unbalance(seqlen_list: list[int], partitions: list[list[int]], prefix: str) -> dict[str, float]:
    """Metrics of the token sums before (contiguous equal chunks) and after balancing, keyed `{prefix}/...`."""
    k = len(partitions)
    chunk = max(1, len(seqlen_list) // k)
    before = [sum(seqlen_list[i : i + chunk]) for i in range(0, len(seqlen_list), chunk)]
    after = [sum(seqlen_list[i] for i in p) for p in partitions]
    return {
        f"{prefix}/min": min(before),
        f"{prefix}/max": max(before),
        f"{prefix}/minmax_diff": max(before) - min(before),
        f"{prefix}/balanced_min": min(after),
        f"{prefix}/balanced_max": max(after),
        f"{prefix}/mean": sum(before) / k,
    }


def balance_batch(batch: Any, dp_size: int, *, prefix: str = "global_seqlen") -> dict[str, float]:
    """``trainer.balance_batch``: reorder ``batch`` (a DataProto, in place) so that each of the ``dp_size``
    contiguous equal chunks, which is what the data-parallel dispatch hands rank 0, 1, ..., holds about the same
    number of tokens (Karmarkar-Karp over ``attention_mask`` sums, equal row counts). Returns the
    :func:`log_seqlen_unbalance` metrics under ``prefix``.

    Only which rank computes which row changes: the losses are normalised by the global token count, so one
    mini-batch's update is the same (up to float summation order) as without balancing; with several mini-batches
    per step their composition changes, as upstream.
    """
    rows = len(batch)
    if dp_size <= 1 or rows < dp_size:
        return {}
    if rows % dp_size:
        raise ValueError(
            f"trainer.balance_batch: {rows} rows cannot be split equally over {dp_size} data-parallel ranks; "
            "make data.train_batch_size * actor_rollout_ref.rollout.n divisible by the number of GPUs"
        )
    seqlens = batch.batch["attention_mask"].sum(-1).tolist()
    partitions = get_seqlen_balanced_partitions(seqlens, dp_size, equal_size=True)
    batch.reorder(torch.tensor([row for part in partitions for row in part]))
    return log_seqlen_unbalance(seqlens, partitions, prefix)


# ----------------------------------------------------------------------------------------------------------------
# dynamic micro-batches
# ----------------------------------------------------------------------------------------------------------------


def _is_dataproto(batch: Any) -> bool:
    return not isinstance(batch, TensorDict) and hasattr(batch, "batch") and hasattr(batch, "non_tensor_batch")


def _effective_seqlens(tensors: TensorDict) -> torch.Tensor:
    """(B,) int64 real token count per sequence: nested input_ids offsets, else attention_mask row sums."""
    input_ids = tensors.get("input_ids", None)
    if input_ids is not None and input_ids.is_nested:
        return input_ids.offsets().diff().long()
    if "attention_mask" not in tensors.keys():
        raise ValueError("dynamic batching needs 'attention_mask' (B, S) or a nested 'input_ids' in the batch.")
    return tensors["attention_mask"].sum(dim=1).long()


def _sync_max(value: int, dp_group: dist.ProcessGroup | None) -> int:
    """MAX of an int over the DP group (identity when torch.distributed is not initialised)."""
    if not dist.is_initialized():
        return value
    if dist.get_backend(dp_group) == "gloo":
        device = "cpu"
    else:
        from verl.utils.device import get_device_name

        device = get_device_name()
    tensor = torch.tensor([value], device=device)
    dist.all_reduce(tensor, op=dist.ReduceOp.MAX, group=dp_group)
    return int(tensor.item())


def _fits(partitions: list[list[int]], seqlens: list[int], max_token_len: int) -> bool:
    return all(sum(seqlens[i] for i in p) <= max_token_len for p in partitions)


def _local_num_micro_batches(seqlens: list[int], workloads: list[int], max_token_len: int, floor: int) -> int:
    """Smallest count >= floor whose balanced partitions all fit the token budget (at most one per sequence)."""
    count = max(floor, min(len(seqlens), ceildiv(sum(seqlens), max_token_len)))
    while count < len(seqlens):
        if _fits(get_seqlen_balanced_partitions(workloads, count, equal_size=False), seqlens, max_token_len):
            break
        count += 1
    return count


def _order_for_pipeline(partitions: list[list[int]], workloads: list[int]) -> list[list[int]]:
    """Heaviest micro-batches in the middle, light ones at both ends (shorter pipeline warm-up and cool-down)."""
    by_load = sorted(partitions, key=lambda p: (sum(workloads[i] for i in p), p[0]), reverse=True)
    return by_load[::2][::-1] + by_load[1::2]


def _micro_batch_indices(
    tensors: TensorDict,
    max_token_len: int,
    dp_group: dist.ProcessGroup | None,
    num_batches_divided_by: int | None,
    same_micro_num_in_dp: bool,
    min_num_micro_batch: int | None,
    use_dynamic_bsz_balance: bool,
) -> list[list[int]]:
    """Index lists of the balanced micro-batches of one batch (see the module docstring)."""
    seqlens = _effective_seqlens(tensors).cpu().tolist()
    if not seqlens:
        raise ValueError("cannot build dynamic micro-batches from an empty batch.")
    longest = max(seqlens)
    if longest > max_token_len:
        raise ValueError(
            f"a sequence has {longest} tokens but the dynamic-batch token budget is {max_token_len}; raise "
            f"{MAX_TOKEN_LEN_KEYS} to at least data.max_prompt_length + data.max_response_length."
        )
    workloads = calculate_workload(torch.tensor(seqlens, dtype=torch.int64)).tolist()
    count = _local_num_micro_batches(seqlens, workloads, max_token_len, min_num_micro_batch or 1)
    if same_micro_num_in_dp:
        count = _sync_max(count, dp_group)
    if num_batches_divided_by is not None:
        count = roundup_divisible(count, num_batches_divided_by)
    if count > len(seqlens):
        raise ValueError(
            f"{count} micro-batches requested (DP sync / min_num_micro_batch / virtual pipeline rounding) but the "
            f"local batch has only {len(seqlens)} sequences; use a larger batch per rank."
        )
    partitions = get_seqlen_balanced_partitions(workloads, count, equal_size=False)
    if not _fits(partitions, seqlens, max_token_len):
        logger.warning("a dynamic micro-batch exceeds max_token_len=%d after DP synchronisation", max_token_len)
    return _order_for_pipeline(partitions, workloads) if use_dynamic_bsz_balance else partitions


def _select_rows(batch: Any, indices: list[int]) -> Any:
    if _is_dataproto(batch):
        return batch.select_idxs(indices)
    return batch[torch.tensor(indices, dtype=torch.long)]


def rearrange_micro_batches(
    batch: Any,
    max_token_len: int,
    dp_group: dist.ProcessGroup | None = None,
    num_batches_divided_by: int | None = None,
    same_micro_num_in_dp: bool = True,
    min_num_micro_batch: int | None = None,
    use_dynamic_bsz_balance: bool = True,
) -> tuple[list[Any], list[list[int]]]:
    """Split a batch into micro-batches of at most `max_token_len` real tokens, balanced by workload.

    Args:
        batch: TensorDict with "attention_mask" (B, S) (or a nested "input_ids"), or a DataProto holding one.
        max_token_len: token budget per micro-batch (ppo_max_token_len_per_gpu x Ulysses SP size).
        dp_group: group whose ranks must agree on the number of micro-batches (same_micro_num_in_dp).
        num_batches_divided_by: round the count up to a multiple (virtual pipeline stages).
        min_num_micro_batch: lower bound on the count.
        use_dynamic_bsz_balance: order micro-batches heavy-in-the-middle (else in partition order).

    Returns:
        (micro_batches, indices): micro-batches of the same type as `batch`, and the original row indices of
        each (sorted within a micro-batch); `restore_dynamic_batch` inverts the order.
    """
    tensors = batch.batch if _is_dataproto(batch) else batch
    indices = _micro_batch_indices(
        tensors,
        max_token_len,
        dp_group,
        num_batches_divided_by,
        same_micro_num_in_dp,
        min_num_micro_batch,
        use_dynamic_bsz_balance,
    )
    return [_select_rows(batch, idx) for idx in indices], indices


def get_reverse_idx(idx_map: list[int]) -> list[int]:
    """Inverse permutation: output[idx_map[i]] = i."""
    reverse = [0] * len(idx_map)
    for position, index in enumerate(idx_map):
        reverse[index] = position
    return reverse


def prepare_dynamic_batch(
    data: Any,
    max_token_len: int,
    dp_group: dist.ProcessGroup | None = None,
    num_batches_divided_by: int | None = None,
    same_micro_num_in_dp: bool = True,
    min_num_micro_batch: int | None = None,
    use_dynamic_bsz_balance: bool = True,
) -> tuple[list[Any], list[list[int]]]:
    """DataProto -> (list of micro-batch DataProtos, their row indices); see `rearrange_micro_batches`."""
    if not _is_dataproto(data):
        raise TypeError(f"prepare_dynamic_batch expects a DataProto, got {type(data).__name__}.")
    return rearrange_micro_batches(
        data,
        max_token_len,
        dp_group=dp_group,
        num_batches_divided_by=num_batches_divided_by,
        same_micro_num_in_dp=same_micro_num_in_dp,
        min_num_micro_batch=min_num_micro_batch,
        use_dynamic_bsz_balance=use_dynamic_bsz_balance,
    )


def restore_dynamic_batch(data: torch.Tensor, batch_idx_list: list[list[int]]) -> torch.Tensor:
    """Concatenated micro-batch outputs (B, ...) back in the original row order (nested tensors too)."""
    order = list(itertools.chain.from_iterable(batch_idx_list))
    if len(order) != data.shape[0]:
        raise ValueError(f"{len(order)} indices for {data.shape[0]} rows: pass the indices of these micro-batches.")
    reverse = get_reverse_idx(order)
    if data.is_nested:
        rows = data.unbind()
        return torch.nested.as_nested_tensor([rows[i] for i in reverse], layout=torch.jagged)
    return data[torch.tensor(reverse, dtype=torch.long, device=data.device)]
