"""``llmkernels.plot``: attention heatmaps and benchmark plots (Agg backend), the PNGs that
``benchmarks/plot_results.py`` and ``python -m llmkernels bench`` write, and the clear error
without matplotlib."""

from __future__ import annotations

import importlib
import io
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")

import llmkernels as lk  # noqa: E402
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
from llmkernels import plot  # noqa: E402
from matplotlib.image import AxesImage  # noqa: E402
from matplotlib.lines import Line2D  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(autouse=True)
def _close_figures() -> Iterator[None]:
    yield
    plt.close("all")


def _image_axes(fig: Any) -> list[Any]:
    return [ax for ax in fig.axes if any(isinstance(a, AxesImage) for a in ax.get_images())]


def _colorbar_axes(fig: Any) -> list[Any]:
    return [ax for ax in fig.axes if ax not in _image_axes(fig)]


def _png(fig: Any) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=50)
    return buf.getvalue()


# --------------------------------------------------------------------------------------
# attention_heatmap
# --------------------------------------------------------------------------------------


@pytest.fixture
def weights() -> np.ndarray:
    rng = np.random.default_rng(0)
    q = rng.standard_normal((1, 4, 6, 8), dtype=np.float32)
    k = rng.standard_normal((1, 2, 6, 8), dtype=np.float32)
    _, w = lk.attention(q, k, k, causal=True, return_weights=True)
    return w  # (1, 4, 6, 6)


def test_heatmap_one_panel_per_head(weights: np.ndarray) -> None:
    fig = plot.attention_heatmap(weights)
    images = _image_axes(fig)
    assert len(images) == 4
    assert [ax.get_title() for ax in images] == [f"head {h}" for h in range(4)]
    for ax in images:
        assert ax.get_xlabel() == "key position"
        assert ax.get_ylabel() == "query position"
        np.testing.assert_array_equal(ax.get_images()[0].get_array().shape, (6, 6))
    (cbar,) = _colorbar_axes(fig)
    assert cbar.get_ylabel() == "attention weight"
    lo, hi = images[0].get_images()[0].get_clim()
    assert lo == 0.0 and hi == pytest.approx(float(weights.max()))
    assert _png(fig).startswith(PNG_MAGIC)


def test_heatmap_accepts_2d_3d_4d_and_array_likes(weights: np.ndarray) -> None:
    assert len(_image_axes(plot.attention_heatmap(weights[0, 0]))) == 1
    assert len(_image_axes(plot.attention_heatmap(weights[0]))) == 4
    assert len(_image_axes(plot.attention_heatmap(weights[0].tolist()))) == 4


def test_heatmap_heads_subset_and_layout(weights: np.ndarray) -> None:
    fig = plot.attention_heatmap(weights, heads=[1, 3], title="two heads")
    assert [ax.get_title() for ax in _image_axes(fig)] == ["head 1", "head 3"]
    assert fig.get_suptitle() == "two heads"
    fig = plot.attention_heatmap(weights, heads=2)
    assert [ax.get_title() for ax in _image_axes(fig)] == ["head 2"]
    fig = plot.attention_heatmap(np.ones((6, 3, 3)) / 3, ncols=4)  # 2 rows, 2 empty slots removed
    assert len(_image_axes(fig)) == 6 and len(fig.axes) == 7


def test_heatmap_token_labels(weights: np.ndarray) -> None:
    tokens = ["<s>", "the", "cat", "sat", "on", "mat"]
    fig = plot.attention_heatmap(weights, tokens=tokens)
    ax = _image_axes(fig)[0]
    assert [t.get_text() for t in ax.get_xticklabels()] == tokens
    assert [t.get_text() for t in ax.get_yticklabels()] == tokens
    # decode-style weights (Tq < Tk): queries are the last Tq tokens (bottom-right alignment)
    fig = plot.attention_heatmap(weights[0, :, -2:], tokens=tokens)
    ax = _image_axes(fig)[0]
    assert [t.get_text() for t in ax.get_yticklabels()] == ["on", "mat"]
    fig = plot.attention_heatmap(weights[0, :, -2:], tokens=(["a", "b"], tokens))
    assert [t.get_text() for t in _image_axes(fig)[0].get_yticklabels()] == ["a", "b"]


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"weights": np.ones((2, 1, 3, 3))}, ValueError, "batch of 2"),
        ({"weights": np.ones(3)}, ValueError, "must be"),
        ({"weights": np.ones((2, 3, 3)), "heads": [2]}, ValueError, "out of range"),
        ({"weights": np.ones((2, 3, 3)), "heads": []}, ValueError, "at least one"),
        ({"weights": np.ones((2, 3, 3)), "heads": [0.5]}, TypeError, "ints"),
        ({"weights": np.ones((3, 3)), "tokens": ["a", "b"]}, ValueError, "one label per key"),
    ],
)
def test_heatmap_errors(kwargs: dict[str, Any], error: type[Exception], match: str) -> None:
    with pytest.raises(error, match=r"\[attention_heatmap\].*" + match):
        plot.attention_heatmap(**kwargs)


# --------------------------------------------------------------------------------------
# benchmark_plot
# --------------------------------------------------------------------------------------


def _impl(times: dict[int, float], work: float) -> dict[str, Any]:
    out: dict[str, Any] = {
        str(t): {"median_s": s, "min_s": s, "rate": work / s * 1e-9} for t, s in times.items()
    }
    out["thread_speedup"] = times[1] / times[2]
    return out


def _results() -> dict[str, Any]:
    """A small results dict with the structure of benchmarks/run.py's results.json."""
    gb, flop = 64e6, 2e9
    return {
        "machine": {"cpu": "Test CPU", "cpu_count": 2, "build_info": {"simd_arch": "avx512"},
                    "numpy": "2.x", "date": "2026-01-01T00:00:00"},  # fmt: skip
        "probe": {
            "triad_gbs": {"1": {"median": 30.0}, "2": {"median": 50.0}},
            "fma_gflops": {"1": {"median": 200.0}, "2": {"median": 400.0}},
        },
        "ops": [
            {"op": "rms_norm", "shape": "(4096, 4096)", "metric": "GB/s", "work_per_call": gb,
             "impls": {"llmkernels": _impl({1: 2.5e-3, 2: 1.6e-3}, gb),
                       "torch": _impl({1: 0.05, 2: 0.03}, gb),
                       "NumPy": _impl({1: 0.01, 2: 0.01}, gb)}},
            {"op": "swiglu_ffn", "shape": "x (512, 2048), d_ff 5632", "metric": "GFLOP/s",
             "work_per_call": flop,
             "impls": {"llmkernels": _impl({1: 0.012, 2: 0.006}, flop),
                       "torch": _impl({1: 0.02, 2: 0.011}, flop)}},
        ],  # fmt: skip
        "attention": {
            "cases": [
                {"op": "attention decode", "shape": "q (1, 32, 1, 128)", "metric": "GB/s",
                 "work_per_call": gb,
                 "impls": {"llmkernels": _impl({1: 3e-3, 2: 2e-3}, gb),
                           "torch SDPA": _impl({1: 9e-3, 2: 8e-3}, gb)}},
            ]  # fmt: skip
        },
        "pure": [
            {"op": "silu", "toy_shape": "(4096,)", "unit": "element",
             "seconds_per_unit": {"pure": 2e-7, "NumPy": 1e-9, "llmkernels": 1.5e-9}},
        ],  # fmt: skip
    }


def _legend_labels(fig: Any) -> list[str]:
    return [t.get_text() for legend in fig.legends for t in legend.get_texts()]


def test_benchmark_plot_rate_panels_roofline_legend() -> None:
    fig = plot.benchmark_plot(_results())
    # per thread count: memory-bound (GB/s) and compute-bound (GFLOP/s) panels; + pure Python
    assert len(fig.axes) == 2 * 2 + 1
    titles = [ax.get_title() for ax in fig.axes]
    assert "memory-bound ops, 1 thread" in titles and "compute-bound ops, 2 threads" in titles
    by_title = dict(zip(titles, fig.axes, strict=True))
    mem1 = by_title["memory-bound ops, 1 thread"]
    assert mem1.get_xlabel().startswith("bandwidth (GB/s)")
    assert by_title["compute-bound ops, 2 threads"].get_xlabel().startswith(
        "compute rate (GFLOP/s)"
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
    fig = plot.benchmark_plot(str(path), kind="time", threads=1, pure=False)
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
        "ops": [{"op": "silu", "shape": "", "metric": "GB/s", "work_per_call": 8e6,
                 "impls": {"llmkernels": {1: {"median_s": 1e-3}}}}],  # fmt: skip
    }
    fig = plot.benchmark_plot(res)
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
        plot.benchmark_plot(results, **kwargs)


def test_real_results_if_present() -> None:
    """The checked-in (or last `make bench`) results draw without error."""
    path = ROOT / "benchmarks" / "results" / "results.json"
    if not path.is_file():
        pytest.skip("no benchmarks/results/results.json (run make bench)")
    fig = plot.benchmark_plot(path)
    assert len(fig.axes) >= 2
    assert _png(fig).startswith(PNG_MAGIC)


# --------------------------------------------------------------------------------------
# the scripts that write PNGs, and the error without matplotlib
# --------------------------------------------------------------------------------------


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONWARNINGS": "error", "MPLBACKEND": "Agg"}


def test_plot_results_script_writes_pngs(tmp_path: Path) -> None:
    src = tmp_path / "results.json"
    src.write_text(json.dumps(_results()))
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "plot_results.py"), str(src)],
        capture_output=True, text=True, timeout=300, env=_env(), check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    for name in ("benchmarks.png", "benchmarks_time.png"):
        assert (tmp_path / name).read_bytes().startswith(PNG_MAGIC)


def test_cli_bench_quick_runs_benchmarks_and_writes_pngs(tmp_path: Path) -> None:
    """``python -m llmkernels bench --quick`` in a source checkout runs benchmarks/run.py
    (here without the attention and row-length tables, to keep it short) and draws its
    results; no progress bar (stderr is not a terminal), no warnings."""
    proc = subprocess.run(
        [sys.executable, "-m", "llmkernels", "bench", "--quick", "--out", str(tmp_path),
         "--no-attention", "--no-row-scaling", "--quiet-wait", "0"],
        capture_output=True, text=True, timeout=600, env=_env(), check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "Warning" not in proc.stderr
    assert "\r" not in proc.stderr  # tqdm is off when stderr is not a TTY
    results = json.loads((tmp_path / "results.json").read_text())
    assert {op["op"] for op in results["ops"]} >= {"rms_norm", "swiglu_ffn"}
    for name in ("benchmarks.png", "benchmarks_time.png"):
        assert (tmp_path / name).read_bytes().startswith(PNG_MAGIC)


def test_cli_bench_builtin_table(tmp_path: Path) -> None:
    """``bench --builtin`` (what an installed wheel without benchmarks/ runs): the side-by-side
    table of every op, and its JSON."""
    proc = subprocess.run(
        [sys.executable, "-m", "llmkernels", "bench", "--quick", "--builtin", "--out",
         str(tmp_path)],
        capture_output=True, text=True, timeout=600, env=_env(), check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "Warning" not in proc.stderr and "\r" not in proc.stderr
    for op in ("rms_norm", "layer_norm", "silu", "swiglu", "swiglu_ffn", "rope", "attention"):
        assert f"\n  {op} " in proc.stdout
    report = json.loads((tmp_path / "builtin_timings.json").read_text())
    assert all(r["seconds"]["llmkernels"] > 0 for r in report["ops"])


def test_missing_matplotlib_message(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    monkeypatch.setitem(sys.modules, "matplotlib.pyplot", None)
    monkeypatch.delitem(sys.modules, "llmkernels.plot")
    with pytest.raises(ImportError, match=r"pip install llmkernels\[notebook\]"):
        importlib.import_module("llmkernels.plot")
