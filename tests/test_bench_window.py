"""benchmarks/bench_window.py: sliding-window attention vs full causal and torch + mask."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_bench_window_quick(tmp_path: Path) -> None:
    """The smoke run: outputs checked against torch's masked SDPA first, one row per thread
    count (no figure is asserted)."""
    env = {**os.environ, "PYTHONWARNINGS": "error"}
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "bench_window.py"), "--quick", "--out",
         str(tmp_path)],
        capture_output=True, text=True, timeout=600, env=env, cwd=ROOT, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = [r for r in (tmp_path / "window.md").read_text().splitlines() if r.startswith("| ")]
    assert len(rows) == 2 + min(2, os.cpu_count() or 1)
