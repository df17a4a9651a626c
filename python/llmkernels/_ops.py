"""Public ops: argument handling around the C++ kernels in ``llmkernels._core``.

Each op first offers its arguments, as given, to its ``_core._fast_<op>`` entry: the common
case (ndarrays of native float32/float64, C-contiguous, one dtype, ``out`` absent or not
overlapping an input except as the exact same array where the op allows it) is checked,
allocated and computed there in one C++ call. Anything else -- array-likes, other or mixed
dtypes, byte-swapped or strided arrays, an overlapping ``out`` -- returns None and takes the
conversion path below, which only converts and calls the C++ entry again: every argument is
checked there, once (messages start with ``[op]`` and name the argument; ``cpp/ops/<op>.cpp``).
``swiglu_ffn`` only converts and calls ``_core.swiglu_ffn``, which checks the shapes.

The conversion path resolves the result dtype (float32 stays float32, float64 stays float64,
integers/bools become float64, mixed float32/float64 promote to float64), makes C-contiguous
copies only where needed, and copies inputs that overlap ``out`` (other than exactly, where the
op allows it); ``out`` is checked completely in C++ before anything is written.

Low-precision arrays (``np.float16``, ``ml_dtypes.bfloat16``, torch bfloat16/float16 tensors)
are widened to float32 (exactly), computed by the same call, and the result is rounded once to
their dtype (``out=`` of that dtype is checked first, then written); mixed with float32 or
float64 they promote as NumPy promotes.
"""

from __future__ import annotations

import os
import threading
from collections import OrderedDict
from typing import Any

import ml_dtypes
import numpy as np

from . import _core

__all__ = [
    "attention",
    "rms_norm",
    "layer_norm",
    "silu",
    "swiglu",
    "swiglu_ffn",
    "rope",
]


# ----------------------------------------------------------------------------------------------
# argument helpers
# ----------------------------------------------------------------------------------------------


_F32, _F64 = np.dtype(np.float32), np.dtype(np.float64)
BF16 = np.dtype(ml_dtypes.bfloat16)
# computed in float32 and returned in their own dtype (low-precision arrays, as NumPy's float16 ops)
_LOW = (np.dtype(np.float16), BF16)


def _torch_bf16_to_numpy(value: Any) -> np.ndarray:
    """A torch bfloat16 tensor as an ml_dtypes.bfloat16 array (the same bits; NumPy's
    ``__array__`` protocol has no bfloat16)."""
    import torch  # already imported: value is one of its tensors

    return value.detach().cpu().contiguous().view(torch.int16).numpy().view(BF16)


def is_torch_bf16(value: Any) -> bool:
    return (
        type(value).__module__.partition(".")[0] == "torch"
        and str(getattr(value, "dtype", "")) == "torch.bfloat16"
    )


def as_array(fn: str, name: str, value: Any) -> np.ndarray:
    """``np.asarray`` with a clear error for things that are not numeric arrays."""
    if isinstance(value, np.ndarray):
        arr = value
    elif is_torch_bf16(value):
        if value.requires_grad:  # refused like any tensor that requires grad (__array__ is)
            raise TypeError(
                f"[{fn}] {name} could not be converted to an array: it requires grad "
                "(use tensor.detach())"
            )
        arr = _torch_bf16_to_numpy(value)
    elif not hasattr(value, "__array__") and hasattr(value, "__dlpack__"):
        try:  # e.g. a tensor of another framework that only speaks DLPack
            arr = np.from_dlpack(value)
        except Exception as exc:
            raise TypeError(f"[{fn}] {name} could not be imported via DLPack: {exc}") from None
    else:
        try:
            arr = np.asarray(value)
        except Exception as exc:  # ragged lists and the like
            raise TypeError(f"[{fn}] {name} could not be converted to an array: {exc}") from None
    kind = arr.dtype.kind
    if kind in "iub" or arr.dtype == BF16:
        return arr
    if kind == "f":
        if arr.dtype.itemsize > 8:
            raise TypeError(
                f"[{fn}] {name} has unsupported dtype {arr.dtype}; use float32 or float64"
            )
        if not arr.dtype.isnative:  # e.g. '>f4' from a file: the kernels read native floats
            arr = arr.astype(arr.dtype.newbyteorder("="))
        return arr
    raise TypeError(
        f"[{fn}] {name} has unsupported dtype {arr.dtype}; expected a real floating-point, "
        "integer or bool array"
    )


def _result_dtype(*arrays: np.ndarray | None) -> np.dtype:
    """The dtype an op returns: NumPy's promotion of the float inputs, integers/bools counting
    as float64 (so float32 stays float32, float16 and bfloat16 stay themselves, float32 with
    float64 or an integer array gives float64, bfloat16 with float32 gives float32). bfloat16
    with float16, which NumPy does not promote, gives float32."""
    result = None
    for arr in arrays:
        if arr is None:
            continue
        dt = _F64 if arr.dtype.kind in "iub" else arr.dtype
        if result is None or result == dt:
            result = dt
            continue
        try:
            result = np.promote_types(result, dt)
        except TypeError:  # DTypePromotionError: bfloat16 and float16
            result = _F32
    return _F64 if result is None else result


def _low(*arrays: np.ndarray | None) -> np.dtype | None:
    """The low-precision dtype (float16 / bfloat16) the op returns, or None."""
    dt = _result_dtype(*arrays)
    return dt if dt in _LOW else None


def _up(arr: np.ndarray | None) -> np.ndarray | None:
    """A low-precision operand widened to float32 (exact); others as they are."""
    return arr.astype(_F32) if arr is not None and arr.dtype in _LOW else arr


def _check_out(fn: str, out: Any, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    """out= of a low-precision result (the C++ entries check the float32/float64 ones), with
    their messages."""
    if not isinstance(out, np.ndarray):
        raise TypeError(f"[{fn}] out must be a numpy.ndarray, got {type(out).__name__}")
    if out.dtype != dtype:
        raise TypeError(f"[{fn}] out must have dtype {dtype}, got {out.dtype}")
    if out.shape != tuple(shape):
        raise ValueError(f"[{fn}] out must have shape {tuple(shape)}, got {out.shape}")
    if not out.flags.c_contiguous:
        raise ValueError(f"[{fn}] out must be C-contiguous")
    if not out.flags.writeable:
        raise ValueError(f"[{fn}] out must be writeable (got a read-only array)")
    return out


def _narrow(fn: str, result: np.ndarray, dtype: np.dtype, out: Any = None) -> np.ndarray:
    """The float32 result of a low-precision call rounded to ``dtype`` (to nearest even), into
    ``out`` if given (checked first: nothing is written to an out that does not fit). A value
    past ``dtype``'s range rounds to the infinity of its sign, as IEEE rounding (and torch)
    gives it: that is the answer in that dtype, not an error, so NumPy's overflow warning of
    the cast is silenced."""
    if out is None:
        with np.errstate(over="ignore"):
            return result.astype(dtype)
    _check_out(fn, out, result.shape, dtype)
    with np.errstate(over="ignore"):
        np.copyto(out, result, casting="unsafe")
    return out


def _narrowed(fn: str, r: Any, dtype: np.dtype, out: Any) -> Any:
    """The result(s) of a call computed in a wider dtype, rounded to ``dtype`` (the first into
    ``out`` if given): values past its range round to inf, as IEEE rounding (see _narrow)."""
    if not isinstance(r, tuple):
        return _narrow(fn, r, dtype, out)
    with np.errstate(over="ignore"):
        rest = tuple(a.astype(dtype) for a in r[1:])
    return (_narrow(fn, r[0], dtype, out), *rest)


def _past_range(m: np.ndarray, dtype: np.dtype) -> bool:
    """Whether float array ``m`` has finite entries beyond ``dtype``'s largest finite value."""
    with np.errstate(invalid="ignore"):
        big = np.abs(m) > np.finfo(dtype).max
    return bool(np.any(big & np.isfinite(m)))


def _compute_dtype(*arrays: np.ndarray | None) -> np.dtype:
    """The dtype the kernels run in: the result dtype, float32 for float16/bfloat16 results."""
    dt = _result_dtype(*arrays)
    return _F32 if dt in _LOW else dt


def _contiguous(arr: np.ndarray, dtype: np.dtype) -> np.ndarray:
    return np.ascontiguousarray(arr, dtype=dtype)


def _exact_alias(a: np.ndarray, b: np.ndarray) -> bool:
    return (
        a.__array_interface__["data"][0] == b.__array_interface__["data"][0]
        and a.shape == b.shape
        and a.strides == b.strides
        and a.dtype == b.dtype
    )


def _detach_from_out(arr: np.ndarray, out: np.ndarray, allow_exact: bool) -> np.ndarray:
    """Copy ``arr`` if it overlaps ``out`` in a way the kernel cannot handle.

    Kernels read each element (row, for row-wise ops) before writing the same position, so an
    input that *is* ``out`` is fine; any other overlap would be read after being overwritten.
    """
    if np.may_share_memory(arr, out) and not (allow_exact and _exact_alias(arr, out)):
        return arr.copy()
    return arr


# ----------------------------------------------------------------------------------------------
# normalisation
# ----------------------------------------------------------------------------------------------


def rms_norm(
    x: Any, weight: Any = None, eps: float = 1e-6, *, out: np.ndarray | None = None
) -> np.ndarray:
    """RMSNorm over the last axis: ``x / sqrt(mean(x**2, -1) + eps) * weight``.

    Args:
        x: array of shape ``(..., D)``; float32 or float64 (integers/bools become float64).
        weight: optional scale of shape ``(D,)``.
        eps: added to the mean square, ``>= 0``.
        out: optional C-contiguous, writeable array of the result's shape and dtype; may be ``x``.

    Rows with entries up to 1e30 (float32) are normalised correctly (no overflow).

    Examples:
        >>> import llmkernels as lk, numpy as np
        >>> np.round(lk.rms_norm([[3.0, 4.0]], eps=0.0), 4)
        array([[0.8485, 1.1314]])
    """
    r = _core._fast_rms_norm(x, weight, eps, out)
    if r is not None:
        return r
    fn = "rms_norm"
    x = as_array(fn, "x", x)
    w = None if weight is None else as_array(fn, "weight", weight)
    low = _low(x, w)
    if low is not None:  # float16 / bfloat16: computed in float32, returned in their dtype
        return _narrow(fn, rms_norm(_up(x), _up(w), eps), low, out)
    dtype = _compute_dtype(x, w)
    xc = _contiguous(x, dtype).reshape(x.shape)
    wc = None if w is None else _contiguous(w, dtype).reshape(w.shape)
    if isinstance(out, np.ndarray):
        xc = _detach_from_out(xc, out, allow_exact=True)
        wc = None if wc is None else _detach_from_out(wc, out, allow_exact=False)
    return _core._fast_rms_norm(xc, wc, eps, out)  # checks the arguments (C++)


def layer_norm(
    x: Any,
    weight: Any = None,
    bias: Any = None,
    eps: float = 1e-5,
    *,
    out: np.ndarray | None = None,
) -> np.ndarray:
    """LayerNorm over the last axis: ``(x - mean) / sqrt(var + eps) * weight + bias``.

    The variance is the biased one (divide by D), as in ``torch.nn.functional.layer_norm``.
    ``weight`` and ``bias`` have shape ``(D,)``; ``out`` as in :func:`rms_norm`.

    Examples:
        >>> import llmkernels as lk, numpy as np
        >>> np.round(lk.layer_norm([[1.0, 2.0, 3.0]], eps=0.0), 4)
        array([[-1.2247,  0.    ,  1.2247]])
    """
    r = _core._fast_layer_norm(x, weight, bias, eps, out)
    if r is not None:
        return r
    fn = "layer_norm"
    x = as_array(fn, "x", x)
    w = None if weight is None else as_array(fn, "weight", weight)
    b = None if bias is None else as_array(fn, "bias", bias)
    low = _low(x, w, b)
    if low is not None:  # float16 / bfloat16: computed in float32, returned in their dtype
        return _narrow(fn, layer_norm(_up(x), _up(w), _up(b), eps), low, out)
    dtype = _compute_dtype(x, w, b)
    xc = _contiguous(x, dtype).reshape(x.shape)
    wc = None if w is None else _contiguous(w, dtype).reshape(w.shape)
    bc = None if b is None else _contiguous(b, dtype).reshape(b.shape)
    if isinstance(out, np.ndarray):
        xc = _detach_from_out(xc, out, allow_exact=True)
        wc = None if wc is None else _detach_from_out(wc, out, allow_exact=False)
        bc = None if bc is None else _detach_from_out(bc, out, allow_exact=False)
    return _core._fast_layer_norm(xc, wc, bc, eps, out)  # checks the arguments (C++)


# ----------------------------------------------------------------------------------------------
# activations
# ----------------------------------------------------------------------------------------------


def silu(x: Any, *, out: np.ndarray | None = None) -> np.ndarray:
    """SiLU (swish): ``x * sigmoid(x)``, elementwise, any shape. ``out`` may be ``x``.

    Examples:
        >>> import llmkernels as lk, numpy as np
        >>> np.round(lk.silu([-1.0, 0.0, 1.0]), 4)
        array([-0.2689,  0.    ,  0.7311])
    """
    r = _core._fast_silu(x, out)
    if r is not None:
        return r
    x = as_array("silu", "x", x)
    low = _low(x)
    if low is not None:  # float16 / bfloat16: computed in float32, returned in their dtype
        return _narrow("silu", silu(_up(x)), low, out)
    xc = _contiguous(x, _compute_dtype(x)).reshape(x.shape)
    if isinstance(out, np.ndarray):
        xc = _detach_from_out(xc, out, allow_exact=True)
    return _core._fast_silu(xc, out)  # checks out (C++)


def swiglu(gate: Any, up: Any, *, out: np.ndarray | None = None) -> np.ndarray:
    """SwiGLU gating: ``silu(gate) * up``, elementwise; ``gate`` and ``up`` have the same shape.

    Examples:
        >>> import llmkernels as lk, numpy as np
        >>> np.round(lk.swiglu([1.0, 2.0], [3.0, 0.5]), 4)
        array([2.1932, 0.8808])
    """
    r = _core._fast_swiglu(gate, up, out)
    if r is not None:
        return r
    fn = "swiglu"
    g = as_array(fn, "gate", gate)
    u = as_array(fn, "up", up)
    low = _low(g, u)
    if low is not None:  # float16 / bfloat16: computed in float32, returned in their dtype
        return _narrow(fn, swiglu(_up(g), _up(u)), low, out)
    dtype = _compute_dtype(g, u)
    gc = _contiguous(g, dtype).reshape(g.shape)
    uc = _contiguous(u, dtype).reshape(u.shape)
    if isinstance(out, np.ndarray):
        gc = _detach_from_out(gc, out, allow_exact=True)
        uc = _detach_from_out(uc, out, allow_exact=True)
    return _core._fast_swiglu(gc, uc, out)  # checks the shapes and out (C++)


def swiglu_ffn(
    x: Any,
    w_gate: Any,
    w_up: Any,
    w_down: Any = None,
    *,
    b_gate: Any = None,
    b_up: Any = None,
    b_down: Any = None,
) -> np.ndarray:
    """SwiGLU feed-forward: ``(silu(x @ w_gate + b_gate) * (x @ w_up + b_up)) @ w_down + b_down``.

    Weights are ``(in, out)`` so the formula reads like NumPy: ``w_gate``/``w_up`` are
    ``(D, H)``, ``w_down`` is ``(H, D_out)``. ``x`` is ``(..., D)``. With ``w_down=None`` the
    gated hidden activation ``(..., H)`` is returned. Matmuls run on the package's packed GEMM
    for 24 to 511 rows of ``x``, on OpenBLAS otherwise (the biases are their C operand); the
    gating runs in the package's kernels.

    Examples:
        >>> import llmkernels as lk, numpy as np
        >>> # one scalar: silu(2 * 1.5 + 0.5) * (3 * 1.5)
        >>> np.round(lk.swiglu_ffn([[1.5]], [[2.0]], [[3.0]], b_gate=[0.5]), 4)
        array([[15.2883]])
    """
    # converted here (array-likes, dtype promotion, contiguity); shapes are checked in C++
    # (cpp/ops/swiglu_ffn.cpp), which also handles empty sizes
    fn = "swiglu_ffn"
    names = ("x", "w_gate", "w_up", "w_down", "b_gate", "b_up", "b_down")
    arrays = [
        None if a is None else as_array(fn, name, a)
        for name, a in zip(names, (x, w_gate, w_up, w_down, b_gate, b_up, b_down), strict=True)
    ]
    low = _low(*arrays)
    if low is not None:  # float16 / bfloat16: computed in float32, returned in their dtype
        xu, gu, uu, du, bg, bu, bd = (_up(a) for a in arrays)
        return _narrow(fn, swiglu_ffn(xu, gu, uu, du, b_gate=bg, b_up=bu, b_down=bd), low)
    dtype = _compute_dtype(*arrays)
    # (np.asarray, not _contiguous: a 0-d x must stay 0-d for its error)
    ready = [None if a is None else np.asarray(a, dtype, order="C") for a in arrays]
    return _core.swiglu_ffn(*ready)


# ----------------------------------------------------------------------------------------------
# rotary position embedding
# ----------------------------------------------------------------------------------------------


# cos/sin tables memoised by (positions, frequencies, factor, dtype): every layer of a forward
# pass and every benchmark repeat reuses them. An LRU bounded by bytes (docs/performance.md: at
# most _TABLE_CACHE_BYTES are kept for the life of the process), shared by threads under a lock.
_TABLE_CACHE: OrderedDict[tuple, tuple[np.ndarray, np.ndarray]] = OrderedDict()
# all cached tables together; the C++ fast path keeps the default calls' tables in a map of
# its own of at most 8 MiB (cpp/ops/rope.cpp), which may hold some the LRU has dropped: 32 MiB
_TABLE_CACHE_BYTES = 24 << 20
_TABLE_CACHE_LOCK = threading.Lock()
_table_cache_used = 0


def _table_cache_after_fork_in_child() -> None:
    # another thread of the parent may have held the lock at the fork: it would never be
    # released in the child (where that thread does not exist). A new, empty cache.
    global _TABLE_CACHE_LOCK, _table_cache_used
    _TABLE_CACHE_LOCK = threading.Lock()
    _TABLE_CACHE.clear()
    _table_cache_used = 0


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_table_cache_after_fork_in_child)


def _rope_tables(
    pos: np.ndarray, freqs: np.ndarray, attention_factor: float, dtype: np.dtype
) -> tuple[np.ndarray, np.ndarray]:
    """cos/sin tables (P, half), from the LRU cache when the same call was made recently."""
    global _table_cache_used
    nbytes = 2 * pos.size * freqs.size * np.dtype(dtype).itemsize
    if nbytes > _TABLE_CACHE_BYTES // 4:  # large tables are not kept: they would evict the rest
        return _core.rope_tables(pos, freqs, attention_factor, dtype)
    key = (pos.tobytes(), freqs.tobytes(), attention_factor, np.dtype(dtype).str)
    with _TABLE_CACHE_LOCK:
        hit = _TABLE_CACHE.get(key)
        if hit is not None:
            _TABLE_CACHE.move_to_end(key)
            return hit
    tables = _core.rope_tables(pos, freqs, attention_factor, dtype)  # outside the lock
    for t in tables:
        t.flags.writeable = False
    with _TABLE_CACHE_LOCK:
        if key not in _TABLE_CACHE:
            _TABLE_CACHE[key] = tables
            _table_cache_used += nbytes
        while _table_cache_used > _TABLE_CACHE_BYTES and _TABLE_CACHE:
            _, (c, s_) = _TABLE_CACHE.popitem(last=False)
            _table_cache_used -= c.nbytes + s_.nbytes
    return tables


def rope(
    x: Any,
    positions: Any = None,
    *,
    theta: float = 10000.0,
    inv_freq: Any = None,
    interleaved: bool = False,
    rotary_dim: int | None = None,
    attention_factor: float = 1.0,
    out: np.ndarray | None = None,
) -> np.ndarray:
    """Rotary position embedding of ``x`` of shape ``(..., T, D)``.

    Args:
        x: queries or keys, ``(..., T, D)``.
        positions: integer positions of shape ``(T,)`` or broadcastable to ``x.shape[:-1]``
            (e.g. ``(B, 1, T)`` for per-sequence positions of ``(B, H, T, D)``); default
            ``arange(T)``. Large offsets (1e6 and beyond) are exact: angles are formed in float64.
        theta: RoPE base, used when ``inv_freq`` is not given.
        inv_freq: explicit frequencies ``(rotary_dim // 2,)`` (e.g. from :func:`rope_inv_freq`
            with a scaling dict, or ``[0.1]`` for "0.1 rad/position").
        interleaved: ``False`` pairs ``(x[i], x[i + r/2])`` (rotate_half: HF LLaMA, GPT-NeoX);
            ``True`` pairs ``(x[2i], x[2i+1])`` (original Meta / RoFormer).
        rotary_dim: rotate only the first ``rotary_dim`` features (even, default ``D``).
        attention_factor: multiplies cos and sin (YaRN / longrope, see
            :func:`rope_attention_factor`).
        out: optional output array (may be ``x``).

    Examples:
        >>> import llmkernels as lk, numpy as np
        >>> np.round(lk.rope([[1.0, 0.5]], [1], inv_freq=[0.1]), 4)  # 0.1 rad/position, position 1
        array([[0.9451, 0.5973]])
    """
    # every argument is checked in C++ (cpp/ops/rope.cpp); here only conversions: array-likes,
    # dtype promotion, inv_freq to float64, a copy of x if it overlaps out other than exactly
    tables = _rope_tables
    r = _core._fast_rope(
        x, positions, theta, inv_freq, interleaved, rotary_dim, attention_factor, out, tables
    )
    if r is not None:
        return r
    fn = "rope"
    x = as_array(fn, "x", x)
    low = _low(x)
    if low is not None:  # float16 / bfloat16: computed in float32, returned in their dtype
        r = rope(
            _up(x),
            positions,
            theta=theta,
            inv_freq=inv_freq,
            interleaved=interleaved,
            rotary_dim=rotary_dim,
            attention_factor=attention_factor,
        )
        return _narrow(fn, r, low, out)
    xc = _contiguous(x, _compute_dtype(x)).reshape(x.shape)
    pos = None if positions is None else as_array(fn, "positions", positions)
    freqs = None if inv_freq is None else as_array(fn, "inv_freq", inv_freq).astype(np.float64)
    if isinstance(out, np.ndarray):
        xc = _detach_from_out(xc, out, allow_exact=True)
    return _core._fast_rope(
        xc, pos, theta, freqs, interleaved, rotary_dim, attention_factor, out, tables
    )


# ----------------------------------------------------------------------------------------------
# attention
# ----------------------------------------------------------------------------------------------


def attention(
    q: Any,
    k: Any,
    v: Any,
    *,
    causal: bool = False,
    mask: Any = None,
    scale: float | None = None,
    window: int | None = None,
    softcap: float | None = None,
    sinks: Any = None,
    return_weights: bool = False,
    return_lse: bool = False,
    out: np.ndarray | None = None,
) -> np.ndarray | tuple[np.ndarray, ...]:
    """Scaled dot-product attention ``softmax(q @ k^T * scale + mask) @ v``, fused and streaming.

    Args:
        q: queries ``(B, Hq, Tq, D)`` or ``(Hq, Tq, D)``.
        k: keys ``(B, Hkv, Tk, D)`` / ``(Hkv, Tk, D)``; ``Hq % Hkv == 0`` (grouped-query /
            multi-query attention: query head ``h`` reads KV head ``h // (Hq // Hkv)``, without
            copying K/V per query head).
        v: values ``(B, Hkv, Tk, Dv)`` / ``(Hkv, Tk, Dv)``; ``Dv`` may differ from ``D``.
        causal: bottom-right aligned: query ``i`` may attend key ``j`` iff
            ``j <= i + (Tk - Tq)``, so one decode step against a KV cache is
            ``attention(q[:, :, -1:], k, v, causal=True)``. (PyTorch's ``is_causal`` is
            top-left aligned; the two agree when ``Tq == Tk``.)
        mask: boolean (True = may attend) or additive float mask, broadcastable to
            ``(..., Hq, Tq, Tk)`` — e.g. a key-padding mask ``(B, 1, 1, Tk)``. Combined with
            ``causal``. A query row with nothing to attend gets zeros.
        scale: score multiplier, default ``1 / sqrt(D)``.
        window: sliding window (Mistral, Gemma 2): key ``j`` is visible to query ``i`` only if
            ``(i + Tk - Tq) - j < window`` (transformers' semantics); combined with ``causal``
            and ``mask``. Key tiles outside every row's window are skipped: O(Tq * window).
        softcap: logit soft-capping (Gemma 2): scores become ``softcap * tanh(s / softcap)``
            before the mask is added.
        sinks: ``(Hq,)`` attention sinks (gpt-oss): a per-head logit in each row's softmax
            denominator, with no value.
        return_weights: also return the softmax probabilities ``(..., Hq, Tq, Tk)`` (the only
            case that stores a score matrix; for plots).
        return_lse: also return the natural log-sum-exp of each row's scores ``(..., Hq, Tq)``
            (sink included; ``-inf`` for a row with nothing to attend): attentions over
            disjoint key blocks merge exactly as ``sum_b exp(lse_b - lse) * out_b`` with
            ``lse = logaddexp(lse_1, lse_2, ...)``.
        out: optional C-contiguous output ``(..., Hq, Tq, Dv)``.

    Returns ``out``, then ``weights`` if ``return_weights``, then ``lse`` if ``return_lse``
    (a tuple when either is asked for).

    The kernel never materialises the ``Tq x Tk`` scores: tiles of 64 query rows stream over
    tiles of 64 keys with a running max and sum (online softmax); memory is O((Tq + Tk) * D).

    Examples:
        >>> import llmkernels as lk, numpy as np
        >>> out, w = lk.attention(np.eye(2)[None], np.eye(2)[None], [[[1.0], [3.0]]], scale=1.0,
        ...                       return_weights=True)
        >>> np.round(w, 4)
        array([[[0.7311, 0.2689],
                [0.2689, 0.7311]]])
    """
    # every argument is checked in C++ (cpp/ops/attention.cpp); here only conversions:
    # array-likes, dtype promotion, a float mask to the compute dtype, copies of operands that
    # overlap out
    r = _core._fast_attention(
        q, k, v, causal, scale, out, mask, window, softcap, sinks, return_weights, return_lse
    )
    if r is not None:
        return r
    fn = "attention"
    q, k, v = as_array(fn, "q", q), as_array(fn, "k", k), as_array(fn, "v", v)
    kw = {
        "causal": causal,
        "scale": scale,
        "window": window,
        "softcap": softcap,
        "sinks": sinks,
        "return_weights": return_weights,
        "return_lse": return_lse,
    }
    low = _low(q, k, v)
    if low is not None:  # float16 / bfloat16: computed in float32, returned in their dtype
        return _narrowed(fn, attention(_up(q), _up(k), _up(v), mask=mask, **kw), low, out)
    dtype = _compute_dtype(q, k, v)
    qc, kc, vc = (_contiguous(a, dtype).reshape(a.shape) for a in (q, k, v))
    m = None
    if mask is not None:
        m = as_array(fn, "mask", mask) if is_torch_bf16(mask) else np.asarray(mask)
        if m.dtype.kind == "f" and m.dtype.itemsize > dtype.itemsize and _past_range(m, dtype):
            # a wider mask with finite entries past the compute dtype's range (1e39, float64's
            # min as HF masks with): the cast would make them +-inf (NaN rows, zeros), so the
            # call runs in float64, as the reference, and its results are rounded
            wide = (a.astype(np.float64) for a in (q, k, v))
            return _narrowed(fn, attention(*wide, mask=m, **kw), dtype, out)
        if m.dtype.kind == "f" or m.dtype == BF16:
            m = m.astype(dtype, copy=False)
    s = None
    if sinks is not None:
        s = as_array(fn, "sinks", sinks)
        s = _contiguous(s, dtype).reshape(s.shape)
    if isinstance(out, np.ndarray):  # the kernel reads its inputs after writing out rows
        qc, kc, vc = (_detach_from_out(a, out, allow_exact=False) for a in (qc, kc, vc))
        if m is not None and np.may_share_memory(m, out):
            m = m.copy()
        if s is not None:
            s = _detach_from_out(s, out, allow_exact=False)
    return _core.attention(  # type: ignore[no-any-return]
        qc, kc, vc, causal, scale, out, m, window, softcap, s, return_weights, return_lse
    )
