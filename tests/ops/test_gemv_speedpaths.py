"""The decode (GEMV) kernels' fast paths: int8 / int4 weights with int8
activations, the combined scales d = s_w * s_x formed in registers per block (int8) or pair of
blocks (int4), specialized for groups of 32 and for larger groups (kernels/quant.hpp:
qgemv_rows_w8_g, qgemv_rows_int4_pairs_g), the int4 nibble offset taken off in int16 per block;
the vectorised activation quantization (ops/quant.cpp: quantize_acts); and the bfloat16
weights widened by one byte shuffle (kernels/weight16.hpp: load_w16).

Reference formulas:
  int8 activations: per token and block of 32, s_x = max|x| / 127, q_x = rint(x / s_x) (half to
  even, 0 where s_x == 0, NaN s_x for a block holding NaN / Inf) -- ref_quantize_activations;
  y[t, r] = sum_b s_w[r, g(b)] * s_x[t, b] * sum_{i in b} code_w[r, i] * q_x[t, i]  (float64:
  ref_quantized_linear(..., activations="int8")), within float32 accumulation error relative
  to the sum of |terms|.
  16-bit weights: y = x . widen(W)^T, bit for bit the float32 path on the widened weights (the
  same operations), and within float32 accumulation error of the float64 product.
Every SIMD path (``isa``), chunk tails (blocks per row not a multiple of 8, odd for int4 pairs),
rows 1, 7, 31, 33, 1025 (not multiples of the 4-row step), tokens 1-8, 1 vs 2 threads bitwise.
"""

from __future__ import annotations

import llmkernels as lk
import ml_dtypes
import numpy as np
import pytest
from llmkernels import _core
from llmkernels.reference import dequantize as ref_dequantize
from llmkernels.reference import quantize_activations as ref_quantize_activations
from llmkernels.reference import quantized_linear as ref_quantized_linear

ROWS = [1, 7, 31, 33, 1025]


def weights(rng: np.random.Generator, rows: int, k: int) -> np.ndarray:
    w = rng.standard_normal((rows, k)).astype(np.float32) * 0.02
    w *= rng.uniform(0.2, 3.0, size=(rows, 1)).astype(np.float32)  # rows of different scales
    return w


def check_int8_acts(y: np.ndarray, x: np.ndarray, q, s, bits: int, g: int) -> None:
    """y against the float64 formula, within 1e-5 of the sum of |terms| (float32 rounding of
    the per-block products and of the accumulation, whatever the cancellation)."""
    ref = ref_quantized_linear(x, q, s, bits, g, activations="int8")
    qx, sx = ref_quantize_activations(x)
    xa = np.abs(qx.astype(np.float64) * np.repeat(sx.astype(np.float64), 32, axis=1))
    wa = np.abs(ref_dequantize(q, s, bits, g).astype(np.float64))
    bound = 1e-5 * (xa @ wa.T) + 1e-30
    assert y.dtype == np.float32 and y.shape == ref.shape
    err = np.abs(y.astype(np.float64) - ref)
    assert np.all(err <= bound), f"max err / bound = {np.max(err / bound)}"


# --- int8 / int4 weights, int8 activations -------------------------------------------------------


@pytest.mark.parametrize("bits", [8, 4])
@pytest.mark.parametrize("rows", ROWS)
@pytest.mark.parametrize("nblocks", [1, 2, 3, 7, 8, 9, 16, 17, 65])
def test_chunk_tails(isa: str, bits: int, rows: int, nblocks: int) -> None:
    """Blocks per row around the 8-block chunk (and odd counts: the int4 single last block)."""
    if rows == 1025 and nblocks > 17:
        pytest.skip("the float64 reference of the largest shape is slow; 65 blocks run below")
    rng = np.random.default_rng(rows * 1000 + nblocks)
    k = 32 * nblocks
    q, s = lk.quantize(weights(rng, rows, k), bits, 32)
    for m in (1, 2, 3, 4, 5, 8):
        x = rng.standard_normal((m, k)).astype(np.float32)
        check_int8_acts(lk.quantized_linear(x, q, s, bits, 32), x, q, s, bits, 32)


@pytest.mark.parametrize("bits", [8, 4])
@pytest.mark.parametrize("g", [32, 64, 128])
@pytest.mark.parametrize("ngroups", [1, 3, 17, 65, 130])
def test_group_sizes_and_scale_refills(isa: str, bits: int, g: int, ngroups: int) -> None:
    """Groups spanning 1, 2 or 4 blocks (a group's scale read per block or pair of blocks), up
    to 130 groups a row (past the 64 groups a chunk of the float-activation path holds)."""
    rng = np.random.default_rng(g * 100 + ngroups)
    k, rows = g * ngroups, 9
    q, s = lk.quantize(weights(rng, rows, k), bits, g)
    for m in (1, 2, 4):
        x = rng.standard_normal((m, k)).astype(np.float32)
        check_int8_acts(lk.quantized_linear(x, q, s, bits, g), x, q, s, bits, g)


def test_int8_codes_minus_128_in_chunks(isa: str) -> None:
    """A stored -128 (valid int8, not made by quantize) in full and partial chunks: |w| = 128
    times sign(x, w) (the activation codes never reach -128)."""
    rng = np.random.default_rng(5)
    k, rows = 32 * 11, 33
    q, s = lk.quantize(weights(rng, rows, k), 8, 32)
    q[::3, ::5] = -128
    q[4] = -128
    for m in (1, 3):
        x = rng.standard_normal((m, k)).astype(np.float32)
        check_int8_acts(lk.quantized_linear(x, q, s, 8, 32), x, q, s, 8, 32)


@pytest.mark.parametrize("bits", [8, 4])
def test_extreme_codes_do_not_overflow(isa: str, bits: int) -> None:
    """Every weight at the code of largest magnitude (int8 127 / -128, int4 -8 / 7) against
    activations at +-127: the int16 pair sums of maddubs, and for int4 the sum of the two
    halves minus 8 * x, stay in range."""
    k, rows = 32 * 9, 5
    if bits == 8:
        q = np.full((rows, k), 127, np.int8)
        q[1::2] = -128
    else:
        q = np.full((rows, k // 2), 0x00, np.uint8)  # both nibbles 0: code -8
        q[1::2] = 0xFF  # code 7
    s = np.full((rows, k // 32), 1.0, np.float16)
    x = np.where(np.arange(k) % 2 == 0, 1.0, -1.0).astype(np.float32)[None, :].repeat(2, 0)
    x[1] = 1.0
    y = lk.quantized_linear(x, q, s, bits, 32)
    check_int8_acts(y, x, q, s, bits, 32)


def test_activation_codes_exact(isa: str) -> None:
    """The vectorised quantization's codes: identity weights (code 1, scale 1) give
    y = s_x * q_x exactly, so every code is checked -- halves round to even, a zero block,
    blocks of scale 2^-100 and 2^100 (the ends of INT8_ACTIVATION_SCALE_RANGE) -- and a token
    with a NaN or Inf gets s_x = NaN for that block, which makes every output of the token NaN
    (0 * NaN), as the float product would. A block of subnormals (a subnormal s_x) or of values
    near float32's max is outside the range: the call takes float activations, y = x exactly."""
    k = 32 * 6
    q = np.zeros((k, k), np.int8)
    np.fill_diagonal(q, 1)
    s = np.ones((k, k // 32), np.float16)
    x = np.zeros((4, k), np.float32)
    x[0, :32] = np.arange(32) - 15.5
    x[0, 0] = 127.0  # s_x = 1: x / s_x = the halves themselves
    x[0, 32:64] = np.linspace(-3, 3, 32)
    x[0, 96:128] = np.float32(127 * 2.0**-100) * np.linspace(-1, 1, 32, dtype=np.float32)
    x[0, 128:160] = np.float32(127 * 2.0**100) * np.linspace(-0.5, 1, 32, dtype=np.float32)
    x[1] = np.random.default_rng(0).standard_normal(k).astype(np.float32) * 10
    x[2] = x[1]
    x[2, 40] = np.nan
    x[3] = x[1]
    x[3, 170] = -np.inf
    y = lk.quantized_linear(x, q, s, 8, 32)
    qx, sx = ref_quantize_activations(x[:2])
    want = (qx.astype(np.float32) * np.repeat(sx, 32, axis=1)).astype(np.float32)
    np.testing.assert_array_equal(y[:2], want)
    assert list(qx[0, 1:6]) == [-14, -14, -12, -12, -10]  # -14.5 -> -14, -13.5 -> -14, ...
    assert (sx[0, 3], sx[0, 4]) == (2.0**-100, 2.0**100)
    assert np.all(np.isnan(y[2:]))
    for block in (np.full(32, 1e-40), np.linspace(-1e30, 3e38, 32)):  # outside: float acts
        x[0, 96:128] = block
        x[0, 100] = 3e-40
        y = lk.quantized_linear(x, q, s, 8, 32)
        np.testing.assert_array_equal(y[:2], x[:2])
        with np.errstate(invalid="ignore"):  # the float product: 0 * NaN, 0 * -inf
            np.testing.assert_array_equal(y[2:], x[2:] @ q.T.astype(np.float32))


@pytest.mark.parametrize("bits", [8, 4])
@pytest.mark.parametrize("m", [1, 2, 3, 4, 8])
def test_thread_counts_bitwise(threads: None, bits: int, m: int) -> None:
    """Row blocks taken by whichever thread is free, and 2 or 4 stripes: an output's arithmetic
    does not depend on which block or thread computes it. 1025 rows (a row tail), 11 blocks (a
    chunk tail); 3 threads on any host (more threads than cores: a different schedule)."""
    rng = np.random.default_rng(m)
    k, rows = 32 * 11, 1025
    q, s = lk.quantize(weights(rng, rows, k), bits, 32)
    x = rng.standard_normal((m, k)).astype(np.float32)
    lk.set_num_threads(1)
    y1 = lk.quantized_linear(x, q, s, bits, 32)
    for n in (2, 3):
        lk.set_num_threads(n)
        np.testing.assert_array_equal(lk.quantized_linear(x, q, s, bits, 32), y1)


def test_float64_and_strided_input(isa: str) -> None:
    """x converted (float64, non-contiguous) before the int8 path: the same as float32 x."""
    rng = np.random.default_rng(3)
    k, rows = 32 * 9, 31
    q, s = lk.quantize(weights(rng, rows, k), 4, 32)
    x64 = rng.standard_normal((3, 2 * k))[:, ::2]
    y = lk.quantized_linear(x64, q, s, 4, 32)
    x32 = np.ascontiguousarray(x64, dtype=np.float32)
    np.testing.assert_array_equal(y, lk.quantized_linear(x32, q, s, 4, 32))
    check_int8_acts(y, x32, q, s, 4, 32)


# --- 16-bit weights --------------------------------------------------------------------------

FORMATS = {"bfloat16": ml_dtypes.bfloat16, "float16": np.float16}


def rounded(rng: np.random.Generator, rows: int, k: int, fmt: str) -> tuple[np.ndarray, np.ndarray]:
    low = np.ascontiguousarray(
        rng.standard_normal((rows, k), dtype=np.float32).astype(FORMATS[fmt])
    )
    return low.view(np.uint16), low.astype(np.float32)


@pytest.mark.parametrize("fmt", list(FORMATS))
@pytest.mark.parametrize("rows", ROWS)
@pytest.mark.parametrize("k", [1, 7, 8, 9, 15, 16, 17, 31, 33, 1025])
def test_w16_gemv_equals_float32_on_widened(isa: str, fmt: str, rows: int, k: int) -> None:
    """y = x . widen(W)^T: bit for bit the float32 GEMV on the widened weights (same lanes,
    same operations), and within float32 accumulation error of the float64 product."""
    rng = np.random.default_rng(rows * 7 + k)
    words, wide = rounded(rng, rows, k, fmt)
    for m in (1, 2, 3, 4, 5, 8):
        x = rng.standard_normal((m, k), dtype=np.float32)
        got = _core._linear(x, words, fmt, None, None)
        np.testing.assert_array_equal(got, _core._linear(x, wide, "float32", None, None))
        ref = x.astype(np.float64) @ wide.astype(np.float64).T
        bound = 1e-6 * k * (np.abs(x).astype(np.float64) @ np.abs(wide).astype(np.float64).T)
        assert np.all(np.abs(got - ref) <= bound + 1e-30)


@pytest.mark.parametrize("fmt", list(FORMATS))
def test_w16_special_words(isa: str, fmt: str) -> None:
    """Every 16-bit pattern widens exactly (subnormals, signed zeros, Inf, NaN): against the
    float32 path on the widened weights, one word per column, one-hot tokens."""
    words = np.arange(65536, dtype=np.uint32).astype(np.uint16).reshape(-1, 256)  # (256, 256)
    wide = words.view(FORMATS[fmt]).astype(np.float32)
    x = np.eye(256, dtype=np.float32)[:8]
    got = _core._linear(x, np.ascontiguousarray(words), fmt, None, None)
    want = _core._linear(x, wide, "float32", None, None)
    np.testing.assert_array_equal(got, want)  # NaN positions equal too
    finite = np.all(np.isfinite(wide), axis=1)  # rows without Inf / NaN (0 * Inf is NaN)
    np.testing.assert_array_equal(got[:, finite], wide[finite, :8].T)


@pytest.mark.parametrize("fmt", list(FORMATS))
@pytest.mark.parametrize("m", [1, 2, 4])
def test_w16_thread_counts_bitwise(threads: None, fmt: str, m: int) -> None:
    rng = np.random.default_rng(m)
    words, _ = rounded(rng, 1025, 1025, fmt)
    x = rng.standard_normal((m, 1025), dtype=np.float32)
    lk.set_num_threads(1)
    y1 = _core._linear(x, words, fmt, None, None)
    for n in (2, 3):
        lk.set_num_threads(n)
        np.testing.assert_array_equal(_core._linear(x, words, fmt, None, None), y1)


@pytest.mark.parametrize("rows", [33, 1025, 4099])
@pytest.mark.parametrize("m", [1, 3])
def test_f32_gemv_thread_counts_bitwise(threads: None, rows: int, m: int) -> None:
    """The float32 GEMV's rows in blocks taken by whichever thread is free: the same bits at
    1, 2 and 3 threads, and those of the float64 product within float32 rounding."""
    rng = np.random.default_rng(rows + m)
    w = rng.standard_normal((rows, 515), dtype=np.float32)
    x = rng.standard_normal((m, 515), dtype=np.float32)
    bias = rng.standard_normal(rows, dtype=np.float32)
    lk.set_num_threads(1)
    y1 = _core._linear(x, w, "float32", bias, None)
    for n in (2, 3):
        lk.set_num_threads(n)
        np.testing.assert_array_equal(_core._linear(x, w, "float32", bias, None), y1)
    ref = x.astype(np.float64) @ w.T.astype(np.float64) + bias
    np.testing.assert_allclose(y1, ref, rtol=0, atol=1e-4 * np.abs(ref).max())
