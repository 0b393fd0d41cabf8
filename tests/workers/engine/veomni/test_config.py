"""VeOmni config mapping (verl/workers/engine/veomni/config.py): pure functions, no veomni needed."""

import pytest

from verl.base_config import ConfigError
from verl.workers.engine.veomni.config import (
    ParallelSizes,
    VeOmniEngineConfig,
    foundation_model_kwargs,
    ops_implementation_kwargs,
    parallel_sizes,
    parallel_state_kwargs,
    parallelize_kwargs,
    parameter_names,
)


def test_parallel_sizes_by_hand():
    """Invariant: world = dp * ulysses and dp = replicate * shard.
    world 16, ulysses 2 -> dp 8; fsdp_size 4 -> 8 / 4 = 2 replicas of 4 shards; ep 4 divides dp 8.
    fsdp_size -1 -> one shard group of all dp ranks (replicate 1)."""
    cfg = VeOmniEngineConfig(ulysses_parallel_size=2, fsdp_size=4, expert_parallel_size=4)
    assert parallel_sizes(cfg, 16) == ParallelSizes(
        dp_size=8, dp_replicate_size=2, dp_shard_size=4, ulysses_size=2, ep_size=4
    )
    assert parallel_sizes(VeOmniEngineConfig(), 8) == ParallelSizes(8, 1, 8, 1, 1)
    # VeOmni's rule (ep divides dp_shard x ulysses): world 16, ulysses 4 -> dp 4 shards; ep 8 divides 4 x 4 = 16
    wide = VeOmniEngineConfig(ulysses_parallel_size=4, expert_parallel_size=8)
    assert parallel_sizes(wide, 16) == ParallelSizes(4, 1, 4, 4, 8)


@pytest.mark.parametrize(
    ("overrides", "world", "key"),
    [
        ({"ulysses_parallel_size": 3}, 8, "ulysses_parallel_size"),  # 8 % 3 != 0
        ({"fsdp_size": 3}, 8, "fsdp_size"),  # dp 8 % 3 != 0
        ({"expert_parallel_size": 3}, 8, "expert_parallel_size"),  # shard 8 x ulysses 1 = 8, 8 % 3 != 0
        # fsdp_size 2 x ulysses 2 = 4 ranks per parameter shard group, 4 % 8 != 0
        ({"expert_parallel_size": 8, "fsdp_size": 2, "ulysses_parallel_size": 2}, 16, "expert_parallel_size"),
    ],
)
def test_parallel_sizes_errors_name_the_key(overrides, world, key):
    """Invariant: a size that does not divide its parent raises ConfigError naming the config key."""
    cfg = VeOmniEngineConfig(**overrides)
    with pytest.raises(ConfigError, match=key):
        parallel_sizes(cfg, world)


def test_config_validation():
    """Invariant: the config refuses another strategy, a zero fsdp_size and an unknown init device, naming each."""
    with pytest.raises(ConfigError, match="strategy"):
        VeOmniEngineConfig(strategy="fsdp2")
    with pytest.raises(ConfigError, match="fsdp_size"):
        VeOmniEngineConfig(fsdp_size=0)
    with pytest.raises(ConfigError, match="init_device"):
        VeOmniEngineConfig(init_device="disk")
    assert VeOmniEngineConfig(ulysses_parallel_size=2).ulysses_sequence_parallel_size == 2


def _new_init(
    dp_size=1,
    dp_replicate_size=1,
    dp_shard_size=1,
    ulysses_size=1,
    dp_mode="fsdp2",
    device_type=None,
    extra_parallel_sizes=(),
    extra_parallel_names=(),
    **kwargs,
):
    """Signature of a recent init_parallel_state (generic extra parallel dims)."""


def _old_init(
    dp_size=1,
    dp_replicate_size=1,
    dp_shard_size=1,
    tp_size=1,
    ep_size=1,
    pp_size=1,
    ulysses_size=1,
    dp_mode="fsdp2",
    device_type=None,
):
    """Signature of an older init_parallel_state (named ep_size)."""


def test_parallel_state_kwargs_pick_the_installed_spelling_of_expert_parallelism():
    """Invariant: ep reaches init_parallel_state as extra_parallel_sizes=(ep,) with names ("ep",) when the installed
    function has them, else as ep_size; the dp/ulysses sizes and dp_mode=fsdp2 are always passed."""
    cfg = VeOmniEngineConfig(expert_parallel_size=2)
    new = parallel_state_kwargs(cfg, 4, "npu", parameter_names(_new_init))
    assert new == {
        "dp_size": 4,
        "dp_replicate_size": 1,
        "dp_shard_size": 4,
        "ulysses_size": 1,
        "dp_mode": "fsdp2",
        "device_type": "npu",
        "extra_parallel_sizes": (2,),
        "extra_parallel_names": ("ep",),
    }
    old = parallel_state_kwargs(cfg, 4, "cuda", parameter_names(_old_init))
    assert old["ep_size"] == 2 and "extra_parallel_sizes" not in old
    with pytest.raises(RuntimeError, match=r"pip install verl\[veomni\]"):
        parallel_state_kwargs(cfg, 4, "cuda", frozenset({"dp_size"}))


def test_parameter_names_ignore_var_keyword():
    """Invariant: **kwargs does not count as accepting a name (it would swallow a misspelt keyword silently)."""
    assert parameter_names(_new_init) >= {"extra_parallel_sizes", "dp_mode"}
    assert "kwargs" not in parameter_names(_new_init)


def test_ops_implementation_rewrites_flash_attention_for_ulysses():
    """Invariant: with Ulysses > 1 flash_attention_2 (and flex) become VeOmni's SP variants; SP 1 is unchanged;
    sdpa under SP (no all-to-all in VeOmni: each rank would attend within its slice) is refused naming the key;
    every kernel switch is passed through (Qwen3.5 GDN kernels must be chosen explicitly on NPU)."""
    sp = VeOmniEngineConfig(ulysses_parallel_size=2, chunk_gated_delta_rule_implementation="npu_ascendc")
    ops = ops_implementation_kwargs(sp)
    assert ops["attn_implementation"] == "veomni_flash_attention_2_with_sp"
    assert ops["chunk_gated_delta_rule_implementation"] == "npu_ascendc" and ops["moe_implementation"] == "fused"
    assert len(ops) == 10
    assert ops_implementation_kwargs(VeOmniEngineConfig())["attn_implementation"] == "flash_attention_2"
    flex = VeOmniEngineConfig(ulysses_parallel_size=2, attn_implementation="flex_attention")
    assert ops_implementation_kwargs(flex)["attn_implementation"] == "veomni_flex_attention_with_sp"
    assert ops_implementation_kwargs(VeOmniEngineConfig(attn_implementation="sdpa"))["attn_implementation"] == "sdpa"
    with pytest.raises(ConfigError, match=r"attn_implementation.*sdpa.*ulysses_parallel_size"):
        VeOmniEngineConfig(ulysses_parallel_size=2, attn_implementation="sdpa")


def test_foundation_model_kwargs():
    """Invariant: paths, dtype name (bf16 -> "bfloat16"), init device and the ops object are passed as given."""
    ops = object()
    kwargs = foundation_model_kwargs(VeOmniEngineConfig(model_dtype="bf16"), "/m", "/c", ops_implementation=ops)
    assert kwargs == {
        "config_path": "/c",
        "weights_path": "/m",
        "torch_dtype": "bfloat16",
        "init_device": "meta",
        "ops_implementation": ops,
        "force_use_huggingface": False,
    }


def _build_foundation_model_0_1_12(
    config_path,
    weights_path=None,
    torch_dtype="bfloat16",
    attn_implementation=None,
    init_device="cuda",
    config_kwargs=None,
    encoder_data_balance=False,
    encoder_data_balance_sorting_algo="post_mbs_balancing_greedy_without_pad",
    ops_implementation=None,
):
    """The signature of veomni 0.1.12's build_foundation_model (read from the installed wheel)."""


def test_foundation_model_kwargs_fit_veomni_0_1_12():
    """veomni 0.1.12 has no force_use_huggingface: the engine's arguments bind to its signature (they used to
    raise TypeError: unexpected keyword), and force_use_huggingface=true is refused naming the key."""
    import inspect

    accepted = parameter_names(_build_foundation_model_0_1_12)
    kwargs = foundation_model_kwargs(VeOmniEngineConfig(), "/m", "/c", ops_implementation=object(), accepted=accepted)
    inspect.signature(_build_foundation_model_0_1_12).bind(**kwargs)
    assert "force_use_huggingface" not in kwargs
    with pytest.raises(ConfigError, match="force_use_huggingface.*MODELING_BACKEND=hf"):
        foundation_model_kwargs(
            VeOmniEngineConfig(force_use_huggingface=True), "/m", "/c", ops_implementation=None, accepted=accepted
        )


class _MixedPrecisionConfig:
    def __init__(self, enable):
        self.enable = enable


def _parallelize_new(
    model,
    weights_path=None,
    enable_reshard_after_forward=True,
    mixed_precision=None,
    enable_gradient_checkpointing=True,
    basic_modules=None,
    **kwargs,
):
    """Recent build_parallelize_model."""


def _parallelize_old(
    model,
    weights_path=None,
    sharding_plan=None,
    enable_full_shard=True,
    enable_mixed_precision=True,
    enable_gradient_checkpointing=True,
    basic_modules=None,
    **kwargs,
):
    """Older build_parallelize_model."""


def test_parallelize_kwargs_for_both_api_generations():
    """Invariant: mixed precision and full-shard reach the installed spelling (MixedPrecisionConfig(enable=...) and
    enable_reshard_after_forward, or enable_mixed_precision and enable_full_shard); basic_modules is the sorted union
    of the model's _no_split_modules (a set in transformers 5, field-report item 6) and the configured extras."""
    cfg = VeOmniEngineConfig(mixed_precision=False, enable_full_shard=False, basic_modules=["VisionBlock"])
    common = dict(weights_path="/m", model_basic_modules={"B", "A"}, enable_gradient_checkpointing=True)
    new = parallelize_kwargs(
        cfg, **common, accepted=parameter_names(_parallelize_new), mixed_precision_cls=_MixedPrecisionConfig
    )
    assert new["mixed_precision"].enable is False and "enable_mixed_precision" not in new
    assert new["enable_reshard_after_forward"] is False and "enable_full_shard" not in new
    assert new["basic_modules"] == ["A", "B", "VisionBlock"]
    assert new["init_device"] == "meta" and new["enable_forward_prefetch"] is True
    old = parallelize_kwargs(
        cfg, **common, accepted=parameter_names(_parallelize_old), mixed_precision_cls=_MixedPrecisionConfig
    )
    assert old["enable_mixed_precision"] is False and "mixed_precision" not in old
    assert old["enable_full_shard"] is False and "enable_reshard_after_forward" not in old
