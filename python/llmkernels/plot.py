"""Plots for notebooks and reports: attention heatmaps and a model's residual stream.

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

Benchmark results are drawn by ``benchmarks/plot_results.py`` in the source tree.

All return a :class:`matplotlib.figure.Figure` made through ``pyplot`` (so Jupyter shows it
inline); call ``fig.savefig(path)`` to write it and ``matplotlib.pyplot.close(fig)`` when done
in a script.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

try:
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator
except ImportError as _exc:  # pragma: no cover - exercised only without matplotlib
    raise ImportError(
        "llmkernels.plot needs matplotlib, an optional dependency: "
        "pip install llmkernels[notebook]  (or: pip install matplotlib)"
    ) from _exc

if TYPE_CHECKING:
    from matplotlib.figure import Figure

__all__ = ["attention_grid", "attention_heatmap", "residual_rms"]


# --------------------------------------------------------------------------------------
# attention heatmaps
# --------------------------------------------------------------------------------------


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
                f"[attention_heatmap] tokens must have one label per key ({t_k}), got {len(k_tok)}"
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
    chosen = _pick("attention_heatmap", "heads", heads, n_heads, item="head")
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


def _pick(
    fn: str, name: str, chosen: int | Sequence[int] | None, n: int, item: str = ""
) -> list[int]:
    """The indices ``chosen`` (an int, a sequence of ints, None: all ``n``), negative ones
    counted from the end. ``item``: the noun of one index in the messages (``"head"``: "head 5
    out of range for 4 heads"), or none."""
    if chosen is None:
        return list(range(n))
    items = [chosen] if isinstance(chosen, (int, np.integer)) else list(chosen)
    if not items:
        raise ValueError(f"[{fn}] {name} must name at least one{' ' + item if item else ''}")
    for i in items:
        if isinstance(i, bool) or not isinstance(i, (int, np.integer)):
            raise TypeError(f"[{fn}] {name} must be ints, got {type(i).__name__}")
        if not -n <= i < n:
            of = f" {item}s" if item else ""
            raise ValueError(f"[{fn}] {item or name} {i} out of range for {n}{of}")
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


def _layer_ticks(n: int) -> tuple[list[int], list[str]]:
    """x ticks of :func:`residual_rms` for ``n`` blocks: integer layers from 0 (as
    ``MaxNLocator`` spaces them, those too close to the end dropped) and ``"final norm"`` at
    ``x = n``, where the final norm's points are drawn: it is not a block boundary."""
    layers = [int(round(t)) for t in MaxNLocator(integer=True).tick_values(0, n - 1)]
    layers = sorted({t for t in layers if 0 <= t < n} | {0})
    step = layers[1] - layers[0] if len(layers) > 1 else 1
    layers = [t for t in layers if t == 0 or n - t >= step / 2 + 0.5]
    return [*layers, n], [str(t) for t in layers] + ["final\nnorm"]


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
        leaving each block ("block output", black), and, right of a dotted line at the x tick
        "final norm" (x = n_layers, not a block), the input and output of the final norm
        (``model.norm``) that the LM head reads.
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
        ax.axvline(n - 0.5, color="0.6", lw=0.8, ls=":")  # the blocks | the final norm
        ax.set_xticks(*_layer_ticks(n))
        ax.grid(alpha=0.3)
        ax.set_title(name or f"{s.norm_position}-norm blocks", fontsize=10)
    axes[0, 0].set_ylabel("RMS over the model dimension\n(mean over tokens)")
    fig.legend(list(handles.values()), list(handles.keys()), loc="outside lower center",
               ncols=4, fontsize=8, frameon=False)  # fmt: skip
    if title:
        fig.suptitle(title)
    return fig
