"""The projection path with 16-bit weights (bfloat16, float16; kernels/weight16.hpp).

Reference (the formula): ``y = x . widen(W)^T (+ bias) (+ y)``, where ``widen`` is the exact
conversion of the 16-bit words to float32 (bf16: the high half of the float32; f16: IEEE
binary16), accumulated in float32. The kernels mirror the float32 ones operation for
operation, so up to 511 tokens the result equals the float32 path on the widened weights bit
for bit; beyond (where float32 goes to the BLAS) it is compared with a float64 reference.
Every SIMD path (``isa``), tails 1, 7, 31, 33, 1025, and thread counts 1-3.
"""

from __future__ import annotations

import llmkernels as lk
import ml_dtypes
import numpy as np
import pytest
from llmkernels import _core

# the exact 16-bit path (the float32 model of the rounded weights), whatever the CPU
pytestmark = pytest.mark.usefixtures("exact_bf16")

FORMATS = {"bfloat16": ml_dtypes.bfloat16, "float16": np.float16}


def round_weights(w: np.ndarray, fmt: str) -> tuple[np.ndarray, np.ndarray]:
    """(uint16 words, their exact float32 values) of ``w`` rounded to ``fmt``."""
    low = np.ascontiguousarray(w.astype(FORMATS[fmt]))
    return low.view(np.uint16), low.astype(np.float32)


def ref_linear(x, w, bias=None, y=None):
    """float64 reference of y = x . w^T (+ bias) (+ y)"""
    out = x.astype(np.float64) @ w.astype(np.float64).T
    if bias is not None:
        out += bias
    if y is not None:
        out += y
    return out


def linear(x, words, fmt, bias=None, y=None):
    return _core._linear(x, words, fmt, bias, y)


@pytest.mark.parametrize("fmt", list(FORMATS))
@pytest.mark.parametrize("m", [1, 2, 3, 4, 5, 7, 8, 9, 31, 33, 100])
@pytest.mark.parametrize("k", [1, 7, 31, 33, 1025])
def test_equals_float32_path_on_widened_weights(isa: str, fmt: str, m: int, k: int) -> None:
    rng = np.random.default_rng(m * 7919 + k)
    for n in (1, 7, 33, 300):
        x = rng.standard_normal((m, k), dtype=np.float32)
        words, wide = round_weights(rng.standard_normal((n, k), dtype=np.float32), fmt)
        bias = rng.standard_normal(n, dtype=np.float32)
        y0 = rng.standard_normal((m, n), dtype=np.float32)
        for b, y in ((None, None), (bias, None), (bias, y0), (None, y0)):
            got = linear(x, words, fmt, b, y)
            want = linear(x, wide, "float32", b, y)
            np.testing.assert_array_equal(got, want)
            np.testing.assert_allclose(got, ref_linear(x, wide, b, y), rtol=1e-4, atol=1e-4 * k)


@pytest.mark.parametrize("fmt", list(FORMATS))
@pytest.mark.parametrize("m", [512, 601])
def test_long_prefill(isa: str, fmt: str, m: int, threads: None) -> None:
    # above 511 tokens float32 goes to the BLAS; 16-bit weights to the packed kernel (widening pack)
    rng = np.random.default_rng(m)
    k, n = 33, 70
    x = rng.standard_normal((m, k), dtype=np.float32)
    words, wide = round_weights(rng.standard_normal((n, k), dtype=np.float32), fmt)
    bias = rng.standard_normal(n, dtype=np.float32)
    got = linear(x, words, fmt, bias)
    np.testing.assert_allclose(got, ref_linear(x, wide, bias), rtol=1e-5, atol=1e-5)
    for t in (1, 2, 3):
        lk.set_num_threads(t)
        np.testing.assert_array_equal(linear(x, words, fmt, bias), got)


@pytest.mark.parametrize("fmt", list(FORMATS))
@pytest.mark.parametrize("m", [1, 4, 8, 9, 64])
def test_bitwise_across_thread_counts(isa: str, fmt: str, m: int, threads: None) -> None:
    rng = np.random.default_rng(m)
    k, n = 1025, 1030  # several column blocks of 256
    x = rng.standard_normal((m, k), dtype=np.float32)
    words, _ = round_weights(rng.standard_normal((n, k), dtype=np.float32), fmt)
    lk.set_num_threads(1)
    want = linear(x, words, fmt)
    for t in (2, 3):
        lk.set_num_threads(t)
        np.testing.assert_array_equal(linear(x, words, fmt), want)


@pytest.mark.parametrize("fmt", list(FORMATS))
@pytest.mark.parametrize("k", [16, 17])
@pytest.mark.parametrize("m", [1, 9])
def test_every_16_bit_pattern_converts_exactly(isa: str, fmt: str, k: int, m: int) -> None:
    # row r holds pattern r at column r % k, zero words elsewhere; x is one-hot at that column,
    # so y is exactly the widened pattern (inf and NaN included): the vector lanes (k = 16) and
    # the scalar tail (column 16 when k = 17) of both kernels
    patterns = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)
    n = patterns.size
    cols = np.arange(n) % k
    words = np.zeros((n, k), np.uint16)
    words[np.arange(n), cols] = patterns
    want = patterns.view(FORMATS[fmt]).astype(np.float32)
    for c in range(k):
        x = np.zeros((m, k), np.float32)
        x[:, c] = 1.0
        rows = cols == c
        got = linear(x, words[rows], fmt)
        for t in range(m):
            np.testing.assert_array_equal(got[t], want[rows])


def test_errors() -> None:
    x = np.ones((2, 4), np.float32)
    with pytest.raises(ValueError, match=r"^\[_linear\] w's itemsize"):
        linear(x, np.ones((3, 4), np.float32), "bfloat16")
    with pytest.raises(ValueError, match=r"^\[_linear\] w must have shape"):
        linear(x, np.ones((3, 5), np.uint16), "bfloat16")
    with pytest.raises(ValueError, match="weight dtype must be"):
        linear(x, np.ones((3, 4), np.uint16), "int3")
