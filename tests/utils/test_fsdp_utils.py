"""Tests of the FSDP1/FSDP2 adapter (verl/utils/fsdp_utils.py): wrap policy leniency (field-report item 6),
strategy selection (item 9) and FSDP1 = FSDP2 = single process for one SGD step on gloo, world size 2."""

import logging

import pytest
import torch
import torch.distributed as dist
from transformers import Qwen2Config, Qwen2ForCausalLM

from verl.utils import fsdp_utils
from verl.utils.fsdp_utils import (
    check_strategy,
    get_fsdp_adapter,
    get_fsdp_wrap_policy,
    mixed_precision_dtypes,
    resolve_wrap_classes,
)
from verl.utils.testing.dist import run_on_ranks


def _tiny_qwen2(seed: int = 0) -> Qwen2ForCausalLM:
    torch.manual_seed(seed)
    cfg = Qwen2Config(
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=128,
        max_position_embeddings=64,
        tie_word_embeddings=False,
        attn_implementation="eager",
    )
    return Qwen2ForCausalLM(cfg).float()


def test_wrap_classes_accept_a_set_and_skip_unknown_names(caplog):
    """Invariant: a set of names resolves like a list; a name absent from the model is skipped with a warning
    (transformers 5 makes `_no_split_modules` a set and Qwen3.5 lists a phantom class: field-report item 6)."""
    model = _tiny_qwen2()
    model._no_split_modules = {"Qwen2DecoderLayer", "Qwen3_5TextDecoderLayer"}
    names, source = fsdp_utils.layer_class_names(model, None)
    assert source == "model._no_split_modules"
    with caplog.at_level(logging.WARNING, logger="verl.utils.fsdp_wrap_policy"):
        classes = resolve_wrap_classes(model, names, source)
    assert {c.__name__ for c in classes} == {"Qwen2DecoderLayer"}
    assert "Qwen3_5TextDecoderLayer" in caplog.text


def test_wrap_classes_fail_only_when_none_resolves():
    """Invariant: if no class name resolves, a ValueError starting with upstream's wording ("Could not find any of
    the transformer layer classes", which upstream tests match) names the config key to set."""
    model = _tiny_qwen2()
    with pytest.raises(ValueError, match="^Could not find any of the transformer layer classes.*transformer_layer_cls"):
        resolve_wrap_classes(model, {"NoSuchLayer", "AlsoMissing"}, "model._no_split_modules")


def test_explicit_wrap_policy_wins_over_no_split_modules():
    """Invariant: fsdp_config.wrap_policy.transformer_layer_cls_to_wrap replaces `_no_split_modules`, and a
    plain string is one class name."""
    model = _tiny_qwen2()
    names, source = fsdp_utils.layer_class_names(model, {"transformer_layer_cls_to_wrap": "Qwen2MLP"})
    assert names == ["Qwen2MLP"] and "transformer_layer_cls_to_wrap" in source
    classes = resolve_wrap_classes(model, names, source)
    assert {c.__name__ for c in classes} == {"Qwen2MLP"}


def test_fsdp1_wrap_policy_selects_decoder_layers_from_a_set():
    """Invariant: the FSDP1 auto-wrap policy built from a set of names wraps exactly the decoder layers."""
    model = _tiny_qwen2()
    model._no_split_modules = {"Qwen2DecoderLayer", "Qwen3_5TextDecoderLayer"}
    policy = get_fsdp_wrap_policy(model, {"min_num_params": 0})  # the YAML default: no class key
    wrapped = [type(m).__name__ for m in model.modules() if policy(module=m, recurse=False, nonwrapped_numel=0)]
    assert wrapped == ["Qwen2DecoderLayer", "Qwen2DecoderLayer"]
    assert get_fsdp_wrap_policy(model, {"disable": True}) is None


def test_strategy_is_checked_with_the_key_named():
    """Invariant: only `fsdp`/`fsdp2` select an adapter; anything else raises naming the config key (item 9)."""
    assert get_fsdp_adapter("fsdp").strategy == "fsdp"
    assert get_fsdp_adapter("fsdp2").strategy == "fsdp2"
    with pytest.raises(ValueError, match="critic.strategy"):
        check_strategy("megatron", "critic.strategy")


def test_contradictory_fsdp_options_name_the_key():
    """Invariant: offload_policy (FSDP2's CPUOffloadPolicy) under strategy=fsdp is refused with the full key and the
    fix; FSDP2 accepts it. An fsdp_size that does not divide the ranks is refused naming fsdp_config.fsdp_size
    (before any process group is touched)."""
    from verl.workers.config import FSDPEngineConfig

    config = FSDPEngineConfig(offload_policy=True)
    with pytest.raises(ValueError, match=r"critic\.model\.fsdp_config\.offload_policy=True is FSDP2-only"):
        get_fsdp_adapter("fsdp").check_options(config, "critic.model.fsdp_config")
    get_fsdp_adapter("fsdp2").check_options(config, "critic.model.fsdp_config")
    with pytest.raises(ValueError, match=r"fsdp_config\.fsdp_size=3 must divide the world size 4"):
        fsdp_utils.create_device_mesh(4, 3)


def test_mixed_precision_defaults_follow_upstream():
    """Invariant: no mixed_precision block means bf16 params with fp32 reduce and buffers (upstream defaults); an
    unknown dtype names its key."""
    assert mixed_precision_dtypes(None) == {
        "param_dtype": torch.bfloat16,
        "reduce_dtype": torch.float32,
        "buffer_dtype": torch.float32,
    }
    assert mixed_precision_dtypes({"param_dtype": "fp32"})["param_dtype"] == torch.float32
    with pytest.raises(ValueError, match=r"fsdp_config\.mixed_precision\.reduce_dtype='fp8' is not a dtype"):
        mixed_precision_dtypes({"reduce_dtype": "fp8"})


# ------------------------------------------------------------------------------------------------------------
# world size 2 (gloo, spawn)
# ------------------------------------------------------------------------------------------------------------

_FP32 = {"param_dtype": torch.float32, "reduce_dtype": torch.float32, "buffer_dtype": torch.float32}


def _batch(rank: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(100 + rank)
    return torch.randint(0, 128, (2, 12), generator=g)


def _loss(model, ids):
    return model(input_ids=ids, labels=ids).loss


def _reference_step(lr: float, max_norm: float):
    """Single process: mean of the two ranks' losses (FSDP averages gradients over ranks), clip, SGD."""
    model = _tiny_qwen2()
    loss = 0.5 * (_loss(model, _batch(0)) + _loss(model, _batch(1)))
    loss.backward()
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    with torch.no_grad():
        for p in model.parameters():
            p -= lr * p.grad
    return norm, {k: v.clone() for k, v in model.state_dict().items()}


def _dist_steps() -> dict:
    """On each rank, for FSDP1 then FSDP2: wrap, accumulate two half-batches (first without grad sync), clip,
    offload/reload, SGD step, full state dict and its load/save round trip. Rank 0 reports."""
    rank, world_size = dist.get_rank(), dist.get_world_size()
    out = {}
    for strategy in ("fsdp", "fsdp2"):
        adapter = get_fsdp_adapter(strategy)
        mesh = fsdp_utils.create_device_mesh(world_size, -1)
        model = adapter.wrap(_tiny_qwen2(), mesh=mesh, dtypes=_FP32, wrap_policy=None)
        assert fsdp_utils.fsdp_version(model) == (1 if strategy == "fsdp" else 2)
        # gradient accumulation without sync then with sync gives the synced mean over ranks
        ids = _batch(rank)
        with adapter.grad_sync(model, enabled=False):
            (0.5 * _loss(model, ids[:1])).backward()
        with adapter.grad_sync(model, enabled=True):
            (0.5 * _loss(model, ids[1:])).backward()
        norm = adapter.clip_grad_norm(model, max_norm=0.5)
        # offload and reload around the step: every tensor of the step is back on one device
        adapter.offload_params(model)
        adapter.load_params(model, "cpu")
        with torch.no_grad():
            for p in model.parameters():
                if p.grad is not None:
                    p -= 1e-2 * p.grad
        state = adapter.full_state_dict(model)
        # load_full_state_dict round trip: loading what we saved changes nothing
        full = [state]
        dist.broadcast_object_list(full, src=0)
        adapter.load_full_state_dict(model, full[0])
        again = adapter.full_state_dict(model)
        out[strategy] = {"norm": norm.item(), "state": state, "again": again}
    return out if rank == 0 else None


@pytest.fixture(scope="module")
def dist_steps():
    return run_on_ranks(_dist_steps, 2, timeout_s=300)[0]


@pytest.mark.dist
@pytest.mark.parametrize("strategy", ["fsdp", "fsdp2"])
def test_fsdp_step_equals_single_process(dist_steps, strategy):
    """Invariant: FSDP1 = FSDP2 = single process. On 2 gloo ranks, two accumulated half-batches (first without
    grad sync), clipping and an SGD step give the same grad norm (fp32: 1e-5 relative) and the same full
    state dict (1e-6 absolute) as one process on the union of the batches; the full-state-dict load/save
    round trip is exact."""
    ref_norm, ref_state = _reference_step(lr=1e-2, max_norm=0.5)
    out = dist_steps[strategy]
    assert abs(out["norm"] - ref_norm.item()) <= 1e-5 * ref_norm.item()
    assert set(out["state"]) == set(ref_state)
    for key, value in ref_state.items():
        torch.testing.assert_close(out["state"][key], value, rtol=0, atol=1e-6, msg=key)
        assert torch.equal(out["again"][key], out["state"][key]), key


def test_layer_classes_resolve_after_fsdp2_renamed_them():
    """FSDP2's fully_shard swaps a layer's class for a subclass named FSDP<name>; resolving <name> afterwards (what
    activation offload does on the wrapped model) still finds the layer class, and isinstance covers the subclass."""
    from verl.utils.fsdp_wrap_policy import get_module_class_from_name, resolve_wrap_classes

    class DecoderLayer(torch.nn.Linear):
        pass

    renamed = type("FSDPDecoderLayer", (DecoderLayer,), {})
    model = torch.nn.Sequential(renamed(2, 2), torch.nn.ReLU())
    assert get_module_class_from_name(model, "DecoderLayer") is DecoderLayer
    classes = tuple(resolve_wrap_classes(model, ["DecoderLayer"], "test"))
    assert [m for m in model.modules() if isinstance(m, classes)] == [model[0]]
