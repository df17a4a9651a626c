"""Look inside a :class:`~llmkernels.Transformer`: every layer's attention weights, the RMS of the
residual stream around every norm, and a classification of attention heads.

The model's own forward (one C++ call per token batch) never stores a score matrix. For a prompt
you want to look at, :func:`trace` runs that same C++ forward with an observer: every block on
every position, the attention through the fused kernel's weights path (the one
``llmkernels.attention(..., return_weights=True)`` runs) instead of its streaming one, and the
RMS of the residual stream recorded around every norm (float64). Its logits equal
``model(ids)`` within the block contract (same weights, same kernels, float32)::

    logits, weights = model(ids, return_attention=True)   # weights[l]: (B, Hq, T, T)
    logits, stats = model(ids, return_stats=True)          # a ResidualStats
    tr = lk.inspect.trace(model, ids)                      # both, as a Trace
    lk.inspect.classify_heads(tr.attention)                # [["first", "previous", ...], ...]

    from llmkernels import plot
    plot.attention_grid(tr.attention, tokens)              # layers x heads, tokens as labels
    plot.residual_rms(tr.stats)                            # RMS per layer around each norm

Head classes follow the head-specialisation analysis of the LLaMA notes' "Anatomy of an LLM"
(section 3.1.1: strong self-focus, local context, generalist/uniform heads), adapted to causal
attention and extended with heads that park their attention on the first token (see
:func:`classify_heads` for the measures and thresholds).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .nn import Transformer
from .nn.model import set_tracer

__all__ = [
    "FIRST_THRESHOLD",
    "HEAD_CLASSES",
    "LOCAL_THRESHOLD",
    "LOCAL_WINDOW",
    "MAX_WEIGHT_BYTES",
    "PREVIOUS_THRESHOLD",
    "ResidualStats",
    "SELF_THRESHOLD",
    "STAT_NAMES",
    "Trace",
    "UNIFORM_THRESHOLD",
    "attention_weights",
    "classify_heads",
    "head_scores",
    "residual_stats",
    "trace",
]

# ----------------------------------------------------------------------------------------------
# results
# ----------------------------------------------------------------------------------------------

#: The per-token RMS series of :class:`ResidualStats`, in the order the forward meets them.
STAT_NAMES = (
    "attn_norm_in",
    "attn_norm_out",
    "ffn_norm_in",
    "ffn_norm_out",
    "block_out",
)


@dataclass
class ResidualStats:
    """RMS of the hidden state around every norm, per layer and token.

    Every array holds ``sqrt(mean(h**2))`` over the model dimension of one token's hidden state
    ``h`` (float64), with NaN at padded positions (``mask`` False). ``(L, B, T)`` arrays have
    one row per block:

    * ``attn_norm_in`` / ``attn_norm_out``: the input and output of the block's first norm
      (``input_layernorm``). Pre-norm: the input is the residual stream entering the block;
      post-norm: it is ``x + attn(x)`` and the output is the residual stream.
    * ``ffn_norm_in`` / ``ffn_norm_out``: the same for the second norm
      (``post_attention_layernorm``). Pre-norm: the input is ``h = x + attn(norm1(x))``;
      post-norm: it is ``h + ffn(h)`` and the output is the block's output.
    * ``block_out``: the block's output (the residual stream entering the next block).

    ``embedding (B, T)`` is the stream entering block 0, ``final_norm_in`` / ``final_norm_out``
    ``(B, T)`` the model's last norm (``model.norm``). :meth:`per_layer` averages over the real
    tokens; :meth:`residual` gives the stream at every block boundary.
    """

    norm_position: str
    embedding: np.ndarray
    attn_norm_in: np.ndarray
    attn_norm_out: np.ndarray
    ffn_norm_in: np.ndarray
    ffn_norm_out: np.ndarray
    block_out: np.ndarray
    final_norm_in: np.ndarray
    final_norm_out: np.ndarray
    mask: np.ndarray = field(repr=False)

    @property
    def n_layers(self) -> int:
        return int(self.attn_norm_in.shape[0])

    def per_layer(self, name: str) -> np.ndarray:
        """``(L,)`` mean over the real tokens of the ``(L, B, T)`` series ``name`` (one of
        ``STAT_NAMES``), or a scalar array for ``embedding`` / ``final_norm_*``."""
        if name not in STAT_NAMES + ("embedding", "final_norm_in", "final_norm_out"):
            raise ValueError(
                f"[ResidualStats.per_layer] name must be one of {STAT_NAMES} or 'embedding', "
                f"'final_norm_in', 'final_norm_out', got {name!r}"
            )
        values = getattr(self, name)
        flat = values.reshape(values.shape[:-2] + (-1,))
        real = ~np.isnan(flat)
        count = real.sum(axis=-1)
        total = np.where(real, flat, 0.0).sum(axis=-1)
        # NaN (and no "mean of empty slice" warning) when no token is real
        return np.divide(total, count, out=np.full(total.shape, np.nan), where=count > 0)

    def residual(self) -> np.ndarray:
        """``(L + 1,)`` mean RMS of the residual stream at the block boundaries: entering block
        0 (the embedding), then leaving every block."""
        return np.concatenate([[self.per_layer("embedding")], self.per_layer("block_out")])


@dataclass
class Trace:
    """What :func:`trace` saw: ``logits (B, T, vocab)`` float32 (``(B, 1, vocab)`` with
    ``last_only``), ``attention``: one ``(B, Hq, T, T)`` float32 array of softmax weights per
    layer (query rows of padded tokens are zero), and the :class:`ResidualStats`."""

    logits: np.ndarray
    attention: list[np.ndarray]
    stats: ResidualStats


# ----------------------------------------------------------------------------------------------
# the observed forward
# ----------------------------------------------------------------------------------------------


def _forward(
    model: Transformer,
    ids: np.ndarray,
    pos: np.ndarray,
    key_mask: np.ndarray | None,
    last_only: bool,
    keep_weights: bool = True,
) -> Trace:
    """The model's own C++ forward with an observer, on validated inputs: ``ids (B, T)`` int,
    ``pos (B, T)`` int64, ``key_mask (B, T)`` uint8 or None (as ``Transformer.__call__``
    prepares them). Every block runs on every position and records the RMS of the residual
    stream at its five points (float64) and, with ``keep_weights``, its attention weights (the
    attention kernel's weights path instead of its streaming one)."""
    b, t = ids.shape
    real = np.ones((b, t), bool) if key_mask is None else key_mask.astype(bool)
    logits, weights, rms = model._impl.observe(
        np.ascontiguousarray(ids, dtype=np.int64),
        pos,
        key_mask,
        bool(last_only),
        model._rope.frequencies(pos),  # the model's rotary schedule, as __call__ asks it
        bool(keep_weights),
    )
    model._rope.advance(pos)
    rms[:, ~real] = np.nan  # (5 L + 3, B, T): padded tokens have no statistics
    n = len(model.blocks)
    per_point = rms[1 : 1 + len(STAT_NAMES) * n].reshape(n, len(STAT_NAMES), b, t)
    return Trace(
        logits=logits,
        attention=list(weights) if weights is not None else [],
        stats=ResidualStats(
            norm_position=model.config.norm_position,
            embedding=rms[0],
            **{name: per_point[:, i] for i, name in enumerate(STAT_NAMES)},
            final_norm_in=rms[-2],
            final_norm_out=rms[-1],
            mask=real,
        ),
    )


def _check_model(fn: str, model: Any) -> None:
    if not isinstance(model, Transformer):
        raise TypeError(
            f"[{fn}] model must be a llmkernels.Transformer, got {type(model).__name__}"
        )


def trace(
    model: Transformer,
    ids: Any,
    *,
    positions: Any = None,
    mask: Any = None,
    last_only: bool = False,
) -> Trace:
    """Run ``model`` on a prompt and keep every layer's attention weights and the
    residual-stream RMS around every norm (the model's C++ forward with an observer).

    Args:
        model: a :class:`~llmkernels.Transformer`.
        ids: token ids, as for ``model(ids)`` (no KV cache: the trace looks at one prompt
            from its start).
        positions: as for ``model(ids, positions=...)``.
        mask: as for ``model(ids, mask=...)``.
        last_only: as for ``model(ids, last_only=...)``.

    Returns:
        A :class:`Trace`; ``trace.logits`` equals ``model(ids, ...)`` within the block
        contract.

    Examples:
        >>> import llmkernels as lk, numpy as np
        >>> model = lk.Transformer({"dim": 16, "n_layers": 2, "n_heads": 4, "n_kv_heads": 2,
        ...                         "hidden_dim": 32, "vocab_size": 50}, seed=0)
        >>> tr = lk.inspect.trace(model, [1, 2, 3])
        >>> len(tr.attention), tr.attention[0].shape, tr.stats.per_layer("block_out").shape
        (2, (1, 4, 3, 3), (2,))
        >>> bool(np.allclose(tr.logits, model([1, 2, 3]), atol=1e-5))
        True
    """
    _check_model("trace", model)
    logits, weights, stats = model(
        ids,
        positions=positions,
        mask=mask,
        last_only=last_only,
        return_attention=True,
        return_stats=True,
    )
    return Trace(logits=logits, attention=weights, stats=stats)


def attention_weights(
    model: Transformer, ids: Any, *, positions: Any = None, mask: Any = None
) -> list[np.ndarray]:
    """Every layer's attention weights for a prompt: a list of ``n_layers`` float32 arrays
    ``(B, Hq, T, T)`` (``model(ids, return_attention=True)[1]``)."""
    _check_model("attention_weights", model)
    return trace(model, ids, positions=positions, mask=mask).attention


def residual_stats(
    model: Transformer, ids: Any, *, positions: Any = None, mask: Any = None
) -> ResidualStats:
    """The RMS of the residual stream before and after every norm, per layer and token
    (``model(ids, return_stats=True)[1]``); see :class:`ResidualStats`."""
    _check_model("residual_stats", model)
    return trace(model, ids, positions=positions, mask=mask).stats


#: Largest attention-weight storage ``return_attention`` builds (``n_layers * B * Hq * T * T``
#: float32): a 22-layer, 32-head model at T = 2048 would need 11 GiB.
MAX_WEIGHT_BYTES = 2 << 30


def call_hook(
    model: Transformer,
    ids: np.ndarray,
    pos: np.ndarray,
    key_mask: np.ndarray | None,
    cache: Any,
    last_only: bool,
    return_attention: bool,
    return_stats: bool,
) -> tuple[Any, ...]:
    """``Transformer.__call__`` with ``return_attention`` / ``return_stats``: ``(logits,
    weights)``, ``(logits, stats)`` or ``(logits, weights, stats)``."""
    for name, flag in (("return_attention", return_attention), ("return_stats", return_stats)):
        if not isinstance(flag, (bool, np.bool_)):
            raise TypeError(f"[Transformer] {name} must be a bool, got {type(flag).__name__}")
    if cache is not None:
        raise ValueError(
            "[Transformer] return_attention/return_stats look at a prompt from its start: "
            "call without cache"
        )
    if return_attention:
        b, t = ids.shape
        c = model.config
        size = c.n_layers * b * c.n_heads * t * t * 4
        if size > MAX_WEIGHT_BYTES:
            raise ValueError(
                f"[Transformer] return_attention would hold {size / 2**30:.1f} GiB of weights "
                f"({c.n_layers} layers x {b} x {c.n_heads} heads x {t} x {t} float32; limit "
                f"{MAX_WEIGHT_BYTES / 2**30:.0f} GiB): use a shorter prompt"
            )
    tr = _forward(model, ids, pos, key_mask, bool(last_only), bool(return_attention))
    out: tuple[Any, ...] = (tr.logits,)
    if return_attention:
        out += (tr.attention,)
    if return_stats:
        out += (tr.stats,)
    return out


# ----------------------------------------------------------------------------------------------
# head classification
# ----------------------------------------------------------------------------------------------

#: Labels :func:`classify_heads` gives, in the order it tests them.
HEAD_CLASSES = ("first", "self", "previous", "local", "uniform", "mixed")

#: Mean weight on the first (real) token above which a head is ``"first"``.
FIRST_THRESHOLD = 0.6
#: Mean weight on the query's own token above which a head is ``"self"`` (the head-
#: specialisation analysis' "strong self-focus": ``diag_attn > 0.6``).
SELF_THRESHOLD = 0.6
#: Mean weight on the token just before the query above which a head is ``"previous"``.
PREVIOUS_THRESHOLD = 0.6
#: Keys a local head looks at: the query's own token and the ``LOCAL_WINDOW - 1`` before it
#: (the analysis uses a window of 3 tokens on each side; causal heads only have the left side).
LOCAL_WINDOW = 4
#: Mean mass inside the window above which a head is ``"local"`` (the analysis: 0.7).
LOCAL_THRESHOLD = 0.7
#: Mean normalised entropy above which a head is ``"uniform"`` (the analysis' generalist test,
#: ``1 - std > 0.9``, measured as entropy: the std of a causal matrix mostly measures its size).
UNIFORM_THRESHOLD = 0.9


def _layer_array(fn: str, w: Any) -> np.ndarray:
    arr = np.asarray(w, dtype=np.float64)
    if arr.ndim == 3:
        arr = arr[None]
    if arr.ndim != 4 or arr.shape[-2] > arr.shape[-1]:
        raise ValueError(
            f"[{fn}] weights must be (H, Tq, Tk) or (B, H, Tq, Tk) with Tq <= Tk per layer, "
            f"got shape {np.shape(w)}"
        )
    if not np.all(np.isfinite(arr)) or arr.size and arr.min() < 0:
        raise ValueError(f"[{fn}] weights must be finite probabilities (>= 0)")
    return arr


def _check_mask(fn: str, mask: Any, batch: int, t_k: int) -> np.ndarray:
    if mask is None:
        return np.ones((batch, t_k), bool)
    m = np.asarray(mask)
    if m.dtype.kind not in "biu":
        raise TypeError(f"[{fn}] mask must be boolean or 0/1 integers, got dtype {m.dtype}")
    if m.ndim == 1:
        m = m[None]
    if m.shape != (batch, t_k):
        raise ValueError(f"[{fn}] mask must have shape (B, Tk) = {(batch, t_k)}, got {m.shape}")
    return m != 0


_SCORES = ("first", "self", "previous", "local", "uniform")


def _layer_scores(w: np.ndarray, mask: np.ndarray) -> dict[str, np.ndarray]:
    """Per-head scores ``(H,)`` of one layer ``w (B, H, Tq, Tk)``, averaged over the batch's
    real query rows that can see at least two keys (NaN when there are none)."""
    batch, n_heads, t_q, t_k = w.shape
    offset = t_k - t_q  # bottom-right aligned: query i sits at key position i + offset
    sums = {name: np.zeros(n_heads) for name in _SCORES}
    counts = {name: 0 for name in _SCORES}
    for b in range(batch):
        real = np.flatnonzero(mask[b])
        if real.size < 2:
            continue
        first = real[0]
        for i in range(t_q):
            p = i + offset
            if not mask[b, p]:
                continue
            keys = real[real <= p]  # the keys a causal query at p can see
            n = keys.size
            if n < 2:
                continue  # one key: every pattern looks the same
            row = w[b, :, i, :]  # (H, Tk)
            vals = {
                "first": row[:, first],
                "self": row[:, p],
                "previous": row[:, keys[-2]],
                "uniform": _normalised_entropy(row[:, keys], n),
            }
            if n > LOCAL_WINDOW:  # where the window covers everything it tells nothing
                vals["local"] = row[:, keys[-LOCAL_WINDOW:]].sum(axis=-1)
            for name, v in vals.items():
                sums[name] += v
                counts[name] += 1
    return {
        name: sums[name] / counts[name] if counts[name] else np.full(n_heads, np.nan)
        for name in _SCORES
    }


def _normalised_entropy(p: np.ndarray, n: int) -> np.ndarray:
    """Entropy of each row of ``p (H, n)`` divided by ``log(n)``: 1 for uniform rows."""
    total = p.sum(axis=-1, keepdims=True)
    q = np.divide(p, total, out=np.zeros_like(p), where=total > 0)
    with np.errstate(divide="ignore", invalid="ignore"):
        ent = -np.sum(np.where(q > 0, q * np.log(q), 0.0), axis=-1)
    return ent / np.log(n)


def _as_layers(fn: str, weights: Any) -> tuple[list[np.ndarray], bool]:
    """(per-layer (B, H, Tq, Tk) arrays, whether one layer was given)."""
    if isinstance(weights, (list, tuple)):
        if not weights:
            raise ValueError(f"[{fn}] weights is an empty list of layers")
        return [_layer_array(fn, w) for w in weights], False
    return [_layer_array(fn, weights)], True


def head_scores(weights: Any, mask: Any = None) -> dict[str, np.ndarray]:
    """The measures :func:`classify_heads` thresholds, per layer and head.

    Args:
        weights: attention weights: a list with one ``(B, H, Tq, Tk)`` or ``(H, Tq, Tk)`` array
            per layer (``model(ids, return_attention=True)[1]``), or one such array.
        mask: ``(B, Tk)`` True for real tokens (the ``mask`` given to the model), default all.

    Returns:
        ``{"first", "self", "previous", "local", "uniform"}`` -> ``(L, H)`` float64 arrays
        (``(H,)`` for one array): the mean over real query rows (that can see at least two
        keys) of the weight on the first real token, on the query's own token, on the token
        before it, the mass on the last ``LOCAL_WINDOW`` tokens (rows that see more than
        ``LOCAL_WINDOW`` keys only; NaN when none does) and the normalised entropy
        ``H(row) / log(n keys)``. Query ``i`` of ``Tq`` is aligned with key ``i + Tk - Tq``.
    """
    layers, single = _as_layers("head_scores", weights)
    per_layer = [
        _layer_scores(w, _check_mask("head_scores", mask, w.shape[0], w.shape[-1])) for w in layers
    ]
    out = {name: np.stack([s[name] for s in per_layer]) for name in _SCORES}
    return {k: v[0] for k, v in out.items()} if single else out


def classify_heads(weights: Any, mask: Any = None) -> list[list[str]] | list[str]:
    """Label each attention head by where it looks, as the head-specialisation
    analysis of the LLaMA notes' "Anatomy of an LLM" does, adapted to causal (decoder) attention.

    With the scores of :func:`head_scores` (means over the query rows), the first rule that
    holds gives the label:

    1. ``"first"``, ``"self"``, ``"previous"``: the largest of the mean weights on the first
       real token, on the query's own token and on the token before it, if it exceeds its
       threshold (``FIRST_THRESHOLD``, ``SELF_THRESHOLD`` — the analysis' "strong self-focus",
       0.6 — and ``PREVIOUS_THRESHOLD``, all 0.6);
    2. ``"uniform"``: mean normalised entropy of the rows >= ``UNIFORM_THRESHOLD`` (0.9;
       the notes' "generalist" heads);
    3. ``"local"``: mean mass on the query's token and the ``LOCAL_WINDOW - 1`` = 3 before it
       >= ``LOCAL_THRESHOLD`` (0.7, the notes' "local context specialist");
    4. ``"mixed"`` otherwise (the notes' "Mixed/specialized attention").

    (The notes' forward/backward-looking test is always "backward" under a causal mask.)

    Args:
        weights: a list of per-layer ``(B, H, Tq, Tk)`` / ``(H, Tq, Tk)`` arrays, or one array.
        mask: ``(B, Tk)`` True for real tokens (left padding), default all real.

    Returns:
        ``labels[layer][head]`` (a list of ``labels[head]`` for one array), from
        ``HEAD_CLASSES``.

    Examples:
        >>> import numpy as np
        >>> from llmkernels.inspect import classify_heads
        >>> t = 6
        >>> first = np.zeros((t, t)); first[:, 0] = 1
        >>> prev = np.eye(t, k=-1); prev[0, 0] = 1
        >>> uniform = np.tril(np.ones((t, t))) / np.arange(1, t + 1)[:, None]
        >>> classify_heads(np.stack([first, np.eye(t), prev, uniform]))
        ['first', 'self', 'previous', 'uniform']
    """
    scores = head_scores(weights, mask)
    single = scores["self"].ndim == 1
    sc = {k: np.atleast_2d(v) for k, v in scores.items()}
    thresholds = {"first": FIRST_THRESHOLD, "self": SELF_THRESHOLD, "previous": PREVIOUS_THRESHOLD}
    labels: list[list[str]] = []
    for layer in range(sc["self"].shape[0]):
        row = []
        for h in range(sc["self"].shape[1]):
            focus = {name: sc[name][layer, h] for name in thresholds}
            best = max(focus, key=lambda name: np.nan_to_num(focus[name], nan=-1.0))
            if focus[best] > thresholds[best]:
                row.append(best)
            elif sc["uniform"][layer, h] >= UNIFORM_THRESHOLD:
                row.append("uniform")
            elif sc["local"][layer, h] >= LOCAL_THRESHOLD:
                row.append("local")
            else:
                row.append("mixed")
        labels.append(row)
    return labels[0] if single else labels


set_tracer(call_hook)
