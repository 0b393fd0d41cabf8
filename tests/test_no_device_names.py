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
# a string literal naming an accelerator family, optionally with a device index ("npu", 'cuda:0')
_FAMILY = r"""["'](?:npu|cuda)(?::\d+)?["']"""

FORBIDDEN = {
    "torch.cuda": re.compile(r"\btorch\.cuda\b"),
    "torch.npu": re.compile(r"\btorch\.npu\b"),
    '"nccl"': re.compile(r"""["']nccl["']"""),
    '"hccl"': re.compile(r"""["']hccl["']"""),
    # torch_npu breaks even `import torch` without CANN; only the platform package imports it, guarded
    "import torch_npu": re.compile(r"^\s*(?:import|from)\s+torch_npu\b", re.MULTILINE),
    # a device *decision* made on the family's name: it belongs on the Platform as an attribute or method
    '== "npu"': re.compile(rf"""[!=]=\s*{_FAMILY}"""),
    '"npu" ==': re.compile(rf"""{_FAMILY}\s*[!=]="""),
    'in ("cuda", ...)': re.compile(rf"""\bin\s*[(\[{{][^)\]}}]*?{_FAMILY}"""),
    '.startswith("npu")': re.compile(rf"""\.startswith\(\s*{_FAMILY}"""),
    'case "npu":': re.compile(rf"""^\s*case\s+{_FAMILY}""", re.MULTILINE),
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
    """No file under verl/ except the platform package mentions torch.cuda, torch.npu, "nccl", "hccl", imports
    torch_npu (use verl.utils.device: get_torch_device(), get_nccl_backend(), get_device_name()) or compares a
    value with "npu"/"cuda" (==, !=, in, startswith, case: make the decision a Platform attribute or method)."""
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
        ('if device_name == "npu":', 1),
        ("if get_device_name() != 'cuda':", 1),
        ('if "cuda" == name:', 1),
        ('ok = device == "npu:0"', 1),
        ('if device_type not in ("cuda", "npu"):', 1),
        ('if name in {"cpu", "npu"}:', 1),
        ('if name in ["npu"]:', 1),
        ('if device.startswith("cuda"):', 1),
        ('    case "npu":', 1),
        # not decisions: declarations, choices offered to the user, other words, other families
        ('platforms=("cpu", "cuda", "npu"),', 0),
        ('require_choice("device", value, DEVICES)', 0),
        ('if tool == "npu_profiler":', 0),
        ('if device == "cpu":', 0),
        ('if x in (a, b):  # runs on "npu" too', 0),
        ('name = "cuda"', 0),
    ],
)
def test_lint_patterns(snippet, hits):
    """The patterns catch each forbidden form and leave ordinary names (nccl_timeout) alone."""
    assert len([name for name, pattern in FORBIDDEN.items() if pattern.search(snippet)]) == hits
