"""Group-wise int8 / int4 weights: :func:`quantize`, :func:`dequantize`, :func:`quantized_linear`,
whose NumPy twins (the specification; the C++ quantization gives the same bits) are
:mod:`llmkernels.reference`'s ``quantize``, ``dequantize`` and ``quantized_linear``.

Format (docs/quantization.md): a weight matrix ``w`` (rows, k) -- rows are output features, as
HF stores ``nn.Linear`` weights -- is quantized along k in groups of ``group_size`` (32, 64 or
128) elements, one float16 scale per (row, group); the dequantized weight is
``code * scale`` (exact in float32).

* ``bits=8``: ``scale`` = the smallest float16 >= max|w| / 127, ``code = rint(w / scale)`` in
  [-127, 127]; ``q`` int8 (rows, k).
* ``bits=4`` (llama.cpp's Q4_0): ``scale`` = (the element of largest magnitude) / -8, rounded
  away from zero to float16, ``code = rint(w / scale)`` clamped to [-8, 7]; ``q`` uint8
  (rows, k / 2) holding ``code + 8``: in every block of 32 elements, element i in the low nibble
  of byte i and element i + 16 in the high nibble.

``rint`` rounds half to even; divisions are float32.
"""

from __future__ import annotations

import math
import numbers
from typing import Any

import numpy as np

from . import _core
from ._ops import BF16, as_array, is_torch_bf16

__all__ = ["dequantize", "int8_activations_used", "quantize", "quantized_linear"]

# The activations of quantized_linear's decode path by default: see docs/quantization.md
DEFAULT_ACTIVATIONS = "int8"
# Up to this many tokens (rows of x) activations="int8" quantizes x on every path: the
# matrix-vector kernel (on AVX2 without VNNI only up to 5 tokens of int8 weights, 8 of int4, where
# the integer tile kernel is faster and gives the same bits); above, the integer prefill kernels
# (AVX2 and up; SSE2: the GEMM with float32 activations). activations="float32" takes the GEMM
# from FLOAT_GEMV_TOKENS + 1 tokens. drivers/qlinear.cpp's kGemvMaxTokensInt8 / kGemvMaxTokens.
INT8_ACTIVATION_TOKENS = 16
FLOAT_GEMV_TOKENS = 8


def _as_f32(name: str, fn: str, a: Any) -> np.ndarray:
    if is_torch_bf16(a):  # no __array__ for bfloat16: its bits, as the functional ops take it
        return np.ascontiguousarray(as_array(fn, name, a), dtype=np.float32)
    try:
        arr = np.asarray(a)
    except Exception as exc:  # ragged lists and the like
        raise TypeError(f"[{fn}] {name} could not be converted to an array: {exc}") from None
    if arr.dtype == BF16:  # ml_dtypes' bfloat16 (a bf16 model's state_dict): widened exactly
        return np.ascontiguousarray(arr, dtype=np.float32)
    if arr.dtype.kind not in "fiub":
        raise TypeError(f"[{fn}] {name} must be a real array, got dtype {arr.dtype}")
    return np.ascontiguousarray(arr, dtype=np.float32)


def _check_args(fn: str, bits: Any, group_size: Any) -> tuple[int, int]:
    """``bits`` (4 or 8) and ``group_size`` (32, 64 or 128): Python or NumPy integers (not bool,
    float or str), checked here, before the C++ call (whose own check would see a converted
    value, or refuse the call with pybind11's dump of the signatures)."""
    for name, value, allowed, text in (
        ("bits", bits, (4, 8), "4 or 8"),
        ("group_size", group_size, (32, 64, 128), "32, 64 or 128"),
    ):
        if (
            isinstance(value, (bool, np.bool_))
            or not isinstance(value, numbers.Integral)
            or int(value) not in allowed
        ):
            raise ValueError(f"[{fn}] {name} must be {text}, got {repr(value)[:40]}")
    return int(bits), int(group_size)


def quantize(w: Any, bits: int = 8, group_size: int = 32) -> tuple[np.ndarray, np.ndarray]:
    """Quantize ``w`` (rows, k) group-wise along k: returns ``(q, scales)``.

    ``q`` is int8 (rows, k) for ``bits=8`` and uint8 (rows, k / 2) for ``bits=4`` (two codes a
    byte, llama.cpp's Q4_0 order); ``scales`` is float16 (rows, k / group_size). k must be a
    multiple of ``group_size`` (32, 64 or 128) and ``w`` finite. Bit-identical to
    :func:`ref_quantize`.

    Examples:
        >>> import numpy as np, llmkernels as lk
        >>> w = np.linspace(-1, 1, 64, dtype=np.float32).reshape(2, 32)
        >>> q, s = lk.quantize(w, bits=8, group_size=32)
        >>> q.dtype, q.shape, s.dtype, s.shape
        (dtype('int8'), (2, 32), dtype('float16'), (2, 1))
        >>> bool(np.abs(lk.dequantize(q, s, 8, 32) - w).max() <= s.max() / 2)
        True
    """
    bits, group_size = _check_args("quantize", bits, group_size)
    return _core.quantize(_as_f32("w", "quantize", w), bits, group_size)


def dequantize(
    q: np.ndarray, scales: np.ndarray, bits: int = 8, group_size: int = 32
) -> np.ndarray:
    """The float32 (rows, k) matrix ``code * scale`` of :func:`quantize`'s ``(q, scales)``.

    Examples:
        >>> import numpy as np, llmkernels as lk
        >>> w = np.array([[0.5, -1.0] * 16], np.float32)
        >>> q, s = lk.quantize(w, bits=4, group_size=32)
        >>> lk.dequantize(q, s, bits=4, group_size=32)[0, :2]
        array([ 0.5, -1. ], dtype=float32)
    """
    bits, group_size = _check_args("dequantize", bits, group_size)
    return _core.dequantize(np.ascontiguousarray(q), np.ascontiguousarray(scales), bits, group_size)


def int8_activations_used(m: int) -> bool:
    """Whether ``quantized_linear(..., activations="int8")`` (and a quantized model's
    projections) quantize the activations of an ``m``-token call on this host: always in the
    matrix-vector kernel (``m <= INT8_ACTIVATION_TOKENS``); above, wherever an integer prefill
    kernel runs (``llmkernels._core.int8_dot()``: ``"amx"``, ``"vnni"`` / ``"vnni512"``
    (AVX512_VNNI) or
    ``"avx2"``: every CPU with AVX2), else -- on the SSE2 path -- the GEMM takes float32
    activations."""
    return m <= INT8_ACTIVATION_TOKENS or _core.int8_dot() != "none"


def quantized_linear(
    x: Any,
    q: np.ndarray,
    scales: np.ndarray,
    bits: int = 8,
    group_size: int = 32,
    bias: Any = None,
    *,
    activations: str = DEFAULT_ACTIVATIONS,
) -> np.ndarray:
    """``x @ dequantize(q, scales).T + bias`` without a dequantized copy of the matrix.

    ``x`` (..., k) float32 (converted if needed); returns (..., rows) float32. Up to 16 tokens
    (``INT8_ACTIVATION_TOKENS``) the product is a matrix-vector kernel reading the codes in
    place (on AVX2 without VNNI up to 5 tokens of int8 weights, 8 of int4; on 256-bit VNNI up to
    4 and 8; on 512-bit VNNI 6 at one thread, 5 at more; on AMX up to 5 of int8 and 7 of int4
    at one thread, 8 and 9 at more: above, the integer kernel of longer calls, with the same
    bits), with ``activations="int8"`` (the default: the
    faster, see docs/quantization.md) quantizing each token in blocks of 32 (llama.cpp's q8_0)
    for integer dot products
    (:func:`ref_quantized_linear` with ``activations="int8"`` is its formula; a call with a
    block of |x| beyond ~1.6e32 or below ~1e-28, not 0, takes float32 activations:
    ``reference.INT8_ACTIVATION_SCALE_RANGE``).
    ``activations="float32"`` keeps x in float32 and dequantizes the weights in registers (the
    float64 product of the dequantized weights within float32 rounding), up to 8 tokens
    (``FLOAT_GEMV_TOKENS``) in the matrix-vector kernel. More tokens, ``activations="int8"``:
    integer dot products (AMX ``tdpbssd``, AVX512_VNNI ``vpdpbusd`` or AVX2 ``vpmaddubsw``),
    each token's result bit for bit what the matrix-vector kernel gives it alone
    (:func:`int8_activations_used`); ``activations="float32"`` (and the SSE2 path): the packed
    GEMM, the weights dequantized as they are packed and multiplied in float32.

    Examples:
        >>> import numpy as np, llmkernels as lk
        >>> rng = np.random.default_rng(0)
        >>> w = rng.standard_normal((64, 128)).astype(np.float32)
        >>> q, s = lk.quantize(w, bits=4, group_size=32)
        >>> x = rng.standard_normal((1, 128)).astype(np.float32)
        >>> y = lk.quantized_linear(x, q, s, bits=4, group_size=32)
        >>> y.shape, y.dtype
        ((1, 64), dtype('float32'))
        >>> exact = x @ lk.dequantize(q, s, bits=4, group_size=32).T
        >>> bool(np.allclose(lk.quantized_linear(x, q, s, 4, 32, activations="float32"), exact,
        ...                  rtol=1e-5, atol=1e-4))
        True
    """
    bits, group_size = _check_args("quantized_linear", bits, group_size)
    if not isinstance(activations, str) or activations not in ("float32", "int8"):
        raise ValueError(
            f"[quantized_linear] activations must be 'float32' or 'int8', got "
            f"{repr(activations)[:40]}"
        )
    try:
        zero_d = np.ndim(x) == 0
    except Exception:  # not an array: _as_f32 says so, naming x
        zero_d = False
    if zero_d:
        raise ValueError("[quantized_linear] x must have shape (..., k), got a 0-d array")
    xa = _as_f32("x", "quantized_linear", x)
    lead = xa.shape[:-1]
    x2 = xa.reshape(math.prod(lead), xa.shape[-1])  # (-1 is ambiguous when k = 0)
    b = None if bias is None else _as_f32("bias", "quantized_linear", bias)
    y = _core.quantized_linear(
        x2,
        np.ascontiguousarray(q),
        np.ascontiguousarray(scales),
        bits,
        group_size,
        b,
        activations,
    )
    return y.reshape(*lead, y.shape[-1])
