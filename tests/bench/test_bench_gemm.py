"""benchmarks/bench_gemm.py: the package's float32 GEMMs vs OpenBLAS and torch."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_bench_gemm_quick(tmp_path: Path) -> None:
    """The smoke run: every peer's output checked against float64 first, one row per peer
    (no figure is asserted)."""
    env = {**os.environ, "PYTHONWARNINGS": "error"}
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "bench_gemm.py"), "--quick", "--out",
         str(tmp_path)],
        capture_output=True, text=True, timeout=600, env=env, cwd=ROOT, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads((tmp_path / "gemm.json").read_text())
    assert len(report["cases"]) == 2 * 2  # 2 shapes x 2 token counts
    for case in report["cases"]:
        for entry in case["threads"].values():
            assert {"lk auto", "lk packed", "lk tokens", "lk OpenBLAS", "NumPy"} <= set(
                entry["peers"]
            )
    assert "| lk packed |" in (tmp_path / "gemm.md").read_text()
