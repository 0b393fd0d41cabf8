"""Instance-scoped replacement of the globals a module's ``forward`` looks up.

Attention-level patches (NPU rotary / fused attention, Ulysses attention) must change a *module-global* function
that the installed transformers' ``forward`` calls. Instead of patching that global for everyone, one module
instance gets a copy of its class's ``forward`` whose globals map the name to the replacement: the exact installed
forward code runs, only for that instance. Used by ``npu_patches``, ``varlen_attention`` and ``ulysses``.

The instance keeps only the *replacements* (a dict of picklable values); the forward copy is built from them on first
use and cached outside the instance, so a deep copy or an unpickled model rebuilds its own copy and never shares or
serialises a function object with foreign globals. The copy becomes the instance's forward through
:func:`verl.models.transformers.instance_patch.set_forward`.
"""

from __future__ import annotations

import types
import weakref
from collections.abc import Callable
from typing import Any

import torch.nn as nn

from verl.models.transformers.instance_patch import original_class, set_forward
from verl.models.transformers.patch_registry import PatchSkipped

__all__ = [
    "FORWARD_GLOBALS_ATTR",
    "WrappedAttentionFunctions",
    "copy_with_globals",
    "innermost",
    "rebind_forward_globals",
]

# Attribute of a patched instance holding the globals its forward copy resolves (merged across patches).
FORWARD_GLOBALS_ATTR = "_verl_forward_globals"


def copy_with_globals(fn: Callable, replacements: dict[str, Any]) -> Callable:
    """A copy of ``fn`` (and of the functions it wraps via ``__wrapped__``) resolving ``replacements`` as globals."""
    inner = getattr(fn, "__wrapped__", None)
    closure = fn.__closure__
    new_inner = None
    if inner is not None and closure:
        new_inner = copy_with_globals(inner, replacements)
        closure = tuple(types.CellType(new_inner) if _cell_is(cell, inner) else cell for cell in closure)
    used = {k: v for k, v in replacements.items() if k in fn.__code__.co_names}
    fn_globals = {**fn.__globals__, **used} if used else fn.__globals__
    copy = types.FunctionType(fn.__code__, fn_globals, fn.__name__, fn.__defaults__, closure)
    copy.__kwdefaults__ = fn.__kwdefaults__
    copy.__dict__.update(fn.__dict__)
    copy.__qualname__ = fn.__qualname__
    if new_inner is not None:
        copy.__wrapped__ = new_inner
    return copy


def _cell_is(cell: types.CellType, obj: Any) -> bool:
    try:
        return cell.cell_contents is obj
    except ValueError:  # empty cell
        return False


def innermost(fn: Callable) -> Callable:
    while getattr(fn, "__wrapped__", None) is not None:
        fn = fn.__wrapped__
    return fn


# module -> (the replacements dict the copy was built from, the copy); weak, so modules are never kept alive
_FORWARD_COPIES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _forward_with_globals(module: nn.Module, *args: Any, **kwargs: Any) -> Any:
    """The forward of a rebound instance: its original class's forward run with the instance's replacements."""
    replacements = module.__dict__[FORWARD_GLOBALS_ATTR]
    built = _FORWARD_COPIES.get(module)
    if built is None or built[0] is not replacements:
        built = (replacements, copy_with_globals(original_class(module).forward, replacements))
        _FORWARD_COPIES[module] = built
    return built[1](module, *args, **kwargs)


def rebind_forward_globals(module: nn.Module, **replacements: Any) -> None:
    """Give ``module`` its own ``forward``: its class's forward with ``replacements`` as globals (merged with any
    replacements an earlier patch made on this instance). Replacement values should be picklable."""
    forward = original_class(module).forward
    code_names = innermost(forward).__code__.co_names
    missing = [name for name in replacements if name not in code_names]
    if missing:
        raise PatchSkipped(f"{type(module).__name__}.forward does not call {', '.join(missing)} in this transformers")
    merged = {**getattr(module, FORWARD_GLOBALS_ATTR, {}), **replacements}
    object.__setattr__(module, FORWARD_GLOBALS_ATTR, merged)
    set_forward(module, _forward_with_globals)


class WrappedAttentionFunctions:
    """Stands in for transformers' ``ALL_ATTENTION_FUNCTIONS`` inside one attention forward (bound there with
    :func:`rebind_forward_globals`): every lookup returns ``wrap(<what the wrapped registry returns>, <name>)``, so a
    patch routes packed input to its own kernel and keeps the configured implementation as the fallback. ``wrap``
    should be picklable (a module-level function or a ``functools.partial`` of one)."""

    def __init__(self, registry: Any, wrap: Callable[[Callable, str], Callable]):
        self._registry = registry
        self._wrap = wrap

    def __deepcopy__(self, memo: dict) -> WrappedAttentionFunctions:
        # a routing table, not state: a copied model shares it (and transformers' registry) with the original
        return self

    def get_interface(self, name: str, default: Callable) -> Callable:
        return self._wrap(self._registry.get_interface(name, default), name)

    def __getitem__(self, name: str) -> Callable:
        return self._wrap(self._registry[name], name)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") or name in ("_registry", "_wrap"):  # unpickling asks before __dict__ is set
            raise AttributeError(name)
        return getattr(self._registry, name)
