"""benchmarks/bench_sizes.py: the size sweep and per-call overhead table."""

from __future__ import annotations

import json
from pathlib import Path

from conftest import run_bench


def test_bench_sizes_quick_writes_results_and_plot(tmp_path: Path) -> None:
    """``--quick``: every op at every quick size with its peers (outputs cross-checked: no
    warning), per-call times, the overhead rows with their targets, sizes.md/json/png."""
    proc = run_bench(
        "bench_sizes.py", "--quick", "--out", str(tmp_path), "--quiet-wait", "0",
        env={"MPLBACKEND": "Agg"},
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "WARNING" not in proc.stderr and "Warning" not in proc.stderr, proc.stderr
    res = json.loads((tmp_path / "sizes.json").read_text())
    sizes = res["config"]["sizes"]
    ops = {(c["op"], c["elements"]) for c in res["sweep"]}
    for op in ("silu", "swiglu", "rms_norm", "layer_norm"):
        assert {(op, n) for n in sizes} <= ops
    assert {("rope", n) for n in sizes if n >= 1024} <= ops
    for case in res["sweep"]:
        assert {"llmkernels", "NumPy"} <= set(case["impls"])
        for t in res["config"]["threads"]:
            assert case["impls"]["llmkernels"][str(t)]["per_call_s"] > 0
    calls = {o["call"].split(" ")[0] for o in res["overhead"]}
    assert {"silu", "swiglu", "rms_norm", "layer_norm", "rope", "attention"} <= calls
    assert {"RMSNorm(1024)", "MultiHeadAttention(64,", "TransformerBlock(64,"} <= calls
    md = (tmp_path / "sizes.md").read_text()
    assert "## Per-call overhead" in md and "## Where llmkernels is behind" in md
    assert (tmp_path / "sizes.png").stat().st_size > 10_000
