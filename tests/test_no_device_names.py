"""Lint: outside verl/utils/platform/ no code names a device family (docs/design.md "Devices: one contract").

Everything device-specific goes through verl.utils.device / the platform object, so supporting a device is one
platform class and CPU/NPU/GPU runs share every other line. The whitelist is empty on purpose: a new exception
is a design change, not a lint fix.
"""

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "verl"
PLATFORM_DIR = PACKAGE / "utils" / "platform"
WHITELIST: frozenset[str] = frozenset()  # paths relative to the repo root; keep it empty

FORBIDDEN = {
    "torch.cuda": re.compile(r"\btorch\.cuda\b"),
    "torch.npu": re.compile(r"\btorch\.npu\b"),
    '"nccl"': re.compile(r"""["']nccl["']"""),
    '"hccl"': re.compile(r"""["']hccl["']"""),
    # torch_npu breaks even `import torch` without CANN; only the platform package imports it, guarded
    "import torch_npu": re.compile(r"^\s*(?:import|from)\s+torch_npu\b", re.MULTILINE),
}


def _violations(path: Path) -> list[str]:
    text = path.read_text(encoding="utf-8", errors="replace")
    found = []
    for name, pattern in FORBIDDEN.items():
        for match in pattern.finditer(text):
            line = text.count("\n", 0, match.start()) + 1
            found.append(f"{path.relative_to(ROOT)}:{line}: {name}")
    return found


def _checked_files() -> list[Path]:
    files = [p for p in PACKAGE.rglob("*.py") if PLATFORM_DIR not in p.parents]
    return [p for p in files if str(p.relative_to(ROOT)) not in WHITELIST]


def test_no_device_family_names_outside_platform():
    """No file under verl/ except the platform package mentions torch.cuda, torch.npu, "nccl", "hccl" or imports
    torch_npu (use verl.utils.device: get_torch_device(), get_nccl_backend(), get_device_name())."""
    violations = [v for path in _checked_files() for v in _violations(path)]
    assert not violations, "device names outside verl/utils/platform/:\n" + "\n".join(violations)


def test_whitelist_is_empty():
    """The exception list stays empty (see module docstring)."""
    assert not WHITELIST


@pytest.mark.parametrize(
    "snippet, hits",
    [
        ("x = torch.cuda.is_available()", 1),
        ("dist.init_process_group(backend='nccl')", 1),
        ('backend = "hccl"', 1),
        ("m = torch.npu", 1),
        ("import torch_npu", 1),
        ("nccl_timeout = 600  # an upstream config key, not a backend name", 0),
        ("get_torch_device().synchronize()", 0),
    ],
)
def test_lint_patterns(snippet, hits):
    """The patterns catch each forbidden form and leave ordinary names (nccl_timeout) alone."""
    assert len([name for name, pattern in FORBIDDEN.items() if pattern.search(snippet)]) == hits
