"""benchmarks/bench_dispatch.py: every kernel family on every SIMD path against the automatic
choice (smoke run: one thread, the minimum of rounds; no figure is asserted)."""

from __future__ import annotations

import json
from pathlib import Path

import llmkernels as lk
from conftest import run_bench


def test_bench_dispatch_smoke(tmp_path: Path) -> None:
    proc = run_bench(
        "bench_dispatch.py", "--threads", "1", "--seconds", "0", "--out", str(tmp_path),
        timeout=600,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads((tmp_path / "dispatch.json").read_text())
    assert report["families"] == lk._core.family_simd_archs()
    assert set(report["verdict"]) == set(report["families"])
    for row in report["rows"]:
        assert row["auto_path"] == report["families"][row["family"]]
        # (the automatic mode timed as a path of its own beside the forced ones)
        assert row["auto_over_fastest"] >= 1.0 and set(row["us"]) == {*report["paths"], "auto"}
