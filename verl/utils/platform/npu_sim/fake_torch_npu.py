"""The simulated ``torch_npu`` module: the fused ops verl calls, with their documented semantics, in plain torch.

Each op follows the signature and behaviour documented for torch_npu (``torch_npu/_op_plugin_docs.py``,
2.10.0.post4; docs/design.md "The simulated NPU") and, like the real kernels, accepts only tensors
on the NPU. Autograd flows through the torch implementation (the real ops have registered backward kernels,
except ``npu_grouped_matmul``, which callers wrap in their own ``autograd.Function`` — as here).

Only the argument combinations verl uses are simulated; any other combination raises NotImplementedError
naming the argument, so a patch cannot silently rely on semantics this file does not check.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F

from verl.utils.platform.npu_sim import device_module as npu  # noqa: F401  (torch_npu.npu is torch.npu)

__version__ = torch.__version__.split("+")[0] + "+sim"

_LAYOUTS = ("BSH", "SBH", "BSND", "BNSD", "TND")


def _require_npu(op: str, *tensors: torch.Tensor | None) -> None:
    for t in tensors:
        if t is not None and t.device.type != "npu":
            raise RuntimeError(f"{op}: expected all tensors on npu, got a tensor on {t.device}")


# ---- normalisation and activations ---------------------------------------------------------------------------------


def _rms(x: torch.Tensor, ndim: int, epsilon: float) -> tuple[torch.Tensor, torch.Tensor]:
    dims = tuple(range(-ndim, 0))
    xf = x.float()
    rstd = torch.rsqrt(xf.pow(2).mean(dim=dims, keepdim=True) + epsilon)
    return xf * rstd, rstd


def npu_rms_norm(self: torch.Tensor, gamma: torch.Tensor, epsilon: float = 1e-06) -> tuple[torch.Tensor, torch.Tensor]:
    """``(y, rstd)``: ``y = x · rstd · gamma`` with ``rstd = 1/sqrt(mean(x², over gamma's dims) + eps)``.

    Shapes: x (..., *gamma.shape); y like x (x's dtype); rstd (..., 1, …, 1) in fp32. Statistics in fp32.
    """
    _require_npu("npu_rms_norm", self, gamma)
    normed, rstd = _rms(self, gamma.dim(), epsilon)
    return (normed.to(self.dtype) * gamma).to(self.dtype), rstd


def npu_gemma_rms_norm(
    input: torch.Tensor, gamma: torch.Tensor, epsilon: float = 1e-06
) -> tuple[torch.Tensor, torch.Tensor]:
    """Zero-centred RMSNorm: ``y = (x · rstd · (1 + gamma))`` computed in fp32, returned in x's dtype."""
    _require_npu("npu_gemma_rms_norm", input, gamma)
    normed, rstd = _rms(input, gamma.dim(), epsilon)
    return (normed * (1.0 + gamma.float())).to(input.dtype), rstd


def npu_swiglu(self: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """Split ``x`` in halves A, B along ``dim``: ``A · sigmoid(A) · B`` (= silu(A)·B); ``dim`` must be even-sized."""
    _require_npu("npu_swiglu", self)
    if self.shape[dim] % 2:
        raise RuntimeError(f"npu_swiglu: dim {dim} has odd size {self.shape[dim]}")
    a, b = self.chunk(2, dim=dim)
    return F.silu(a) * b


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def _rotate_interleave(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x[..., 0::2], x[..., 1::2]
    return torch.stack((-x2, x1), dim=-1).flatten(-2)


def npu_rotary_mul(
    input: torch.Tensor, r1: torch.Tensor, r2: torch.Tensor, rotary_mode: str = "half", rotate: object = None
) -> torch.Tensor:
    """``x·r1 + rotate(x)·r2`` (r1 = cos, r2 = sin, broadcast to x); 4-D inputs, even head dim < 896.

    ``rotary_mode="half"`` rotates halves (``cat(-x2, x1)``); ``"interleave"`` rotates adjacent pairs.
    """
    _require_npu("npu_rotary_mul", input, r1, r2)
    if input.dim() != 4 or r1.dim() != 4 or r2.dim() != 4:
        raise RuntimeError(f"npu_rotary_mul: expects 4-D input/r1/r2, got {input.dim()}/{r1.dim()}/{r2.dim()}")
    head_dim = input.shape[-1]
    if head_dim % 2 or head_dim >= 896:
        raise RuntimeError(f"npu_rotary_mul: head dim must be even and < 896, got {head_dim}")
    if rotary_mode == "half":
        rotated = _rotate_half(input)
    elif rotary_mode == "interleave":
        rotated = _rotate_interleave(input)
    else:
        raise NotImplementedError(f"npu_rotary_mul: rotary_mode={rotary_mode!r} not simulated")
    return input * r1 + rotated * r2


# ---- attention -----------------------------------------------------------------------------------------------------


def _cumulative(values: Sequence[int], name: str, total: int) -> list[int]:
    values = [int(v) for v in values]
    if not values or values[-1] != total or any(b < a for a, b in zip([0] + values, values)):
        raise ValueError(f"npu_fusion_attention: {name} must be cumulative lengths ending at {total}, got {values}")
    return values


def _causal_keep(sq: int, skv: int, sparse_mode: int, device: torch.device) -> torch.Tensor | None:
    # True = attend. sparse_mode 2: left-up causal (j <= i); 3: right-down causal (j <= i + skv - sq).
    if sparse_mode == 0:
        return None
    offset = 0 if sparse_mode == 2 else skv - sq
    i = torch.arange(sq, device=device)[:, None]
    j = torch.arange(skv, device=device)[None, :]
    return j <= i + offset


def _attend(q, k, v, scale, keep, keep_prob):
    """q (N, Sq, D), k/v (Nkv, Skv, D) → (N, Sq, D), computed in fp32; GQA by repeating kv heads."""
    if q.shape[0] != k.shape[0]:
        k = k.repeat_interleave(q.shape[0] // k.shape[0], dim=0)
        v = v.repeat_interleave(q.shape[0] // v.shape[0], dim=0)
    scores = torch.matmul(q.float(), k.float().transpose(-1, -2)) * scale
    if keep is not None:
        scores = scores.masked_fill(~keep, float("-inf"))
    probs = torch.softmax(scores, dim=-1)
    if keep_prob < 1.0:
        probs = F.dropout(probs, p=1.0 - keep_prob)
    return torch.matmul(probs, v.float()).to(q.dtype)


def _check_mask(atten_mask: torch.Tensor | None, sparse_mode: int) -> None:
    if sparse_mode not in (0, 2, 3):
        raise NotImplementedError(f"npu_fusion_attention: sparse_mode={sparse_mode} not simulated (0, 2, 3 are)")
    if sparse_mode in (2, 3):
        # The kernel reads a compressed lower-triangular mask: 2048x2048 bool, True above the diagonal.
        if atten_mask is None or tuple(atten_mask.shape) != (2048, 2048) or atten_mask.dtype != torch.bool:
            raise RuntimeError("npu_fusion_attention: sparse_mode 2/3 needs atten_mask = bool (2048, 2048) triu(1)")
    elif atten_mask is not None:
        raise NotImplementedError("npu_fusion_attention: explicit atten_mask with sparse_mode=0 not simulated")


def _tnd_attention(query, key, value, scale, keep_prob, sparse_mode, q_cum, kv_cum):
    out = torch.empty_like(query)
    for start_q, end_q, start_kv, end_kv in zip([0] + q_cum[:-1], q_cum, [0] + kv_cum[:-1], kv_cum):
        q = query[start_q:end_q].transpose(0, 1)  # (N, Sq, D)
        k = key[start_kv:end_kv].transpose(0, 1)
        v = value[start_kv:end_kv].transpose(0, 1)
        keep = _causal_keep(end_q - start_q, end_kv - start_kv, sparse_mode, query.device)
        out[start_q:end_q] = _attend(q, k, v, scale, keep, keep_prob).transpose(0, 1)
    return out


def _to_bnsd(x: torch.Tensor, layout: str, head_dim: int) -> torch.Tensor:
    if layout == "BNSD":
        return x
    if layout == "BSND":
        return x.transpose(1, 2)
    if layout == "BSH":
        return x.view(x.shape[0], x.shape[1], -1, head_dim).transpose(1, 2)
    raise NotImplementedError(f"npu_fusion_attention: input_layout={layout!r} not simulated")


def npu_fusion_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    head_num: int,
    input_layout: str,
    pse: torch.Tensor | None = None,
    padding_mask: torch.Tensor | None = None,
    atten_mask: torch.Tensor | None = None,
    scale: float = 1.0,
    keep_prob: float = 1.0,
    pre_tockens: int = 2147483647,
    next_tockens: int = 2147483647,
    inner_precise: int = 0,
    prefix: object = None,
    actual_seq_qlen: Sequence[int] | None = None,
    actual_seq_kvlen: Sequence[int] | None = None,
    sparse_mode: int = 0,
    gen_mask_parallel: bool = True,
    sync: bool = False,
    softmax_layout: str = "",
) -> tuple:
    """Training flash attention. Returns ``(out, softmax_max, softmax_sum, softmax_out, seed, offset, numels)``.

    TND layout (varlen): query (T, N, D), key/value (T_kv, N_kv, D) with N % N_kv == 0; ``actual_seq_qlen`` /
    ``actual_seq_kvlen`` are *cumulative* lengths (``cu_seqlens[1:]``) and attention never crosses sequences.
    ``sparse_mode`` 0 = no mask, 2 = left-up causal, 3 = right-down causal (both with the 2048² compressed
    mask). BSND/BNSD/BSH are simulated for sparse_mode 0/2/3 too. Only ``out`` is meaningful here; the
    softmax statistics are returned as zeros of the documented shapes.
    """
    _require_npu("npu_fusion_attention", query, key, value, atten_mask)
    if input_layout not in _LAYOUTS:
        raise ValueError(f"npu_fusion_attention: input_layout must be one of {_LAYOUTS}, got {input_layout!r}")
    if pse is not None or padding_mask is not None or prefix is not None:
        raise NotImplementedError("npu_fusion_attention: pse/padding_mask/prefix not simulated")
    _check_mask(atten_mask, sparse_mode)
    if input_layout == "TND":
        if query.shape[1] != head_num:
            raise RuntimeError(f"npu_fusion_attention: head_num={head_num} but query has {query.shape[1]} heads")
        if actual_seq_qlen is None or actual_seq_kvlen is None:
            raise RuntimeError("npu_fusion_attention: TND layout needs actual_seq_qlen and actual_seq_kvlen")
        q_cum = _cumulative(actual_seq_qlen, "actual_seq_qlen", query.shape[0])
        kv_cum = _cumulative(actual_seq_kvlen, "actual_seq_kvlen", key.shape[0])
        if len(q_cum) != len(kv_cum):
            raise ValueError("npu_fusion_attention: actual_seq_qlen and actual_seq_kvlen differ in batch size")
        out = _tnd_attention(query, key, value, scale, keep_prob, sparse_mode, q_cum, kv_cum)
        stats_shape = (query.shape[0], head_num, 8)
    else:
        head_dim = query.shape[-1] // head_num if input_layout == "BSH" else query.shape[-1]
        q, k, v = (_to_bnsd(t, input_layout, head_dim) for t in (query, key, value))
        keep = _causal_keep(q.shape[2], k.shape[2], sparse_mode, query.device)
        out_bnsd = torch.stack([_attend(q[b], k[b], v[b], scale, keep, keep_prob) for b in range(q.shape[0])])
        out = _from_bnsd(out_bnsd, input_layout)
        stats_shape = (q.shape[0], head_num, q.shape[2], 8)
    zeros = torch.zeros(stats_shape, dtype=torch.float32, device=query.device)
    return out, zeros, zeros.clone(), torch.empty(0, device=query.device, dtype=query.dtype), 0, 0, 0


def _from_bnsd(x: torch.Tensor, layout: str) -> torch.Tensor:
    if layout == "BNSD":
        return x
    if layout == "BSND":
        return x.transpose(1, 2)
    b, n, s, d = x.shape
    return x.transpose(1, 2).reshape(b, s, n * d)  # BSH


# ---- grouped matmul (MoE) ------------------------------------------------------------------------------------------


def _group_sizes(group_list: torch.Tensor | Sequence[int], group_list_type: int, total: int) -> list[int]:
    values = group_list.tolist() if isinstance(group_list, torch.Tensor) else [int(v) for v in group_list]
    if group_list_type == 0:  # cumulative ends
        sizes = [b - a for a, b in zip([0] + values[:-1], values)]
    elif group_list_type == 1:  # per-group counts
        sizes = values
    else:
        raise NotImplementedError(f"npu_grouped_matmul: group_list_type={group_list_type} not simulated")
    if any(s < 0 for s in sizes) or sum(sizes) != total:
        raise RuntimeError(f"npu_grouped_matmul: group sizes {sizes} do not add up to {total}")
    return sizes


def _expert_weights(weight: Sequence[torch.Tensor], groups: int) -> list[torch.Tensor]:
    if len(weight) == 1 and weight[0].dim() == 3:
        stacked = weight[0]
        if stacked.shape[0] != groups:
            raise RuntimeError(f"npu_grouped_matmul: weight has {stacked.shape[0]} groups, group_list {groups}")
        return list(stacked.unbind(0))
    if len(weight) != groups:
        raise RuntimeError(f"npu_grouped_matmul: {len(weight)} weights for {groups} groups")
    return list(weight)


def npu_grouped_matmul(
    x: Sequence[torch.Tensor],
    weight: Sequence[torch.Tensor],
    *,
    bias: Sequence[torch.Tensor] | None = None,
    group_list: torch.Tensor | Sequence[int] | None = None,
    split_item: int = 0,
    group_type: int | None = None,
    group_list_type: int = 0,
    act_type: int = 0,
    output_dtype: torch.dtype | None = None,
    **quant: object,
) -> list[torch.Tensor]:
    """Grouped GEMM over contiguous row groups (MoE experts). No autograd of its own (callers wrap it).

    Simulated forms (single x, single output, ``split_item`` 2 or 3):

    * ``group_type=0`` (groups along M): x = [X (M, K)], weight = [W (G, K, N)] or G tensors (K, N);
      output [Y (M, N)] with ``Y[rows_g] = X[rows_g] @ W_g``.
    * ``group_type=2`` (groups along the contraction axis): x = [Xᵀ (K, M)], weight = [B (M, N)];
      output [Y (G, K, N)] with ``Y_g = Xᵀ[:, rows_g] @ B[rows_g]`` (the weight gradient of the M-grouped form).

    ``group_list``: cumulative row ends (``group_list_type=0``) or per-group counts (``1``).
    """
    if any(v is not None for v in quant.values()) or bias is not None or act_type != 0:
        raise NotImplementedError("npu_grouped_matmul: bias/quantisation/activation arguments not simulated")
    if len(x) != 1 or split_item not in (2, 3) or group_list is None:
        raise NotImplementedError("npu_grouped_matmul: only one x, split_item 2/3 and a group_list are simulated")
    _require_npu("npu_grouped_matmul", x[0], *weight)
    (a,) = x
    if group_type == 0:
        sizes = _group_sizes(group_list, group_list_type, a.shape[0])
        weights = _expert_weights(weight, len(sizes))
        parts = [rows @ w for rows, w in zip(a.split(sizes, dim=0), weights)]
        out = torch.cat(parts, dim=0) if parts else a.new_zeros(0, weights[0].shape[-1])
    elif group_type == 2:
        if len(weight) != 1:
            raise NotImplementedError("npu_grouped_matmul: group_type=2 expects one weight tensor (M, N)")
        sizes = _group_sizes(group_list, group_list_type, a.shape[1])
        pairs = zip(a.split(sizes, dim=1), weight[0].split(sizes, dim=0))
        out = torch.stack([lhs @ rhs for lhs, rhs in pairs])
    else:
        raise NotImplementedError(f"npu_grouped_matmul: group_type={group_type} not simulated (0 and 2 are)")
    return [out.to(output_dtype) if output_dtype is not None else out]


# ---- loss ----------------------------------------------------------------------------------------------------------


def npu_cross_entropy_loss(
    input: torch.Tensor,
    target: torch.Tensor,
    weight: torch.Tensor | None = None,
    reduction: str = "mean",
    ignore_index: int = -100,
    label_smoothing: float = 0.0,
    lse_square_scale_for_zloss: float = 0.0,
    return_zloss: bool = False,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(loss, log_prob, zloss, lse_for_zloss)`` for logits (N, C) and targets (N,); z-loss is not simulated."""
    _require_npu("npu_cross_entropy_loss", input, target, weight)
    if lse_square_scale_for_zloss != 0.0 or return_zloss:
        raise NotImplementedError("npu_cross_entropy_loss: z-loss not simulated")
    loss = F.cross_entropy(
        input.float(),
        target,
        weight=weight,
        reduction=reduction,
        ignore_index=ignore_index,
        label_smoothing=label_smoothing,
    )
    log_prob = torch.log_softmax(input.float(), dim=-1)
    empty = torch.empty(0, device=input.device)
    return loss.to(input.dtype), log_prob, empty, empty.clone()
