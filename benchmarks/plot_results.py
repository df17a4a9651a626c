#!/usr/bin/env python
"""Draw the benchmark results as PNG plots beside their JSON.

Usage::

    python benchmarks/plot_results.py                  # benchmarks/results/{ops,attention}.json
    python benchmarks/plot_results.py a.json [b.json]  # -> benchmarks.png next to a.json

Writes ``benchmarks.png`` (rate of every op and implementation against the roofline, per
thread count, plus pure Python at toy sizes) and ``benchmarks_time.png`` (median time per call,
log scale, with the roofline's least possible time per op) next to the (first) JSON, drawn by
:func:`benchmark_plot` (which a notebook can import from here too). Needs matplotlib
(``pip install -e .[bench]`` or ``.[notebook]``).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

try:
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter
except ImportError as exc:
    sys.exit(f"benchmarks/plot_results.py: {exc} (pip install -e .[bench] or .[notebook])")

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

RESULTS = Path(__file__).resolve().parent / "results"


# --------------------------------------------------------------------------------------
# drawing
# --------------------------------------------------------------------------------------

# Implementation name -> (legend label, colour). The torch-side peers (F.*, SDPA, HF's RoPE)
# share one colour; anything unknown gets the next colour of the cycle.
_FAMILIES: dict[str, tuple[str, str]] = {
    "llmkernels": ("llmkernels", "#1f5fbf"),
    "llmkernels (no out=)": ("llmkernels (allocating its result)", "#8fb3ea"),
    "torch": ("torch CPU (F.*, SDPA) / HF RoPE", "#e8782a"),
    "torch SDPA": ("torch CPU (F.*, SDPA) / HF RoPE", "#e8782a"),
    "HF apply_rotary_pos_emb": ("torch CPU (F.*, SDPA) / HF RoPE", "#e8782a"),
    "NumPy": ("NumPy formula", "#3a9a4a"),
    "pure": ("pure Python", "#c23b3b"),
}
_EXTRA_COLOURS = ["#7b4fb0", "#8c6d31", "#d35fb7", "#5b5b5b"]

_UNIT_LABEL = {"GB/s": "bandwidth (GB/s)", "GFLOP/s": "compute rate (GFLOP/s)"}
_ROOF_NAME = {"GB/s": "triad bandwidth", "GFLOP/s": "fp32 FMA peak"}


def _family(name: str, extra: dict[str, tuple[str, str]]) -> tuple[str, str]:
    if name in _FAMILIES:
        return _FAMILIES[name]
    if name not in extra:
        extra[name] = (name, _EXTRA_COLOURS[len(extra) % len(_EXTRA_COLOURS)])
    return extra[name]


def _by_threads(d: Mapping[Any, Any], threads: int) -> Any:
    """``d[threads]`` for JSON (string) or Python (int) keys; None when absent."""
    if threads in d:
        return d[threads]
    return d.get(str(threads))


def _roof(probe: Mapping[str, Any], metric: str, threads: int) -> float | None:
    key = {"GB/s": "triad_gbs", "GFLOP/s": "fma_gflops"}.get(metric)
    if key is None or key not in probe:
        return None
    entry = _by_threads(probe[key], threads)
    if entry is None:
        return None
    return float(entry["median"] if isinstance(entry, Mapping) else entry)


def _load(
    results: Mapping[str, Any] | str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
) -> Mapping[str, Any]:
    """The results dict: as given, read from a path, or merged from several paths (the ops,
    pure Python and attention cases of all; the machine and probe of the first)."""
    if isinstance(results, (str, os.PathLike)):
        with open(results, encoding="utf-8") as f:
            return json.load(f)
    if isinstance(results, Sequence) and not isinstance(results, Mapping):
        if not results or not all(isinstance(p, (str, os.PathLike)) for p in results):
            raise TypeError(
                "[benchmark_plot] results must be a results dict, a path to a results JSON "
                f"or a non-empty list of such paths, got {results!r}"
            )
        parts = [_load(p) for p in results]
        merged: dict[str, Any] = {"ops": [], "pure": [], "attention": {"cases": []}}
        for part in parts:
            for key in ("machine", "probe"):
                if key in part and key not in merged:
                    merged[key] = part[key]
            merged["ops"] += list(part.get("ops") or [])
            merged["pure"] += list(part.get("pure") or [])
            merged["attention"]["cases"] += list((part.get("attention") or {}).get("cases") or [])
        return merged
    if not isinstance(results, Mapping):
        raise TypeError(
            "[benchmark_plot] results must be the dict of a results JSON (bench_ops.py, "
            f"bench_attention.py) or a path to it, got {type(results).__name__}"
        )
    return results


def _cases(res: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    cases = list(res.get("ops") or [])
    attention = res.get("attention") or {}
    cases += list(attention.get("cases") or [])
    return cases


def _measure(impl: Mapping[str, Any], case: Mapping[str, Any], threads: int) -> tuple[float, float]:
    """(median seconds, rate) of one implementation at ``threads``; NaN when absent."""
    entry = _by_threads(impl, threads)
    if not isinstance(entry, Mapping) or "median_s" not in entry:
        return math.nan, math.nan
    t = float(entry["median_s"])
    rate = entry.get("rate")
    if rate is None:
        work = float(case.get("work_per_call", math.nan))
        scale = 1e-9  # GB/s and GFLOP/s
        rate = work / t * scale if t > 0 else math.nan
    return t, float(rate)


def _threads_in(res: Mapping[str, Any]) -> list[int]:
    found: set[int] = set()
    for case in _cases(res):
        for impl in case.get("impls", {}).values():
            found.update(int(k) for k in impl if str(k).isdigit())
    return sorted(found)


def _short_shape(shape: str) -> str:
    return shape.replace("q, k, v ", "").replace("q, k: ", "q,k ")


def _case_label(case: Mapping[str, Any]) -> str:
    op = str(case.get("op", "?"))
    shape = _short_shape(str(case.get("shape", "")))
    return f"{op}\n{shape}" if shape else op


_MARKERS = {"llmkernels": "o", "pure Python": "s", "NumPy formula": "D"}


def _fmt_value(v: float) -> str:
    return f"{v:.3g}" if v < 1000 else f"{v:,.0f}"


def _log_axis(ax: Axes) -> None:
    """Log x axis labelled with plain numbers: at 1, 2, 5 x 10^k over up to three decades,
    at the decades only beyond; minor ticks unlabelled. Call after plotting."""
    ax.set_xscale("log")
    lo, hi = ax.get_xlim()
    subs = (1.0, 2.0, 5.0) if hi / lo <= 1e3 else (1.0,)
    ax.xaxis.set_major_locator(LogLocator(base=10, subs=subs))
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _pos: f"{v:g}"))
    ax.xaxis.set_minor_formatter(NullFormatter())
    ax.grid(axis="x", which="major", alpha=0.35)
    ax.grid(axis="x", which="minor", alpha=0.12)


def _rows(ax: Axes, labels: list[str]) -> None:
    ax.set_yticks(range(len(labels) - 1, -1, -1), labels, fontsize=8)
    ax.set_ylim(-0.6, len(labels) - 0.4)


def _bar_panel(
    ax: Axes,
    cases: list[Mapping[str, Any]],
    metric: str,
    threads: int,
    probe: Mapping[str, Any],
    kind: str,
    extra: dict[str, tuple[str, str]],
    handles: dict[str, Any],
) -> None:
    """One row per op. ``kind="rate"``: grouped bars on a linear axis up to the roofline;
    ``kind="time"``: dots on a log axis, with the roofline's lower bound as a black tick."""
    roof = _roof(probe, metric, threads)
    impl_names: list[str] = []
    for case in cases:
        for name in case.get("impls", {}):
            if name not in impl_names:
                impl_names.append(name)
    # one slot per family so that e.g. "torch" and "torch SDPA" sit at the same offset
    families = list(dict.fromkeys(_family(n, extra)[0] for n in impl_names))
    height = 0.8 / max(1, len(families))
    top = 0.0
    for i, case in enumerate(cases):
        y0 = len(cases) - 1 - i  # first case on top
        work = float(case.get("work_per_call", math.nan))
        for name, impl in case.get("impls", {}).items():
            label, colour = _family(name, extra)
            slot = families.index(label)
            t, rate = _measure(impl, case, threads)
            if kind == "rate":
                if not math.isfinite(rate) or rate <= 0:
                    continue
                y = y0 + 0.4 - height * (slot + 0.5)
                bar = ax.barh(y, rate, height=height * 0.9, color=colour, label=label)
                ax.annotate(_fmt_value(rate), xy=(rate, y), xytext=(2, 0), zorder=4,
                            textcoords="offset points", va="center", fontsize=6.5,
                            bbox={"facecolor": "white", "edgecolor": "none", "alpha": 0.75,
                                  "pad": 0.3})  # fmt: skip
                top = max(top, rate)
                handles.setdefault(label, bar)
            else:
                if not math.isfinite(t) or t <= 0:
                    continue
                (dot,) = ax.plot(t * 1e3, y0, _MARKERS.get(label, "o"), color=colour, ms=7,
                                 alpha=0.9, label=label)  # fmt: skip
                handles.setdefault(label, dot)
        if kind == "time" and roof and math.isfinite(work):
            bound_ms = work * 1e-9 / roof * 1e3
            (mark,) = ax.plot([bound_ms] * 2, [y0 - 0.35, y0 + 0.35], color="black", lw=1.8)
            handles.setdefault("roofline: least possible time (work / roof)", mark)
    _rows(ax, [_case_label(c) for c in cases])
    if kind == "rate":
        ax.set_xlabel(f"{_UNIT_LABEL.get(metric, metric)} (higher is better)")
        ax.grid(axis="x", alpha=0.3)
        if roof:
            top = max(top, roof)
            line = ax.axvline(roof, color="black", ls="--", lw=1.4)
            ax.annotate(
                f"{_ROOF_NAME.get(metric, 'roof')} {roof:.0f} {metric}",
                xy=(roof, len(cases) - 0.4 + 0.3), xytext=(-4, 0), textcoords="offset points",
                ha="right", va="center", fontsize=8,
            )  # fmt: skip
            handles.setdefault("roofline (probe, same run)", line)
        ax.set_xlim(0, top * 1.12 if top > 0 else 1)
        ax.set_ylim(-0.6, len(cases) - 0.4 + 0.6)  # headroom for the roofline's label
    else:
        ax.set_xscale("log")
        ax.margins(x=0.08)
        _log_axis(ax)
        ax.set_xlabel("median time per call (ms), log scale (lower is better)")


def _pure_panel(
    ax: Axes, pure: list[Mapping[str, Any]], extra: dict[str, tuple[str, str]], handles: dict
) -> None:
    """Time per element (per FLOP for the FFN) at the toy sizes: pure Python, NumPy and
    llmkernels as dots on a log axis, with the pure/llmkernels ratio written beside them."""
    names = ["pure", "NumPy", "llmkernels"]
    labels = []
    right = 0.0
    for i, row in enumerate(pure):
        y0 = len(pure) - 1 - i
        labels.append(f"{row.get('op', '?')} {row.get('toy_shape', '')}, per {row.get('unit')}")
        per_unit = row.get("seconds_per_unit", {})
        values = {n: float(per_unit[n]) * 1e9 for n in names if (per_unit.get(n) or 0) > 0}
        if values:
            ax.plot([min(values.values()), max(values.values())], [y0, y0], color="0.8",
                    lw=1, zorder=1)  # fmt: skip
        for name, v in values.items():
            label, colour = _family(name, extra)
            (dot,) = ax.plot(v, y0, _MARKERS.get(label, "o"), color=colour, ms=7, zorder=2,
                             label=label)  # fmt: skip
            handles.setdefault(label, dot)
            right = max(right, v)
        if "pure" in values and "llmkernels" in values:
            ratio = values["pure"] / values["llmkernels"]
            ax.annotate(f"pure / llmkernels = {ratio:,.0f}x", xy=(values["pure"], y0),
                        xytext=(8, 0), textcoords="offset points", va="center",
                        fontsize=7.5)  # fmt: skip
    _rows(ax, labels)
    ax.set_xscale("log")
    if right > 0:
        lo, _ = ax.get_xlim()
        ax.set_xlim(lo, right * 30)  # room for the ratio labels
    _log_axis(ax)
    ax.set_xlabel("time per element (per FLOP for swiglu_ffn), ns, log scale (lower is better)")
    ax.set_title("pure Python vs NumPy vs llmkernels at toy sizes, 1 thread", fontsize=10)


def benchmark_plot(
    results: Mapping[str, Any] | str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
    *,
    threads: int | Sequence[int] | None = None,
    kind: str = "rate",
    pure: bool = True,
    title: str = "llmkernels vs peers, float32, medians after warm-up",
) -> Figure:
    """Plot the benchmark results: every op, every implementation, and the roofline.

    Args:
        results: the dict ``bench_ops.py`` writes to ``ops.json`` (or ``bench_attention.py``
            to ``attention.json``), the path of such a file, or a list of paths (merged; the
            roofline is the first file's). Needed keys: ``probe`` (``triad_gbs`` /
            ``fma_gflops`` by thread count, each ``{"median": ...}``) and ``ops`` and/or
            ``attention.cases``, each case
            ``{"op", "shape", "metric": "GB/s" | "GFLOP/s", "work_per_call" (bytes or
            FLOPs), "impls": {name: {threads: {"median_s", "rate"}}}}`` (``rate`` is derived
            from ``work_per_call / median_s`` when absent). Optional: ``pure`` (pure Python at
            toy sizes) and ``machine`` (shown in the title).
        threads: thread count(s) to draw, one row of panels each; default every count found.
        kind: ``"rate"`` (GB/s or GFLOP/s, with the roofline as a dashed line) or ``"time"``
            (median ms per call, with the roofline's lower bound ``work / roof`` as a black
            tick per op).
        pure: add a panel with pure Python vs NumPy vs llmkernels per element at toy sizes
            when the results have it.
        title: the first line of the figure's title (the machine, from ``machine``, follows).

    Returns:
        The figure: per thread count, a panel of the memory-bound cases (GB/s against the
        triad bandwidth) and one of the compute-bound cases (GFLOP/s against the FMA peak),
        log-scale axes with units, one legend.
    """
    if kind not in ("rate", "time"):
        raise ValueError(f"[benchmark_plot] kind must be 'rate' or 'time', got {kind!r}")
    res = _load(results)
    cases = _cases(res)
    if not cases:
        raise ValueError("[benchmark_plot] results have no 'ops' or 'attention' cases")
    probe = res.get("probe") or {}
    if threads is None:
        thread_list = _threads_in(res) or [1]
    elif isinstance(threads, int):
        thread_list = [threads]
    else:
        thread_list = [int(t) for t in threads]
    metrics = [m for m in ("GB/s", "GFLOP/s") if any(c.get("metric") == m for c in cases)]
    metrics += sorted({str(c.get("metric")) for c in cases} - set(metrics))
    by_metric = {m: [c for c in cases if c.get("metric") == m] for m in metrics}
    pure_rows = list(res.get("pure") or []) if pure else []

    # panel heights follow the number of cases so that bars have the same thickness everywhere
    heights = [max(len(by_metric[m]) for m in metrics)] * len(thread_list)
    mosaic = [[f"{t}:{m}" for m in metrics] for t in thread_list]
    if pure_rows:
        mosaic.append(["pure"] * len(metrics))
        heights.append(len(pure_rows))
    fig = plt.figure(figsize=(7.0 * len(metrics), 0.62 * sum(heights) + 1.6 * len(heights) + 1.2),
                     layout="constrained")  # fmt: skip
    axd = fig.subplot_mosaic(mosaic, height_ratios=[h + 1.5 for h in heights])
    extra: dict[str, tuple[str, str]] = {}
    handles: dict[str, Any] = {}
    for t in thread_list:
        for m in metrics:
            ax = axd[f"{t}:{m}"]
            _bar_panel(ax, by_metric[m], m, t, probe, kind, extra, handles)
            what = "memory-bound" if m == "GB/s" else "compute-bound" if m == "GFLOP/s" else m
            ax.set_title(f"{what} ops, {t} thread{'s' if t != 1 else ''}", fontsize=10)
    if pure_rows:
        _pure_panel(axd["pure"], pure_rows, extra, handles)

    machine = res.get("machine") or {}
    info = machine.get("build_info") or {}
    bits = [
        str(machine.get("cpu", "")),
        f"{machine['cpu_count']} cores" if machine.get("cpu_count") else "",
        f"SIMD {info['simd_arch']}" if info.get("simd_arch") else "",
        f"torch {machine['torch']}" if machine.get("torch") else "",
        f"NumPy {machine['numpy']}" if machine.get("numpy") else "",
        str(machine.get("date", ""))[:10],
    ]
    subtitle = ", ".join(b for b in bits if b)
    fig.suptitle(title + (f"\n{subtitle}" if subtitle else ""), fontsize=11)
    fig.legend(list(handles.values()), list(handles.keys()), loc="outside lower center",
               ncols=min(3, len(handles)), fontsize=9, frameon=False)  # fmt: skip
    return fig


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "results",
        nargs="*",
        type=Path,
        default=[RESULTS / "ops.json", RESULTS / "attention.json"],
        help="results JSON written by bench_ops.py / bench_attention.py (default: both, in "
        "benchmarks/results)",
    )
    parser.add_argument(
        "--out", type=Path, default=None, help="output directory (default: the first JSON's)"
    )
    parser.add_argument("--dpi", type=int, default=110)
    args = parser.parse_args(argv)
    paths = [p for p in args.results if p.is_file()]
    if not paths:
        print(f"no results in {[str(p) for p in args.results]}: run the benchmarks first",
              file=sys.stderr)  # fmt: skip
        return 1
    plt.switch_backend("Agg")  # files only: no display needed
    out = args.out or paths[0].parent
    out.mkdir(parents=True, exist_ok=True)
    for kind, name in (("rate", "benchmarks.png"), ("time", "benchmarks_time.png")):
        fig = benchmark_plot(paths, kind=kind)
        fig.savefig(out / name, dpi=args.dpi)
        plt.close(fig)
        print(f"wrote {out / name}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
