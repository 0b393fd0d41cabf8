"""docs/ascend.zh.md (the Chinese guide) stays in step with docs/ascend.md: the same commands in code blocks, the
same version matrix rows, the same environment variables. The prose differs (the Chinese guide is written for
its readers, not translated line by line); what a user copies or compares must not."""

from __future__ import annotations

import re
from pathlib import Path

DOCS = Path(__file__).resolve().parents[2] / "docs"
EN, ZH = DOCS / "ascend.md", DOCS / "ascend.zh.md"
ENV_VAR = re.compile(r"\b[A-Z][A-Z0-9]*_[A-Z0-9_]*[A-Z0-9]\b")
VERSION = re.compile(r"\d+\.\d+(?:\.\d+)?(?:\.post\d+|rc\d+)?")


def code_lines(text: str) -> list[str]:
    """Lines inside ``` blocks, comment-only lines dropped and trailing `  # ...` comments cut (comments are prose)."""
    lines, inside = [], False
    for line in text.splitlines():
        if line.startswith("```"):
            inside = not inside
            continue
        if inside and not line.lstrip().startswith("# "):
            lines.append(re.split(r"\s{2,}# ", line)[0].rstrip())
    return lines


def matrix_versions(text: str) -> list[list[str]]:
    """The version numbers of each row of the first table (the environment matrix), in order."""
    rows, started = [], False
    for line in text.splitlines():
        if line.startswith("|"):
            started = True
            if not line.startswith("|---"):
                rows.append(VERSION.findall(line))
        elif started:
            break
    return rows[1:]  # without the header


def env_vars(text: str) -> set[str]:
    return set(ENV_VAR.findall(text))


def test_same_commands():
    en, zh = code_lines(EN.read_text()), code_lines(ZH.read_text())
    assert en == zh, (
        f"only in ascend.md: {sorted(set(en) - set(zh))}; only in ascend.zh.md: {sorted(set(zh) - set(en))}"
    )


def test_same_version_rows():
    en, zh = matrix_versions(EN.read_text()), matrix_versions(ZH.read_text())
    assert len(en) >= 10 and en == zh


def test_same_environment_variables():
    en, zh = env_vars(EN.read_text()), env_vars(ZH.read_text())
    assert {"HCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME", "HCCL_CONNECT_TIMEOUT"} <= en
    assert en == zh, f"only in ascend.md: {sorted(en - zh)}; only in ascend.zh.md: {sorted(zh - en)}"


def test_the_chinese_guide_is_chinese():
    text = ZH.read_text()
    assert sum("\u4e00" <= ch <= "\u9fff" for ch in text) > 2000


def test_checker_sees_a_dropped_command_and_variable():
    text = EN.read_text()
    assert code_lines(text.replace("\nnpu-smi info ", "\nnpu-smi ", 1)) != code_lines(text)
    assert env_vars(text.replace("HCCL_EXEC_TIMEOUT", "X")) != env_vars(text)
    assert matrix_versions(text.replace("| 8.5.1", "| 8.5.0", 1)) != matrix_versions(text)
