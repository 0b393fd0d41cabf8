"""Give one module instance its own ``forward`` in a way that later model-wide passes cannot undo.

Every model patch of this package replaces the forward of chosen module *instances* (never a class for everyone,
never at import). The obvious way, ``module.forward = types.MethodType(fn, module)``, stores a bound method in the
instance ``__dict__``. That is fragile in two ways, both seen on real models:

* transformers 5.25 routes around it. ``from_pretrained`` turns on the hub-kernel layer (the ``kernels`` package),
  and every ``model.train()`` / ``model.eval()`` that changes the mode *re-kernelizes* the model: for each module
  whose class is decorated with ``@use_kernel_forward_from_hub`` (Qwen3.5's Gated DeltaNet, its norms, its router)
  the kernels library resets the instance to its class's forward by popping ``forward`` from ``__dict__``. The
  patch was applied, reported, and silently gone at the first ``train()``.
* A bound method that points back at its module makes ``copy.deepcopy`` of the model recurse without end (the
  copy re-binds the method through ``nn.Module.__getattr__`` before the copy has its ``_parameters``).

Here the instance instead gets a *class of its own*: a subclass of its class, made once per class (cached), whose
``forward`` calls the replacement stored under :data:`FORWARD_ATTR` on the instance — a plain function
``fn(module, *args, **kwargs)``, never a bound method. Nothing that manipulates ``forward`` attributes can drop
it, and the original class, all other instances and other models are untouched (FSDP2 wraps modules the same way,
with a per-class ``FSDP<Class>`` subclass). The subclass keeps the class name, so code that looks modules up by
class name (wrap policies, ``_no_split_modules``) sees no difference; ``isinstance`` checks against the original
class still hold. It also:

* sets ``kernel_condition`` (the opt-out hook of the ``kernels`` library) to refuse kernelization: a hub kernel
  installed later would otherwise take the place of the project's forward;
* pickles and deep-copies as "an instance of the patched subclass of <original class>", so a copy runs the same
  replacement (the replacement must itself be picklable: a module-level function, or a ``functools.partial`` /
  small object of picklable values).

Whether a patched forward is really on the call path is checked separately, by running the model
(:mod:`verl.models.transformers.patch_probe`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch.nn as nn

__all__ = [
    "FORWARD_ATTR",
    "call_original_forward",
    "has_own_forward",
    "original_class",
    "set_forward",
]

# Instance attribute holding the replacement forward, ``fn(module, *args, **kwargs)``.
FORWARD_ATTR = "_verl_forward"
_ORIGINAL_CLASS_ATTR = "_verl_original_class"
_PATCHED_CLASSES: dict[type, type] = {}


def _dispatch_forward(self: nn.Module, *args: Any, **kwargs: Any) -> Any:
    replacement = self.__dict__.get(FORWARD_ATTR)
    if replacement is None:  # e.g. a module built directly from the subclass: behave like the original
        return call_original_forward(self, *args, **kwargs)
    return replacement(self, *args, **kwargs)


def _never_kernelize(_module: nn.Module) -> bool:
    return False


def _new_patched_instance(original: type) -> nn.Module:
    """Unpickling / deep-copy constructor: an empty instance of the patched subclass of ``original``."""
    cls = _patched_class(original)
    return cls.__new__(cls)


def _reduce_ex(self: nn.Module, protocol: int) -> tuple:
    # object's own reduction, with the class (which pickle cannot find by name) replaced by its recipe
    reduced = object.__reduce_ex__(self, max(protocol, 2))
    return (_new_patched_instance, (getattr(type(self), _ORIGINAL_CLASS_ATTR),), *reduced[2:])


def _patched_class(original: type) -> type:
    cached = _PATCHED_CLASSES.get(original)
    if cached is None:
        cached = type(
            original.__name__,
            (original,),
            {
                "forward": _dispatch_forward,
                "kernel_condition": staticmethod(_never_kernelize),
                "__reduce_ex__": _reduce_ex,
                _ORIGINAL_CLASS_ATTR: original,
                "__module__": original.__module__,
                "__qualname__": original.__qualname__,
                "__doc__": f"{original.__name__} with a per-instance forward (verl model patch).",
            },
        )
        _PATCHED_CLASSES[original] = cached
    return cached


def original_class(module: nn.Module) -> type:
    """The class ``module`` had before any patch gave it a forward of its own (its own class otherwise)."""
    for cls in type(module).__mro__:
        original = cls.__dict__.get(_ORIGINAL_CLASS_ATTR)
        if original is not None:
            return original
    return type(module)


def has_own_forward(module: nn.Module) -> bool:
    """True when a patch gave ``module`` its own forward (:func:`set_forward`)."""
    return module.__dict__.get(FORWARD_ATTR) is not None


def set_forward(module: nn.Module, forward: Callable[..., Any]) -> None:
    """Make ``forward(module, *args, **kwargs)`` the forward of this instance only (module docstring).

    ``forward`` must not be a bound method (deep copies would recurse) and should be picklable. Calling it again
    replaces the previous replacement; :func:`call_original_forward` always reaches the class's own forward.
    """
    if hasattr(forward, "__self__") and not isinstance(forward, type):
        raise TypeError(f"set_forward needs a plain function fn(module, ...), got the bound method {forward!r}")
    if not getattr(type(module), _ORIGINAL_CLASS_ATTR, None):
        module.__class__ = _patched_class(type(module))
    object.__setattr__(module, FORWARD_ATTR, forward)


def call_original_forward(module: nn.Module, *args: Any, **kwargs: Any) -> Any:
    """Run the forward ``module``'s class had before it was patched (e.g. a patch deferring to HF's own code)."""
    return original_class(module).forward(module, *args, **kwargs)
