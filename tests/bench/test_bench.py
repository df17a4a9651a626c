"""The benchmark scripts in ``benchmarks/`` and their shared harness: quick smoke runs of the
scripts (the same CLI ``make bench`` uses), the performance page's tables regenerated from the
committed JSON (so the page cannot drift from the results), the benchmark plots, and the harness's
timing and formatting helpers. No timing is asserted (speed lives in the benchmarks)."""

from __future__ import annotations

import io
import json
import math
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
from matplotlib.lines import Line2D  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "benchmarks"
RESULTS = BENCH / "results"
PAGE = ROOT / "docs" / "performance.md"
sys.path.insert(0, str(BENCH))

import bench_attention  # noqa: E402
import bench_blocks  # noqa: E402
import bench_ops  # noqa: E402
import harness  # noqa: E402
import plot_results  # noqa: E402
import render_tables  # noqa: E402

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(autouse=True)
def _close_figures() -> Iterator[None]:
    yield
    plt.close("all")


def _png(fig: Any) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=50)
    return buf.getvalue()


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONWARNINGS": "error", "MPLBACKEND": "Agg"}


def _run(*args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, *args], capture_output=True, text=True, timeout=timeout, env=_env(),
        cwd=ROOT, check=False,
    )  # fmt: skip


# --------------------------------------------------------------------------------------
# the performance page's tables
# --------------------------------------------------------------------------------------


def test_performance_tables_are_rendered_from_the_committed_results() -> None:
    """``make bench`` rewrites the tables between the page's markers from the JSON; the
    committed page must be what the committed JSON renders to."""
    readme = PAGE.read_text(encoding="utf-8")
    tables = render_tables.tables(RESULTS)
    assert set(tables) == {"ops", "blocks"}
    for name, lines in tables.items():
        start, end = f"<!-- bench:{name} -->\n", f"\n<!-- /bench:{name} -->"
        assert readme.count(start) == 1 and readme.count(end) == 1, name
        body = readme.split(start)[1].split(end)[0]
        assert body.splitlines() == lines, name
    assert render_tables.replace_sections(readme, tables) == readme
    assert _run(str(BENCH / "render_tables.py"), "--check").returncode == 0


def test_table_renderer_rows_follow_the_numbers() -> None:
    """A changed number in the JSON changes the row (the table is not copied text)."""
    ops = json.loads((RESULTS / "ops.json").read_text())
    attention = json.loads((RESULTS / "attention.json").read_text())
    rms = ops["ops"][0]
    assert rms["op"] == "rms_norm"
    rms["impls"]["llmkernels"]["1"].update(median_s=1e-3, rate=64.0, fraction_of_roof=1.5)
    rms["impls"]["torch"]["1"]["time_vs_llmkernels"] = 3.0
    row = render_tables.ops_table(ops, attention)[2]
    expected = "| `rms_norm` (4096, 4096) | 1 ms, 64.0 GB/s | 150% of triad | 3.0× `F.rms_norm` "
    assert row == expected + "| 6.7× | 1.20 |"
    with pytest.raises(ValueError, match="no <!-- bench:nope --> markers"):
        render_tables.replace_sections("text", {"nope": []})


def test_render_tables_check_and_rewrite(tmp_path: Path) -> None:
    """``--check`` fails on a table that no longer matches the JSON; a plain run rewrites it
    (and only the marked tables)."""
    readme = PAGE.read_text(encoding="utf-8")
    stale = readme.replace("| 4.18 ms, 32.1 GB/s |", "| 9.99 ms, 1.0 GB/s |", 1)
    assert stale != readme
    path = tmp_path / "performance.md"
    path.write_text(stale, encoding="utf-8")
    assert render_tables.main(["--page", str(path), "--check"]) == 1
    assert render_tables.main(["--page", str(path)]) == 0
    assert path.read_text(encoding="utf-8") == readme
    assert render_tables.main(["--page", str(path), "--check"]) == 0


def test_committed_reports_render() -> None:
    """Each script renders its markdown report from its committed JSON alone."""
    ops = bench_ops.render(json.loads((RESULTS / "ops.json").read_text()))
    assert "## Ops" in ops and "## Pure Python" in ops and "## Thread scaling" in ops
    att = bench_attention.render(json.loads((RESULTS / "attention.json").read_text()))
    assert "**attention prefill** q, k, v (1, 32, 2048, 128)" in att
    blocks = bench_blocks.render(json.loads((RESULTS / "blocks.json").read_text()))
    assert "## TinyLlama-like block" in blocks and "## Whole model" in blocks


# --------------------------------------------------------------------------------------
# quick runs of the scripts
# --------------------------------------------------------------------------------------


def test_bench_ops_quick_writes_results_and_plots(tmp_path: Path) -> None:
    """``bench_ops.py --quick`` (here without the row-length table, to keep it short) writes
    ops.json / ops.md that ``plot_results.py`` draws; no warnings."""
    proc = _run(str(BENCH / "bench_ops.py"), "--quick", "--out", str(tmp_path),
                "--no-row-scaling", "--quiet-wait", "0")  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "Warning" not in proc.stderr and "WARNING" not in proc.stderr
    results = json.loads((tmp_path / "ops.json").read_text())
    assert [op["op"] for op in results["ops"]] == [
        "rms_norm", "layer_norm", "silu", "swiglu", "rope", "swiglu_ffn",
    ]  # fmt: skip
    rms = results["ops"][0]["impls"]
    assert set(rms) >= {"llmkernels", "llmkernels (no out=)", "NumPy"}
    for t in results["config"]["threads"]:
        assert rms["llmkernels"][str(t)]["median_s"] > 0
        assert rms["NumPy"][str(t)]["time_vs_llmkernels"] > 0
    assert {r["op"] for r in results["pure"]} >= {"rms_norm", "swiglu_ffn"}
    assert results["thread_scaling"]["summary"]["rms_norm"]["median_speedup"] > 0
    assert results["machine"]["build_info"]["version"]
    assert (tmp_path / "ops.md").read_text().startswith("# llmkernels ops (--quick)")
    proc = _run(str(BENCH / "plot_results.py"), str(tmp_path / "ops.json"))
    assert proc.returncode == 0, proc.stderr
    for name in ("benchmarks.png", "benchmarks_time.png"):
        assert (tmp_path / name).read_bytes().startswith(PNG_MAGIC)


def test_bench_attention_quick(tmp_path: Path) -> None:
    proc = _run(str(BENCH / "bench_attention.py"), "--quick", "--out", str(tmp_path),
                "--no-scaling", "--quiet-wait", "0")  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "Warning" not in proc.stderr and "WARNING" not in proc.stderr
    results = json.loads((tmp_path / "attention.json").read_text())
    names = [c["op"] for c in results["attention"]["cases"]]
    assert names[:3] == [
        "attention prefill", "attention prefill, causal", "attention decode (same K/V each call)",
    ]  # fmt: skip
    assert names[3].startswith("attention decode (cold:")
    for case in results["attention"]["cases"]:
        assert case["max_rel_diff_vs_llmkernels"]["NumPy"] < 1e-3
    assert (
        "### llmkernels attention vs sequence length" not in (tmp_path / "attention.md").read_text()
    )


def test_cli_bench_builtin_table(tmp_path: Path) -> None:
    """``python examples/demo.py bench``: the side-by-side table of every op, and its JSON (the
    full benchmarks are the scripts above)."""
    proc = _run("examples/demo.py", "bench", "--quick", "--out", str(tmp_path))
    assert proc.returncode == 0, proc.stderr
    assert "Warning" not in proc.stderr and "\r" not in proc.stderr
    for op in ("rms_norm", "layer_norm", "silu", "swiglu", "swiglu_ffn", "rope", "attention"):
        assert f"\n  {op} " in proc.stdout
    report = json.loads((tmp_path / "builtin_timings.json").read_text())
    assert all(r["seconds"]["llmkernels"] > 0 for r in report["ops"])


# --------------------------------------------------------------------------------------
# the harness
# --------------------------------------------------------------------------------------


def test_measure_interleaves_peers_with_warmup_setup_and_cap() -> None:
    calls: list[str] = []
    impls = {"a": lambda: calls.append("a"), "b": lambda: calls.append("b")}
    setup = {"b": lambda: calls.append("prep b")}
    samples = harness.measure(impls, rounds=2, per_round=3, warmup=1, setup=setup, warmup_s=0)
    assert {k: len(v) for k, v in samples.items()} == {"a": 3 * 2, "b": 3 * 2}
    one_round = ["a"] * 4 + ["prep b", "b"] * 4  # 1 warm-up + 3 timed calls each, in turn
    assert calls == one_round * 2
    # the warm-up also lasts at least warmup_s (the previous peer's spinning threads go idle)
    calls.clear()
    t0 = time.perf_counter()
    harness.measure({"a": lambda: calls.append("a")}, rounds=1, per_round=1, warmup_s=0.05)
    assert time.perf_counter() - t0 >= 0.05 and len(calls) > 2
    capped = harness.measure({"a": lambda: None}, rounds=1, per_round=50, cap_s=0.0)
    assert len(capped["a"]) == 2  # at least two calls however slow
    samples, others = harness.measure_quietly(impls, 1, 2, quiet_wait=0.0)
    assert len(samples["a"]) == 2 and (others is None or others >= 0.0)


def test_paired_ratio_pairs_samples_by_index() -> None:
    # a slow phase (x1.6) covers the peer's 2nd and 3rd samples and our 3rd: pairs 1, 3, 4 still
    # read 2.0; a ratio of medians would read 2.6 / 1.0
    peer = [2.0, 3.2, 3.2, 2.0, 2.6]
    ours = [1.0, 1.0, 1.6, 1.0, 1.3]
    assert harness.paired_ratio(peer, ours) == 2.0
    assert harness.paired_ratio([4.0, 4.0, 9.0], [2.0, 2.0]) == 2.0  # the shorter list rules
    with pytest.raises(ValueError, match="paired_ratio"):
        harness.paired_ratio([], [1.0])


def test_peer_stats_and_roof() -> None:
    st = harness.peer_stats({"llmkernels": [1.0, 2.0, 3.0], "x": [4.0, 4.0]}, 8e9, 4.0)
    assert st["llmkernels"]["median_s"] == 2.0 and st["llmkernels"]["rate"] == 4.0
    assert st["llmkernels"]["fraction_of_roof"] == 1.0
    assert st["x"]["time_vs_llmkernels"] == 2.0 and st["x"]["min_s"] == 4.0
    median_form = {"triad_gbs": {"1": {"median": 30.0}}, "fma_gflops": {"1": {"median": 200.0}}}
    best_form = {"triad_gbs": {"1": 31.0}, "fma_gflops": {"1": 210.0}}
    assert harness.roof(median_form, "GB/s", 1) == 30.0
    assert harness.roof(best_form, "GFLOP/s", "1") == 210.0


def test_max_rel_diff_and_formulas() -> None:
    rng = np.random.default_rng(0)
    x, w = harness.rng_f32(rng, 3, 8), harness.rng_f32(rng, 8)
    assert harness.max_rel_diff((x, x), (x, x)) == 0.0
    assert harness.max_rel_diff(x * 1.5, x) == pytest.approx(0.5, rel=1e-6)
    # RMSNorm formula: x / sqrt(mean(x^2) + eps) * w
    ref = x / np.sqrt((x.astype(np.float64) ** 2).mean(-1, keepdims=True) + 1e-6) * w
    np.testing.assert_allclose(harness.numpy_rms_norm(x, w, 1e-6), ref, rtol=1e-5)
    cos, sin = harness.rope_cos_sin(8, np.arange(3))
    assert cos.shape == (3, 4) and math.isclose(float(cos[0, 0]), 1.0)


def test_formatting() -> None:
    assert (
        harness.fmt(None) == "-" and harness.fmt(1.234) == "1.23" and harness.fmt(1e-4) == "1.0e-04"
    )
    assert harness.fmt_time(0.00418) == "4.18 ms" and harness.fmt_time(2.5e-8) == "25 ns"
    assert harness.fmt_time(None) == "-" and harness.fmt_time(1.5) == "1.5 s"
    assert harness.fmt_bytes(32 * 2**20) == "32 MiB" and harness.fmt_bytes(None) == "-"
    assert harness.fmt_cpus([0.04, None]) == "0.0 / -"
    assert harness.md_table(["a", "b"], [["1", "2"]]) == ["| a | b |", "| --- | --- |", "| 1 | 2 |"]
    m = json.loads((RESULTS / "blocks.json").read_text())["machine"]
    assert harness.machine_lines(m)[0].startswith("- AMD EPYC, 2 CPUs")


# --------------------------------------------------------------------------------------
# benchmark_plot (benchmarks/plot_results.py)
# --------------------------------------------------------------------------------------


def _impl(times: dict[int, float], work: float) -> dict[str, Any]:
    out: dict[str, Any] = {
        str(t): {"median_s": s, "min_s": s, "rate": work / s * 1e-9} for t, s in times.items()
    }
    out["thread_speedup"] = times[1] / times[2]
    return out


def _results() -> dict[str, Any]:
    """A small results dict with the structure of ops.json and attention.json together."""
    gb, flop = 64e6, 2e9
    return {
        "machine": {
            "cpu": "Test CPU",
            "cpu_count": 2,
            "build_info": {"simd_arch": "avx512"},
            "numpy": "2.x",
            "date": "2026-01-01T00:00:00",
        },  # fmt: skip
        "probe": {
            "triad_gbs": {"1": {"median": 30.0}, "2": {"median": 50.0}},
            "fma_gflops": {"1": {"median": 200.0}, "2": {"median": 400.0}},
        },
        "ops": [
            {
                "op": "rms_norm",
                "shape": "(4096, 4096)",
                "metric": "GB/s",
                "work_per_call": gb,
                "impls": {
                    "llmkernels": _impl({1: 2.5e-3, 2: 1.6e-3}, gb),
                    "torch": _impl({1: 0.05, 2: 0.03}, gb),
                    "NumPy": _impl({1: 0.01, 2: 0.01}, gb),
                },
            },
            {
                "op": "swiglu_ffn",
                "shape": "x (512, 2048), d_ff 5632",
                "metric": "GFLOP/s",
                "work_per_call": flop,
                "impls": {
                    "llmkernels": _impl({1: 0.012, 2: 0.006}, flop),
                    "torch": _impl({1: 0.02, 2: 0.011}, flop),
                },
            },
        ],  # fmt: skip
        "attention": {
            "cases": [
                {
                    "op": "attention decode",
                    "shape": "q (1, 32, 1, 128)",
                    "metric": "GB/s",
                    "work_per_call": gb,
                    "impls": {
                        "llmkernels": _impl({1: 3e-3, 2: 2e-3}, gb),
                        "torch SDPA": _impl({1: 9e-3, 2: 8e-3}, gb),
                    },
                },
            ]  # fmt: skip
        },
        "pure": [
            {
                "op": "silu",
                "toy_shape": "(4096,)",
                "unit": "element",
                "seconds_per_unit": {"pure": 2e-7, "NumPy": 1e-9, "llmkernels": 1.5e-9},
            },
        ],  # fmt: skip
    }


def _legend_labels(fig: Any) -> list[str]:
    return [t.get_text() for legend in fig.legends for t in legend.get_texts()]


def test_benchmark_plot_rate_panels_roofline_legend() -> None:
    fig = plot_results.benchmark_plot(_results())
    # per thread count: memory-bound (GB/s) and compute-bound (GFLOP/s) panels; + pure Python
    assert len(fig.axes) == 2 * 2 + 1
    titles = [ax.get_title() for ax in fig.axes]
    assert "memory-bound ops, 1 thread" in titles and "compute-bound ops, 2 threads" in titles
    by_title = dict(zip(titles, fig.axes, strict=True))
    mem1 = by_title["memory-bound ops, 1 thread"]
    assert mem1.get_xlabel().startswith("bandwidth (GB/s)")
    assert (
        by_title["compute-bound ops, 2 threads"].get_xlabel().startswith("compute rate (GFLOP/s)")
    )
    labels = [t.get_text() for t in mem1.get_yticklabels()]
    ticks = dict(zip(labels, mem1.get_yticks(), strict=True))
    # one row per case, in the results' order from the top: ops, then attention cases
    assert ticks["rms_norm\n(4096, 4096)"] > ticks["attention decode\nq (1, 32, 1, 128)"]
    # the roofline: a vertical line at the probe's triad bandwidth for that thread count
    roof_x = [ln.get_xdata()[0] for ln in mem1.get_lines() if isinstance(ln, Line2D)]
    assert 30.0 in roof_x
    # bars: rate = work / median time (llmkernels rms_norm, 1 thread: 64 MB / 2.5 ms)
    widths = sorted(p.get_width() for p in mem1.patches)
    assert any(w == pytest.approx(64e6 / 2.5e-3 * 1e-9) for w in widths)
    labels = _legend_labels(fig)
    assert "llmkernels" in labels and "NumPy formula" in labels and "pure Python" in labels
    assert any(lb.startswith("roofline") for lb in labels)
    assert any(lb.startswith("torch") for lb in labels)
    assert "Test CPU" in fig.get_suptitle()
    assert _png(fig).startswith(PNG_MAGIC)


def test_benchmark_plot_time_one_thread_from_path(tmp_path: Path) -> None:
    path = tmp_path / "results.json"
    path.write_text(json.dumps(_results()))
    fig = plot_results.benchmark_plot(str(path), kind="time", threads=1, pure=False)
    assert len(fig.axes) == 2
    for ax in fig.axes:
        assert ax.get_xscale() == "log"
        assert ax.get_xlabel().startswith("median time per call (ms)")
    assert any(lb.startswith("roofline") for lb in _legend_labels(fig))
    assert _png(fig).startswith(PNG_MAGIC)


def test_benchmark_plot_minimal_dict_int_thread_keys() -> None:
    # what a notebook can build by hand: no rate (derived from work / time), int thread keys
    res = {
        "probe": {"triad_gbs": {1: {"median": 20.0}}},
        "ops": [
            {
                "op": "silu",
                "shape": "",
                "metric": "GB/s",
                "work_per_call": 8e6,
                "impls": {"llmkernels": {1: {"median_s": 1e-3}}},
            }
        ],  # fmt: skip
    }
    fig = plot_results.benchmark_plot(res)
    (ax,) = fig.axes
    assert [p.get_width() for p in ax.patches] == [pytest.approx(8.0)]


@pytest.mark.parametrize(
    ("results", "kwargs", "error"),
    [
        (_results(), {"kind": "speed"}, ValueError),
        ({"probe": {}}, {}, ValueError),
        ([1, 2], {}, TypeError),
    ],
)
def test_benchmark_plot_errors(results: Any, kwargs: dict[str, Any], error: type) -> None:
    with pytest.raises(error, match=r"\[benchmark_plot\]"):
        plot_results.benchmark_plot(results, **kwargs)


def test_committed_results_draw() -> None:
    """The committed (or last `make bench`) results draw, ops and attention merged."""
    paths = [RESULTS / "ops.json", RESULTS / "attention.json"]
    fig = plot_results.benchmark_plot(paths)
    labels = [t.get_text() for ax in fig.axes for t in ax.get_yticklabels()]
    assert any(lb.startswith("rms_norm") for lb in labels)
    assert any(lb.startswith("attention decode") for lb in labels)
    assert len(fig.axes) >= 2
    assert _png(fig).startswith(PNG_MAGIC)


def test_plot_results_script_writes_pngs(tmp_path: Path) -> None:
    src = tmp_path / "results.json"
    src.write_text(json.dumps(_results()))
    proc = _run(str(BENCH / "plot_results.py"), str(src), timeout=300)
    assert proc.returncode == 0, proc.stderr
    for name in ("benchmarks.png", "benchmarks_time.png"):
        assert (tmp_path / name).read_bytes().startswith(PNG_MAGIC)


def test_plot_results_script_without_results(tmp_path: Path) -> None:
    proc = _run(str(BENCH / "plot_results.py"), str(tmp_path / "none.json"))
    assert proc.returncode == 1 and "run the benchmarks first" in proc.stderr
