"""Lint: the repository stands on its own — no text points at notes that are not part of it, and every
``docs/<name>.md`` a comment or document names exists here.

Comments, docstrings, docs, scripts and the Makefile explain themselves or cite this repository's ``docs/``
(``docs/design.md``, ``docs/qwen3_5.md``, ``docs/cpu_notes.md``, ...). A pointer to the private planning notes the
project was started from (listed in ``OUTSIDE_NOTES``) is a dead link for every reader of the repository, so it
fails here with ``file:line``. This file is the one place allowed to spell those names.

Files scanned: every file git knows (tracked, or new and not ignored) that reads as UTF-8 text — ``.py``, ``.md``,
``.yaml``, ``.sh``, ``.txt``, ``.toml``, ``.cfg``, the Makefile, Dockerfiles, C++ sources, ... Paths of the form
``docs/<name>.md`` (one level, the layout of this repository's docs) must name a file of the repository; nested
paths such as ``docs/algo/x.md`` are other projects' documents cited by name and are not checked.
"""

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
THIS_FILE = Path(__file__).resolve().relative_to(ROOT).as_posix()

# Case-sensitive: the repository's own `docs/design.md` is lower case and allowed. A bare section number ("§3.4",
# "§A1.4") is an outside note's too: this repository's docs are cited by section title.
OUTSIDE_NOTES = re.compile(
    r"DESIGN\.md|shared/reference|/work/shared|seed_fixes|qwen3_5_model\.md|cpu_environment|ascend_and_peers"
    r"|verl_upstream_reference|style_anchors|examples_to_follow|§\s*[A-Z]?\d"
)
# `docs/name.md`, also as `../docs/name.md`; not `upstream/docs/...` or `docs/sub/name.md`.
DOCS_PATH = re.compile(r"(?<![\w/-])(?:\.\./)*docs/([\w-]+\.md)\b")
# `docs/name.md "Section"` or `docs/name.md, "Section"`: the section must be a heading of that doc.
DOCS_SECTION = re.compile(r"(?<![\w/-])(?:\.\./)*docs/([\w-]+\.md),? \"([^\"\n]+)\"")
_SKIPPED_DIRS = {".git", "__pycache__", "build", "node_modules"}


def _repository_files() -> list[str]:
    """Paths (relative, posix) of the files git tracks plus new files it does not ignore."""
    try:
        out = subprocess.run(
            ["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"],
            cwd=ROOT,
            capture_output=True,
            check=True,
        ).stdout
    except (OSError, subprocess.CalledProcessError):
        return _walk_files()  # a copy of the tree without .git: every file outside hidden/build folders
    return sorted({p for p in out.decode().split("\0") if p and (ROOT / p).is_file()})


def _walk_files() -> list[str]:
    files = []
    for path in ROOT.rglob("*"):
        rel = path.relative_to(ROOT)
        if path.is_file() and not any(p in _SKIPPED_DIRS or p.startswith(".venv") for p in rel.parts[:-1]):
            files.append(rel.as_posix())
    return sorted(files)


def _text(rel: str) -> str | None:
    """The file's text, or None for binary files (NUL byte or not UTF-8)."""
    data = (ROOT / rel).read_bytes()
    if b"\0" in data[:8192]:
        return None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return None


def _line_of(text: str, offset: int) -> int:
    return text.count("\n", 0, offset) + 1


def _scan() -> tuple[list[str], list[str]]:
    """(pointers at outside notes, docs paths that do not exist), each as ``file:line: what``."""
    files = _repository_files()
    present = set(files)
    outside, missing = [], []
    for rel in files:
        text = _text(rel)
        if text is None or rel == THIS_FILE:
            continue
        for match in OUTSIDE_NOTES.finditer(text):
            outside.append(f"{rel}:{_line_of(text, match.start())}: {match.group(0)}")
        for match in DOCS_PATH.finditer(text):
            if f"docs/{match.group(1)}" not in present:
                missing.append(f"{rel}:{_line_of(text, match.start())}: docs/{match.group(1)}")
    return outside, missing


def test_scan_sees_the_repository():
    """Guard against a vacuous pass: the scan reads this checkout's sources and docs."""
    files = _repository_files()
    assert "verl/utils/packing.py" in files and "Makefile" in files and "README.md" in files
    assert _text("verl/utils/packing.py") is not None


def test_no_pointer_at_outside_notes():
    """No comment, docstring, doc or script line cites the private planning notes."""
    outside, _ = _scan()
    assert not outside, "cite docs/ or explain inline instead of:\n" + "\n".join(outside)


def test_every_cited_doc_exists():
    """Every ``docs/<name>.md`` mentioned anywhere is a file of this repository."""
    _, missing = _scan()
    assert not missing, "these docs are cited but missing:\n" + "\n".join(missing)


def _headings(rel: str) -> set[str]:
    text = (ROOT / rel).read_text(encoding="utf-8")
    return {m.group(1).strip() for m in re.finditer(r"^#+\s+(.+)$", text, re.MULTILINE)}


def test_every_cited_doc_section_exists():
    """A citation ``docs/<name>.md "Title"`` names a heading of that doc, so renaming a section breaks loudly."""
    present = set(_repository_files())
    missing = []
    for rel in present:
        text = _text(rel)
        if text is None or rel == THIS_FILE:
            continue
        for match in DOCS_SECTION.finditer(text):
            doc, title = f"docs/{match.group(1)}", match.group(2)
            if doc in present and title not in _headings(doc):
                missing.append(f"{rel}:{_line_of(text, match.start())}: {doc} has no section {title!r}")
    assert not missing, "\n".join(missing)


def test_the_patterns_catch_what_they_claim():
    """The patterns match the note names and skip the allowed look-alikes (worked examples)."""
    assert OUTSIDE_NOTES.search('(DESIGN.md "Memory")')
    assert OUTSIDE_NOTES.search("see shared/reference/x.md")
    assert OUTSIDE_NOTES.search("(cpu_environment §3b)") and OUTSIDE_NOTES.search("(reference §4.2 table)")
    assert not OUTSIDE_NOTES.search('(docs/design.md "Memory")')
    assert [m.group(1) for m in DOCS_PATH.finditer("[a](../docs/ascend.md), docs/qwen3_5.md.")] == [
        "ascend.md",
        "qwen3_5.md",
    ]
    assert not DOCS_PATH.search("upstream's docs/algo/rollout_corr_math.md, vllm/docs/x.md")
    cited = 'x (docs/qwen3_5.md, "Norms"), y (docs/design.md "SP 1 = 2")'
    assert [m.groups() for m in DOCS_SECTION.finditer(cited)] == [("qwen3_5.md", "Norms"), ("design.md", "SP 1 = 2")]
