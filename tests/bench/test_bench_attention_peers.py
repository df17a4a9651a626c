"""``benchmarks/bench_attention_peers.py`` (llmkernels attention vs torch SDPA and ONNX Runtime):
a ``--quick`` smoke run writes its JSON and markdown, every peer that is installed agrees with
llmkernels before it is timed, and a peer that is not installed is reported as skipped. No
timing is asserted (speed lives in the benchmarks)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

from conftest import run_bench

CASES = ["prefill", "prefill, causal", "small, causal", "decode, GQA"]


def test_bench_attention_peers_quick(tmp_path: Path) -> None:
    proc = run_bench(
        "bench_attention_peers.py", "--quick", "--out", str(tmp_path), "--quiet-wait", "0"
    )
    assert proc.returncode == 0, proc.stderr
    assert "WARNING" not in proc.stderr and "Warning" not in proc.stderr
    report = json.loads((tmp_path / "attention_peers.json").read_text())
    assert report["paths"], "no path ran"
    have_torch = importlib.util.find_spec("torch") is not None
    have_ort = all(importlib.util.find_spec(m) is not None for m in ("onnxruntime", "onnx"))
    for path in report["paths"]:
        assert [c["case"] for c in path["cases"]] == CASES
        assert ("torch SDPA" in path["skipped"]) is not have_torch
        assert ("ORT Attention" in path["skipped"]) is not have_ort
        for case in path["cases"]:
            diffs = case["max_rel_diff"]
            assert diffs["llmkernels_vs_float64"] < 1e-4
            peers = {n for n in diffs if n != "llmkernels_vs_float64"}
            assert all(diffs[n] < 1e-4 for n in peers), diffs
            for t in report["config"]["threads"]:
                impls = case["threads"][str(t)]["impls"]
                assert set(impls) == {"llmkernels", *peers}
                assert all(s["median_s"] > 0 and s["ratio"] > 0 for s in impls.values())
            if have_ort:
                assert "ORT Attention" in peers
                assert ("ORT GQA" if case["case"].startswith("decode") else "ORT MHA") in peers
    md = (tmp_path / "attention_peers.md").read_text()
    assert md.startswith("# llmkernels attention vs torch SDPA and ONNX Runtime (--quick)")
    assert "| case | shape | lk 1T |" in md
