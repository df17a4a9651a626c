"""benchmarks/bench_families.py: every family against transformers eager."""

from __future__ import annotations

import os
from pathlib import Path

from conftest import run_bench
from llmkernels.families import FAMILIES


def test_bench_families_quick(tmp_path: Path) -> None:
    """The smoke run: every family loads, its logits are checked against transformers' before
    timing, and the table has a row per family and thread count (no figure is asserted)."""
    proc = run_bench("bench_families.py", "--quick", "--out", str(tmp_path), timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    table = (tmp_path / "families.md").read_text()
    families = list(FAMILIES)
    cells = [r.split("|")[1:-1] for r in table.splitlines() if r.startswith("| ")]
    rows = [c for c in cells if c[0].strip() in families]
    assert sorted({r[0].strip() for r in rows}) == sorted(families)
    assert len(rows) == len(families) * min(2, os.cpu_count() or 1)
