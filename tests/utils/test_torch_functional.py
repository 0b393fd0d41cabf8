"""Upstream-named functions of verl.utils.torch_functional: hand-worked values, shapes and error paths."""

import math
import subprocess
import sys

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from verl.utils import torch_functional as verl_F

LN3 = math.log(3.0)


def test_import_is_inert():
    """Importing torch_functional imports neither flash_attn, torch_npu, transformers nor tensordict
    (no import-time probing, cheap to import)."""
    code = (
        "import sys, verl.utils.torch_functional as F; "
        "print(any(m.split('.')[0] in {'flash_attn', 'torch_npu', 'transformers', 'tensordict'} for m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_upstream_flags_are_false_on_cpu():
    """The upstream availability flags exist and are False without flash-attn / an NPU."""
    assert verl_F.FLAH_ATTN_CROSS_ENTROPY_LOSS_AVAILABLE is False
    assert verl_F.NPU_CROSS_ENTROPY_LOSS_AVAILABLE is False


def test_gather_from_labels():
    """gather_from_labels picks data[..., label]: rows [1,2,3],[4,5,6] with labels 2, 0 give 3, 4."""
    data = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
    assert torch.equal(verl_F.gather_from_labels(data, torch.tensor([2, 0])), torch.tensor([3.0, 4.0]))
    with pytest.raises(ValueError, match="labels shape"):
        verl_F.gather_from_labels(data, torch.tensor([0, 1, 2]))


@pytest.mark.parametrize(
    "fn", [verl_F.logprobs_from_logits, verl_F.logprobs_from_logits_naive, verl_F.logprobs_from_logits_v2]
)
def test_logprobs_hand_worked(fn):
    """logits [0, ln 3] -> softmax [1/4, 3/4]; log p(1) = ln 0.75 = -0.2876821, log p(0) = ln 0.25 = -1.3862944."""
    logits = torch.tensor([[0.0, LN3], [0.0, LN3]])
    out = fn(logits, torch.tensor([1, 0]))
    torch.testing.assert_close(out, torch.tensor([math.log(0.75), math.log(0.25)]), atol=1e-6, rtol=0)


def test_logprobs_v2_3d_and_bf16_match_naive():
    """v2 equals log_softmax+gather on (B, S, V) in fp32 (1e-6) and in bf16 (bf16 result, compared at 2e-2)."""
    torch.manual_seed(0)
    logits = torch.randn(2, 5, 11)
    labels = torch.randint(0, 11, (2, 5))
    reference = torch.log_softmax(logits, -1).gather(-1, labels[..., None]).squeeze(-1)
    torch.testing.assert_close(verl_F.logprobs_from_logits_v2(logits, labels), reference, atol=1e-6, rtol=0)
    low = verl_F.logprobs_from_logits_v2(logits.bfloat16(), labels)
    assert low.dtype == torch.bfloat16
    # bf16 has an 8-bit mantissa: log-probs of magnitude ~3 carry ~1e-2 absolute rounding
    torch.testing.assert_close(low.float(), reference, atol=2e-2, rtol=0)


def test_logprobs_bad_shape_raises():
    """Labels that do not match logits[..., :-1] raise ValueError instead of a gather error."""
    with pytest.raises(ValueError):
        verl_F.logprobs_from_logits(torch.zeros(2, 3, 5), torch.zeros(2, dtype=torch.long))


def test_clip_by_value():
    """Tensor-bound clamp: x [-2, 0, 5] within [-1, 1], [-1, 1], [-1, 3] -> [-1, 0, 3]."""
    out = verl_F.clip_by_value(torch.tensor([-2.0, 0.0, 5.0]), torch.tensor(-1.0), torch.tensor([1.0, 1.0, 3.0]))
    assert torch.equal(out, torch.tensor([-1.0, 0.0, 3.0]))


def test_entropy_from_logits_hand_worked():
    """Uniform over 4: H = ln 4 = 1.3862944; [0, ln 3]: H = 0.25 ln 4 + 0.75 ln(4/3) = 0.5623351."""
    logits = torch.tensor([[0.0, 0.0, 0.0, 0.0], [0.0, LN3, -1e9, -1e9]])
    expected = torch.tensor([math.log(4.0), 0.25 * math.log(4.0) + 0.75 * math.log(4.0 / 3.0)])
    torch.testing.assert_close(verl_F.entropy_from_logits(logits), expected, atol=1e-6, rtol=0)


@pytest.mark.parametrize("shape", [(10, 13), (2, 5, 13), (1, 7, 13)])
def test_entropy_with_chunking_any_shape(shape):
    """Chunked entropy (chunk 3, not dividing T) equals the one-shot entropy and its gradient, for 2-D and 3-D."""
    torch.manual_seed(1)
    logits = torch.randn(*shape, requires_grad=True)
    weights = torch.randn(shape[:-1])
    chunked = verl_F.entropy_from_logits_with_chunking(logits, chunk_size=3)
    (grad_chunked,) = torch.autograd.grad((chunked * weights).sum(), logits)
    reference = verl_F.entropy_from_logits(logits)
    (grad_reference,) = torch.autograd.grad((reference * weights).sum(), logits)
    assert chunked.shape == shape[:-1] and chunked.dtype == torch.float32
    torch.testing.assert_close(chunked, reference, atol=1e-5, rtol=0)
    torch.testing.assert_close(grad_chunked, grad_reference, atol=1e-5, rtol=0)


class _NewFloatTensors(TorchDispatchMode):
    """Records the element count of every floating-point tensor an aten op allocates (views and in-place results,
    which share an argument's storage, are not allocations and are left out)."""

    def __init__(self):
        super().__init__()
        self.numels: list[int] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        inputs = {
            t.untyped_storage().data_ptr() for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)
        }
        self.numels += [
            t.numel()
            for t in tree_flatten(out)[0]
            if isinstance(t, torch.Tensor) and t.is_floating_point() and t.untyped_storage().data_ptr() not in inputs
        ]
        return out


def test_entropy_with_chunking_never_allocates_a_full_vocab_softmax():
    """Field-report item 2 (the 18.95 GiB softmax): with N=64 tokens, V=1000 and chunk 8 the forward allocates
    nothing larger than two chunk buffers (2 * 8 * 1000 = 16,000 elements, vs N * V = 64,000 for one softmax) and
    the backward allocates one N x V tensor, the gradient itself. The un-chunked entropy_from_logits allocates
    64,000-element tensors in the forward (the softmax) and several in the backward, so it fails here."""
    n, v, chunk = 64, 1000, 8
    logits = torch.randn(n, v, requires_grad=True)
    with _NewFloatTensors() as forward:
        entropy = verl_F.entropy_from_logits_with_chunking(logits, chunk_size=chunk)
    with _NewFloatTensors() as backward:
        entropy.sum().backward()
    assert max(forward.numels) <= 2 * chunk * v
    assert sum(numel >= n * v for numel in backward.numels) == 1


def test_sum_pi_squared():
    """[0, ln 3] -> pi = [1/4, 3/4], sum pi^2 = 1/16 + 9/16 = 0.625; uniform over 4 -> 0.25."""
    out = verl_F.calculate_sum_pi_squared_from_logits(torch.tensor([[0.0, LN3, -1e9, -1e9], [0.0, 0.0, 0.0, 0.0]]))
    torch.testing.assert_close(out, torch.tensor([0.625, 0.25]), atol=1e-6, rtol=0)


def test_post_process_logits_is_out_of_place():
    """Temperature 2 halves the logits in a new tensor; the input keeps its values and version (item 3)."""
    logits = torch.tensor([[2.0, -4.0]])
    version = logits._version
    out = verl_F.post_process_logits(None, logits, temperature=2.0, top_k=None, top_p=None)
    assert torch.equal(out, torch.tensor([[1.0, -2.0]]))
    assert torch.equal(logits, torch.tensor([[2.0, -4.0]])) and logits._version == version
    assert verl_F.post_process_logits(None, logits, 1.0, None, None) is logits


def _response_reference(input_ids, logits, response_length):
    """log_softmax(logits)[b, t, input_ids[b, t + 1]] for the response positions."""
    logp = torch.log_softmax(logits, -1)[:, :-1].gather(-1, input_ids[:, 1:, None]).squeeze(-1)
    return logp[:, -response_length:]


def test_log_probs_from_logits_response():
    """Response log-probs read logits at t for token t + 1: equals the shifted log_softmax gather."""
    torch.manual_seed(2)
    input_ids = torch.randint(0, 9, (2, 6))
    logits = torch.randn(2, 6, 9)
    out = verl_F.log_probs_from_logits_response(input_ids, logits, response_length=3)
    torch.testing.assert_close(out, _response_reference(input_ids, logits, 3), atol=1e-6, rtol=0)


def test_rmpad_response_log_probs_match_padded():
    """Packed (rmpad) response log-probs equal the padded computation at real tokens (left-padded prompts)."""
    torch.manual_seed(3)
    input_ids = torch.randint(0, 9, (2, 6))
    attention_mask = torch.tensor([[0, 1, 1, 1, 1, 1], [0, 0, 1, 1, 1, 1]])
    logits = torch.randn(2, 6, 9)
    indices, _, _ = verl_F.get_unpad_data(attention_mask)
    logits_rmpad = logits.reshape(12, 9)[indices]
    expected = _response_reference(input_ids, logits, 3)
    out = verl_F.log_probs_from_logits_response_rmpad(input_ids, attention_mask, logits_rmpad, 3)
    torch.testing.assert_close(out, expected, atol=1e-6, rtol=0)
    ids_rmpad = input_ids.flatten()[indices].unsqueeze(0)
    out_all = verl_F.log_probs_from_logits_all_rmpad(ids_rmpad, logits_rmpad, indices, 2, 6, 3)
    torch.testing.assert_close(out_all, expected, atol=1e-6, rtol=0)


def test_masked_sum_and_mean_ignore_nan_outside_mask():
    """values [1, 2, nan, 4], mask [1, 1, 0, 1]: sum 7, mean 7/3; per-row axis=1 sums [3, 4]."""
    values = torch.tensor([1.0, 2.0, float("nan"), 4.0])
    mask = torch.tensor([1, 1, 0, 1])
    assert verl_F.masked_sum(values, mask).item() == 7.0
    torch.testing.assert_close(verl_F.masked_mean(values, mask), torch.tensor(7.0 / 3.0), atol=1e-6, rtol=0)
    per_row = verl_F.masked_sum(values.view(2, 2), mask.view(2, 2), axis=1)
    assert torch.equal(per_row, torch.tensor([3.0, 4.0]))


def test_masked_var_and_whiten():
    """[1, 2, 3, 4]: mean 2.5, biased var 1.25, unbiased 1.25 * 4/3 = 5/3; whiten = (x - 2.5) / sqrt(5/3)."""
    values = torch.tensor([1.0, 2.0, 3.0, 4.0, 100.0])
    mask = torch.tensor([1, 1, 1, 1, 0])
    torch.testing.assert_close(verl_F.masked_var(values, mask, unbiased=False), torch.tensor(1.25), atol=1e-6, rtol=0)
    torch.testing.assert_close(verl_F.masked_var(values, mask), torch.tensor(5.0 / 3.0), atol=1e-6, rtol=0)
    scale = math.sqrt(5.0 / 3.0)
    expected = torch.tensor([-1.5, -0.5, 0.5, 1.5]) / scale
    torch.testing.assert_close(verl_F.masked_whiten(values, mask)[:4], expected, atol=1e-6, rtol=0)
    torch.testing.assert_close(
        verl_F.masked_whiten(values, mask, shift_mean=False)[:4], expected + 2.5, atol=1e-6, rtol=0
    )


@pytest.mark.parametrize("mask", [[0, 0, 0], [0, 1, 0]])
def test_masked_var_rejects_tiny_masks(mask):
    """The unbiased variance of 0 or 1 selected elements raises ValueError (n - 1 <= 0)."""
    with pytest.raises(ValueError):
        verl_F.masked_var(torch.tensor([1.0, 2.0, 3.0]), torch.tensor(mask))


def test_get_response_mask():
    """1 up to and including the first EOS; with eos 1 row 2 ends at its '1' (index 4), with [1, 2] at its '2'."""
    response = torch.tensor([[20, 10, 34, 1, 0, 0, 0], [78, 0, 76, 2, 1, 0, 0], [23, 98, 1, 0, 0, 0, 0]])
    expected_1 = torch.tensor([[1, 1, 1, 1, 0, 0, 0], [1, 1, 1, 1, 1, 0, 0], [1, 1, 1, 0, 0, 0, 0]])
    expected_12 = torch.tensor([[1, 1, 1, 1, 0, 0, 0], [1, 1, 1, 1, 0, 0, 0], [1, 1, 1, 0, 0, 0, 0]])
    assert torch.equal(verl_F.get_response_mask(response, eos_token=1), expected_1)
    assert torch.equal(verl_F.get_response_mask(response, eos_token=[1, 2]), expected_12)
    assert verl_F.get_response_mask(response, 1, dtype=torch.bool).dtype == torch.bool


def test_check_device_and_original_compile_context_managers():
    """On the CPU platform the device check passes; without MindSpeed use_original_torch_compile is a no-op."""
    with verl_F.check_device_is_available():
        pass
    with verl_F.use_original_torch_compile():
        compiled = torch.compile
    assert compiled is torch.compile


def test_reexported_names_exist():
    """Every name of upstream's torch_functional (and the new chunked/fused entry points) is importable from it."""
    names = [
        "gather_from_labels",
        "logprobs_from_logits",
        "logprobs_from_logits_flash_attn",
        "logprobs_from_logits_torch_npu",
        "logprobs_from_logits_naive",
        "logprobs_from_logits_v2",
        "clip_by_value",
        "entropy_from_logits",
        "entropy_from_logits_with_chunking",
        "masked_sum",
        "masked_mean",
        "masked_var",
        "masked_whiten",
        "get_response_mask",
        "compute_grad_norm",
        "broadcast_dict_tensor",
        "allgather_dict_tensors",
        "allgather_dict_into_dict",
        "split_dict_tensor_into_batches",
        "pad_2d_list_to_length",
        "pad_sequence_to_length",
        "postprocess_data",
        "tokenize_and_postprocess_data",
        "remove_pad_token",
        "log_probs_from_logits_response",
        "log_probs_from_logits_response_rmpad",
        "log_probs_from_logits_all_rmpad",
        "post_process_logits",
        "calculate_sum_pi_squared_from_logits",
        "get_cosine_schedule_with_warmup",
        "get_constant_schedule_with_warmup",
        "get_wsd_schedule_with_warmup",
        "prepare_decoder_attention_mask",
        "_make_causal_mask",
        "_expand_mask",
        "get_unpad_data",
        "check_device_is_available",
        "distributed_mean_max_min_std",
        "distributed_masked_mean",
        "expand_as_nested",
        "use_original_torch_compile",
        "log_probs_and_entropy_chunked",
        "fused_linear_log_probs_and_entropy",
    ]
    missing = [name for name in names if not callable(getattr(verl_F, name, None))]
    assert missing == []


def test_logprobs_kernel_follows_the_tensors_platform(npu_sim, monkeypatch, request):
    """On the simulated Ascend, NPU logits take torch_npu's cross-entropy (Platform.cross_entropy_kernel) and CPU
    logits in the same process the plain formula; both equal log_softmax gathered at the labels."""
    # the kernel lookup is cached per process (availability does not change in a real run); the simulation does
    verl_F._npu_cross_entropy.cache_clear()
    request.addfinalizer(verl_F._npu_cross_entropy.cache_clear)
    calls = []
    real = verl_F.logprobs_from_logits_torch_npu

    def spy(logits, labels):
        calls.append(logits.device.type)
        return real(logits, labels)

    monkeypatch.setattr(verl_F, "logprobs_from_logits_torch_npu", spy)
    logits = torch.randn(2, 3, 7, generator=torch.Generator().manual_seed(0))
    labels = torch.tensor([[0, 6, 3], [1, 2, 5]])
    reference = torch.log_softmax(logits, -1).gather(-1, labels[..., None]).squeeze(-1)
    on_npu = verl_F.logprobs_from_logits(logits.to("npu"), labels.to("npu"))
    assert calls == ["npu"]
    torch.testing.assert_close(on_npu.cpu(), reference)
    on_cpu = verl_F.logprobs_from_logits(logits, labels)
    assert calls == ["npu"]  # the CPU tensor did not take the NPU kernel
    torch.testing.assert_close(on_cpu, reference)
