"""benchmarks/bench_serve.py: the serving benchmark (smoke run: the example model, one thread,
1 and 4 streams, no llama-server)."""

from __future__ import annotations

import json
from pathlib import Path

from conftest import run_bench


def test_bench_serve_smoke(tmp_path: Path) -> None:
    proc = run_bench(
        "bench_serve.py", "--quick", "--threads", "1", "--out", str(tmp_path), timeout=600
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads((tmp_path / "serve.json").read_text())
    assert [(r["threads"], r["streams"]) for r in report["rows"]] == [(1, 1), (1, 4)]
    for row in report["rows"]:  # no figure is asserted: they exist and are positive
        assert row["ours"]["tok_s"] > 0 and row["ours"]["ttft_s"] > 0
    assert "| 1 | 4 |" in (tmp_path / "serve.md").read_text()
