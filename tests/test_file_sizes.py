"""Lint: every Python module under verl/ stays at or under 600 lines.

A module past that size holds more than one concept; it is split along one (a layer, a stage of the loop, the
private-API helpers of an adapter), never by packing statements onto fewer lines: ``make test`` runs
``ruff format --check`` before the tests, so the count is of formatted code.
"""

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
MAX_LINES = 600


def _line_count(text: str) -> int:
    return len(text.splitlines())


def test_every_verl_module_is_at_most_600_lines():
    """No verl/**/*.py file exceeds MAX_LINES lines (the message names each file and its size)."""
    too_long = sorted(
        f"{path.relative_to(ROOT)}: {n} lines"
        for path in (ROOT / "verl").rglob("*.py")
        if (n := _line_count(path.read_text(encoding="utf-8"))) > MAX_LINES
    )
    assert not too_long, f"modules over {MAX_LINES} lines:\n" + "\n".join(too_long)


@pytest.mark.parametrize("text, lines", [("", 0), ("a\n", 1), ("a\nb", 2), ("a\n\n", 2)])
def test_line_count(text, lines):
    """The count is wc -l's for newline-terminated files (a final line without newline counts too)."""
    assert _line_count(text) == lines
