"""Small pure-Python helpers shared by the protocol, the single controller and the trainer (upstream names).

* dict helpers: ``union_two_dict``, ``append_to_dict``, ``list_of_dict_to_dict_of_list``, ``rename_dict``;
* ``DynamicEnum``: an enum whose members can be added at runtime (``Dispatch`` / ``Execute`` are built on it) and
  that pickle *by name*, so a member sent to a Ray actor is the same object there;
* ``temp_env_var``: set an environment variable for the duration of a ``with`` block;
* ``convert_to_regular_types``: turn OmegaConf containers into plain lists / dicts (e.g. before pickling).
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any

from verl.upstream_gaps import missing_name_getattr

__all__ = [
    "DynamicEnum",
    "DynamicEnumMeta",
    "append_to_dict",
    "convert_to_regular_types",
    "flatten",
    "list_of_dict_to_dict_of_list",
    "rename_dict",
    "temp_env_var",
    "union_two_dict",
]


def union_two_dict(dict1: dict, dict2: dict) -> dict:
    """Merge ``dict2`` into ``dict1`` in place and return ``dict1``.

    A key present in both must map to equal values; otherwise the merge would silently pick one side.

    Raises:
        ValueError: naming the conflicting key.
    """
    for key, val in dict2.items():
        if key in dict1 and not _plain_equal(dict1[key], val):
            raise ValueError(
                f"union of two dicts: key {key!r} has conflicting values {dict1[key]!r} and {val!r}; "
                "rename one of them or make them equal before the union"
            )
        dict1[key] = val
    return dict1


def _plain_equal(a: Any, b: Any) -> bool:
    # `==` on numpy arrays / tensors is elementwise; compare shapes first, then reduce to one bool.
    if hasattr(a, "shape") or hasattr(b, "shape"):
        if getattr(a, "shape", None) != getattr(b, "shape", None) or type(a) is not type(b):
            return False
        return bool((a == b).all())
    return bool(a == b)


def append_to_dict(data: dict[str, list], new_data: dict[str, Any]) -> None:
    """Append every value of ``new_data`` to the list stored under the same key in ``data`` (created if absent)."""
    for key, val in new_data.items():
        data.setdefault(key, []).append(val)


def list_of_dict_to_dict_of_list(list_of_dict: list[dict]) -> dict[str, list]:
    """``[{"a": 1, "b": 2}, {"a": 3, "b": 4}] -> {"a": [1, 3], "b": [2, 4]}``.

    Every dict must have the keys of the first one (a missing or extra key would misalign the lists).

    Raises:
        ValueError: naming the element and the key that differs.
    """
    if len(list_of_dict) == 0:
        return {}
    keys = list(list_of_dict[0].keys())
    output: dict[str, list] = {key: [] for key in keys}
    for index, data in enumerate(list_of_dict):
        if set(data.keys()) != set(keys):
            extra = sorted(set(data.keys()) - set(keys), key=str)
            missing = sorted(set(keys) - set(data.keys()), key=str)
            raise ValueError(
                f"list_of_dict_to_dict_of_list: element {index} has keys that differ from element 0 "
                f"(extra: {extra}, missing: {missing})"
            )
        for key in keys:
            output[key].append(data[key])
    return output


def rename_dict(data: dict, prefix: str = "") -> dict:
    """Return a copy of ``data`` whose keys are ``prefix + key``."""
    return {prefix + str(key): val for key, val in data.items()}


@contextmanager
def temp_env_var(key: str, value: str) -> Iterator[None]:
    """Set ``os.environ[key] = value`` inside the block, then restore the previous value (or remove the key)."""
    previous = os.environ.get(key)
    os.environ[key] = value
    try:
        yield
    finally:
        if previous is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = previous


def convert_to_regular_types(obj: Any) -> Any:
    """Recursively convert OmegaConf ``ListConfig`` / ``DictConfig`` (and tuples) into plain lists / dicts."""
    try:
        from omegaconf import DictConfig, ListConfig
    except ImportError:  # omegaconf is optional for this helper
        DictConfig = ListConfig = ()  # noqa: N806
    if isinstance(obj, ListConfig | list | tuple):
        return [convert_to_regular_types(x) for x in obj]
    if isinstance(obj, DictConfig | dict):
        return {key: convert_to_regular_types(val) for key, val in obj.items()}
    return obj


class DynamicEnumMeta(type):
    """Metaclass giving ``DynamicEnum`` subclasses enum-like class behaviour (iteration, ``in``, ``[name]``)."""

    def __iter__(cls) -> Iterator[DynamicEnum]:
        return iter(cls._registry.values())

    def __contains__(cls, item: object) -> bool:
        if isinstance(item, str):
            return item.upper() in cls._registry
        return item in cls._registry.values()

    def __getitem__(cls, name: str) -> DynamicEnum:
        return cls._registry[name.upper()]

    def names(cls) -> list[str]:
        return list(cls._registry.keys())

    def values(cls) -> list[DynamicEnum]:
        return list(cls._registry.values())


class DynamicEnum(metaclass=DynamicEnumMeta):
    """Enum whose members are registered at runtime with ``register(name)``.

    Each subclass must define its own ``_registry = {}`` and ``_next_value = 0``. Members compare by identity;
    pickling goes through the member's name so that an unpickled member *is* the registered one.
    """

    _registry: dict[str, DynamicEnum] = {}
    _next_value: int = 0

    def __init__(self, name: str, value: int) -> None:
        self.name = name
        self.value = value

    def __repr__(self) -> str:
        return f"<{type(self).__name__}.{self.name}: {self.value}>"

    def __reduce__(self) -> tuple:
        return _lookup_dynamic_enum_member, (type(self).__module__, type(self).__qualname__, self.name)

    @classmethod
    def register(cls, name: str) -> DynamicEnum:
        """Add member ``name.upper()``; raises ValueError if it already exists."""
        key = name.upper()
        if key in cls._registry:
            raise ValueError(f"{cls.__name__}.{key} is already registered; pick another name")
        member = cls(key, cls._next_value)
        cls._registry[key] = member
        setattr(cls, key, member)
        cls._next_value += 1
        return member

    @classmethod
    def remove(cls, name: str) -> DynamicEnum:
        """Remove and return member ``name.upper()``; raises KeyError if absent."""
        key = name.upper()
        member = cls._registry.pop(key)
        delattr(cls, key)
        return member

    @classmethod
    def from_name(cls, name: str) -> DynamicEnum | None:
        """The member called ``name`` (case-insensitive), or None."""
        return cls._registry.get(name.upper())


def _lookup_dynamic_enum_member(module: str, qualname: str, name: str) -> DynamicEnum:
    enum_cls: Any = importlib.import_module(module)
    for part in qualname.split("."):
        enum_cls = getattr(enum_cls, part)
    return enum_cls[name]


def flatten(list_of_lists: Iterable[Iterable[Any]]) -> list[Any]:
    """``[[1, 2], [3]] -> [1, 2, 3]``."""
    return [item for sub in list_of_lists for item in sub]


__getattr__ = missing_name_getattr(__name__)  # upstream names missing here raise with the reason (verl.upstream_gaps)
