"""benchmarks/bench_quant.py: quantized GEMV (int8 / int4, both activation strategies) vs
float32 at TinyLlama's shapes."""

from __future__ import annotations

import json
from pathlib import Path

from conftest import run_bench


def test_bench_quant_quick(tmp_path: Path) -> None:
    """The smoke run: outputs checked against float64 first (quantization error only), one row
    per weight format and shape (no figure is asserted)."""
    proc = run_bench("bench_quant.py", "--quick", "--out", str(tmp_path))
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = [r for r in (tmp_path / "quant.md").read_text().splitlines() if r.startswith("| ")]
    assert len(rows) == 2 + 2 * 5  # header, separator, 2 shapes x 5 peers
    report = json.loads((tmp_path / "quant.json").read_text())
    assert report["llama_cpp"].startswith(("installed", "not installed"))
