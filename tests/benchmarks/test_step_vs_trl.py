"""Smoke test of benchmarks/step_vs_trl.py --quick (the full comparison is a manual measurement, not a test).

Needs TRL's own virtualenv (``make bench-trl`` creates it; TRL is not a dependency of this package), so it is
skipped without one, and marked slow (two fresh training runs, ~1-2 min on 2 cores)."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "step_vs_trl.py"
TRL_PYTHON = os.environ.get("VERL_TRL_PYTHON", "/tmp/venv-trl/bin/python")

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not Path(TRL_PYTHON).is_file(), reason=f"no TRL venv at {TRL_PYTHON} (make bench-trl)"),
]


def test_quick_comparison_runs_and_reports_every_phase(tmp_path):
    """--quick runs one round of each trainer and prints the per-phase table, start-up and both reward curves."""
    out = subprocess.run(
        [sys.executable, str(SCRIPT), "--quick", "--trl-python", TRL_PYTHON, "--dir", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    for row in ("| generation |", "| update (fwd+bwd+optim) |", "| whole step |", "| launch -> first step |"):
        assert row in out.stdout
    assert "this project:" in out.stdout and "TRL:" in out.stdout
