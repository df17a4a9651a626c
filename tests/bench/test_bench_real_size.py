"""benchmarks/bench_real_size.py: the whole-model prefill / decode benchmark at TinyLlama-1.1B's
shape, each case in its own process (smoke run: one layer, no llama.cpp, one round)."""

from __future__ import annotations

import json
from pathlib import Path

from conftest import run_bench


def test_bench_real_size_smoke(tmp_path: Path) -> None:
    proc = run_bench(
        "bench_real_size.py", "--workdir", str(tmp_path / "work"), "--layers", "1",
        "--threads", "1", "--rounds", "1", "--repeats", "1", "--cases", "float32,bfloat16,int8",
        "--no-llamacpp", "--out", str(tmp_path / "out"), timeout=900,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads((tmp_path / "out" / "real_size.json").read_text())
    assert [r["ours"] for r in report["rows"]] == ["float32", "bfloat16", "int8"]
    for row in report["rows"]:  # no figure is asserted: they exist and are finite
        assert row["our_prefill_s"] > 0 and row["our_decode_tok_s"] > 0
        assert row["our_decode_gbs"] > 0 and row["decode_of_read_probe"] > 0
    assert report["probes"]["fma_gflops"]["1"] > 0 and report["probes"]["read_gbs"]["1"] > 0
    assert report["int8_dot"] in ("none", "vnni", "vnni512", "amx", "avx2")
    assert report["bf16_dot"] in ("none", "avx512bf16", "amx")
    assert "| 1 | int8 |" in (tmp_path / "out" / "real_size.md").read_text()


def test_bench_real_size_pairs_smoke(tmp_path: Path) -> None:
    """--pairs: the model stays loaded in a child that answers timed calls, the read probe
    beside every round's decode, our float32 model resident beside the other cases."""
    proc = run_bench(
        "bench_real_size.py", "--workdir", str(tmp_path / "work"), "--layers", "1",
        "--threads", "1", "--pairs", "2", "--cases", "float32,bfloat16", "--no-llamacpp",
        "--out", str(tmp_path / "out"), timeout=900,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads((tmp_path / "out" / "real_size.json").read_text())
    assert [r["ours"] for r in report["rows"]] == ["float32", "bfloat16"]
    for row in report["rows"]:
        assert row["our_decode_tok_s"] > 0 and row["our_prefill_s"] > 0
        assert row["prefill_vs_our_float32"] > 0
    assert "2 adjacent pairs" in report["protocol"]
    assert report["probes"]["read_gbs"]["1"] > 0
