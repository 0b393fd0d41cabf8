"""Smoke test of benchmarks/logprob_memory.py --quick (the full run is a manual measurement, not a test)."""

import re
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "logprob_memory.py"


def test_quick_benchmark_runs_and_streams():
    """--quick measures all 8 (pass, variant) pairs in fresh processes and prints the table and target summary.
    Loose physical check (vocab 32,768, 512 tokens, chunk 32): the chunked forward needs well under half the
    naive forward's extra memory (2 x 32 x 32,768 x 4 B = 8 MiB of buffers vs >= 64 MiB of full-vocab temporaries)."""
    out = subprocess.run([sys.executable, str(SCRIPT), "--quick"], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    rows = [line for line in out.stdout.splitlines() if line.startswith(("forward", "fwd+bwd"))]
    assert len(rows) == 8
    ratio = float(re.search(r"chunked forward memory / naive\s+([0-9.]+)", out.stdout).group(1))
    assert 0 < ratio < 0.5
