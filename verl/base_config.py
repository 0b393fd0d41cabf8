"""`BaseConfig`: the typed dataclass every verl config node derives from.

Upstream user code treats config nodes as mappings (`cfg["lr"]`, `cfg.get("lr")`, `dict(cfg)`), because they
used to be OmegaConf `DictConfig`s. `BaseConfig` keeps that surface while the values live in typed dataclass
fields, so each default has exactly one home (the dataclass field) and typos fail loudly:

* read like a read-only Mapping: `cfg["k"]`, `cfg.get("k")`, `"k" in cfg` over the declared fields, and, as
  upstream, over properties and runtime attributes (`cfg["n_gpus"]`); `keys()`, `items()`, `len(cfg)` and
  iteration cover the declared fields only;
* frozen after construction: re-assigning a field raises `dataclasses.FrozenInstanceError`, except for the
  names a subclass lists in `_mutable_fields` (the rollout's `max_model_len`, which a server may shrink, for instance);
* closed for config keys: a key that is not a field is refused when the config is built (by
  `omega_conf_to_dataclass`, naming the full key path). After construction, code may attach runtime attributes
  that are not config keys (upstream sets e.g. `model_config.share_embeddings_and_output_weights` or
  `actor_config.global_batch_info`); but an attribute whose name is close to a field's
  (`cfg.ppo_mini_batchsize = 8`) is a typo of a config key and raises `AttributeError` naming that field, so it
  can never silently create a second, ignored setting. Runtime attributes take no part in equality,
  iteration or `to_dict()`.

Cross-field checks live in each subclass's `__post_init__` and raise `ConfigError` (a `ValueError`) naming the
key relative to the node; `verl.utils.config.omega_conf_to_dataclass` prefixes the full key path
(`actor_rollout_ref.actor.ppo_mini_batch_size`) when it builds the node from Hydra.
"""

from __future__ import annotations

import collections.abc
import dataclasses
import difflib
from collections.abc import Iterator
from dataclasses import FrozenInstanceError, dataclass, field
from typing import Any, ClassVar

__all__ = ["BaseConfig", "ConfigError", "field_default", "require_choice", "require_positive"]


class ConfigError(ValueError):
    """A configuration value the user can fix.

    `name` is the dotted key relative to the config node that raised (e.g. `"ppo_mini_batch_size"` or
    `"fsdp_config.strategy"`) and `node` the path of that node once known (`"actor_rollout_ref.actor"`);
    `key` is the full path. The message may write `{node}.other_key` to name a sibling key: the placeholder
    is replaced by the node path when it is known and dropped otherwise.
    """

    def __init__(self, name: str, message: str, node: str = ""):
        self.name = name
        self.node = node
        self.detail = message
        super().__init__(f"{self.key}: {self._render(message)}" if self.key else self._render(message))

    @property
    def key(self) -> str:
        """The full dotted key path (`node.name`)."""
        return ".".join(p for p in (self.node, self.name) if p)

    def _render(self, message: str) -> str:
        return message.replace("{node}.", f"{self.node}." if self.node else "")

    def under(self, prefix: str) -> ConfigError:
        """The same error rebased under the path of the node that holds the raising node."""
        if not prefix:
            return self
        return ConfigError(self.name, self.detail, ".".join(p for p in (prefix, self.node) if p))


def closest_names(name: str, candidates: collections.abc.Iterable[str]) -> str:
    """' Did you mean: a, b?' for the field names closest to `name` ('' when nothing is close)."""
    matches = difflib.get_close_matches(name, list(candidates), n=3, cutoff=0.6)
    return f" Did you mean: {', '.join(matches)}?" if matches else ""


# Similarity (difflib ratio) above which a new attribute name counts as a typo of a field name:
# "ppo_mini_batchsize" vs "ppo_mini_batch_size" is 0.97, "global_batch_info" vs any actor key below 0.6.
_TYPO_CUTOFF = 0.8


def _is_property(cls: type, name: str) -> bool:
    return isinstance(getattr(cls, name, None), property)


@dataclass
class BaseConfig(collections.abc.Mapping):
    """A dataclass that is also a read-only Mapping over its field names (see the module docstring)."""

    # Field names a caller may re-assign after construction. Everything else is frozen.
    _mutable_fields: ClassVar[frozenset[str]] = frozenset()

    _target_: str = field(default="", compare=False)
    """Import path of the class, as written in the YAML node; informational once the object exists (it does not
    take part in equality, so a config built from YAML equals the same config built in Python)."""

    def __setattr__(self, name: str, value: Any) -> None:
        fields = self.__dataclass_fields__
        if name not in fields:
            self._set_runtime_attribute(name, value)
            return
        if name in self.__dict__ and name not in self._mutable_fields:
            raise FrozenInstanceError(
                f"{type(self).__name__}.{name} is frozen after construction; derive a new config with "
                f"dataclasses.replace(cfg, {name}=...) instead of mutating this one."
            )
        object.__setattr__(self, name, value)

    def _set_runtime_attribute(self, name: str, value: Any) -> None:
        """Attach a non-config attribute, unless ``name`` looks like a typo of a config key (see the docstring)."""
        close = difflib.get_close_matches(name, list(self.__dataclass_fields__), n=3, cutoff=_TYPO_CUTOFF)
        if close:
            raise AttributeError(
                f"{type(self).__name__} has no config key {name!r}. Did you mean: {', '.join(close)}? Config keys "
                f"are the dataclass fields; a runtime attribute needs a name that is not close to one of them."
            )
        object.__setattr__(self, name, value)

    def _normalize(self, name: str, value: Any) -> None:
        """Set a field from `__post_init__` (normalising an alias, linking two keys); bypasses freezing."""
        if name not in self.__dataclass_fields__:
            raise AttributeError(f"{type(self).__name__} has no field {name!r}")
        object.__setattr__(self, name, value)

    # ---- read-only Mapping over field names (compatibility with code written for DictConfig) ----
    def __getitem__(self, key: str) -> Any:
        if not isinstance(key, str):
            raise KeyError(key)
        if key in self.__dataclass_fields__ or key in self.__dict__ or _is_property(type(self), key):
            return getattr(self, key)
        raise KeyError(key)

    def __iter__(self) -> Iterator[str]:
        return iter(f.name for f in dataclasses.fields(self))

    def __len__(self) -> int:
        return len(dataclasses.fields(self))

    def to_dict(self) -> dict[str, Any]:
        """A plain nested dict of the fields (nested configs become dicts), e.g. for experiment trackers."""
        return dataclasses.asdict(self)


# ---- small checks shared by the config dataclasses' __post_init__ ----
def require_choice(name: str, value: Any, choices: collections.abc.Collection[Any]) -> None:
    """Raise ConfigError unless `value` is one of `choices`."""
    if value not in choices:
        options = " | ".join(str(c) for c in choices)
        raise ConfigError(name, f"{value!r} is not supported; choose one of: {options}.")


def require_positive(name: str, value: int | float | None, *, allow_none: bool = False) -> None:
    """Raise ConfigError unless `value > 0` (or None when `allow_none`)."""
    if value is None and allow_none:
        return
    if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
        raise ConfigError(name, f"must be a positive number, got {value!r}.")


def field_default(cls: type, name: str) -> Any:
    """The declared default of dataclass field `name` of `cls` (calling its default_factory)."""
    f = cls.__dataclass_fields__[name]
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    raise ConfigError(name, f"{cls.__name__}.{name} has no default")
