"""benchmarks/bench_window.py: sliding-window attention vs full causal and torch + mask."""

from __future__ import annotations

import os
from pathlib import Path

from conftest import run_bench


def test_bench_window_quick(tmp_path: Path) -> None:
    """The smoke run: outputs checked against torch's masked SDPA first, one row per thread
    count (no figure is asserted)."""
    proc = run_bench("bench_window.py", "--quick", "--out", str(tmp_path))
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = [r for r in (tmp_path / "window.md").read_text().splitlines() if r.startswith("| ")]
    assert len(rows) == 2 + min(2, os.cpu_count() or 1)
