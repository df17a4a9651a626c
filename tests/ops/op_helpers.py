"""What the per-op tests of tests/ops share: the size/shape/dtype sweeps, the tolerance check,
random data and the non-contiguous layouts. Each test_<op>.py keeps its op's reference formula
beside its tests (as MLX's python/tests/test_fast.py does)."""

from __future__ import annotations

from collections.abc import Callable

import llmkernels as lk
import numpy as np
import pytest
from conftest import TOL

SIZES = [1, 7, 31, 33, 128, 1025, 4096]
LEADS = [(), (3,), (2, 5)]
DTYPES = [np.float32, np.float64]
LAYOUTS = ["strided_rows", "strided_last_axis", "fortran", "transposed", "negative_stride"]


def gemv_tokens() -> int:
    """Up to how many tokens the automatic route gives float32 and 16-bit projections to the
    matrix-vector kernel (kernels/gemv.hpp: horizontal sums, not one fma chain per output):
    drivers/gemm_routes.cpp's kGemvMaxRowsBlocked, or kGemvMaxRows on AVX-512."""
    return 8 if lk.simd_arch() == "avx512" else 20


# an op as a function (x, rng) -> (llmkernels result, reference result) on x of shape (..., n)
OpCase = Callable[[np.ndarray, np.random.Generator], tuple[np.ndarray, np.ndarray]]


def check(actual: np.ndarray, expected: np.ndarray, dtype: type) -> None:
    dt = np.dtype(dtype)
    assert actual.dtype == dt
    assert actual.shape == expected.shape
    np.testing.assert_allclose(actual, expected, **TOL[dt])


def data(rng: np.random.Generator, shape: tuple[int, ...], dtype: type, scale: float = 1.0):
    return (rng.standard_normal(shape) * scale).astype(dtype)


def layouts(rng, dtype):
    """Non-contiguous views, one at a time from the default shape (2, 5, 33)."""
    base = data(rng, (4, 10, 66), dtype)
    return {
        "strided_rows": base[::2, ::2, :33],
        "strided_last_axis": base[:2, :5, ::2],
        "fortran": np.asfortranarray(base[:2, :5, :33]),
        "transposed": base[:2, :5, :33].transpose(1, 0, 2),
        "negative_stride": base[:2, :5, 32::-1],
    }


def sweep(test):
    """Parametrizes a test(op, n, lead, dtype, ...) over the sizes (SIMD tails 1, 7, 31, 33 and
    the large sizes), the leading shapes and both dtypes (test ids: op-n-lead-dtype)."""
    test = pytest.mark.parametrize("n", SIZES)(test)
    test = pytest.mark.parametrize("lead", LEADS, ids=str)(test)
    return pytest.mark.parametrize("dtype", DTYPES)(test)


def run_sweep(case: OpCase, n, lead, dtype, rng) -> None:
    x = data(rng, lead + (n,), dtype)
    actual, expected = case(x, rng)
    check(actual, expected, dtype)


def by_layout(test):
    """Parametrizes a test(op, layout, dtype) over the non-contiguous layouts and both dtypes."""
    test = pytest.mark.parametrize("layout", LAYOUTS)(test)
    return pytest.mark.parametrize("dtype", DTYPES)(test)


def run_layout(case: OpCase, layout, dtype, rng) -> None:
    x = layouts(rng, dtype)[layout]
    assert not x.flags.c_contiguous
    actual, expected = case(x, np.random.default_rng(0))
    check(actual, expected, dtype)


def op_tests(ops: dict[str, OpCase]):
    """The sweep and layout tests of an op module's cases: ``test_sweep, test_layouts =
    op_tests(OPS)`` (every SIMD path, sizes, leading shapes, dtypes; non-contiguous inputs)."""

    @sweep
    @pytest.mark.parametrize("op", list(ops))
    def test_sweep(op, n, lead, dtype, isa, rng):
        run_sweep(ops[op], n, lead, dtype, rng)

    @by_layout
    @pytest.mark.parametrize("op", list(ops))
    def test_layouts(op, layout, dtype, rng):
        run_layout(ops[op], layout, dtype, rng)

    return test_sweep, test_layouts


def check_fma_bound(got, x, w, bias=None, y=None) -> None:
    """float64 ``x . w^T (+ bias) (+ y)`` within the bound of a float32 fma chain over k
    (Higham's gamma_(k+2) times the magnitudes): the products of the GEMV / GEMM kernels."""
    want = x.astype(np.float64) @ w.astype(np.float64).T
    mag = np.abs(x).astype(np.float64) @ np.abs(w).astype(np.float64).T
    if bias is not None:
        want += bias
        mag += np.abs(bias)
    if y is not None:
        want += y
        mag += np.abs(y)
    u = 2.0**-24
    k = x.shape[1]
    bound = (k + 2) * u / (1 - (k + 2) * u) * mag + 1e-37
    assert got.dtype == np.float32 and got.shape == want.shape
    err = np.abs(got.astype(np.float64) - want)
    assert np.all(err <= bound), f"max error / bound {np.max(err / bound):.3g}"
