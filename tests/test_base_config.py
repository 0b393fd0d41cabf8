"""BaseConfig: a dataclass that reads like a read-only Mapping, frozen after construction and closed to new keys."""

import copy
import pickle
from dataclasses import FrozenInstanceError, dataclass, field, replace

import pytest

from verl.base_config import BaseConfig, ConfigError


@dataclass
class _Inner(BaseConfig):
    lr: float = 1e-6
    betas: list[float] = field(default_factory=lambda: [0.9, 0.999])


@dataclass
class _Outer(BaseConfig):
    _mutable_fields = frozenset({"micro_batch_size"})

    micro_batch_size: int = 4
    strategy: str = "fsdp"
    optim: _Inner = field(default_factory=_Inner)


def test_mapping_access_matches_attributes():
    """cfg["k"], cfg.get("k"), keys(), items(), len and iteration all expose exactly the dataclass fields."""
    cfg = _Outer(strategy="fsdp2")
    assert cfg["strategy"] == cfg.strategy == "fsdp2"
    assert cfg.get("strategy") == "fsdp2"
    assert cfg.get("not_a_key") is None
    assert cfg.get("not_a_key", 3) == 3
    assert "optim" in cfg and "nope" not in cfg
    assert list(cfg.keys()) == ["_target_", "micro_batch_size", "strategy", "optim"]
    assert len(cfg) == 4
    assert dict(cfg.items())["optim"]["lr"] == 1e-6
    assert list(iter(cfg)) == list(cfg.keys())


def test_missing_key_raises_keyerror():
    """cfg["missing"] raises KeyError like a dict (so `in` and `.get` work through Mapping)."""
    with pytest.raises(KeyError):
        _Outer()["missing"]
    with pytest.raises(KeyError):
        _Outer()[0]


def test_fields_are_frozen_unless_listed_mutable():
    """Re-assigning a field raises FrozenInstanceError unless the class lists it in _mutable_fields."""
    cfg = _Outer()
    with pytest.raises(FrozenInstanceError, match="dataclasses.replace"):
        cfg.strategy = "fsdp2"
    cfg.micro_batch_size = 2
    assert cfg.micro_batch_size == 2
    assert replace(cfg, strategy="fsdp2").strategy == "fsdp2"


def test_unknown_attribute_is_rejected_with_suggestion():
    """Setting an attribute that is not a field raises AttributeError naming the closest field."""
    cfg = _Outer()
    with pytest.raises(AttributeError, match="micro_batch_size"):
        cfg.micro_batchsize = 2
    assert not hasattr(cfg, "micro_batchsize")


def test_equality_copy_and_pickle_roundtrip():
    """Configs compare by value and survive deepcopy and pickle (Ray ships them to workers)."""
    cfg = _Outer(strategy="fsdp2", optim=_Inner(lr=3e-6))
    assert cfg == _Outer(strategy="fsdp2", optim=_Inner(lr=3e-6))
    assert cfg != _Outer()
    assert copy.deepcopy(cfg) == cfg
    assert pickle.loads(pickle.dumps(cfg)) == cfg


def test_to_dict_is_plain_nested_dict():
    """to_dict() turns nested configs into plain dicts (for trackers)."""
    assert _Outer().to_dict()["optim"] == {"_target_": "", "lr": 1e-6, "betas": [0.9, 0.999]}


def test_config_error_rebases_key_path():
    """ConfigError.under prefixes the relative key with the node path, also inside `{node}.` placeholders."""
    err = ConfigError("fsdp_config.strategy", "(fsdp) contradicts {node}.strategy (fsdp2)")
    assert isinstance(err, ValueError)
    assert str(err) == "fsdp_config.strategy: (fsdp) contradicts strategy (fsdp2)"
    full = err.under("actor").under("actor_rollout_ref")
    assert full.key == "actor_rollout_ref.actor.fsdp_config.strategy"
    assert str(full) == (
        "actor_rollout_ref.actor.fsdp_config.strategy: (fsdp) contradicts actor_rollout_ref.actor.strategy (fsdp2)"
    )


@dataclass
class _WithProperty(BaseConfig):
    # Upstream's subclass style: _mutable_fields built from the base with a set union.
    _mutable_fields = BaseConfig._mutable_fields | {"n"}

    n: int = 2
    per_node: int = 4

    @property
    def total(self) -> int:
        return self.n * self.per_node


def test_runtime_attributes_that_upstream_code_sets_are_allowed():
    """Upstream code attaches non-key attributes at run time (HFModelConfig.share_embeddings_and_output_weights,
    ActorConfig.global_batch_info): that works, the attribute reads through cfg[...] / cfg.get like upstream, and it
    is not a config key (not in keys(), equality, to_dict())."""
    cfg = _Outer()
    cfg.share_embeddings_and_output_weights = True
    cfg.global_batch_info = {"dp_size": 2}
    cfg.global_batch_info = {"dp_size": 4}  # runtime attributes stay assignable
    assert cfg.share_embeddings_and_output_weights is True
    assert cfg["global_batch_info"] == {"dp_size": 4} and cfg.get("global_batch_info") == {"dp_size": 4}
    assert "global_batch_info" in cfg and "global_batch_info" not in list(cfg.keys())
    assert cfg == _Outer() and "global_batch_info" not in cfg.to_dict()
    assert pickle.loads(pickle.dumps(cfg)).global_batch_info == {"dp_size": 4}


def test_properties_read_through_the_mapping_interface_and_upstream_mutable_style():
    """cfg["total"] / cfg.get("total") read a property (upstream's __getitem__ is getattr); methods are not keys.
    A `_mutable_fields = BaseConfig._mutable_fields | {...}` subclass works as upstream's."""
    cfg = _WithProperty(n=3)
    assert cfg["total"] == 12 and cfg.get("total") == 12
    assert "to_dict" not in cfg and cfg.get("to_dict") is None
    cfg.n = 5
    assert cfg.total == 20
    with pytest.raises(FrozenInstanceError):
        cfg.per_node = 1
    with pytest.raises(AttributeError, match="Did you mean: per_node"):
        cfg.pernode = 1  # a typo of a key is still refused
