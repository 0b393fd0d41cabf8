"""Smoke test of benchmarks/reward_scoring.py --quick (the full run is a manual measurement, not a test)."""

import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "reward_scoring.py"


def test_quick_benchmark_runs_and_scores_match():
    """--quick times serial and 4-worker scoring of 16 samples and the process costs; the script itself fails when
    parallel scores differ from serial ones, so a zero exit code means identical scores."""
    out = subprocess.run([sys.executable, str(SCRIPT), "--quick"], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "scores identical to serial: True" in out.stdout
    assert out.stdout.count("per call,") == 2
