"""Load user code named in the config: a Python file (or ``pkg://module``) plus an attribute name.

Upstream names: ``load_module``, ``load_extern_object``, ``load_extern_type``, ``load_class_from_fqn``,
``import_external_libs`` and the ``is_*_available`` probes. Used for ``reward.custom_reward_function``,
``data.custom_cls``, custom reward managers and samplers.

A file is executed as a fresh module that is *not* left in ``sys.modules``: cloudpickle (Ray) then ships the
functions and classes it defines by value, so a reward function loaded on the driver also works inside a Ray
actor on another process that cannot import the file by name. A function wrapped by :func:`as_extern_function`
(the reward function) pickles as the file's source instead and is re-executed where it is unpickled, so each
process gets its own module globals (see :class:`ExternFunction`).
"""

from __future__ import annotations

import functools
import hashlib
import importlib
import importlib.util
import os
import sys
import warnings
from collections.abc import Callable
from functools import cache
from types import ModuleType
from typing import Any

PKG_PREFIX = "pkg://"
FILE_PREFIX = "file://"


@cache
def _has_module(name: str) -> bool:
    """True when ``name`` can be imported, without importing it (cheap probe for optional backends)."""
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def is_vllm_available() -> bool:
    """True when vLLM is installed."""
    return _has_module("vllm")


def is_sglang_available() -> bool:
    """True when SGLang is installed."""
    return _has_module("sglang")


def is_megatron_core_available() -> bool:
    """True when Megatron-Core is installed."""
    return _has_module("megatron.core")


def is_trl_available() -> bool:
    """True when TRL is installed."""
    return _has_module("trl")


def is_msprobe_available() -> bool:
    """True when msprobe (the Ascend precision debugger) is installed."""
    return _has_module("msprobe")


def is_nvtx_available() -> bool:
    """True when the nvtx profiler annotations package is installed."""
    return _has_module("nvtx")


def _module_name_for(path: str) -> str:
    """A unique, stable module name for a file path (two files named ``reward.py`` must not collide)."""
    digest = hashlib.sha1(path.encode()).hexdigest()[:12]
    stem = os.path.splitext(os.path.basename(path))[0].replace("-", "_")
    return f"verl_extern_{stem}_{digest}"


def _exec_source_module(source: str, path: str, module_name: str | None) -> ModuleType:
    """Execute ``source`` (the text of the file at ``path``) as a new module and return it."""
    name = module_name or _module_name_for(path)
    spec = importlib.util.spec_from_loader(name, loader=None, origin=path)
    module = importlib.util.module_from_spec(spec)
    module.__file__ = path
    # Registered only while it runs: dataclasses and typing look the module up by name during class creation.
    sys.modules[name] = module
    try:
        exec(compile(source, path, "exec"), module.__dict__)  # noqa: S102 - the user's own file, named in the config
    except Exception as exc:
        raise ImportError(f"Executing {path!r} failed: {type(exc).__name__}: {exc}") from exc
    finally:
        if module_name is None:
            sys.modules.pop(name, None)
    return module


def _exec_file_module(path: str, module_name: str | None) -> ModuleType:
    """Execute the Python file at ``path`` as a new module and return it."""
    if not path.endswith(".py"):
        raise ImportError(f"Cannot load {path!r} as a Python module (is it a .py file?).")
    with open(path, encoding="utf-8") as f:
        source = f.read()
    return _exec_source_module(source, path, module_name)


def load_module(module_path: str | None, module_name: str | None = None) -> ModuleType | None:
    """Import ``pkg://dotted.module`` (or ``pkg://dotted/module``) by name, or execute a ``.py`` file given by path
    (optionally ``file://``-prefixed, ``~`` expanded).

    ``None`` or ``""`` is the "nothing configured" case and returns None, as upstream (config keys such as
    ``custom_reward_function.path`` default to null). ``module_name``: register the file module in ``sys.modules``
    under this name (by default it is not kept there, see the module docstring). Raises FileNotFoundError for a
    missing file, ImportError when it fails to run.
    """
    if not module_path:
        return None
    if module_path.startswith(PKG_PREFIX):
        return importlib.import_module(module_path[len(PKG_PREFIX) :].replace("/", "."))
    module_path = module_path.removeprefix(FILE_PREFIX)
    path = os.path.abspath(os.path.expanduser(module_path))
    if not os.path.isfile(path):
        raise FileNotFoundError(f"Python file {module_path!r} not found (resolved to {path!r}).")
    return _exec_file_module(path, module_name)


def _public_names(module: ModuleType) -> list[str]:
    """Names a user most likely meant: public module attributes, sorted."""
    return sorted(name for name in vars(module) if not name.startswith("_"))


def load_extern_object(module_path: str | None, object_name: str | None) -> Any:
    """Attribute ``object_name`` (function, class or constant) of the module at ``module_path``.

    Returns None when no module is configured (``module_path`` None or ``""``). Raises ValueError when a module is
    given without a name, AttributeError (upstream's "Object not found in module" first) listing the module's
    public names when ``object_name`` is missing.
    """
    module = load_module(module_path)
    if module is None:
        return None
    if not object_name:
        raise ValueError(f"load_extern_object: a name is required to load an object from {module_path!r}.")
    if not hasattr(module, object_name):
        raise AttributeError(
            f"Object not found in module: object_name={object_name!r}, module_path={module_path!r}. "
            f"Public names there: {', '.join(_public_names(module))}."
        )
    return getattr(module, object_name)


def load_extern_type(file_path: str | None, type_name: str | None) -> Any:
    """Upstream's older name for :func:`load_extern_object` (same behaviour, None when no file is configured)."""
    return load_extern_object(file_path, type_name)


def load_class_from_fqn(fqn: str, description: str = "class") -> Any:
    """Import ``package.module.Name`` by its fully qualified name."""
    module_name, _, attr = fqn.rpartition(".")
    if not module_name:
        raise ValueError(f"Invalid {description} path {fqn!r}: expected 'package.module.ClassName'.")
    module = importlib.import_module(module_name)
    if not hasattr(module, attr):
        raise AttributeError(f"{description} {attr!r} not found in module {module_name!r} (from {fqn!r}).")
    return getattr(module, attr)


def import_external_libs(external_libs: str | list[str] | None = None) -> None:
    """Import user packages for their registration side effects (e.g. ``model.external_lib``)."""
    if external_libs is None:
        return
    for name in [external_libs] if isinstance(external_libs, str) else external_libs:
        importlib.import_module(name)


class ExternFunction:
    """Function ``name`` of the Python file at ``path``, called like the function itself, that pickles as the
    file's source text.

    Unpickling it (in a reward worker process, a Ray actor, a process on another node) executes that source again as
    a fresh module and takes ``name`` from it. So the function works where the file does not exist, its module
    top-level code runs once in each process that uses it, and its module globals belong to that process, exactly as
    if each process had loaded the file itself. (Pickling the function object by value instead would copy its
    globals as they were when pickled, and fail on unpicklable ones such as a lock or an open client.)
    """

    def __init__(self, path: str, name: str, source: str, function: Callable[..., Any] | None = None):
        self.path, self.name, self.source = path, name, source
        if function is None:
            module = _exec_source_module(source, path, None)
            if not hasattr(module, name):
                raise AttributeError(f"{name!r} not found in {path!r}. Public names there: {_public_names(module)}.")
            function = getattr(module, name)
        self.function = function
        functools.update_wrapper(self, function)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.function(*args, **kwargs)

    def __reduce__(self) -> tuple:
        return ExternFunction, (self.path, self.name, self.source)

    def __repr__(self) -> str:
        return f"ExternFunction({self.name!r} from {self.path!r})"


def as_extern_function(function: Callable[..., Any], module_path: str, name: str) -> Callable[..., Any]:
    """``function`` (already loaded from ``module_path``) as an :class:`ExternFunction` when it comes from a file;
    a ``pkg://`` module's function is importable by name everywhere and is returned as it is."""
    if module_path.startswith(PKG_PREFIX):
        return function
    path = os.path.abspath(os.path.expanduser(module_path.removeprefix(FILE_PREFIX)))
    with open(path, encoding="utf-8") as f:
        return ExternFunction(path, name, f.read(), function=function)


def deprecated(replacement: str = "") -> Callable[[Any], Any]:
    """Decorator marking a function or class as deprecated: each call (or instantiation) emits a FutureWarning
    naming it and, if given, its ``replacement``."""

    def decorator(obj: Any) -> Any:
        message = f"Warning: {'Class' if isinstance(obj, type) else 'Function'} '{obj.__module__}.{obj.__qualname__}' "
        message += "is deprecated." + (f" Please use '{replacement}' instead." if replacement else "")
        target = obj.__init__ if isinstance(obj, type) else obj

        @functools.wraps(target)
        def wrapped(*args: Any, **kwargs: Any) -> Any:
            warnings.warn(message, category=FutureWarning, stacklevel=2)
            return target(*args, **kwargs)

        if isinstance(obj, type):
            obj.__init__ = wrapped
            return obj
        return wrapped

    return decorator
