"""Decode projections on short rows and at the blocking boundaries: the float GEMV
(kernels/gemv.hpp ``gemv_tokens``) and the AVX2 int8-activation GEMV (kernels/quant.hpp
``qgemv_tokens``) take rows in 4 stripes (rows r, r + n/4, ... together) and the n % 4 left one at
a time; the other integer paths take rows of at most 2 KiB (``kQGemvShortRowBytes``: int8 codes
k <= 2048, int4 k <= 4096) one at a time, longer ones in blocks of consecutive rows. A row's
arithmetic is the same either way (the same accumulators, the same order), so:

* 16-bit weights equal the float32 path on the widened weights bit for bit on both sides of the
  boundary -- also where one format is below it and the other above (k = 1024: 2 KiB of bf16,
  4 KiB of float32);
* a row's result is that of the row alone, and does not depend on the thread count;
* against the float64 reference: ``|y - x . W^T| <= gamma_(k+2) * |x| . |W|^T`` (a float32 sum);
  int8 / int4 codes against ``ref_quantized_linear(..., "int8")``.

Every SIMD path (``isa``), rows 1, 7, 31, 33, 1025, tokens 1-5 (the 4-token passes and a tail).
"""

from __future__ import annotations

import llmkernels as lk
import ml_dtypes
import numpy as np
import pytest
from llmkernels import _core
from op_helpers import check_fma_bound, gemv_tokens

# k on both sides of 2 KiB rows for float32 (512 | 513) and for 16-bit weights (1024 | 1025)
KS = [512, 513, 1024, 1025]


@pytest.mark.parametrize("k", KS)
@pytest.mark.parametrize("m", [1, 2, 5])
@pytest.mark.parametrize("fmt", ["bfloat16", "float16"])
def test_16_bit_equals_float32_on_the_widened_weights(isa: str, fmt: str, m: int, k: int) -> None:
    rng = np.random.default_rng(k * 31 + m)
    low_t = ml_dtypes.bfloat16 if fmt == "bfloat16" else np.float16
    for rows in (1, 7, 31, 33, 1025):
        low = np.ascontiguousarray(rng.standard_normal((rows, k), dtype=np.float32).astype(low_t))
        wide = low.astype(np.float32)
        x = rng.standard_normal((m, k), dtype=np.float32)
        bias = rng.standard_normal(rows, dtype=np.float32)
        y0 = rng.standard_normal((m, rows), dtype=np.float32)
        for b, y in ((None, None), (bias, y0)):
            got = _core._linear(x, low.view(np.uint16), fmt, b, y)
            want = _core._linear(x, wide, "float32", b, y)
            np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("k", KS)
@pytest.mark.parametrize("m", [1, 3, 4, 5])
def test_float32_against_float64(isa: str, m: int, k: int) -> None:
    rng = np.random.default_rng(k + m)
    for rows in (1, 7, 31, 33, 1025):
        w = rng.standard_normal((rows, k), dtype=np.float32)
        x = rng.standard_normal((m, k), dtype=np.float32)
        bias = rng.standard_normal(rows, dtype=np.float32)
        check_fma_bound(_core._linear(x, w, "float32", bias, None), x, w, bias)


@pytest.mark.parametrize("k", KS)
@pytest.mark.parametrize("fmt", ["float32", "bfloat16"])
def test_bitwise_across_thread_counts(threads: None, fmt: str, k: int) -> None:
    rng = np.random.default_rng(k)
    w = rng.standard_normal((1030, k), dtype=np.float32)  # several 256-row thread blocks
    words = w if fmt == "float32" else np.ascontiguousarray(w.astype(ml_dtypes.bfloat16))
    stored = words if fmt == "float32" else words.view(np.uint16)
    x = rng.standard_normal((3, k), dtype=np.float32)
    lk.set_num_threads(1)
    want = _core._linear(x, stored, fmt, None, None)
    for t in (2, 3):
        lk.set_num_threads(t)
        np.testing.assert_array_equal(_core._linear(x, stored, fmt, None, None), want)


# int8 / int4 codes with int8 activations (kernels/quant.hpp, kQGemvShortRowBytes): rows of at
# most 2 KiB of codes one at a time, longer ones in blocks of 4 (2 from 3 tokens)
QKS = {8: [2048, 2080], 4: [4096, 4128]}


@pytest.mark.parametrize("bits", [8, 4])
@pytest.mark.parametrize("m", [1, 3, 5])
def test_quantized_rows_do_not_depend_on_the_block(isa: str, bits: int, m: int) -> None:
    """Each row's result is that of the same row alone (a 1-row matrix: the single-row kernel),
    on both sides of the boundary, and the int8-activation reference within float32 error."""
    from llmkernels.reference import quantized_linear as ref_quantized_linear

    rng = np.random.default_rng(bits * 10 + m)
    for k in QKS[bits]:
        rows = 9
        q, s = lk.quantize(rng.standard_normal((rows, k), dtype=np.float32), bits, 32)
        x = rng.standard_normal((m, k), dtype=np.float32)
        bias = rng.standard_normal(rows, dtype=np.float32)
        y = lk.quantized_linear(x, q, s, bits, 32, bias)
        for r in (0, 3, 8):  # in the first block of 4, the second, the row tail
            alone = lk.quantized_linear(x, q[r : r + 1], s[r : r + 1], bits, 32, bias[r : r + 1])
            np.testing.assert_array_equal(y[:, r : r + 1], alone)
        want = ref_quantized_linear(x, q, s, bits, 32, bias, "int8")
        np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())


@pytest.mark.parametrize("k", KS)
def test_float_rows_do_not_depend_on_the_block(isa: str, k: int) -> None:
    rng = np.random.default_rng(k + 7)
    w = rng.standard_normal((9, k), dtype=np.float32)
    x = rng.standard_normal((2, k), dtype=np.float32)
    y = _core._linear(x, w, "float32", None, None)
    for r in (0, 3, 8):
        np.testing.assert_array_equal(
            y[:, r], _core._linear(x, w[r : r + 1], "float32", None, None)[:, 0]
        )


# More than one group of tokens (kernels/gemv.hpp gemv_impl: groups of 3 tokens for float32 on
# AVX2 / SSE2, 2 for 16-bit weights, 4 on AVX-512) walks the stripes in blocks of rows for all
# the groups; the automatic route keeps float32 and 16-bit weights on it up to gemv_tokens().
@pytest.mark.parametrize("m", [5, 6, 7, 9, 13, 16, 20])
@pytest.mark.parametrize("k", [1, 31, 512, 1025])
def test_token_groups_in_row_blocks(
    isa: str, threads: None, exact_bf16: None, m: int, k: int
) -> None:
    rng = np.random.default_rng(m * 100 + k)
    rows = 1030  # several blocks of rows per stripe, 2 rows left over
    w = rng.standard_normal((rows, k), dtype=np.float32)
    low = np.ascontiguousarray(w.astype(ml_dtypes.bfloat16))
    x = rng.standard_normal((m, k), dtype=np.float32)
    bias = rng.standard_normal(rows, dtype=np.float32)
    y0 = rng.standard_normal((m, rows), dtype=np.float32)
    lk.set_num_threads(1)
    got = _core._linear(x, w, "float32", bias, y0.copy())
    check_fma_bound(got, x, w, bias, y0)
    # a token's result does not depend on which group took it: each equals the token in a
    # call of 2 (one group) -- where the GEMV takes all m (AVX-512: up to 8, then gemm_xt)
    for t in (0, m // 2, m - 1) if m <= gemv_tokens() else ():
        pair = _core._linear(x[[t, t]], w, "float32", bias, y0[[t, t]].copy())
        np.testing.assert_array_equal(got[t], pair[0])
    # 16-bit weights: the float32 kernel's bits on the widened weights
    np.testing.assert_array_equal(
        _core._linear(x, low.view(np.uint16), "bfloat16", bias, y0.copy()),
        _core._linear(x, low.astype(np.float32), "float32", bias, y0.copy()),
    )
    for n in (2, 3):
        lk.set_num_threads(n)
        np.testing.assert_array_equal(_core._linear(x, w, "float32", bias, y0.copy()), got)
