"""verl.utils.profiler on the CPU: upstream's names import and work — timers accumulate wall time, the memory
logger reports the platform's numbers, DistProfiler(tool=torch) writes a real trace containing the marked
ranges, rank selection follows upstream's rules, and tools not implemented here are refused by name."""

import json
import logging
import time

import pytest
import torch

from verl.utils.profiler import (
    DistProfiler,
    DistProfilerExtension,
    GPUMemoryLogger,
    NPUToolConfig,
    ProfilerConfig,
    TorchMemoryToolConfig,
    TorchProfilerToolConfig,
    gather_timing,
    log_gpu_memory_usage,
    mark_annotate,
    mark_end_range,
    mark_start_range,
    marked_timer,
    reduce_timing,
    simple_timer,
)


def test_timers_accumulate_seconds_per_name():
    """Two blocks under one name add up; each block's time is at least its sleep (a lower bound, no upper one)."""
    timing = {}
    for _ in range(2):
        with simple_timer("gen", timing):
            time.sleep(0.01)
    with marked_timer("reward", timing, color="blue"):
        time.sleep(0.01)
    assert set(timing) == {"gen", "reward"}
    assert timing["gen"] >= 0.02 and timing["reward"] >= 0.01
    with pytest.raises(RuntimeError), simple_timer("failed", timing):
        raise RuntimeError
    assert "failed" in timing  # the time of a failing block is still recorded


def test_timing_helpers_without_a_process_group():
    """Without torch.distributed, reduce_timing returns the input and gather_timing one-element lists."""
    assert reduce_timing({"a": 1.5}) == {"a": 1.5}
    assert gather_timing({"a": 1.5, "b": 2.0}) == {"a": [1.5], "b": [2.0]}


def test_memory_logging_reports_the_platform_numbers(caplog, monkeypatch):
    """The numbers are the platform's (CPU: allocated/reserved 0, used/total of the host); here the platform's
    memory_allocated is replaced by 3 GiB to show the value is read from it, not computed elsewhere."""
    from verl.utils.device import get_platform

    platform = get_platform()
    monkeypatch.setattr(platform, "memory_allocated", lambda: 3 * 1024**3)
    monkeypatch.setattr(platform, "mem_get_info", lambda: (1 * 1024**3, 4 * 1024**3))
    logger = logging.getLogger("test_profiler")
    with caplog.at_level(logging.INFO, logger="test_profiler"):
        log_gpu_memory_usage("after load", logger=logger, level=logging.INFO)

        @GPUMemoryLogger(role="actor", logger=logger, level=logging.INFO)
        def update_actor(x):
            return x + 1

        assert update_actor(1) == 2
    lines = [r.getMessage() for r in caplog.records]
    assert lines[0] == (
        "after load, memory allocated (GB): 3.00, memory reserved (GB): 0.00, device memory used/total (GB): 3.00/4.00"
    )
    assert lines[1].startswith("[actor] Before update_actor, memory allocated (GB): 3.00")
    assert lines[2].startswith("[actor] After update_actor")
    assert update_actor.__name__ == "update_actor"


def test_torch_profiler_writes_a_trace_with_the_marked_ranges(tmp_path):
    """tool=torch on the CPU: start/stop around a step writes <save_path>/step3_rank0.json, a Chrome trace whose
    events include the marked_timer, mark_annotate and mark_start_range ranges of that step."""
    config = ProfilerConfig(tool="torch", enable=True, ranks=[0], save_path=str(tmp_path))
    profiler = DistProfiler(rank=0, config=config, tool_config=TorchProfilerToolConfig(contents=["shapes"]))

    @mark_annotate("annotated_fn")
    def work():
        return torch.randn(64, 64) @ torch.randn(64, 64)

    profiler.start(profile_step=3)
    assert profiler.check_this_step()
    with marked_timer("old_log_prob", {}):
        work()
    handle = mark_start_range("manual_range")
    torch.ones(8).sum()
    mark_end_range(handle)
    profiler.stop()
    assert not profiler.check_this_step()
    trace = json.loads((tmp_path / "step3_rank0.json").read_text())
    names = {event.get("name") for event in trace["traceEvents"]}
    assert {"old_log_prob", "annotated_fn", "manual_range", "aten::mm"} <= names


def test_rank_selection_follows_upstream():
    """enable + ranks=[1]: only rank 1; enable without ranks: rank 0; all_ranks: every rank; disabled: none
    (and then even an unimplemented tool is never started)."""
    assert [
        DistProfiler(r, ProfilerConfig(tool="torch", enable=True, ranks=[1], save_path="x")).check_this_rank()
        for r in (0, 1)
    ] == [False, True]
    assert DistProfiler(0, ProfilerConfig(tool="torch", enable=True, save_path="x")).check_this_rank()
    assert not DistProfiler(1, ProfilerConfig(tool="torch", enable=True, save_path="x")).check_this_rank()
    assert DistProfiler(5, ProfilerConfig(tool="torch", enable=True, all_ranks=True, save_path="x")).check_this_rank()
    disabled = DistProfiler(0, ProfilerConfig(tool="npu"))
    disabled.start()
    assert not disabled.check_enable() and not disabled.check_this_step()
    assert not DistProfiler(0).check_enable()  # no config: off


@pytest.mark.parametrize("tool", ["nsys", "npu", "torch_memory", "precision_debugger"])
def test_unimplemented_tools_are_refused_by_name(tool):
    """An enabled profiler with a tool this distribution lacks raises at construction, naming the tool and what
    to use instead, instead of training without the profile the user asked for."""
    with pytest.raises(ValueError, match=f"profiler tool='{tool}': .*(tool=torch|not integrated)"):
        DistProfiler(0, ProfilerConfig(tool=tool, enable=True, save_path="x"))


def test_config_validation():
    with pytest.raises(ValueError, match="tool: 'perf' is not supported"):
        ProfilerConfig(tool="perf")
    with pytest.raises(ValueError, match="contents: 'gpu' is not supported"):
        TorchProfilerToolConfig(contents=["gpu"])
    with pytest.raises(ValueError, match="level: 'level9' is not supported"):
        NPUToolConfig(level="level9")
    with pytest.raises(ValueError, match="stack_depth: must be a positive integer"):
        TorchMemoryToolConfig(stack_depth=0)
    with pytest.raises(ValueError, match="needs save_path"):
        DistProfiler(0, ProfilerConfig(tool="torch", enable=True))
    merged = ProfilerConfig(tool="torch", ranks=[0]).union(ProfilerConfig(tool="torch", enable=True, ranks=[2]))
    assert merged.enable and merged.ranks == [0, 2]
    with pytest.raises(ValueError, match="different tools"):
        ProfilerConfig(tool="torch").intersect(ProfilerConfig(tool="npu"))


def test_extension_gives_workers_start_and_stop_group_methods():
    """DistProfilerExtension's start_profile / stop_profile are ONE_TO_ALL group methods driving self.profiler."""
    from verl.single_controller.base.decorator import MAGIC_ATTR, Dispatch

    class Recorder:
        def __init__(self):
            self.calls = []

        def start(self, **kwargs):
            self.calls.append(("start", kwargs))

        def stop(self):
            self.calls.append(("stop", {}))

    ext = DistProfilerExtension(Recorder())
    ext.start_profile(profile_step=1)
    ext.stop_profile()
    assert ext.profiler.calls == [("start", {"profile_step": 1}), ("stop", {})]
    assert getattr(DistProfilerExtension.start_profile, MAGIC_ATTR)["dispatch_mode"] == Dispatch.ONE_TO_ALL
