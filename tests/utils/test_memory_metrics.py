"""perf/max_memory_*_gb come from the Platform's allocator stats (whatever device it is), perf/cpu_memory_used_gb
from the host."""

import psutil
import pytest

from verl.utils.debug import performance
from verl.utils.debug.performance import memory_metrics, timed

GIB = 1024**3


class _Allocator:
    """A platform whose allocator reports fixed peaks (the CPU platform has none: it reports 0)."""

    def max_memory_allocated(self):
        return 3 * GIB

    def max_memory_reserved(self):
        return 5 * GIB // 2


def test_device_peaks_are_read_through_the_platform(monkeypatch):
    monkeypatch.setattr(performance, "get_platform", lambda: _Allocator())
    metrics = memory_metrics()
    assert metrics["perf/max_memory_allocated_gb"] == 3.0
    assert metrics["perf/max_memory_reserved_gb"] == 2.5
    used = psutil.virtual_memory().used / GIB
    assert metrics["perf/cpu_memory_used_gb"] == pytest.approx(used, rel=0.1)  # the host moves a little between


def test_cpu_platform_reports_zero_device_memory():
    from verl.utils.platform.cpu import CpuPlatform

    assert CpuPlatform().max_memory_allocated() == 0


def test_timed_accumulates():
    seconds = {}
    with timed(seconds, "x"):
        pass
    with timed(seconds, "x"):
        pass
    assert set(seconds) == {"x"} and seconds["x"] >= 0.0
