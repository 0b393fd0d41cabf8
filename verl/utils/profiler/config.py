"""Profiler settings (upstream ``verl.utils.profiler.config``): which tool profiles which ranks, and per-tool options.

``ProfilerConfig`` is the per-role node (``actor_rollout_ref.actor.profiler`` in upstream's YAML); the tool
configs hold each tool's options. Which tools exist here is stated in ``verl.utils.profiler.profile``: ``torch``
(torch.profiler, on every device including the CPU) runs; the device-vendor tools are refused with a message.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

from verl.base_config import BaseConfig, ConfigError, require_choice

__all__ = [
    "PROFILER_TOOLS",
    "NPUToolConfig",
    "NsightToolConfig",
    "ProfilerConfig",
    "TorchMemoryToolConfig",
    "TorchProfilerToolConfig",
]

PROFILER_TOOLS = ("nsys", "npu", "torch", "torch_memory", "precision_debugger")
"""Upstream's tool names (``global_profiler.tool`` / ``ProfilerConfig.tool``)."""

TORCH_PROFILER_CONTENTS = ("cuda", "cpu", "memory", "shapes", "stack")
NPU_PROFILER_CONTENTS = ("npu", "cpu", "memory", "shapes", "module", "stack")


def _check_contents(name: str, contents: list[str], allowed: tuple[str, ...]) -> None:
    if not isinstance(contents, list):
        raise ConfigError(name, f"must be a list, got {type(contents).__name__}.")
    for item in contents:
        require_choice(name, item, allowed)


@dataclass
class NsightToolConfig(BaseConfig):
    """Nsight Systems (``tool=nsys``) options."""

    discrete: bool = False
    """True: one report per profiled task; false: one report per training step."""

    name: str = "nsight"
    """Tool name (informational)."""


@dataclass
class TorchProfilerToolConfig(BaseConfig):
    """torch.profiler (``tool=torch``) options."""

    contents: list[str] = field(default_factory=list)
    """What to record besides CPU ops: cuda | cpu | memory | shapes | stack (empty = CPU and device ops only)."""

    discrete: bool = False
    """True: one trace per profiled task; false: one trace per step (only false is supported here)."""

    name: str = "torch"
    """Tool name (informational)."""

    def __post_init__(self) -> None:
        _check_contents("contents", self.contents, TORCH_PROFILER_CONTENTS)


@dataclass
class TorchMemoryToolConfig(BaseConfig):
    """Allocator memory snapshots (``tool=torch_memory``) options."""

    trace_alloc_max_entries: int = 100_000
    """Allocation events kept in the history."""

    stack_depth: int = 32
    """Stack frames recorded per allocation."""

    name: str = "torch_memory"
    """Tool name (informational)."""

    def __post_init__(self) -> None:
        for key in ("trace_alloc_max_entries", "stack_depth"):
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ConfigError(key, f"must be a positive integer, got {value!r}.")


@dataclass
class NPUToolConfig(NsightToolConfig):
    """Ascend profiler (``tool=npu``, torch_npu.profiler + mstx) options."""

    contents: list[str] = field(default_factory=list)
    """What to record: npu | cpu | memory | shapes | module | stack."""

    level: str = "level0"
    """Collection level: level_none | level0 | level1 | level2."""

    analysis: bool = False
    """Parse the collected data automatically."""

    name: str = "npu"
    """Tool name (informational)."""

    def __post_init__(self) -> None:
        _check_contents("contents", self.contents, NPU_PROFILER_CONTENTS)
        require_choice("level", self.level, ("level_none", "level0", "level1", "level2"))


@dataclass
class ProfilerConfig(BaseConfig):
    """Which tool profiles which ranks of a role, and where results go."""

    tool: Optional[str] = None
    """nsys | npu | torch | torch_memory | precision_debugger; null = no profiling."""

    enable: bool = False
    """Profile this role (with global_profiler.steps choosing the steps)."""

    all_ranks: bool = False
    """Profile every rank (else only ``ranks``, else rank 0)."""

    ranks: list[int] = field(default_factory=list)
    """Ranks to profile when not all_ranks; empty = rank 0."""

    save_path: Optional[str] = None
    """Directory of the results (traces, reports)."""

    tool_config: Any = None
    """The tool's options (one of the *ToolConfig classes); null = that tool's defaults."""

    global_tool_config: Optional[Any] = None
    """Options shared by every role (upstream's global_profiler.global_tool_config)."""

    def __post_init__(self) -> None:
        if self.tool is not None:
            require_choice("tool", self.tool, PROFILER_TOOLS)
        if not isinstance(self.ranks, list) or any(isinstance(r, bool) or not isinstance(r, int) for r in self.ranks):
            raise ConfigError("ranks", f"must be a list of rank numbers, got {self.ranks!r}.")

    def union(self, other: ProfilerConfig) -> ProfilerConfig:
        """Profile what either config profiles (same tool required)."""
        self._check_same_tool(other, "union")
        return ProfilerConfig(
            tool=self.tool,
            enable=self.enable or other.enable,
            all_ranks=self.all_ranks or other.all_ranks,
            ranks=sorted(set(self.ranks) | set(other.ranks)),
            save_path=self.save_path,
            tool_config=self.tool_config,
            global_tool_config=self.global_tool_config or other.global_tool_config,
        )

    def intersect(self, other: ProfilerConfig) -> ProfilerConfig:
        """Profile only what both configs profile (same tool required)."""
        self._check_same_tool(other, "intersect")
        return ProfilerConfig(
            tool=self.tool,
            enable=self.enable and other.enable,
            all_ranks=self.all_ranks and other.all_ranks,
            ranks=sorted(set(self.ranks) & set(other.ranks)),
            save_path=self.save_path,
            tool_config=self.tool_config,
            global_tool_config=self.global_tool_config if self.global_tool_config else other.global_tool_config,
        )

    def _check_same_tool(self, other: ProfilerConfig, op: str) -> None:
        if self.tool != other.tool:
            raise ValueError(f"Cannot {op} ProfilerConfig with different tools: {self.tool} vs {other.tool}")
