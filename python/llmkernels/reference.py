"""The specification: every public function as a plain NumPy float64 formula.

These functions are written for clarity, like a textbook or llama2.c, not for speed. They
compute in float64 and return float64, whatever the input dtype, and they validate only
what the formula needs. The test suite compares the C++ kernels against them.

Conventions (see DESIGN.md §3):

* Norms reduce over the last axis.
* Linear-layer weights are ``(in, out)``, so a layer is ``x @ w + b`` as in NumPy.
* RoPE: ``x`` is ``(..., T, D)``; pairs are ``(x[i], x[i + r/2])`` (half-split,
  ``interleaved=False``, HF LLaMA / GPT-NeoX) or ``(x[2i], x[2i+1])`` (``interleaved=True``,
  Meta / RoFormer); only the first ``r = rotary_dim`` features rotate.
* Attention: ``q (..., Hq, Tq, D)``, ``k (..., Hkv, Tk, D)``, ``v (..., Hkv, Tk, Dv)``;
  ``causal=True`` is bottom-right aligned.
* NaN and Inf in the data propagate as IEEE arithmetic does, without NumPy warnings.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import TypeVar

import numpy as np
from numpy.typing import ArrayLike, NDArray

from ._rope_scaling import rope_attention_factor, rope_inv_freq

__all__ = [
    "attention",
    "layer_norm",
    "rms_norm",
    "rope",
    "rope_attention_factor",
    "rope_inv_freq",
    "sigmoid",
    "silu",
    "swiglu",
    "swiglu_ffn",
]

F64 = NDArray[np.float64]
_F = TypeVar("_F", bound=Callable[..., object])


def _ieee(fn: _F) -> _F:
    """Run ``fn`` with NumPy floating-point warnings off: NaN/Inf simply propagate."""

    @functools.wraps(fn)
    def wrapper(*args: object, **kwargs: object) -> object:
        with np.errstate(over="ignore", invalid="ignore", divide="ignore", under="ignore"):
            return fn(*args, **kwargs)

    return wrapper  # type: ignore[return-value]


def _f64(a: ArrayLike) -> F64:
    return np.asarray(a, dtype=np.float64)


# --------------------------------------------------------------------------------------
# normalization
# --------------------------------------------------------------------------------------


@_ieee
def rms_norm(x: ArrayLike, weight: ArrayLike | None = None, eps: float = 1e-6) -> F64:
    """RMSNorm (Zhang & Sennrich 2019) over the last axis.

    ``y = x / sqrt(mean(x**2) + eps) * weight``; ``weight`` (shape ``(D,)``) defaults to ones.
    Same as ``torch.nn.functional.rms_norm(x, (D,), weight, eps)`` and HF ``LlamaRMSNorm``.
    """
    x = _f64(x)
    mean_square = np.mean(x * x, axis=-1, keepdims=True)
    y = x / np.sqrt(mean_square + eps)
    if weight is not None:
        y = y * _f64(weight)
    return y


@_ieee
def layer_norm(
    x: ArrayLike,
    weight: ArrayLike | None = None,
    bias: ArrayLike | None = None,
    eps: float = 1e-5,
) -> F64:
    """LayerNorm (Ba et al. 2016) over the last axis, with the biased variance.

    ``y = (x - mean) / sqrt(var + eps) * weight + bias`` where ``var = mean((x - mean)**2)``.
    ``weight`` defaults to ones and ``bias`` to zeros. Same as
    ``torch.nn.functional.layer_norm(x, (D,), weight, bias, eps)``.
    """
    x = _f64(x)
    mean = np.mean(x, axis=-1, keepdims=True)
    centered = x - mean
    var = np.mean(centered * centered, axis=-1, keepdims=True)
    y = centered / np.sqrt(var + eps)
    if weight is not None:
        y = y * _f64(weight)
    if bias is not None:
        y = y + _f64(bias)
    return y


# --------------------------------------------------------------------------------------
# activations and the SwiGLU feed-forward
# --------------------------------------------------------------------------------------


@_ieee
def sigmoid(x: ArrayLike) -> F64:
    """The logistic function ``1 / (1 + exp(-x))``.

    Evaluated as ``1 / (1 + e)`` for ``x >= 0`` and ``e / (1 + e)`` for ``x < 0`` with
    ``e = exp(-|x|)``, which is the same value without overflowing ``exp``.
    ``sigmoid(+inf) = 1``, ``sigmoid(-inf) = 0``, NaN stays NaN.
    """
    x = _f64(x)
    e = np.exp(-np.abs(x))
    return np.where(x >= 0, 1.0 / (1.0 + e), e / (1.0 + e))


@_ieee
def silu(x: ArrayLike) -> F64:
    """SiLU / swish: ``x * sigmoid(x)`` (``silu(-inf)`` is NaN, as in PyTorch)."""
    x = _f64(x)
    return x * sigmoid(x)


@_ieee
def swiglu(gate: ArrayLike, up: ArrayLike) -> F64:
    """The SwiGLU gate (Shazeer 2020): ``silu(gate) * up``, elementwise (same shapes)."""
    return silu(gate) * _f64(up)


@_ieee
def swiglu_ffn(
    x: ArrayLike,
    w_gate: ArrayLike,
    w_up: ArrayLike,
    w_down: ArrayLike | None = None,
    *,
    b_gate: ArrayLike | None = None,
    b_up: ArrayLike | None = None,
    b_down: ArrayLike | None = None,
) -> F64:
    """The LLaMA (SwiGLU) feed-forward network.

    ``y = (silu(x @ w_gate + b_gate) * (x @ w_up + b_up)) @ w_down + b_down``.
    ``x`` is ``(..., d_in)``; ``w_gate`` and ``w_up`` are ``(d_in, d_ff)``; ``w_down`` is
    ``(d_ff, d_out)``. Weights are ``(in, out)`` (the transpose of ``torch.nn.Linear.weight``).
    Biases default to zero. With ``w_down=None`` the hidden activation
    ``silu(x @ w_gate + b_gate) * (x @ w_up + b_up)`` of shape ``(..., d_ff)`` is returned
    (and ``b_down`` is ignored).
    """
    x = _f64(x)
    gate = x @ _f64(w_gate)
    up = x @ _f64(w_up)
    if b_gate is not None:
        gate = gate + _f64(b_gate)
    if b_up is not None:
        up = up + _f64(b_up)
    hidden = swiglu(gate, up)
    if w_down is None:
        return hidden
    y = hidden @ _f64(w_down)
    if b_down is not None:
        y = y + _f64(b_down)
    return y


# --------------------------------------------------------------------------------------
# rotary position embedding
# --------------------------------------------------------------------------------------


@_ieee
def rope(
    x: ArrayLike,
    positions: ArrayLike | None = None,
    *,
    theta: float = 10000.0,
    inv_freq: ArrayLike | None = None,
    interleaved: bool = False,
    rotary_dim: int | None = None,
    attention_factor: float = 1.0,
) -> F64:
    """Rotary position embedding (Su et al. 2021) of ``x`` with shape ``(..., T, D)``.

    With ``r = rotary_dim`` (default ``D``) and ``inv_freq`` (default
    ``rope_inv_freq(r, theta)``, length ``r / 2``), the token at position ``p`` has angles
    ``a_k = p * inv_freq[k]`` (computed in float64) and each pair ``(x1, x2)`` becomes::

        x1' = x1 * cos(a_k) * attention_factor - x2 * sin(a_k) * attention_factor
        x2' = x2 * cos(a_k) * attention_factor + x1 * sin(a_k) * attention_factor

    Pairs are ``(x[k], x[k + r/2])`` when ``interleaved=False`` (the half-split /
    ``rotate_half`` convention of HF LLaMA, GPT-NeoX, MLX) and ``(x[2k], x[2k+1])`` when
    ``interleaved=True`` (Meta LLaMA, RoFormer). Features ``r..D-1`` pass through unchanged
    (partial rotary), and ``attention_factor`` (the YaRN / longrope cos-sin multiplier, see
    :func:`rope_attention_factor`) scales the rotated features only.

    ``positions`` is ``(T,)`` or any shape broadcastable to ``x.shape[:-1]``; default
    ``arange(T)``. ``inv_freq`` overrides ``theta``.
    """
    x = _f64(x)
    n_pos, d = x.shape[-2], x.shape[-1]
    r = d if rotary_dim is None else int(rotary_dim)
    if r % 2 or not 0 <= r <= d:
        raise ValueError(f"[rope] rotary_dim must be even and in [0, {d}], got {rotary_dim}")
    half = r // 2

    if inv_freq is not None:
        freqs = _f64(inv_freq)
    else:
        freqs = rope_inv_freq(r, theta) if r > 0 else np.zeros(0)
    if freqs.shape != (half,):
        raise ValueError(f"[rope] inv_freq must have shape ({half},), got {freqs.shape}")

    pos = np.arange(n_pos, dtype=np.float64) if positions is None else _f64(positions)
    pos = np.broadcast_to(pos, x.shape[:-1])  # (..., T)

    angles = pos[..., None] * freqs  # (..., T, r/2), float64
    cos = np.cos(angles) * attention_factor
    sin = np.sin(angles) * attention_factor

    if interleaved:
        x1, x2 = x[..., 0:r:2], x[..., 1:r:2]
    else:
        x1, x2 = x[..., :half], x[..., half:r]

    out = x.copy()
    if interleaved:
        out[..., 0:r:2] = x1 * cos - x2 * sin
        out[..., 1:r:2] = x2 * cos + x1 * sin
    else:
        out[..., :half] = x1 * cos - x2 * sin
        out[..., half:r] = x2 * cos + x1 * sin
    return out


# --------------------------------------------------------------------------------------
# attention
# --------------------------------------------------------------------------------------


@_ieee
def attention(
    q: ArrayLike,
    k: ArrayLike,
    v: ArrayLike,
    *,
    causal: bool = False,
    mask: ArrayLike | None = None,
    scale: float | None = None,
    return_weights: bool = False,
) -> F64 | tuple[F64, F64]:
    """Scaled dot-product attention ``softmax(q @ k.T * scale + mask) @ v``, per head.

    Shapes: ``q (..., Hq, Tq, D)``, ``k (..., Hkv, Tk, D)``, ``v (..., Hkv, Tk, Dv)``; the
    result is ``(..., Hq, Tq, Dv)``. Grouped-query attention: ``Hq % Hkv == 0`` and query
    head ``h`` uses key/value head ``h // (Hq // Hkv)``. ``scale`` defaults to
    ``1 / sqrt(D)``.

    ``mask`` is boolean (True = may attend) or additive float (added to the scores; ``-inf``
    forbids), broadcastable to ``(..., Hq, Tq, Tk)``. ``causal=True`` is bottom-right
    aligned: query ``i`` may attend key ``j`` iff ``j <= i + (Tk - Tq)`` (the KV-cache
    convention; PyTorch's ``is_causal`` is top-left aligned and differs when Tq != Tk).
    A query row with no key to attend gives a zero output row and a zero weights row.

    With ``return_weights=True`` returns ``(output, weights)``, ``weights`` being the
    ``(..., Hq, Tq, Tk)`` softmax probabilities.
    """
    q, k, v = _f64(q), _f64(k), _f64(v)
    n_q_heads, n_kv_heads = q.shape[-3], k.shape[-3]
    if n_kv_heads == 0 or n_q_heads % n_kv_heads:
        raise ValueError(f"[attention] Hq % Hkv must be 0, got Hq={n_q_heads}, Hkv={n_kv_heads}")
    group = n_q_heads // n_kv_heads
    k = np.repeat(k, group, axis=-3)  # query head h -> kv head h // group
    v = np.repeat(v, group, axis=-3)
    t_q, t_k = q.shape[-2], k.shape[-2]
    if scale is None:
        scale = 1.0 / np.sqrt(q.shape[-1])

    scores = (q @ np.swapaxes(k, -1, -2)) * scale  # (..., Hq, Tq, Tk)
    allowed = np.ones(scores.shape, dtype=bool)
    if causal:
        i = np.arange(t_q)[:, None]
        j = np.arange(t_k)[None, :]
        allowed = allowed & (j <= i + (t_k - t_q))
    if mask is not None:
        mask = np.asarray(mask)
        if mask.dtype == np.bool_:
            allowed = allowed & mask
        else:
            scores = scores + mask.astype(np.float64)
    allowed = allowed & (scores != -np.inf)

    # softmax over the allowed keys, max-subtracted
    any_allowed = np.any(allowed, axis=-1, keepdims=True)
    masked = np.where(allowed, scores, -np.inf)
    row_max = np.where(any_allowed, np.max(masked, axis=-1, keepdims=True), 0.0)
    e = np.where(allowed, np.exp(masked - row_max), 0.0)
    total = np.sum(e, axis=-1, keepdims=True)
    weights = np.where(any_allowed, e / np.where(any_allowed, total, 1.0), 0.0)

    out = weights @ v
    if return_weights:
        return out, weights
    return out
