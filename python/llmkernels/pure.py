"""Pure-Python versions of the formulas: lists of floats and the ``math`` module only.

These are for teaching and for side-by-side timing at toy sizes (they are slow: one Python
bytecode loop per multiply-add). They follow :mod:`llmkernels.reference` formula for formula:

* a vector is a ``list[float]``; a matrix is a list of rows (``list[list[float]]``);
* the norms and activations accept a vector or any nesting of lists of vectors and
  normalize/apply over the innermost lists (the last axis);
* linear-layer weights are ``(in, out)``: ``w[i][j]`` connects input ``i`` to output ``j``;
* :func:`rope` takes one sequence, ``x`` being ``T`` rows of ``D`` floats (or a nesting of
  such sequences);
* :func:`attention` takes one sequence: ``q[h][t][d]`` (heads, positions, features);
* :func:`transformer_block` takes one sequence (``T`` rows of ``dim`` floats) and, like
  :func:`llmkernels.reference.transformer_block`, Hugging Face LLaMA weights (``(out, in)``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

__all__ = [
    "attention",
    "layer_norm",
    "rms_norm",
    "rope",
    "rope_inv_freq",
    "sigmoid",
    "silu",
    "swiglu",
    "swiglu_ffn",
    "transformer_block",
]

Vector = list[float]
Matrix = list[list[float]]


def _is_vector(x: Sequence[Any]) -> bool:
    """True if ``x`` is a flat list of numbers (an empty list counts as a vector)."""
    return len(x) == 0 or not isinstance(x[0], (list, tuple))


# --------------------------------------------------------------------------------------
# normalization
# --------------------------------------------------------------------------------------


def rms_norm(x: Sequence[Any], weight: Sequence[float] | None = None, eps: float = 1e-6) -> Any:
    """RMSNorm over the last axis: ``x / sqrt(mean(x**2) + eps) * weight``."""
    if not _is_vector(x):
        return [rms_norm(row, weight, eps) for row in x]
    n = len(x)
    if n == 0:  # an empty row normalises to an empty row (as lk.rms_norm)
        return []
    mean_square = sum(v * v for v in x) / n
    inv_rms = 1.0 / math.sqrt(mean_square + eps)
    out = []
    for i in range(n):
        y = x[i] * inv_rms
        if weight is not None:
            y *= weight[i]
        out.append(y)
    return out


def layer_norm(
    x: Sequence[Any],
    weight: Sequence[float] | None = None,
    bias: Sequence[float] | None = None,
    eps: float = 1e-5,
) -> Any:
    """LayerNorm over the last axis (biased variance): ``(x - mean) / sqrt(var + eps) * w + b``."""
    if not _is_vector(x):
        return [layer_norm(row, weight, bias, eps) for row in x]
    n = len(x)
    if n == 0:
        return []
    mean = sum(x) / n
    var = sum((v - mean) * (v - mean) for v in x) / n
    inv_std = 1.0 / math.sqrt(var + eps)
    out = []
    for i in range(n):
        y = (x[i] - mean) * inv_std
        if weight is not None:
            y *= weight[i]
        if bias is not None:
            y += bias[i]
        out.append(y)
    return out


# --------------------------------------------------------------------------------------
# activations and the SwiGLU feed-forward
# --------------------------------------------------------------------------------------


def _sigmoid1(v: float) -> float:
    # 1 / (1 + exp(-v)) without overflowing exp for large |v|
    if v >= 0:
        return 1.0 / (1.0 + math.exp(-v))
    if v < 0:
        e = math.exp(v)
        return e / (1.0 + e)
    return v  # NaN


def sigmoid(x: Any) -> Any:
    """The logistic function ``1 / (1 + exp(-x))``, elementwise on a number or nested lists."""
    if isinstance(x, (list, tuple)):
        return [sigmoid(v) for v in x]
    return _sigmoid1(float(x))


def silu(x: Any) -> Any:
    """SiLU / swish ``x * sigmoid(x)``, elementwise on a number or nested lists."""
    if isinstance(x, (list, tuple)):
        return [silu(v) for v in x]
    v = float(x)
    return v * _sigmoid1(v)


def swiglu(gate: Any, up: Any) -> Any:
    """``silu(gate) * up`` elementwise; ``gate`` and ``up`` have the same (nested) shape."""
    if isinstance(gate, (list, tuple)):
        return [swiglu(g, u) for g, u in zip(gate, up, strict=True)]
    return silu(gate) * float(up)


def _vec_mat(x: Sequence[float], w: Sequence[Sequence[float]]) -> Vector:
    """``x @ w`` for a vector ``x`` of length ``n_in`` and ``w`` of shape ``(n_in, n_out)``."""
    n_out = len(w[0]) if w else 0
    out = [0.0] * n_out
    for i, xi in enumerate(x):
        row = w[i]
        for j in range(n_out):
            out[j] += xi * row[j]
    return out


def _add(a: Vector, b: Sequence[float] | None) -> Vector:
    return a if b is None else [ai + bi for ai, bi in zip(a, b, strict=True)]


def swiglu_ffn(
    x: Sequence[Any],
    w_gate: Sequence[Sequence[float]],
    w_up: Sequence[Sequence[float]],
    w_down: Sequence[Sequence[float]] | None = None,
    *,
    b_gate: Sequence[float] | None = None,
    b_up: Sequence[float] | None = None,
    b_down: Sequence[float] | None = None,
) -> Any:
    """``(silu(x @ w_gate + b_gate) * (x @ w_up + b_up)) @ w_down + b_down``.

    ``x`` is a vector of ``d_in`` floats or a list of them (rows). Weights are ``(in, out)``
    lists of rows. With ``w_down=None`` the hidden activation (``d_ff`` floats per row) is
    returned.
    """
    if not _is_vector(x):
        return [
            swiglu_ffn(row, w_gate, w_up, w_down, b_gate=b_gate, b_up=b_up, b_down=b_down)
            for row in x
        ]
    gate = _add(_vec_mat(x, w_gate), b_gate)
    up = _add(_vec_mat(x, w_up), b_up)
    hidden = [silu(g) * u for g, u in zip(gate, up, strict=True)]
    if w_down is None:
        return hidden
    return _add(_vec_mat(hidden, w_down), b_down)


# --------------------------------------------------------------------------------------
# rotary position embedding
# --------------------------------------------------------------------------------------


def rope_inv_freq(dim: int, theta: float = 10000.0) -> Vector:
    """The unscaled RoPE frequencies ``1 / theta**(2k / dim)`` for ``k = 0 .. dim/2 - 1``.

    (The scaled variants live in :func:`llmkernels.reference.rope_inv_freq`.)
    """
    return [1.0 / theta ** (2 * k / dim) for k in range(dim // 2)]


def rope(
    x: Sequence[Any],
    positions: Sequence[float] | None = None,
    *,
    theta: float = 10000.0,
    inv_freq: Sequence[float] | None = None,
    interleaved: bool = False,
    rotary_dim: int | None = None,
    attention_factor: float = 1.0,
) -> Any:
    """Rotate one sequence ``x`` (``T`` rows of ``D`` floats); positions default to ``0..T-1``.

    ``x`` may also be a nesting of sequences (e.g. ``[batch][heads][T][D]``); each sequence
    is rotated with the same ``positions``.

    Pairs are ``(x[k], x[k + r/2])`` (half-split, ``interleaved=False``) or
    ``(x[2k], x[2k+1])`` (``interleaved=True``), ``r = rotary_dim`` (default ``D``); features
    from ``r`` on pass through. Pair ``k`` of the token at position ``p`` is rotated by the
    angle ``p * inv_freq[k]``; cos and sin are multiplied by ``attention_factor``.
    """
    if x and x[0] and isinstance(x[0][0], (list, tuple)):  # leading dims: recurse
        return [
            rope(
                seq,
                positions,
                theta=theta,
                inv_freq=inv_freq,
                interleaved=interleaved,
                rotary_dim=rotary_dim,
                attention_factor=attention_factor,
            )
            for seq in x
        ]
    n_pos = len(x)
    d = len(x[0]) if n_pos else 0
    r = d if rotary_dim is None else rotary_dim
    if r % 2 or not 0 <= r <= d:
        raise ValueError(f"[rope] rotary_dim must be even and in [0, {d}], got {rotary_dim}")
    half = r // 2
    freqs = list(inv_freq) if inv_freq is not None else rope_inv_freq(r, theta)
    if len(freqs) != half:
        raise ValueError(f"[rope] inv_freq must have {half} entries, got {len(freqs)}")
    if positions is None:
        positions = range(n_pos)

    out = []
    for t in range(n_pos):
        row = list(x[t])  # features r..D-1 are copied unchanged
        for k in range(half):
            angle = positions[t] * freqs[k]
            c = math.cos(angle) * attention_factor
            s = math.sin(angle) * attention_factor
            i, j = (2 * k, 2 * k + 1) if interleaved else (k, k + half)
            x1, x2 = x[t][i], x[t][j]
            row[i] = x1 * c - x2 * s
            row[j] = x2 * c + x1 * s
        out.append(row)
    return out


# --------------------------------------------------------------------------------------
# attention
# --------------------------------------------------------------------------------------


def _is_bool(x: Any) -> bool:
    """A Python bool or a NumPy one (``np.bool_``, an entry of a bool array), without NumPy."""
    return isinstance(x, bool) or getattr(getattr(x, "dtype", None), "kind", None) == "b"


def attention(
    q: Sequence[Sequence[Sequence[float]]],
    k: Sequence[Sequence[Sequence[float]]],
    v: Sequence[Sequence[Sequence[float]]],
    *,
    causal: bool = False,
    mask: Sequence[Sequence[Any]] | None = None,
    scale: float | None = None,
    window: int | None = None,
    softcap: float | None = None,
    sinks: Sequence[float] | None = None,
) -> list[Matrix]:
    """Scaled dot-product attention for one sequence, head by head.

    ``q[h][i]`` (``Hq`` heads of ``Tq`` rows of ``D``), ``k[g][j]`` and ``v[g][j]`` (``Hkv``
    heads of ``Tk`` rows); query head ``h`` uses key/value head ``h // (Hq // Hkv)``.
    ``mask[i][j]`` (shared by all heads) is a bool (True = may attend) or a float added to
    the score. ``causal=True``: query ``i`` may attend key ``j`` iff ``j <= i + (Tk - Tq)``.
    ``window=w``: only keys with ``(i + Tk - Tq) - j < w``. ``softcap=c``: a score ``s``
    becomes ``c * tanh(s / c)`` (before the mask). ``sinks[h]``: an extra logit in head
    ``h``'s softmax denominator, with no value.
    A query with no key to attend gets a row of zeros. Returns ``out[h][i]`` of ``Dv`` floats.
    """
    n_q_heads, n_kv_heads = len(q), len(k)
    if n_kv_heads == 0 or n_q_heads % n_kv_heads:
        raise ValueError(f"[attention] Hq % Hkv must be 0, got Hq={n_q_heads}, Hkv={n_kv_heads}")
    group = n_q_heads // n_kv_heads
    d = len(q[0][0]) if n_q_heads and q[0] else 1
    if scale is None:
        scale = 1.0 / math.sqrt(d)

    out = []
    for h in range(n_q_heads):
        keys, values = k[h // group], v[h // group]
        t_q, t_k = len(q[h]), len(keys)
        d_v = len(values[0]) if t_k else 0
        head_out = []
        for i in range(t_q):
            # scores of the keys query i may attend
            scores: list[tuple[int, float]] = []
            for j in range(t_k):
                if causal and j > i + (t_k - t_q):
                    continue
                if window is not None and (i + t_k - t_q) - j >= window:
                    continue
                s = sum(a * b for a, b in zip(q[h][i], keys[j], strict=True)) * scale
                if softcap is not None:
                    s = softcap * math.tanh(s / softcap)
                if mask is not None:
                    m = mask[i][j]
                    if _is_bool(m):
                        if not m:
                            continue
                    else:
                        s += m
                if s == -math.inf:
                    continue
                scores.append((j, s))
            row = [0.0] * d_v
            if scores:
                # softmax (over the keys and the sink), max-subtracted
                top = max(s for _, s in scores)
                if sinks is not None:
                    top = max(top, sinks[h])
                weights = [(j, math.exp(s - top)) for j, s in scores]
                total = sum(w for _, w in weights)
                if sinks is not None:
                    total += math.exp(sinks[h] - top)
                for j, w in weights:
                    p = w / total
                    for c in range(d_v):
                        row[c] += p * values[j][c]
            head_out.append(row)
        out.append(head_out)
    return out


# --------------------------------------------------------------------------------------
# the LLaMA transformer block (one sequence)
# --------------------------------------------------------------------------------------


def _mat_vec(w: Sequence[Sequence[float]], x: Sequence[float]) -> Vector:
    """``W @ x`` for ``W`` of shape ``(out, in)`` (``torch.nn.Linear.weight``), ``x`` of ``in``."""
    return [sum(w_oi * x_i for w_oi, x_i in zip(row, x, strict=True)) for row in w]


def transformer_block(
    x: Sequence[Sequence[float]],
    weights: dict[str, Any],
    config: dict[str, Any],
    *,
    positions: Sequence[float] | None = None,
) -> Matrix:
    """One LLaMA decoder layer on one sequence ``x`` (``T`` rows of ``dim`` floats).

    The same formula as :func:`llmkernels.reference.transformer_block` (pre-norm
    ``h = x + attn(norm1(x)); y = h + ffn(norm2(h))`` or the post-norm variant, RMSNorm or
    LayerNorm, causal grouped-query attention with half-split RoPE, SwiGLU MLP), without a
    batch, mask or cache. ``weights`` uses the HF names and ``(out, in)`` shapes as nested
    lists (``self_attn.q_proj.weight``, ..., ``input_layernorm.weight``, see the reference);
    ``config`` the same keys (``dim``, ``n_heads``, ``n_kv_heads``, ``head_dim``,
    ``norm_eps``, ``rope_theta``, ``norm``, ``norm_position``, ``attention_bias``,
    ``mlp_bias``). RoPE scaling (``rope_scaling``) is not supported here. ``positions``
    defaults to ``0 .. T-1``.
    """
    dim = config["dim"]
    n_heads = config["n_heads"]
    n_kv_heads = config.get("n_kv_heads", n_heads)
    head_dim = config.get("head_dim", dim // n_heads)
    eps = config.get("norm_eps", 1e-6 if config.get("norm", "rms") == "rms" else 1e-5)
    if config.get("rope_scaling") is not None:
        raise ValueError("[pure.transformer_block] rope_scaling is not supported; use reference")
    attn_bias = config.get("attention_bias", False)
    mlp_bias = config.get("mlp_bias", False)
    n_tok = len(x)

    def linear(v: Vector, name: str, bias: bool) -> Vector:
        # W @ v + b with W (out, in)
        return _add(
            _mat_vec(weights[name + ".weight"], v), weights[name + ".bias"] if bias else None
        )

    def norm(v: Vector, name: str) -> Vector:
        kind = config.get("norm", "rms")
        if kind == "rms":
            return rms_norm(v, weights[name + ".weight"], eps)
        if kind == "layer":
            return layer_norm(v, weights[name + ".weight"], weights[name + ".bias"], eps)
        raise ValueError(f"config['norm'] must be 'rms' or 'layer', got {kind!r}")

    def attn(rows: Sequence[Vector]) -> Matrix:
        # per token: q (Hq * hd), k and v (Hkv * hd); then split into heads [h][t][d]
        q = [linear(r, "self_attn.q_proj", attn_bias) for r in rows]
        k = [linear(r, "self_attn.k_proj", attn_bias) for r in rows]
        v = [linear(r, "self_attn.v_proj", attn_bias) for r in rows]
        qh = [
            [q[t][h * head_dim : (h + 1) * head_dim] for t in range(n_tok)] for h in range(n_heads)
        ]
        kh = [
            [k[t][g * head_dim : (g + 1) * head_dim] for t in range(n_tok)]
            for g in range(n_kv_heads)
        ]
        vh = [
            [v[t][g * head_dim : (g + 1) * head_dim] for t in range(n_tok)]
            for g in range(n_kv_heads)
        ]
        theta = config.get("rope_theta", 10000.0)
        qh = [rope(seq, positions, theta=theta) for seq in qh]
        kh = [rope(seq, positions, theta=theta) for seq in kh]
        out = attention(qh, kh, vh, causal=True)  # out[h][t][d]
        # merge heads per token (t: Hq * hd) and project back to dim
        merged = [[val for h in range(n_heads) for val in out[h][t]] for t in range(n_tok)]
        return [linear(m, "self_attn.o_proj", attn_bias) for m in merged]

    def ffn(v: Vector) -> Vector:
        gate = linear(v, "mlp.gate_proj", mlp_bias)
        up = linear(v, "mlp.up_proj", mlp_bias)
        return linear(swiglu(gate, up), "mlp.down_proj", mlp_bias)

    def add(a: Sequence[Vector], b: Sequence[Vector]) -> Matrix:
        return [
            [ai + bi for ai, bi in zip(ra, rb, strict=True)] for ra, rb in zip(a, b, strict=True)
        ]

    rows = [[float(val) for val in r] for r in x]
    if config.get("norm_position", "pre") == "pre":
        h = add(rows, attn([norm(r, "input_layernorm") for r in rows]))
        return add(h, [ffn(norm(r, "post_attention_layernorm")) for r in h])
    if config.get("norm_position") == "post":
        h = [norm(r, "input_layernorm") for r in add(rows, attn(rows))]
        return [norm(r, "post_attention_layernorm") for r in add(h, [ffn(r) for r in h])]
    raise ValueError(
        f"config['norm_position'] must be 'pre' or 'post', got {config['norm_position']!r}"
    )
