"""Step profiling of workers (upstream ``verl.utils.profiler.profile``): ``DistProfiler`` and its worker mixin.

``DistProfiler(rank, config, tool_config)`` decides from ``ProfilerConfig`` whether this rank profiles
(``enable`` and ``all_ranks`` / ``ranks`` / rank 0) and with which tool; ``start()`` / ``stop()`` bracket a
profiled step and ``@DistProfiler.annotate(...)`` marks a worker method as a named range inside it.
``DistProfilerExtension`` gives a ``Worker`` subclass the ``start_profile`` / ``stop_profile`` group methods.

Tools:
* ``torch`` — ``torch.profiler`` on every device, the CPU included; each profiled step writes a Chrome trace
  ``<save_path>/step<N>_rank<R>.json`` (``step<N>`` from ``start(profile_step=N)``). Ranges from ``marked_timer``,
  ``mark_*`` and ``annotate`` appear in it.
* ``nsys``, ``npu``, ``torch_memory``, ``precision_debugger`` — not implemented in this distribution: an enabled
  profiler with one of them raises ``ValueError`` naming the tool and what to use instead, rather than running
  without profiling. (Nsight Systems can still profile the workers through Ray:
  ``ray_kwargs.ray_init.runtime_env.nsight``.)
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from typing import Any, Optional

import torch

from verl.single_controller.base.decorator import Dispatch, register
from verl.utils.profiler.config import ProfilerConfig, TorchProfilerToolConfig

__all__ = ["DistProfiler", "DistProfilerExtension", "mark_annotate", "mark_end_range", "mark_start_range"]

_UNSUPPORTED_TOOLS = {
    "nsys": "Nsight Systems step profiling is not implemented; profile the workers with Ray's "
    "ray_kwargs.ray_init.runtime_env.nsight, or use tool=torch",
    "npu": "the Ascend (torch_npu.profiler / mstx) profiler is not implemented; use tool=torch, which records NPU "
    "operators through torch.profiler as well",
    "torch_memory": "allocator memory snapshots are not implemented; use tool=torch with tool_config.contents=[memory]",
    "precision_debugger": "the msprobe precision debugger is not integrated",
}


def mark_start_range(
    message: Optional[str] = None,
    color: Optional[str] = None,
    domain: Optional[str] = None,
    category: Optional[str] = None,
) -> Any:
    """Open a named profiler range; returns its handle for :func:`mark_end_range`."""
    handle = torch.profiler.record_function(message or "range")
    handle.__enter__()
    return handle


def mark_end_range(range_id: Any) -> None:
    """Close a range opened by :func:`mark_start_range`."""
    if range_id is not None:
        range_id.__exit__(None, None, None)


def mark_annotate(
    message: Optional[str] = None,
    color: Optional[str] = None,
    domain: Optional[str] = None,
    category: Optional[str] = None,
) -> Callable[[Callable], Callable]:
    """Decorator running the function inside a profiler range named ``message`` (default: the function name)."""

    def decorator(func: Callable) -> Callable:
        @functools.wraps(func)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            with torch.profiler.record_function(message or func.__name__):
                return func(*args, **kwargs)

        return wrapper

    return decorator


class _NoOpProfiler:
    def start(self, **kwargs: Any) -> None:
        return None

    def stop(self) -> None:
        return None


class _TorchProfiler:
    """One ``torch.profiler.profile`` per profiled step, exported as a Chrome trace when the step stops."""

    def __init__(self, rank: int, save_path: str, tool_config: TorchProfilerToolConfig) -> None:
        self.rank, self.save_path, self.tool_config = rank, save_path, tool_config
        self._profile: Optional[torch.profiler.profile] = None
        self._step: Any = None

    def _activities(self) -> list[torch.profiler.ProfilerActivity]:
        from verl.utils.device import get_platform

        activities = [torch.profiler.ProfilerActivity.CPU]
        accelerator = get_platform().profiler_activity
        if accelerator is not None:
            activities.append(getattr(torch.profiler.ProfilerActivity, accelerator))
        return activities

    def start(self, **kwargs: Any) -> None:
        contents = set(self.tool_config.contents)
        self._step = kwargs.get("profile_step")
        self._profile = torch.profiler.profile(
            activities=self._activities(),
            record_shapes="shapes" in contents,
            profile_memory="memory" in contents,
            with_stack="stack" in contents,
        )
        self._profile.__enter__()

    def stop(self) -> None:
        if self._profile is None:
            return
        self._profile.__exit__(None, None, None)
        os.makedirs(self.save_path, exist_ok=True)
        step = "" if self._step is None else f"step{self._step}_"
        self._profile.export_chrome_trace(os.path.join(self.save_path, f"{step}rank{self.rank}.json"))
        self._profile = None


def _profiles_rank(config: ProfilerConfig, rank: int) -> bool:
    if config.all_ranks:
        return True
    return rank in config.ranks if config.ranks else (rank == 0 and config.enable)


class DistProfiler:
    """Profiles one worker rank according to ``config`` (see the module docstring for the tools)."""

    def __init__(
        self,
        rank: int,
        config: Optional[ProfilerConfig] = None,
        tool_config: Optional[Any] = None,
        **kwargs: Any,
    ) -> None:
        self.config = config if config is not None else ProfilerConfig()
        self.tool_config = tool_config if tool_config is not None else self.config.tool_config
        self.rank = rank
        self._enable = bool(self.config.enable)
        self._this_rank = _profiles_rank(self.config, rank)
        self._this_step = False
        self._discrete = bool(getattr(self.tool_config, "discrete", False))
        self._impl = self._make_impl()

    def _make_impl(self) -> Any:
        tool = self.config.tool
        active = self._enable and self._this_rank and tool is not None
        if not active:
            return _NoOpProfiler()
        if tool in _UNSUPPORTED_TOOLS:
            raise ValueError(f"profiler tool={tool!r}: {_UNSUPPORTED_TOOLS[tool]}.")
        if self._discrete:
            raise ValueError("profiler tool='torch' with tool_config.discrete=True is not implemented; set it false.")
        if not self.config.save_path:
            raise ValueError("profiler tool='torch' needs save_path (the directory of the traces).")
        tool_config = self.tool_config if isinstance(self.tool_config, TorchProfilerToolConfig) else None
        return _TorchProfiler(self.rank, self.config.save_path, tool_config or TorchProfilerToolConfig())

    def check_enable(self) -> bool:
        return self._enable

    def check_this_rank(self) -> bool:
        return self._this_rank

    def check_this_step(self) -> bool:
        return self._this_step

    def is_discrete_mode(self) -> bool:
        return self._discrete

    def start(self, **kwargs: Any) -> None:
        """Begin a profiled step on this rank (``profile_step=N`` names the trace)."""
        if self._enable and self._this_rank:
            self._this_step = True
            self._impl.start(**kwargs)

    def stop(self) -> None:
        """End the profiled step and write its result."""
        if self._enable and self._this_rank:
            self._this_step = False
            self._impl.stop()

    @classmethod
    def annotate(
        cls,
        message: Optional[str] = None,
        color: Optional[str] = None,
        domain: Optional[str] = None,
        category: Optional[str] = None,
        **kwargs: Any,
    ) -> Callable[[Callable], Callable]:
        """Decorator for worker methods: inside a profiled step of ``self.profiler`` the call is a named range."""

        def decorator(func: Callable) -> Callable:
            @functools.wraps(func)
            def wrapper(self_instance: Any, *args: Any, **inner: Any) -> Any:
                profiler = getattr(self_instance, "profiler", None)
                if profiler is None or not profiler.check_this_step():
                    return func(self_instance, *args, **inner)
                with torch.profiler.record_function(message or func.__name__):
                    return func(self_instance, *args, **inner)

            return wrapper

        return decorator


class DistProfilerExtension:
    """Mixin for ``Worker`` subclasses: ``start_profile`` / ``stop_profile`` as group methods on every rank."""

    def __init__(self, profiler: DistProfiler) -> None:
        self.profiler = profiler

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def start_profile(self, **kwargs: Any) -> None:
        """Start a profiled step on this rank."""
        self.profiler.start(**kwargs)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def stop_profile(self) -> None:
        """Stop the profiled step on this rank."""
        self.profiler.stop()
