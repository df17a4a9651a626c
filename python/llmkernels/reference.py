"""The specification: every public function as a plain NumPy float64 formula.

These functions are written for clarity, like a textbook or llama2.c, not for speed. They
compute in float64 and return float64, whatever the input dtype, and they validate only
what the formula needs. The test suite compares the C++ kernels against them.

Conventions:

* Norms reduce over the last axis.
* Linear-layer weights are ``(in, out)``, so a layer is ``x @ w + b`` as in NumPy. The
  exception is the model part (:func:`transformer_block`, :func:`transformer_forward`,
  :func:`greedy_generate`), which takes Hugging Face LLaMA state dicts: ``(out, in)``
  weights, applied as ``x @ W.T + b``.
* RoPE: ``x`` is ``(..., T, D)``; pairs are ``(x[i], x[i + r/2])`` (half-split,
  ``interleaved=False``, HF LLaMA / GPT-NeoX) or ``(x[2i], x[2i+1])`` (``interleaved=True``,
  Meta / RoFormer); only the first ``r = rotary_dim`` features rotate.
* Attention: ``q (..., Hq, Tq, D)``, ``k (..., Hkv, Tk, D)``, ``v (..., Hkv, Tk, Dv)``;
  ``causal=True`` is bottom-right aligned.
* NaN and Inf in the data propagate as IEEE arithmetic does, without NumPy warnings.
* Quantized weights (:func:`quantize`, :func:`dequantize`, :func:`quantize_activations`) are
  twins of the C++ quantization bit for bit, so they return its dtypes (int8 / uint8 codes,
  float16 scales, float32 weights); :func:`quantized_linear` is float64.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

import numpy as np
from numpy.typing import ArrayLike, NDArray

from . import _libm
from ._rope_scaling import rope_attention_factor, rope_inv_freq

__all__ = [
    "BLOCK",
    "INT8_ACTIVATION_SCALE_RANGE",
    "attention",
    "dequantize",
    "greedy_generate",
    "layer_norm",
    "quant_codes",
    "quantize",
    "quantize_activations",
    "quantized_linear",
    "rms_norm",
    "rope",
    "rope_attention_factor",
    "rope_inv_freq",
    "sigmoid",
    "silu",
    "swiglu",
    "swiglu_ffn",
    "transformer_block",
    "transformer_forward",
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
    e = _libm.exp(-np.abs(x))
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
    cos = _libm.cos(angles) * attention_factor
    sin = _libm.sin(angles) * attention_factor

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
    window: int | None = None,
    softcap: float | None = None,
    sinks: ArrayLike | None = None,
    return_weights: bool = False,
    return_lse: bool = False,
) -> F64 | tuple[F64, ...]:
    """Scaled dot-product attention ``softmax(q @ k.T * scale + mask) @ v``, per head.

    Shapes: ``q (..., Hq, Tq, D)``, ``k (..., Hkv, Tk, D)``, ``v (..., Hkv, Tk, Dv)``; the
    result is ``(..., Hq, Tq, Dv)``. Grouped-query attention: ``Hq % Hkv == 0`` and query
    head ``h`` uses key/value head ``h // (Hq // Hkv)``. ``scale`` defaults to
    ``1 / sqrt(D)``.

    ``mask`` is boolean (True = may attend) or additive float (added to the scores; ``-inf``
    forbids), broadcastable to ``(..., Hq, Tq, Tk)``. ``causal=True`` is bottom-right
    aligned: query ``i`` may attend key ``j`` iff ``j <= i + (Tk - Tq)`` (the KV-cache
    convention; PyTorch's ``is_causal`` is top-left aligned and differs when Tq != Tk).
    ``window=w`` (sliding window, Mistral / Gemma 2): key ``j`` is visible to query ``i`` only
    if ``(i + Tk - Tq) - j < w`` (transformers' semantics), combined with ``causal`` and
    ``mask``. ``softcap=c`` (Gemma 2): the scaled scores become ``c * tanh(s / c)`` before the
    mask is added. ``sinks`` (shape ``(Hq,)``, gpt-oss): a per-head logit added to each row's
    softmax denominator with no value (the weights of a row then sum to less than 1).
    A query row with no key to attend gives a zero output row and a zero weights row.

    With ``return_weights=True`` also returns the ``(..., Hq, Tq, Tk)`` softmax probabilities;
    with ``return_lse=True`` also the ``(..., Hq, Tq)`` natural log-sum-exp of each row's
    scores (over the visible keys, plus the sink; ``-inf`` for a row with neither), with which
    attentions over disjoint key blocks merge exactly:
    ``out = sum_b exp(lse_b - lse) * out_b`` with ``lse = logaddexp(lse_1, lse_2, ...)``.
    Returns ``out``, ``(out, weights)``, ``(out, lse)`` or ``(out, weights, lse)``.
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
    if softcap is not None:
        scores = softcap * _libm.tanh(scores / softcap)
    allowed = np.ones(scores.shape, dtype=bool)
    i = np.arange(t_q)[:, None] + (t_k - t_q)  # query i's position among the keys
    j = np.arange(t_k)[None, :]
    if causal:
        allowed = allowed & (j <= i)
    if window is not None:
        allowed = allowed & (i - j < window)
    if mask is not None:
        mask = np.asarray(mask)
        if mask.dtype == np.bool_:
            allowed = allowed & mask
        else:
            scores = scores + mask.astype(np.float64)
    allowed = allowed & (scores != -np.inf)

    # softmax over the allowed keys (and the sink), max-subtracted; NaN and inf propagate. A
    # row with no allowed key and no (finite) sink attends nothing: zeros, lse -inf.
    masked = np.where(allowed, scores, -np.inf)
    row_max = np.max(masked, axis=-1, keepdims=True, initial=-np.inf)
    sink = None
    if sinks is not None:
        sink = _f64(sinks)[:, None, None]  # (Hq, 1, 1): one logit per query head
        row_max = np.maximum(row_max, sink)
    attends = ~np.isneginf(row_max)
    row_max = np.where(attends, row_max, 0.0)
    e = np.where(allowed, _libm.exp(masked - row_max), 0.0)
    total = np.sum(e, axis=-1, keepdims=True)
    if sink is not None:
        total = total + _libm.exp(sink - row_max)
    weights = np.where(attends, e / np.where(attends, total, 1.0), 0.0)

    # (a row that attends nothing is zeros even where v holds NaN or inf: 0 @ NaN is NaN)
    out = np.where(attends, weights @ v, 0.0)
    result: tuple[F64, ...] = (out,)
    if return_weights:
        result += (weights,)
    if return_lse:
        with np.errstate(divide="ignore"):
            lse = np.where(attends, row_max + _libm.log(total), -np.inf)[..., 0]
        result += (lse,)
    return result[0] if len(result) == 1 else result


# --------------------------------------------------------------------------------------
# the LLaMA transformer block and model (the specification of the C++ modules)
# --------------------------------------------------------------------------------------
#
# Weights come as a dict with Hugging Face LLaMA key names and shapes. Unlike the functions
# above, linear weights here are ``(out, in)`` like ``torch.nn.Linear.weight``, so a
# projection is ``x @ W.T + b`` and a ``transformers`` state dict can be used as it is:
#
#   self_attn.q_proj.weight   (n_heads * head_dim, dim)     (+ .bias when attention_bias)
#   self_attn.k_proj.weight   (n_kv_heads * head_dim, dim)
#   self_attn.v_proj.weight   (n_kv_heads * head_dim, dim)
#   self_attn.o_proj.weight   (dim, n_heads * head_dim)
#   mlp.gate_proj.weight      (hidden_dim, dim)              (+ .bias when mlp_bias)
#   mlp.up_proj.weight        (hidden_dim, dim)
#   mlp.down_proj.weight      (dim, hidden_dim)
#   input_layernorm.weight            (dim,)   norm1       (+ .bias when norm == "layer")
#   post_attention_layernorm.weight   (dim,)   norm2
#
# A whole model adds ``model.embed_tokens.weight (vocab_size, dim)``, the layers under
# ``model.layers.{i}.``, ``model.norm.weight (dim,)`` and ``lm_head.weight (vocab_size, dim)``
# (absent when the embeddings are tied).
#
# The config is a plain dict with these names (defaults after the ``=``):
#
#   dim, n_layers, n_heads, n_kv_heads = n_heads, head_dim = dim // n_heads, hidden_dim,
#   vocab_size, norm = "rms" | "layer", norm_eps = 1e-6 (rms) / 1e-5 (layer),
#   norm_position = "pre" | "post", rope_theta = 10000.0, rope_scaling = None (an HF
#   rope_scaling dict, without rope_theta), attention_bias = False, mlp_bias = False,
#   tie_embeddings = False
#
# (``hidden_dim`` and ``vocab_size`` are implied by the weight shapes and only read by code
# that builds weights.)

_CONFIG_DEFAULTS: dict[str, object] = {
    "rope_theta": 10000.0,
    "rope_scaling": None,
    "norm": "rms",
    "norm_position": "pre",
    "attention_bias": False,
    "mlp_bias": False,
    "tie_embeddings": False,
}


def _cfg_get(config: Mapping[str, Any], key: str) -> Any:
    """``config[key]``, or its default (``n_kv_heads`` = ``n_heads``, ``head_dim`` =
    ``dim // n_heads``, ``norm_eps`` = 1e-6 for RMSNorm and 1e-5 for LayerNorm, the rest from
    ``_CONFIG_DEFAULTS``); ``KeyError`` if it has none."""
    if key in config:
        return config[key]
    if key == "norm_eps":
        return 1e-6 if _cfg_get(config, "norm") == "rms" else 1e-5
    if key == "n_kv_heads":
        return config["n_heads"]
    if key == "head_dim":
        return config["dim"] // config["n_heads"]
    if key in _CONFIG_DEFAULTS:
        return _CONFIG_DEFAULTS[key]
    raise KeyError(f"config needs {key!r}")


KVCache = dict[str, F64]
"""One layer's cache: ``{"k": (B, Hkv, L, head_dim), "v": (B, Hkv, L, head_dim)}`` holding
the keys (already rotated by RoPE) and values of the ``L`` tokens seen so far. ``{}`` is the
empty cache."""


def _linear(x: F64, weights: Mapping[str, ArrayLike], name: str, bias: bool) -> F64:
    """``x @ W.T + b`` with ``W = weights[name + ".weight"]`` of shape ``(out, in)``."""
    y = x @ _f64(weights[name + ".weight"]).T
    if bias:
        y = y + _f64(weights[name + ".bias"])
    return y


def _norm(x: F64, weights: Mapping[str, ArrayLike], name: str, config: Mapping[str, Any]) -> F64:
    """RMSNorm or LayerNorm (``config["norm"]``) over the last axis, weights under ``name``."""
    eps = _cfg_get(config, "norm_eps")
    kind = _cfg_get(config, "norm")
    if kind == "rms":
        return rms_norm(x, weights[name + ".weight"], eps)
    if kind == "layer":
        return layer_norm(x, weights[name + ".weight"], weights[name + ".bias"], eps)
    raise ValueError(f"config['norm'] must be 'rms' or 'layer', got {kind!r}")


def _cache_len(cache: KVCache | None) -> int:
    return 0 if not cache else int(cache["k"].shape[2])


def _self_attention(
    x: F64,
    weights: Mapping[str, ArrayLike],
    config: Mapping[str, Any],
    positions: ArrayLike | None,
    mask: ArrayLike | None,
    cache: KVCache | None,
) -> tuple[F64, KVCache]:
    """LLaMA self-attention of ``x (B, T, dim)``: returns ``(out (B, T, dim), new cache)``."""
    n_batch, n_tok, _ = x.shape
    n_heads = _cfg_get(config, "n_heads")
    n_kv_heads = _cfg_get(config, "n_kv_heads")
    head_dim = _cfg_get(config, "head_dim")
    bias = _cfg_get(config, "attention_bias")
    past = _cache_len(cache)

    # projections, then split the features into heads: (B, T, H * hd) -> (B, H, T, hd)
    q = _linear(x, weights, "self_attn.q_proj", bias)  # (B, T, Hq * hd)
    k = _linear(x, weights, "self_attn.k_proj", bias)  # (B, T, Hkv * hd)
    v = _linear(x, weights, "self_attn.v_proj", bias)  # (B, T, Hkv * hd)
    q = q.reshape(n_batch, n_tok, n_heads, head_dim).transpose(0, 2, 1, 3)  # (B, Hq, T, hd)
    k = k.reshape(n_batch, n_tok, n_kv_heads, head_dim).transpose(0, 2, 1, 3)  # (B, Hkv, T, hd)
    v = v.reshape(n_batch, n_tok, n_kv_heads, head_dim).transpose(0, 2, 1, 3)  # (B, Hkv, T, hd)

    # RoPE (half-split) on queries and keys; positions continue after the cached tokens
    if positions is None:
        pos = np.arange(past, past + n_tok, dtype=np.float64)  # (T,)
    else:
        pos = _f64(positions)  # (T,) or (B, T)
        if pos.ndim == 2:
            pos = pos[:, None, :]  # (B, 1, T): the same positions for every head
    scaling = _cfg_get(config, "rope_scaling")
    seq_len = int(np.max(pos)) + 1 if pos.size else None  # dynamic NTK / longrope only
    inv_freq = rope_inv_freq(head_dim, _cfg_get(config, "rope_theta"), scaling, seq_len=seq_len)
    factor = rope_attention_factor(scaling)
    q = rope(q, pos, inv_freq=inv_freq, attention_factor=factor)
    k = rope(k, pos, inv_freq=inv_freq, attention_factor=factor)

    # append to the cache: keys and values of all L + T tokens
    if cache:
        k = np.concatenate([_f64(cache["k"]), k], axis=2)  # (B, Hkv, L + T, hd)
        v = np.concatenate([_f64(cache["v"]), v], axis=2)
    new_cache: KVCache = {"k": k, "v": v}

    # causal (bottom-right aligned: query t sees keys 0 .. L + t) and key-padding mask
    key_mask = None
    if mask is not None:
        key_mask = np.asarray(mask, dtype=bool)[:, None, None, :]  # (B, 1, 1, L + T)
    out = attention(q, k, v, causal=True, mask=key_mask)  # (B, Hq, T, hd)

    # merge the heads and project back: (B, Hq, T, hd) -> (B, T, Hq * hd) -> (B, T, dim)
    out = out.transpose(0, 2, 1, 3).reshape(n_batch, n_tok, n_heads * head_dim)
    return _linear(out, weights, "self_attn.o_proj", bias), new_cache


def _feed_forward(x: F64, weights: Mapping[str, ArrayLike], config: Mapping[str, Any]) -> F64:
    """The SwiGLU MLP: ``down(silu(gate(x)) * up(x))``, ``(B, T, dim) -> (B, T, dim)``."""
    bias = _cfg_get(config, "mlp_bias")
    gate = _linear(x, weights, "mlp.gate_proj", bias)  # (B, T, hidden_dim)
    up = _linear(x, weights, "mlp.up_proj", bias)  # (B, T, hidden_dim)
    return _linear(swiglu(gate, up), weights, "mlp.down_proj", bias)  # (B, T, dim)


@_ieee
def transformer_block(
    x: ArrayLike,
    weights: Mapping[str, ArrayLike],
    config: Mapping[str, Any],
    *,
    positions: ArrayLike | None = None,
    mask: ArrayLike | None = None,
    cache: KVCache | None = None,
) -> F64 | tuple[F64, KVCache]:
    """One LLaMA decoder layer (HF ``LlamaDecoderLayer``) on ``x (B, T, dim)``.

    Pre-norm (``norm_position="pre"``, LLaMA)::

        h = x + attn(norm1(x))
        y = h + ffn(norm2(h))

    Post-norm (``"post"``, the original Transformer)::

        h = norm1(x + attn(x))
        y = norm2(h + ffn(h))

    ``norm1``/``norm2`` are ``input_layernorm``/``post_attention_layernorm`` (RMSNorm, or
    LayerNorm with ``norm="layer"``, eps ``norm_eps``). ``attn`` projects q, k, v, applies
    half-split RoPE (``rope_theta``, ``rope_scaling``) to q and k, runs causal grouped-query
    attention and projects with ``o_proj``; ``ffn`` is the SwiGLU MLP.

    Args:
        x: ``(B, T, dim)``.
        weights: the layer's weights with HF names (see the table above this function).
        config: the model config dict (see above).
        positions: RoPE positions, ``(T,)`` or ``(B, T)``; default ``arange(L, L + T)`` where
            ``L`` is the number of cached tokens.
        mask: boolean key-padding mask ``(B, L + T)``, True = a real token that may be
            attended; combined with the causal mask.
        cache: past keys/values of this layer (``{}`` when empty, see ``KVCache``). The
            function does not modify it; it returns the extended one.

    Returns:
        ``y (B, T, dim)``, or ``(y, new_cache)`` when ``cache`` is not None.
    """
    x = _f64(x)
    position = _cfg_get(config, "norm_position")
    if position == "pre":
        a, new_cache = _self_attention(
            _norm(x, weights, "input_layernorm", config), weights, config, positions, mask, cache
        )
        h = x + a
        f = _feed_forward(_norm(h, weights, "post_attention_layernorm", config), weights, config)
        y = h + f
    elif position == "post":
        a, new_cache = _self_attention(x, weights, config, positions, mask, cache)
        h = _norm(x + a, weights, "input_layernorm", config)
        f = _feed_forward(h, weights, config)
        y = _norm(h + f, weights, "post_attention_layernorm", config)
    else:
        raise ValueError(f"config['norm_position'] must be 'pre' or 'post', got {position!r}")
    if cache is None:
        return y
    return y, new_cache


def _layer_weights(state_dict: Mapping[str, ArrayLike], i: int) -> dict[str, ArrayLike]:
    """The weights of layer ``i`` with the ``model.layers.{i}.`` prefix removed."""
    prefix = f"model.layers.{i}."
    return {key[len(prefix) :]: w for key, w in state_dict.items() if key.startswith(prefix)}


@_ieee
def transformer_forward(
    ids: ArrayLike,
    state_dict: Mapping[str, ArrayLike],
    config: Mapping[str, Any],
    *,
    positions: ArrayLike | None = None,
    mask: ArrayLike | None = None,
    cache: list[KVCache] | None = None,
) -> F64 | tuple[F64, list[KVCache]]:
    """A LLaMA causal language model (HF ``LlamaForCausalLM``): token ids ``(B, T)`` to logits
    ``(B, T, vocab_size)``.

    ``x = embed_tokens[ids]``, then the ``n_layers`` blocks, the final norm (``model.norm``,
    of kind ``config["norm"]``) and ``logits = x @ lm_head.T``, where ``lm_head`` is the
    embedding matrix when ``tie_embeddings`` is set or ``lm_head.weight`` is absent.

    ``positions`` and ``mask`` are as in :func:`transformer_block` (the same for every layer).
    ``cache`` is a list of ``n_layers`` per-layer caches (``[{}] * n_layers`` when empty, or
    ``[]`` for short); with it the function returns ``(logits, new_cache)``.
    """
    ids = np.asarray(ids)
    n_layers = _cfg_get(config, "n_layers")
    embed = _f64(state_dict["model.embed_tokens.weight"])  # (vocab, dim)
    x = embed[ids]  # (B, T, dim)

    layer_caches: list[KVCache] = []
    for i in range(n_layers):
        weights = _layer_weights(state_dict, i)
        if cache is None:
            x = transformer_block(x, weights, config, positions=positions, mask=mask)
        else:
            past = cache[i] if i < len(cache) else {}
            x, layer_cache = transformer_block(
                x, weights, config, positions=positions, mask=mask, cache=past
            )
            layer_caches.append(layer_cache)

    x = _norm(x, state_dict, "model.norm", config)  # (B, T, dim)
    tied = _cfg_get(config, "tie_embeddings") or "lm_head.weight" not in state_dict
    head = embed if tied else _f64(state_dict["lm_head.weight"])  # (vocab, dim)
    logits = x @ head.T  # (B, T, vocab)
    if cache is None:
        return logits
    return logits, layer_caches


def greedy_generate(
    ids: ArrayLike,
    state_dict: Mapping[str, ArrayLike],
    config: Mapping[str, Any],
    max_new_tokens: int,
) -> NDArray[np.int64]:
    """Greedy (argmax) decoding, the specification of ``Transformer.generate``.

    Appends ``max_new_tokens`` tokens to each row of ``ids (B, T)`` (or ``(T,)``), each the
    argmax (first maximum on ties) of the last position's logits, recomputing the whole
    forward at every step (no cache, no end-of-sequence stop). Returns ``(B, T +
    max_new_tokens)`` (or ``(T + max_new_tokens,)``) int64 ids, the prompt included, as HF
    ``generate(do_sample=False)`` does.
    """
    seq = np.asarray(ids, dtype=np.int64)
    single = seq.ndim == 1
    if single:
        seq = seq[None, :]
    for _ in range(max_new_tokens):
        logits = transformer_forward(seq, state_dict, config)  # (B, T, vocab)
        next_ids = np.argmax(logits[:, -1, :], axis=-1)  # (B,)
        seq = np.concatenate([seq, next_ids[:, None]], axis=1)
    return seq[0] if single else seq


# ----------------------------------------------------------------------------------------------
# group-wise int8 / int4 weights (the format: llmkernels.quant); bit-exact twins of the C++
# quantization, so these return its dtypes (int8 / uint8 codes, float16 scales), not float64
# ----------------------------------------------------------------------------------------------

BLOCK = 32  # int4 packing block and per-token activation block
# The int8 activation scales (s = max|x| / 127 per token and block of 32) the integer kernels
# take: 0, NaN or within this range. A call with any other (|x| beyond ~1.6e32, or a nonzero
# block below ~1e-28) takes float32 activations: the product s_w * s_x would overflow (inf * 0 =
# NaN for a zero integer dot product) or be subnormal (a few significant bits).
# ops/quant.cpp's kActScaleMin / kActScaleMax.
INT8_ACTIVATION_SCALE_RANGE = (2.0**-100, 2.0**100)


def _half_ceil(d: np.ndarray) -> np.ndarray:
    """The smallest float16 >= d (d >= 0, float32), as float16."""
    with np.errstate(over="ignore"):
        h = d.astype(np.float16)
    up = h.astype(np.float32) < d
    return np.where(up, np.nextafter(h, np.float16(np.inf)), h)


def quantize(w: np.ndarray, bits: int, group_size: int) -> tuple[np.ndarray, np.ndarray]:
    """The bits of :func:`llmkernels.quantize`: int8 codes (rows, k) or packed int4 (rows,
    k / 2) uint8, and float16 scales (rows, k / group_size); see :mod:`llmkernels.quant`."""
    w = np.asarray(w, np.float32)
    rows, k = w.shape
    wg = w.reshape(rows, k // group_size, group_size)
    if bits == 8:
        d = np.abs(wg).max(-1) / np.float32(127)
    else:
        idx = np.abs(wg).argmax(-1)  # the first element of largest magnitude
        d = np.take_along_axis(wg, idx[..., None], -1)[..., 0] / np.float32(-8)
    h = _half_ceil(np.abs(d).astype(np.float32))
    scales = np.where(d < 0, -h, h).astype(np.float16)
    s = scales.astype(np.float32)[..., None]
    lo, hi = (-127, 127) if bits == 8 else (-8, 7)
    with np.errstate(divide="ignore", invalid="ignore"):
        codes = np.where(s == 0, np.float32(0), np.rint(wg / s))
    codes = np.clip(codes, lo, hi).astype(np.int8).reshape(rows, k)
    if bits == 8:
        return codes, scales
    nib = (codes.astype(np.int16) + 8).astype(np.uint8).reshape(rows, k // BLOCK, BLOCK)
    packed = nib[..., :16] | (nib[..., 16:] << 4)
    return packed.reshape(rows, k // 2), scales


def quant_codes(q: np.ndarray, bits: int) -> np.ndarray:
    """The int codes (rows, k) of ``q``."""
    if bits == 8:
        return np.asarray(q, np.int8).astype(np.int32)
    rows = q.shape[0]
    b = np.asarray(q, np.uint8).reshape(rows, -1, 16).astype(np.int32)
    return np.concatenate([b & 15, b >> 4], axis=-1).reshape(rows, -1) - 8


def dequantize(q: np.ndarray, scales: np.ndarray, bits: int, group_size: int) -> np.ndarray:
    """The float32 weight of codes and scales (``code * scale``, exact): the bits of
    :func:`llmkernels.dequantize`."""
    c = quant_codes(q, bits).astype(np.float32)
    s = np.repeat(np.asarray(scales).astype(np.float32), group_size, axis=1)
    return c * s


def quantize_activations(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per token, per block of 32: ``s = max|x| / 127`` (float32), ``q = rint(x / s)`` (0 where
    s == 0). Returns (q int8 (m, k), s float32 (m, k / 32))."""
    x = np.asarray(x, np.float32)
    m, k = x.shape
    xb = x.reshape(m, k // BLOCK, BLOCK)
    s = np.abs(xb).max(-1) / np.float32(127)
    with np.errstate(divide="ignore", invalid="ignore"):
        qx = np.where(s[..., None] == 0, np.float32(0), np.rint(xb / s[..., None]))
    return np.clip(qx, -127, 127).astype(np.int8).reshape(m, k), s


def quantized_linear(
    x: np.ndarray,
    q: np.ndarray,
    scales: np.ndarray,
    bits: int,
    group_size: int,
    bias: np.ndarray | None = None,
    activations: str = "float32",
) -> np.ndarray:
    """float64 reference of :func:`llmkernels.quantized_linear`: ``x @ W_deq.T + bias``, with x
    replaced by its per-token int8 blocks (``q * s``) when ``activations="int8"`` (unless a
    block scale is outside ``INT8_ACTIVATION_SCALE_RANGE``: then x as it is, as the kernel
    does)."""
    w = dequantize(q, scales, bits, group_size).astype(np.float64)
    x = np.asarray(x, np.float32)
    if activations == "int8":
        qx, s = quantize_activations(x)
        lo, hi = INT8_ACTIVATION_SCALE_RANGE
        with np.errstate(invalid="ignore"):
            if np.any((s != 0) & np.isfinite(s) & ((s < lo) | (s > hi))):
                activations = "float32"
    if activations == "int8":
        xd = qx.astype(np.float64) * np.repeat(s.astype(np.float64), BLOCK, axis=1)
    else:
        xd = x.astype(np.float64)
    y = xd @ w.T
    if bias is not None:
        y = y + np.asarray(bias, np.float64)
    return y
