"""benchmarks/bench_quant.py: quantized GEMV (int8 / int4, both activation strategies) vs
float32 at TinyLlama's shapes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_bench_quant_quick(tmp_path: Path) -> None:
    """The smoke run: outputs checked against float64 first (quantization error only), one row
    per weight format and shape (no figure is asserted)."""
    env = {**os.environ, "PYTHONWARNINGS": "error"}
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "bench_quant.py"), "--quick", "--out",
         str(tmp_path)],
        capture_output=True, text=True, timeout=600, env=env, cwd=ROOT, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = [r for r in (tmp_path / "quant.md").read_text().splitlines() if r.startswith("| ")]
    assert len(rows) == 2 + 2 * 5  # header, separator, 2 shapes x 5 peers
    report = json.loads((tmp_path / "quant.json").read_text())
    assert report["llama_cpp"].startswith(("installed", "not installed"))
