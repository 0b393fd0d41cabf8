"""`BaseConfig`: the typed dataclass every verl config node derives from.

Upstream user code treats config nodes as mappings (`cfg["lr"]`, `cfg.get("lr")`, `dict(cfg)`), because they
used to be OmegaConf `DictConfig`s. `BaseConfig` keeps that surface while the values live in typed dataclass
fields, so each default has exactly one home (the dataclass field) and typos fail loudly:

* read like a read-only Mapping: `cfg["k"]`, `cfg.get("k")`, `"k" in cfg`, `keys()`, `items()`, `len(cfg)`,
  iteration over field names;
* frozen after construction: re-assigning a field raises `dataclasses.FrozenInstanceError`, except for the
  names a subclass lists in `_mutable_fields` (per-rank batch sizes a worker normalises, for instance);
* closed: assigning an attribute that is not a field raises `AttributeError` naming the class and the
  closest field names, so `cfg.ppo_mini_batchsize = 8` can never silently create a new attribute.

Cross-field checks live in each subclass's `__post_init__` and raise `ConfigError` (a `ValueError`) naming the
key relative to the node; `verl.utils.config.omega_conf_to_dataclass` prefixes the full key path
(`actor_rollout_ref.actor.ppo_mini_batch_size`) when it builds the node from Hydra.
"""

from __future__ import annotations

import collections.abc
import dataclasses
import difflib
from collections.abc import Iterator
from dataclasses import FrozenInstanceError, dataclass
from typing import Any, ClassVar

__all__ = ["BaseConfig", "ConfigError"]


class ConfigError(ValueError):
    """A configuration value the user can fix.

    `key` is the dotted key relative to the config node that raised (e.g. `"ppo_mini_batch_size"` or
    `"fsdp_config.strategy"`); `under(prefix)` rebases it onto the node's full path.
    """

    def __init__(self, key: str, message: str):
        self.key = key
        self.detail = message
        super().__init__(f"{key}: {message}" if key else message)

    def under(self, prefix: str) -> ConfigError:
        """The same error with `key` prefixed by the path of the node that holds it."""
        if not prefix:
            return self
        return ConfigError(f"{prefix}.{self.key}" if self.key else prefix, self.detail)


def closest_names(name: str, candidates: collections.abc.Iterable[str]) -> str:
    """' Did you mean: a, b?' for the field names closest to `name` ('' when nothing is close)."""
    matches = difflib.get_close_matches(name, list(candidates), n=3, cutoff=0.6)
    return f" Did you mean: {', '.join(matches)}?" if matches else ""


@dataclass
class BaseConfig(collections.abc.Mapping):
    """A dataclass that is also a read-only Mapping over its field names (see the module docstring)."""

    # Field names a caller may re-assign after construction. Everything else is frozen.
    _mutable_fields: ClassVar[frozenset[str]] = frozenset()

    _target_: str = ""
    """Import path of the class, as written in the YAML node; informational once the object exists."""

    def __setattr__(self, name: str, value: Any) -> None:
        fields = self.__dataclass_fields__
        if name not in fields:
            raise AttributeError(
                f"{type(self).__name__} has no config key {name!r}.{closest_names(name, fields)} "
                f"Config objects are closed: add the field to the dataclass instead."
            )
        if name in self.__dict__ and name not in self._mutable_fields:
            raise FrozenInstanceError(
                f"{type(self).__name__}.{name} is frozen after construction; derive a new config with "
                f"dataclasses.replace(cfg, {name}=...) instead of mutating this one."
            )
        object.__setattr__(self, name, value)

    def _normalize(self, name: str, value: Any) -> None:
        """Set a field from `__post_init__` (normalising an alias, linking two keys); bypasses freezing."""
        if name not in self.__dataclass_fields__:
            raise AttributeError(f"{type(self).__name__} has no field {name!r}")
        object.__setattr__(self, name, value)

    # ---- read-only Mapping over field names (compatibility with code written for DictConfig) ----
    def __getitem__(self, key: str) -> Any:
        if not isinstance(key, str) or key not in self.__dataclass_fields__:
            raise KeyError(key)
        return getattr(self, key)

    def __iter__(self) -> Iterator[str]:
        return iter(f.name for f in dataclasses.fields(self))

    def __len__(self) -> int:
        return len(dataclasses.fields(self))

    def to_dict(self) -> dict[str, Any]:
        """A plain nested dict of the fields (nested configs become dicts), e.g. for experiment trackers."""
        return dataclasses.asdict(self)
