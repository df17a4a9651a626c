"""benchmarks/bench_load.py: load time and peak memory of from_pretrained."""

from __future__ import annotations

from pathlib import Path

from conftest import run_bench


def test_bench_load_runs_on_a_tiny_checkpoint(tmp_path: Path) -> None:
    """Both checkpoints (bf16 and f32) measured with the old path too: one table row each,
    with the load/read ratio and the peak over the model (no figure is asserted: speed lives
    in the benchmark's output, not in the tests)."""
    proc = run_bench(
        "bench_load.py", "--layers", "1", "--dim", "64", "--hidden", "128", "--heads", "4",
        "--kv-heads", "2", "--vocab", "300", "--repeats", "1", "--old",
        env={"BENCH_TMP": str(tmp_path)},
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    rows = [line.split("|")[1:-1] for line in proc.stdout.splitlines()[2:]]
    assert [(r[0].strip(), r[1].strip()) for r in rows] == [
        ("bf16", "new"), ("bf16", "old"), ("f32", "new"), ("f32", "old"),
    ]  # fmt: skip
    for row in rows:
        assert float(row[8].split()[0]) > 0 and float(row[10]) > 0
