"""Plots for notebooks and reports: attention heatmaps and benchmark results.

matplotlib is an optional dependency (``pip install llmkernels[notebook]``); importing this
module without it raises an :class:`ImportError` that says so.

* :func:`attention_heatmap` draws the ``(Tq, Tk)`` probabilities that
  ``llmkernels.attention(..., return_weights=True)`` returns, one subplot per head::

      out, w = lk.attention(q, k, v, causal=True, return_weights=True)   # w (B, H, Tq, Tk)
      fig = attention_heatmap(w[0], tokens=["The", "cat", "sat"])

* :func:`attention_grid` draws every layer's weights (``model(ids, return_attention=True)``,
  see :mod:`llmkernels.inspect`): one row per layer, one column per head, the tokens as tick
  labels, and the head classes of :func:`llmkernels.inspect.classify_heads` in the titles::

      logits, weights = model(ids, return_attention=True)
      fig = attention_grid(weights, tokens, labels=lk.inspect.classify_heads(weights))

* :func:`residual_rms` draws the RMS of the residual stream around every norm, per layer
  (``model(ids, return_stats=True)``), one panel per model (e.g. pre-norm vs post-norm).

* :func:`benchmark_plot` draws the JSON written by ``benchmarks/run.py``
  (``benchmarks/results/results.json``): the rate (GB/s or GFLOP/s) or the time of every
  implementation of every op, with the machine's roofline measured in the same run.

Both return a :class:`matplotlib.figure.Figure` made through ``pyplot`` (so Jupyter shows it
inline); call ``fig.savefig(path)`` to write it and ``matplotlib.pyplot.close(fig)`` when done
in a script.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

try:
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter, LogLocator, MaxNLocator, NullFormatter
except ImportError as _exc:  # pragma: no cover - exercised only without matplotlib
    raise ImportError(
        "llmkernels.plot needs matplotlib, an optional dependency: "
        "pip install llmkernels[notebook]  (or: pip install matplotlib)"
    ) from _exc

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

__all__ = ["attention_grid", "attention_heatmap", "benchmark_plot", "residual_rms"]


# --------------------------------------------------------------------------------------
# attention heatmaps
# --------------------------------------------------------------------------------------


def _head_list(heads: int | Sequence[int] | None, n_heads: int) -> list[int]:
    if heads is None:
        return list(range(n_heads))
    chosen = [heads] if isinstance(heads, (int, np.integer)) else list(heads)
    if not chosen:
        raise ValueError("[attention_heatmap] heads must name at least one head")
    for h in chosen:
        if isinstance(h, bool) or not isinstance(h, (int, np.integer)):
            raise TypeError(f"[attention_heatmap] heads must be ints, got {type(h).__name__}")
        if not -n_heads <= h < n_heads:
            raise ValueError(f"[attention_heatmap] head {h} out of range for {n_heads} heads")
    return [int(h) % n_heads for h in chosen]


def _token_labels(
    tokens: Sequence[str] | tuple[Sequence[str], Sequence[str]] | None, t_q: int, t_k: int
) -> tuple[list[str] | None, list[str] | None]:
    """Query and key labels. ``tokens`` is either the ``Tk`` key tokens (queries are the last
    ``Tq`` of them, bottom-right aligned as with a KV cache) or a pair ``(query_tokens,
    key_tokens)``."""
    if tokens is None:
        return None, None
    if (
        isinstance(tokens, tuple)
        and len(tokens) == 2
        and not isinstance(tokens[0], str)
        and not isinstance(tokens[1], str)
    ):
        q_tok, k_tok = [str(t) for t in tokens[0]], [str(t) for t in tokens[1]]
    else:
        k_tok = [str(t) for t in tokens]
        if len(k_tok) != t_k:
            raise ValueError(
                f"[attention_heatmap] tokens must have one label per key ({t_k}), "
                f"got {len(k_tok)}"
            )
        q_tok = k_tok[t_k - t_q :] if t_q <= t_k else None
        if q_tok is None:
            raise ValueError(
                f"[attention_heatmap] {t_q} queries but {t_k} keys: pass tokens as "
                "(query_tokens, key_tokens)"
            )
    if len(q_tok) != t_q or len(k_tok) != t_k:
        raise ValueError(
            f"[attention_heatmap] tokens must be ({t_q} query, {t_k} key) labels, "
            f"got ({len(q_tok)}, {len(k_tok)})"
        )
    return q_tok, k_tok


def attention_heatmap(
    weights: Any,
    tokens: Sequence[str] | tuple[Sequence[str], Sequence[str]] | None = None,
    heads: int | Sequence[int] | None = None,
    *,
    title: str | None = None,
    cmap: str = "viridis",
    ncols: int | None = None,
) -> Figure:
    """Heatmaps of attention probabilities, one subplot per head, one shared colorbar.

    Args:
        weights: attention probabilities ``(Tq, Tk)`` (one head), ``(H, Tq, Tk)`` or
            ``(1, H, Tq, Tk)`` — the second result of
            ``llmkernels.attention(..., return_weights=True)``; pick one batch element
            (``w[b]``) when the batch is larger than 1. Any array-like.
        tokens: labels for the axes: the ``Tk`` key tokens (the queries are then labelled with
            the last ``Tq`` of them, as the bottom-right causal convention aligns them), or a
            pair ``(query_tokens, key_tokens)``. Default: positions ``0, 1, ...``.
        heads: which heads to draw (an int or a sequence of ints); default all.
        title: the figure's title.
        cmap: a matplotlib colormap name.
        ncols: subplots per row (default: up to 4).

    Returns:
        The figure: one image per head titled ``head h``, x axis "key position", y axis
        "query position" (query 0 at the top, like the matrix), and a colorbar
        "attention weight" (from 0 to the largest weight drawn).
    """
    w = np.asarray(weights, dtype=np.float64)
    if w.ndim == 4:
        if w.shape[0] != 1:
            raise ValueError(
                f"[attention_heatmap] weights has a batch of {w.shape[0]}; pass one element, "
                "e.g. weights[0]"
            )
        w = w[0]
    if w.ndim == 2:
        w = w[None]
    if w.ndim != 3:
        raise ValueError(
            "[attention_heatmap] weights must be (Tq, Tk), (H, Tq, Tk) or (1, H, Tq, Tk), "
            f"got shape {np.shape(weights)}"
        )
    n_heads, t_q, t_k = w.shape
    chosen = _head_list(heads, n_heads)
    q_tok, k_tok = _token_labels(tokens, t_q, t_k)

    n = len(chosen)
    cols = max(1, min(n, ncols if ncols is not None else 4))
    rows = math.ceil(n / cols)
    cell = min(4.0, max(2.2, 0.35 * max(t_q, t_k) + 1.0))
    fig, axes = plt.subplots(
        rows,
        cols,
        figsize=(cell * cols + 1.2, cell * rows + (0.5 if title else 0.2)),
        squeeze=False,
        layout="constrained",
    )
    finite = w[chosen][np.isfinite(w[chosen])]
    vmax = float(finite.max()) if finite.size and finite.max() > 0 else 1.0
    image = None
    used = []
    for idx, ax in enumerate(axes.flat):
        if idx >= n:
            fig.delaxes(ax)
            continue
        used.append(ax)
        h = chosen[idx]
        image = ax.imshow(w[h], cmap=cmap, vmin=0.0, vmax=vmax, aspect="auto",
                          interpolation="nearest")  # fmt: skip
        ax.set_title(f"head {h}")
        ax.set_xlabel("key position")
        ax.set_ylabel("query position")
        if k_tok is not None and q_tok is not None:
            ax.set_xticks(range(t_k), k_tok, rotation=90)
            ax.set_yticks(range(t_q), q_tok)
        else:
            ax.xaxis.set_major_locator(MaxNLocator(integer=True))
            ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    assert image is not None
    fig.colorbar(image, ax=used, label="attention weight", shrink=0.9)
    if title:
        fig.suptitle(title)
    return fig


# --------------------------------------------------------------------------------------
# a model's attention, layer by layer (llmkernels.inspect)
# --------------------------------------------------------------------------------------


def _pick(fn: str, name: str, chosen: int | Sequence[int] | None, n: int) -> list[int]:
    if chosen is None:
        return list(range(n))
    items = [chosen] if isinstance(chosen, (int, np.integer)) else list(chosen)
    if not items:
        raise ValueError(f"[{fn}] {name} must name at least one")
    for i in items:
        if isinstance(i, bool) or not isinstance(i, (int, np.integer)):
            raise TypeError(f"[{fn}] {name} must be ints, got {type(i).__name__}")
        if not -n <= i < n:
            raise ValueError(f"[{fn}] {name} {i} out of range for {n}")
    return [int(i) % n for i in items]


def _tick_text(token: str) -> str:
    """A token as a tick label: whitespace made visible, ``$`` escaped (two of them would
    start matplotlib's mathtext)."""
    return token.replace("\n", "\\n").replace("\t", "\\t").replace("$", r"\$")


def attention_grid(
    weights: Sequence[Any],
    tokens: Sequence[str] | None = None,
    *,
    batch: int = 0,
    layers: int | Sequence[int] | None = None,
    heads: int | Sequence[int] | None = None,
    labels: Sequence[Sequence[str]] | None = None,
    title: str | None = None,
    cmap: str = "viridis",
) -> Figure:
    """Every layer's attention as a grid of heatmaps: one row per layer, one column per head.

    Args:
        weights: one array per layer, ``(B, H, Tq, Tk)`` or ``(H, Tq, Tk)`` — what
            ``model(ids, return_attention=True)`` returns second.
        tokens: the ``Tk`` key tokens, e.g. ``[tokenizer.decode([i]) for i in ids]`` (queries
            get the last ``Tq`` of them); drawn as the tick labels of the bottom row (keys)
            and the left column (queries). Default: positions.
        batch: which batch element to draw.
        layers, heads: which to draw (an int or ints); default all.
        labels: ``labels[layer][head]`` added to each panel's title, e.g.
            :func:`llmkernels.inspect.classify_heads`'s.
        title: the figure's title.
        cmap: a matplotlib colormap name.

    Returns:
        The figure: panels titled ``L{layer} H{head}`` (``: label`` appended), keys on x and
        queries on y (query 0 at the top), one colorbar "attention weight" from 0 to the
        largest weight drawn.
    """
    fn = "attention_grid"
    if isinstance(weights, np.ndarray) or not isinstance(weights, Sequence) or not weights:
        raise TypeError(
            f"[{fn}] weights must be a list with one (B, H, Tq, Tk) array per layer "
            "(model(ids, return_attention=True)[1])"
        )
    arrays = []
    for i, w in enumerate(weights):
        a = np.asarray(w, dtype=np.float64)
        if a.ndim == 3:
            a = a[None]
        if a.ndim != 4:
            raise ValueError(
                f"[{fn}] weights[{i}] must be (B, H, Tq, Tk) or (H, Tq, Tk), got {a.shape}"
            )
        arrays.append(a)
    shape = arrays[0].shape
    if any(a.shape != shape for a in arrays):
        raise ValueError(f"[{fn}] every layer's weights must have the same shape")
    n_batch, n_heads, t_q, t_k = shape
    if isinstance(batch, bool) or not isinstance(batch, (int, np.integer)):
        raise TypeError(f"[{fn}] batch must be an int, got {type(batch).__name__}")
    if not -n_batch <= batch < n_batch:
        raise ValueError(f"[{fn}] batch {batch} out of range for a batch of {n_batch}")
    rows = _pick(fn, "layers", layers, len(arrays))
    cols = _pick(fn, "heads", heads, n_heads)
    try:
        q_tok, k_tok = _token_labels(tokens, t_q, t_k)
    except ValueError as exc:
        raise ValueError(str(exc).replace("[attention_heatmap]", f"[{fn}]")) from None
    if q_tok is not None and k_tok is not None:
        q_tok, k_tok = [_tick_text(x) for x in q_tok], [_tick_text(x) for x in k_tok]
    if labels is not None:
        if len(labels) != len(arrays) or any(len(row) != n_heads for row in labels):
            raise ValueError(
                f"[{fn}] labels must be labels[layer][head] for {len(arrays)} layers and "
                f"{n_heads} heads"
            )

    data = np.stack([arrays[layer][batch] for layer in rows])[:, cols]  # (rows, cols, Tq, Tk)
    finite = data[np.isfinite(data)]
    vmax = float(finite.max()) if finite.size and finite.max() > 0 else 1.0
    cell = min(3.2, max(1.8, 0.22 * max(t_q, t_k) + 0.9))
    label_room = 0.09 * max((len(t) for t in k_tok), default=0) if k_tok else 0.0
    fig, axes = plt.subplots(
        len(rows),
        len(cols),
        figsize=(cell * len(cols) + 1.6 + label_room, cell * len(rows) + 0.6 + label_room),
        squeeze=False,
        sharex=True,
        sharey=True,
        layout="constrained",
    )
    image = None
    for r, layer in enumerate(rows):
        for c, head in enumerate(cols):
            ax = axes[r, c]
            image = ax.imshow(data[r, c], cmap=cmap, vmin=0.0, vmax=vmax, aspect="auto",
                              interpolation="nearest")  # fmt: skip
            name = f"L{layer} H{head}"
            if labels is not None:
                name += f": {labels[layer][head]}"
            ax.set_title(name, fontsize=9)
            if k_tok is not None and q_tok is not None:
                ax.set_xticks(range(t_k), k_tok, rotation=90, fontsize=7)
                ax.set_yticks(range(t_q), q_tok, fontsize=7)
            else:
                ax.xaxis.set_major_locator(MaxNLocator(integer=True))
                ax.yaxis.set_major_locator(MaxNLocator(integer=True))
            if r == len(rows) - 1:
                ax.set_xlabel("key")
            if c == 0:
                ax.set_ylabel("query")
    assert image is not None
    fig.colorbar(image, ax=axes.ravel().tolist(), label="attention weight", shrink=0.8)
    if title:
        fig.suptitle(title)
    return fig


# (series name, legend label, style) of ResidualStats, in the order the forward meets them
_RMS_SERIES = (
    ("attn_norm_in", "attention norm: input", {"color": "#1f5fbf", "ls": "-", "marker": "o"}),
    ("attn_norm_out", "attention norm: output", {"color": "#1f5fbf", "ls": "--", "marker": "s"}),
    ("ffn_norm_in", "FFN norm: input", {"color": "#e8782a", "ls": "-", "marker": "o"}),
    ("ffn_norm_out", "FFN norm: output", {"color": "#e8782a", "ls": "--", "marker": "s"}),
)


def residual_rms(
    stats: Any,
    *,
    title: str | None = "RMS of the residual stream around each norm",
    log: bool = True,
) -> Figure:
    """The RMS of the hidden state before and after each norm, per layer.

    Args:
        stats: a :class:`llmkernels.inspect.ResidualStats` (``model(ids,
            return_stats=True)[1]``), or a dict ``{name: stats}`` to compare models side by
            side (e.g. ``{"pre-norm": ..., "post-norm": ...}``), one panel each with a shared
            y axis.
        title: the figure's title.
        log: log-scale y axis (RMS values of an un-normalised stream grow by orders of
            magnitude).

    Returns:
        The figure: per panel, x = layer, y = mean RMS over the prompt's real tokens of the
        input and output of each block's attention norm and FFN norm, the residual stream
        leaving each block ("block output", black), and the final norm's input and output at
        x = n_layers.
    """
    from .inspect import ResidualStats

    fn = "residual_rms"
    if isinstance(stats, ResidualStats):
        panels = {"": stats}
    elif isinstance(stats, Mapping) and stats:
        panels = dict(stats)
        for name, s in panels.items():
            if not isinstance(s, ResidualStats):
                raise TypeError(
                    f"[{fn}] stats[{name!r}] must be a ResidualStats, got {type(s).__name__}"
                )
    else:
        raise TypeError(
            f"[{fn}] stats must be a ResidualStats (model(ids, return_stats=True)[1]) or a "
            f"non-empty dict of them, got {type(stats).__name__}"
        )
    fig, axes = plt.subplots(1, len(panels), figsize=(5.2 * len(panels), 4.0), sharey=True,
                             squeeze=False, layout="constrained")  # fmt: skip
    handles: dict[str, Any] = {}
    for ax, (name, s) in zip(axes[0], panels.items(), strict=True):
        n = s.n_layers
        x = np.arange(n)
        for key, label, style in _RMS_SERIES:
            (line,) = ax.plot(x, s.per_layer(key), label=label, ms=5, **style)
            handles.setdefault(label, line)
        (line,) = ax.plot(x, s.per_layer("block_out"), color="black", lw=1.2, marker=".",
                          label="block output")  # fmt: skip
        handles.setdefault("block output", line)
        for key, label, marker in (("final_norm_in", "final norm: input", "^"),
                                   ("final_norm_out", "final norm: output", "v")):  # fmt: skip
            (dot,) = ax.plot([n], [s.per_layer(key)], marker, color="#3a9a4a", ms=7, label=label)
            handles.setdefault(label, dot)
        if log:
            ax.set_yscale("log")
        ax.set_xlabel("layer")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.grid(alpha=0.3)
        ax.set_title(name or f"{s.norm_position}-norm blocks", fontsize=10)
    axes[0, 0].set_ylabel("RMS over the model dimension (mean over tokens)")
    fig.legend(list(handles.values()), list(handles.keys()), loc="outside lower center",
               ncols=4, fontsize=8, frameon=False)  # fmt: skip
    if title:
        fig.suptitle(title)
    return fig


# --------------------------------------------------------------------------------------
# benchmark results (benchmarks/run.py's results.json)
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


def _load(results: Mapping[str, Any] | str | os.PathLike[str]) -> Mapping[str, Any]:
    if isinstance(results, (str, os.PathLike)):
        with open(results, encoding="utf-8") as f:
            return json.load(f)
    if not isinstance(results, Mapping):
        raise TypeError(
            "[benchmark_plot] results must be the dict of benchmarks/run.py's results.json "
            f"or a path to it, got {type(results).__name__}"
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
    results: Mapping[str, Any] | str | os.PathLike[str],
    *,
    threads: int | Sequence[int] | None = None,
    kind: str = "rate",
    pure: bool = True,
    title: str = "llmkernels vs peers, float32, medians after warm-up",
) -> Figure:
    """Plot ``benchmarks/run.py``'s results: every op, every implementation, and the roofline.

    Args:
        results: the dict ``benchmarks/run.py`` writes to ``results.json`` (or the path of
            that file). Needed keys: ``probe`` (``triad_gbs`` / ``fma_gflops`` by thread
            count, each ``{"median": ...}``) and ``ops`` and/or ``attention.cases``, each case
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
