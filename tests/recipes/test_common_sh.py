"""recipes/qwen3_5/common.sh, sourced by a user's shell as the Ascend guide says: it leaves the caller's shell
options as they were, and exports the HCCL/NIC settings without overriding the user's. Real bash; CANN's set_env.sh is a stand-in that reads an unset variable (as the
real scripts do with LD_LIBRARY_PATH), since CANN is not installed here."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

COMMON = Path(__file__).resolve().parents[2] / "recipes" / "qwen3_5" / "common.sh"


def _bash(script: str, tmp_path: Path, **env: str) -> subprocess.CompletedProcess:
    toolkit = tmp_path / "Ascend" / "ascend-toolkit"
    toolkit.mkdir(parents=True, exist_ok=True)
    (toolkit / "set_env.sh").write_text('export VERL_TEST_CANN_LOADED="yes${VERL_TEST_NEVER_SET}"\n')
    run_env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "ASCEND_HOME": str(tmp_path / "Ascend"), **env}
    return subprocess.run(["bash", "-c", script], env=run_env, capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("caller_options", ["", "set -eu", "set -euo pipefail"])
def test_sourcing_keeps_the_callers_shell_options(tmp_path, caller_options):
    script = f"""{caller_options}
before=$-; before_pipefail=$(set -o | grep pipefail)
source {COMMON}
verl_export_ascend_env
echo "loaded=$VERL_TEST_CANN_LOADED"
[[ $- == "$before" ]] || {{ echo "options changed: $before -> $-"; exit 3; }}
[[ $(set -o | grep pipefail) == "$before_pipefail" ]] || {{ echo "pipefail changed"; exit 4; }}
"""
    done = _bash(script, tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "loaded=yes" in done.stdout  # the stand-in set_env.sh ran despite reading an unset variable


def test_without_nounset_later_commands_may_read_unset_variables(tmp_path):
    """The reported failure: after `source common.sh && verl_export_ascend_env`, `echo $UNSET` aborted the shell."""
    done = _bash(f'source {COMMON} && verl_export_ascend_env; echo "[$SOME_UNSET_VAR]"; echo still-here', tmp_path)
    assert done.returncode == 0 and "still-here" in done.stdout, done.stderr


def test_nic_and_hccl_defaults_do_not_override_the_user(tmp_path):
    script = f"source {COMMON} && verl_export_ascend_env && env | grep -E '^(HCCL|GLOO)_' | sort"
    lines = set(_bash(script, tmp_path, VERL_NIC="enp1", GLOO_SOCKET_IFNAME="eth9").stdout.splitlines())
    assert {"HCCL_SOCKET_IFNAME=enp1", "GLOO_SOCKET_IFNAME=eth9", "HCCL_CONNECT_TIMEOUT=1500"} <= lines
    assert "HCCL_EXEC_TIMEOUT=1800" in lines
    no_nic = _bash(script, tmp_path).stdout
    assert "HCCL_SOCKET_IFNAME" not in no_nic and "GLOO_SOCKET_IFNAME" not in no_nic
