"""Small torch utilities under upstream verl's names (`verl.utils.torch_functional`, imported as `verl_F`).

Where the maths lives:
* this module: log-probs and entropy under upstream names, masked statistics, response masks, padding helpers;
* `verl.utils.logprob`: chunked and fused log-prob/entropy that never hold a full-vocabulary fp32 tensor
  (`log_probs_and_entropy_chunked`, `fused_linear_log_probs_and_entropy`, re-exported here);
* `verl.utils.lr_schedules`: the warmup schedules (re-exported here);
* `verl.utils.tensor_collectives`: grad norm, dict-of-tensor collectives and distributed statistics (re-exported).

Differences from upstream, on purpose:
* nothing happens at import: the flash-attn / torch_npu cross-entropy kernels are probed on first use, and the
  upstream flags `FLAH_ATTN_CROSS_ENTROPY_LOSS_AVAILABLE` (sic) / `NPU_CROSS_ENTROPY_LOSS_AVAILABLE` are computed
  when read;
* `entropy_from_logits_with_chunking` accepts any leading shape and its backward recomputes each chunk;
* `post_process_logits` divides by the temperature out of place (field-report item 3);
* bad shapes and arguments raise ValueError/TypeError instead of asserting.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from functools import cache
from typing import Any

import torch
import torch.nn.functional as F

from verl.utils.logprob import (
    entropy_chunked,
    fused_linear_log_probs_and_entropy,
    log_probs_and_entropy_chunked,
)
from verl.utils.lr_schedules import (
    get_constant_schedule_with_warmup,
    get_cosine_schedule_with_warmup,
    get_wsd_schedule_with_warmup,
)
from verl.utils.platform.registry import platform_of_device_type
from verl.utils.tensor_collectives import (
    allgather_dict_into_dict,
    allgather_dict_tensors,
    broadcast_dict_tensor,
    compute_grad_norm,
    distributed_masked_mean,
    distributed_mean_max_min_std,
    split_dict_tensor_into_batches,
)
from verl.utils.torch_padding import _expand_mask as _expand_mask  # noqa: F401 (upstream private names)
from verl.utils.torch_padding import _make_causal_mask as _make_causal_mask  # noqa: F401
from verl.utils.torch_padding import (
    expand_as_nested,
    get_unpad_data,
    pad_2d_list_to_length,
    pad_sequence_to_length,
    postprocess_data,
    prepare_decoder_attention_mask,
    remove_pad_token,
    tokenize_and_postprocess_data,
)

__all__ = [
    "allgather_dict_into_dict",
    "allgather_dict_tensors",
    "broadcast_dict_tensor",
    "calculate_sum_pi_squared_from_logits",
    "check_device_is_available",
    "clip_by_value",
    "compute_grad_norm",
    "distributed_masked_mean",
    "distributed_mean_max_min_std",
    "entropy_chunked",
    "entropy_from_logits",
    "entropy_from_logits_with_chunking",
    "expand_as_nested",
    "fused_linear_log_probs_and_entropy",
    "gather_from_labels",
    "get_constant_schedule_with_warmup",
    "get_cosine_schedule_with_warmup",
    "get_response_mask",
    "get_unpad_data",
    "get_wsd_schedule_with_warmup",
    "log_probs_and_entropy_chunked",
    "log_probs_from_logits_all_rmpad",
    "log_probs_from_logits_response",
    "log_probs_from_logits_response_rmpad",
    "logprobs_from_logits",
    "logprobs_from_logits_flash_attn",
    "logprobs_from_logits_naive",
    "logprobs_from_logits_torch_npu",
    "logprobs_from_logits_v2",
    "masked_mean",
    "masked_sum",
    "masked_var",
    "masked_whiten",
    "pad_2d_list_to_length",
    "pad_sequence_to_length",
    "post_process_logits",
    "postprocess_data",
    "prepare_decoder_attention_mask",
    "remove_pad_token",
    "split_dict_tensor_into_batches",
    "tokenize_and_postprocess_data",
    "use_original_torch_compile",
]


# ----------------------------------------------------------------------------------------------------------------
# optional cross-entropy kernels, probed lazily
# ----------------------------------------------------------------------------------------------------------------


@cache
def _flash_attn_cross_entropy() -> Callable | None:
    """flash-attn's Triton cross-entropy (CUDA only), or None when flash-attn is absent or cannot load."""
    try:
        module = importlib.import_module("flash_attn.ops.triton.cross_entropy")
    except (ImportError, RuntimeError, OSError):
        return None
    return getattr(module, "cross_entropy_loss", None)


@cache
def _npu_cross_entropy() -> Callable | None:
    """torch_npu's `npu_cross_entropy_loss` when an NPU is usable, else None (never imports it on other boxes)."""
    from verl.utils.device import is_torch_npu_available
    from verl.utils.platform.npu import import_torch_npu

    if not is_torch_npu_available(check_device=True):
        return None
    module, _ = import_torch_npu()
    return getattr(module, "npu_cross_entropy_loss", None)


def __getattr__(name: str) -> Any:
    # upstream's import-time flags, evaluated on first read (PEP 562) so that importing this module stays inert
    if name == "FLAH_ATTN_CROSS_ENTROPY_LOSS_AVAILABLE":
        return _flash_attn_cross_entropy() is not None
    if name == "NPU_CROSS_ENTROPY_LOSS_AVAILABLE":
        return _npu_cross_entropy() is not None
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# ----------------------------------------------------------------------------------------------------------------
# log-probs and entropy (upstream names)
# ----------------------------------------------------------------------------------------------------------------


def _check_logits_labels(logits: torch.Tensor, labels: torch.Tensor) -> None:
    if logits.dim() < 1 or labels.shape != logits.shape[:-1]:
        raise ValueError(
            f"labels shape {tuple(labels.shape)} must equal logits shape without its last (vocab) dim; "
            f"got logits {tuple(logits.shape)}."
        )


def gather_from_labels(data: torch.Tensor, label: torch.Tensor) -> torch.Tensor:
    """data (..., V), label (...) int -> data[..., label] of shape (...)."""
    _check_logits_labels(data, label)
    return torch.gather(data, -1, label.unsqueeze(-1)).squeeze(-1)


def logprobs_from_logits(logits: torch.Tensor, labels: torch.Tensor, inplace_backward: bool = True) -> torch.Tensor:
    """log softmax(logits)[labels]: logits (..., V), labels (...) -> (...).

    The logits' platform names the fused kernel (``Platform.cross_entropy_kernel``): flash-attn's cross-entropy
    on CUDA (unless VERL_DISABLE_FLASH_ATTN_CE=1), torch_npu's on an NPU; without one, or when its package does
    not import, `logprobs_from_logits_v2`. For large vocabularies prefer `log_probs_and_entropy_chunked` or the
    fused LM-head path.
    """
    _check_logits_labels(logits, labels)
    kernel = _cross_entropy_kernel(logits.device.type)
    if kernel == "flash_attn" and _flash_attn_cross_entropy() is not None:
        flat = logprobs_from_logits_flash_attn(
            logits.reshape(-1, logits.shape[-1]), labels.reshape(-1), inplace_backward=inplace_backward
        )
        return flat.view(labels.shape)
    if kernel == "torch_npu" and _npu_cross_entropy() is not None:
        return logprobs_from_logits_torch_npu(logits, labels)
    return logprobs_from_logits_v2(logits, labels)


def _cross_entropy_kernel(device_type: str) -> str | None:
    platform = platform_of_device_type(device_type)
    return None if platform is None else platform.cross_entropy_kernel()


def logprobs_from_logits_flash_attn(
    logits: torch.Tensor, labels: torch.Tensor, inplace_backward: bool = True
) -> torch.Tensor:
    """-cross_entropy via flash-attn's Triton kernel: logits (N, V), labels (N,) -> (N,) fp32."""
    kernel = _flash_attn_cross_entropy()
    if kernel is None:
        raise RuntimeError("flash-attn's cross_entropy_loss is not importable; install flash-attn>=2.4.3 (CUDA).")
    output = kernel(logits, labels, inplace_backward=inplace_backward)
    if not isinstance(output, tuple):
        raise RuntimeError("flash-attn>=2.4.3 is required: cross_entropy_loss must return (losses, z_losses).")
    return -output[0]


def logprobs_from_logits_torch_npu(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """-cross_entropy via torch_npu.npu_cross_entropy_loss: logits (..., V), labels (...) -> (...)."""
    kernel = _npu_cross_entropy()
    if kernel is None:
        raise RuntimeError("torch_npu.npu_cross_entropy_loss is unavailable: an Ascend NPU with torch_npu is needed.")
    loss, *_ = kernel(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1), reduction="none")
    return -loss.view(labels.shape)


def logprobs_from_logits_naive(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """log_softmax over the full vocabulary, then gather: (..., V), (...) -> (...). Holds a (..., V) tensor."""
    return gather_from_labels(F.log_softmax(logits, dim=-1), labels)


def logprobs_from_logits_v2(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Upstream's loop-over-rows log-probs: (..., V), (...) -> (...).

    fp32/fp64: label logit minus a per-row (first dim) logsumexp. Other dtypes: log_softmax per row in the
    input dtype (logsumexp is unstable in bf16), result in the input dtype.
    """
    _check_logits_labels(logits, labels)
    if logits.dim() == 1:
        return logprobs_from_logits_naive(logits, labels)
    if logits.dtype in (torch.float32, torch.float64):
        label_logits = gather_from_labels(logits, labels)
        row_lse = torch.stack([torch.logsumexp(row, dim=-1) for row in logits])
        return label_logits - row_lse
    rows = [logprobs_from_logits_naive(row, row_labels) for row, row_labels in zip(logits, labels)]
    return torch.stack(rows)


def clip_by_value(x: torch.Tensor, tensor_min: torch.Tensor, tensor_max: torch.Tensor) -> torch.Tensor:
    """Elementwise clamp of x to [tensor_min, tensor_max] (tensor bounds, broadcast): max(min(x, hi), lo)."""
    return torch.max(torch.min(x, tensor_max), tensor_min)


def entropy_from_logits(logits: torch.Tensor) -> torch.Tensor:
    """Entropy of softmax(logits): logsumexp(z) - sum softmax(z) * z; (..., V) -> (...), input dtype, one shot.

    Holds several (..., V) tensors (the field-report OOM); use `entropy_from_logits_with_chunking` or
    `log_probs_and_entropy_chunked(..., compute_entropy=True)` for large vocabularies.
    """
    probs = F.softmax(logits, dim=-1)
    return torch.logsumexp(logits, dim=-1) - torch.sum(probs * logits, dim=-1)


def entropy_from_logits_with_chunking(logits: torch.Tensor, chunk_size: int = 2048) -> torch.Tensor:
    """Entropy in fp32, `chunk_size` tokens at a time: (..., V) -> (...) fp32.

    Upstream accepts only (N, V) and its backward keeps every chunk's softmax; here any leading shape works
    (padded (B, S, V) and packed (1, T, V) alike) and backward recomputes each chunk (O(chunk x V) extra).
    """
    return entropy_chunked(logits, chunk_size=chunk_size)


def calculate_sum_pi_squared_from_logits(logits: torch.Tensor) -> torch.Tensor:
    """sum_v pi_v^2 = exp(logsumexp(2 z) - 2 logsumexp(z)); (..., V) -> (...). Optimal-token-baseline input."""
    return torch.exp(torch.logsumexp(2.0 * logits, dim=-1) - 2.0 * torch.logsumexp(logits, dim=-1))


def post_process_logits(
    input_ids: torch.Tensor, logits: torch.Tensor, temperature: float, top_k: int | None, top_p: float | None
) -> torch.Tensor:
    """logits / temperature, **out of place** (upstream divides in place, which breaks autograd views, item 3).

    top_k / top_p are accepted and ignored, as upstream (its warpers are commented out).
    """
    if temperature != 1.0:
        logits = logits / temperature
    return logits


# ----------------------------------------------------------------------------------------------------------------
# response log-probs from full-sequence logits
# ----------------------------------------------------------------------------------------------------------------


def log_probs_from_logits_response(input_ids: torch.Tensor, logits: torch.Tensor, response_length: int) -> torch.Tensor:
    """Response-token log-probs: input_ids (B, S), logits (B, S, V) with logits = model(input_ids) -> (B, R).

    Position t predicts token t + 1, so the response tokens input_ids[:, -R:] read logits[:, -R-1:-1].
    """
    if logits.dim() != 3 or logits.shape[:2] != input_ids.shape:
        raise ValueError(f"expected input_ids (B, S) and logits (B, S, V), got {input_ids.shape}, {logits.shape}.")
    response_logits = logits[:, -response_length - 1 : -1]
    return logprobs_from_logits(response_logits, input_ids[:, -response_length:])


def _scatter_rows(values: torch.Tensor, indices: torch.Tensor, batch_size: int, seqlen: int) -> torch.Tensor:
    """Packed (nnz,) values back to a zero-filled (B, S) layout at flat positions `indices`."""
    out = values.new_zeros(batch_size * seqlen)
    out[indices] = values
    return out.view(batch_size, seqlen)


def log_probs_from_logits_response_rmpad(
    input_ids: torch.Tensor, attention_mask: torch.Tensor, logits_rmpad: torch.Tensor, response_length: int
) -> torch.Tensor:
    """Response log-probs from packed logits: input_ids, attention_mask (B, S), logits_rmpad (nnz, V) -> (B, R).

    logits_rmpad = model(packed input ids); the label of packed token i is packed token i + 1 (roll by -1).
    """
    if input_ids.shape != attention_mask.shape or input_ids.dim() != 2:
        raise ValueError(
            f"input_ids and attention_mask must both be (B, S); got {input_ids.shape}, {attention_mask.shape}."
        )
    batch_size, seqlen = input_ids.shape
    indices, _, _ = get_unpad_data(attention_mask)
    labels = torch.roll(input_ids.flatten()[indices], shifts=-1, dims=0)
    full = _scatter_rows(logprobs_from_logits(logits_rmpad, labels), indices, batch_size, seqlen)
    return full[:, -response_length - 1 : -1]


def log_probs_from_logits_all_rmpad(
    input_ids_rmpad: torch.Tensor,
    logits_rmpad: torch.Tensor,
    indices: torch.Tensor,
    batch_size: int,
    seqlen: int,
    response_length: int,
) -> torch.Tensor:
    """Response log-probs from packed ids and logits: input_ids_rmpad (1, nnz), logits_rmpad (nnz, V) -> (B, R)."""
    labels = torch.roll(input_ids_rmpad.reshape(-1), shifts=-1, dims=0)
    full = _scatter_rows(logprobs_from_logits(logits_rmpad, labels), indices, batch_size, seqlen)
    return full[:, -response_length - 1 : -1]


# ----------------------------------------------------------------------------------------------------------------
# masked statistics and response masks
# ----------------------------------------------------------------------------------------------------------------


def masked_sum(values: torch.Tensor, mask: torch.Tensor, axis: int | tuple[int, ...] | None = None) -> torch.Tensor:
    """sum(values * mask) over `axis` (all if None); NaNs where mask == 0 are zeroed first so they cannot leak."""
    valid = torch.where(mask.bool(), values, torch.zeros((), dtype=values.dtype, device=values.device))
    return (valid * mask).sum(dim=axis)


def masked_mean(values: torch.Tensor, mask: torch.Tensor, axis: int | tuple[int, ...] | None = None) -> torch.Tensor:
    """masked_sum / (mask.sum + 1e-8) over `axis`."""
    return masked_sum(values, mask, axis) / (mask.sum(dim=axis) + 1e-8)


def masked_var(values: torch.Tensor, mask: torch.Tensor, unbiased: bool = True) -> torch.Tensor:
    """Variance of the masked elements (scalar); unbiased applies Bessel's n / (n - 1).

    Raises ValueError when unbiased and the mask selects 0 or 1 elements (n - 1 would be <= 0).
    """
    centred = values - masked_mean(values, mask)
    variance = masked_mean(centred**2, mask)
    if unbiased:
        count = mask.sum()
        if count == 0:
            raise ValueError("masked_var: the mask selects no element; at least one must be 1.")
        if count == 1:
            raise ValueError(
                "masked_var: the mask selects a single element, so the unbiased variance divides by zero; "
                "use a larger (mini-)batch."
            )
        variance = variance * (count / (count - 1))
    return variance


def masked_whiten(values: torch.Tensor, mask: torch.Tensor, shift_mean: bool = True) -> torch.Tensor:
    """(values - mean) * rsqrt(var + 1e-8) with masked (unbiased) statistics; mean added back if not shift_mean."""
    mean, var = masked_mean(values, mask), masked_var(values, mask)
    whitened = (values - mean) * torch.rsqrt(var + 1e-8)
    if not shift_mean:
        whitened = whitened + mean
    return whitened


def get_response_mask(
    response_id: torch.Tensor, eos_token: int | Sequence[int] = 2, dtype: torch.dtype = torch.int64
) -> torch.Tensor:
    """(B, R) mask: 1 up to and including the first EOS token (an id or a list of ids) of each row, 0 after."""
    if response_id.dim() != 2:
        raise ValueError(f"response_id must be (B, R), got shape {tuple(response_id.shape)}.")
    eos_ids = torch.as_tensor(eos_token, device=response_id.device)
    is_eos = torch.isin(response_id, eos_ids).int()
    # number of EOS tokens strictly before each position: 0 until (and including) the first EOS
    return (is_eos.cumsum(dim=1) - is_eos).eq(0).to(dtype)


# ----------------------------------------------------------------------------------------------------------------
# context managers
# ----------------------------------------------------------------------------------------------------------------


@contextmanager
def check_device_is_available() -> Iterator[None]:
    """Raise RuntimeError unless the selected accelerator (`verl.utils.device`) is available, then run the body.

    Upstream uses it around imports that must happen after the device is initialised.
    """
    from verl.utils.device import get_device_name, get_torch_device

    if not get_torch_device().is_available():
        raise RuntimeError(
            f"device {get_device_name()!r} must be available before importing this module; check trainer.device."
        )
    yield


def _applied_torch_compile_patch() -> Any | None:
    """MindSpeed's active patch of `torch.compile` (Ascend), or None when MindSpeed is absent or did not patch."""
    try:
        from mindspeed.patch_utils import MindSpeedPatchesManager
    except ImportError:
        return None
    for patch in MindSpeedPatchesManager.patches_info.values():
        if patch.orig_module_name == "torch" and patch.orig_func_name == "compile":
            return patch if patch.is_applied() else None
    return None


@contextmanager
def use_original_torch_compile() -> Iterator[None]:
    """Run the body with the original `torch.compile` when MindSpeed (Ascend) replaced it; restore afterwards.

    Upstream swallows every exception (and could yield twice); here the patch is re-applied in `finally` and
    errors of the body propagate.
    """
    patch = _applied_torch_compile_patch()
    if patch is None:
        yield
        return
    patch.remove_patch()
    try:
        yield
    finally:
        patch.apply_patch()
