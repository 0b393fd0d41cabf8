"""Profiling and timing (upstream ``verl.utils.profiler``): timers, device-memory logging, step profiler.

Works on every platform, the CPU included: timers use the wall clock, ranges are ``torch.profiler`` ranges, and
memory numbers come from the device platform (``verl.utils.device``). See ``profile.py`` for which profiler tools
run here.
"""

from verl.utils.profiler.config import (
    NPUToolConfig,
    NsightToolConfig,
    ProfilerConfig,
    TorchMemoryToolConfig,
    TorchProfilerToolConfig,
)
from verl.utils.profiler.performance import (
    GPUMemoryLogger,
    gather_timing,
    log_gpu_memory_usage,
    marked_timer,
    reduce_timing,
    simple_timer,
)
from verl.utils.profiler.profile import (
    DistProfiler,
    DistProfilerExtension,
    mark_annotate,
    mark_end_range,
    mark_start_range,
)

__all__ = [
    "DistProfiler",
    "DistProfilerExtension",
    "GPUMemoryLogger",
    "NPUToolConfig",
    "NsightToolConfig",
    "ProfilerConfig",
    "TorchMemoryToolConfig",
    "TorchProfilerToolConfig",
    "gather_timing",
    "log_gpu_memory_usage",
    "mark_annotate",
    "mark_end_range",
    "mark_start_range",
    "marked_timer",
    "reduce_timing",
    "simple_timer",
]
