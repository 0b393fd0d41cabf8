"""FSDPEngineConfig checks and the role <-> fsdp_config link (one setting per knob; field report item 9)."""

import pytest

from verl.workers.config import FSDPActorConfig, FSDPCriticConfig, FSDPCriticModelCfg, FSDPEngineConfig, FSDPRefConfig


def test_engine_strategy_follows_the_role():
    """A null fsdp_config.strategy takes the role's strategy (actor, ref and critic)."""
    assert FSDPActorConfig(strategy="fsdp2").fsdp_config.strategy == "fsdp2"
    assert FSDPRefConfig(strategy="fsdp2").fsdp_config.strategy == "fsdp2"
    assert FSDPCriticConfig(strategy="fsdp2").model.fsdp_config.strategy == "fsdp2"


def test_engine_strategy_contradiction_names_both_keys():
    """fsdp_config.strategy=fsdp under actor.strategy=fsdp2 raises (it used to build FSDP1 silently upstream)."""
    with pytest.raises(ValueError, match=r"^fsdp_config\.strategy: \(fsdp\) contradicts strategy \(fsdp2\)"):
        FSDPActorConfig(strategy="fsdp2", fsdp_config=FSDPEngineConfig(strategy="fsdp"))
    with pytest.raises(ValueError, match=r"^model\.fsdp_config\.strategy: \(fsdp2\) contradicts strategy \(fsdp\)"):
        FSDPCriticConfig(model=FSDPCriticModelCfg(fsdp_config=FSDPEngineConfig(strategy="fsdp2")))


def test_unknown_strategy():
    """Only fsdp and fsdp2 exist; the message lists them (an upstream backend such as megatron gets its own
    message: tests/workers/config/test_unsupported.py)."""
    with pytest.raises(ValueError, match=r"^strategy: 'deepspeed' is not supported; choose one of: fsdp \| fsdp2"):
        FSDPActorConfig(strategy="deepspeed")


@pytest.mark.parametrize(
    "key, value",
    [
        ("ulysses_sequence_parallel_size", 2),
        ("entropy_from_logits_with_chunking", True),
        ("entropy_from_logits_chunk_size", 512),
        ("entropy_checkpointing", True),
        ("use_torch_compile", False),
    ],
)
def test_linked_keys_whichever_side_is_set_wins(key, value):
    """Setting the role-level key reaches fsdp_config, and setting only the fsdp_config key reaches the role."""
    role_set = FSDPActorConfig(**{key: value})
    assert getattr(role_set, key) == getattr(role_set.fsdp_config, key) == value
    engine_set = FSDPActorConfig(fsdp_config=FSDPEngineConfig(**{key: value}))
    assert getattr(engine_set, key) == getattr(engine_set.fsdp_config, key) == value


def test_linked_keys_contradiction():
    """Both sides set to different non-default values is an error naming the engine key and the role key."""
    with pytest.raises(
        ValueError,
        match=r"^fsdp_config\.entropy_from_logits_chunk_size: \(512\) contradicts "
        r"entropy_from_logits_chunk_size \(1024\)",
    ):
        FSDPActorConfig(
            entropy_from_logits_chunk_size=1024, fsdp_config=FSDPEngineConfig(entropy_from_logits_chunk_size=512)
        )


def test_shared_engine_object_is_not_mutated():
    """Linking replaces the engine config by a copy, so an engine config shared between roles is left untouched."""
    shared = FSDPEngineConfig()
    actor = FSDPActorConfig(strategy="fsdp2", fsdp_config=shared)
    assert shared.strategy is None and actor.fsdp_config.strategy == "fsdp2"


def test_offload_policy_is_fsdp2_only():
    """offload_policy (CPUOffloadPolicy) with FSDP1 would do nothing: raise naming the key and the fix."""
    with pytest.raises(ValueError, match=r"^fsdp_config\.offload_policy: is FSDP2-only"):
        FSDPActorConfig(strategy="fsdp", fsdp_config=FSDPEngineConfig(offload_policy=True))
    assert FSDPActorConfig(
        strategy="fsdp2", fsdp_config=FSDPEngineConfig(offload_policy=True)
    ).fsdp_config.offload_policy


def test_offload_policy_switches_manual_offload_off():
    """Upstream semantics: with offload_policy the policy owns placement, so param/optimizer offload turn off."""
    engine = FSDPEngineConfig(offload_policy=True, param_offload=True, optimizer_offload=True)
    assert (engine.param_offload, engine.optimizer_offload) == (False, False)


def test_wrap_policy_and_mixed_precision_keys_are_checked():
    """Free-form dict nodes still reject misspelt keys."""
    with pytest.raises(ValueError, match=r"^wrap_policy\.min_params: unknown key"):
        FSDPEngineConfig(wrap_policy={"min_params": 1})
    with pytest.raises(ValueError, match=r"^mixed_precision\.param_type: unknown key"):
        FSDPEngineConfig(mixed_precision={"param_type": "bf16"})
    FSDPEngineConfig(wrap_policy={"transformer_layer_cls_to_wrap": ["Qwen3_5DecoderLayer"]})


def test_ref_engine_is_forward_only_by_default():
    """The reference policy's engine is forward-only (YAML ref/dp_ref.yaml sets the same)."""
    assert FSDPRefConfig().fsdp_config.forward_only is True
    assert FSDPActorConfig().fsdp_config.forward_only is False
