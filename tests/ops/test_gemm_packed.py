"""The float32/float64 GEMMs of the projection path (cpp/ops/linear.cpp, kernels/gemm.hpp):
gemm_packed_kernel (both operands packed, large m) and gemm_xt_kernel (x packed, weights read in
place), against float64 and against each other.

Formula (the reference): ``y = x . W^T (+ bias) (+ y0)``, W (n, k) as HF stores projections (the
modules' layout; ``_core._linear``), or ``x . W`` with W (k, n) (the functional API's layout:
``swiglu_ffn``). Arithmetic contract (kernels/gemm.hpp): every output is one fma chain over k
starting from y0 (or 0), then + bias -- so the two kernels, every thread split and every
blocking give the same bits, which the tests below check bitwise; the float64 comparison uses
the textbook bound of a sequential sum, |error| <= gamma_(k+2) * (|x| . |W|^T + |y0| + |bias|).

Routes are forced with ``_core._set_gemm_route`` ("packed", "tokens", "blas", "auto").
"""

from __future__ import annotations

from collections.abc import Iterator

import llmkernels as lk
import ml_dtypes
import numpy as np
import pytest
from llmkernels import _core
from op_helpers import check_fma_bound, gemv_tokens

FORMATS = {"bfloat16": ml_dtypes.bfloat16, "float16": np.float16}
TAILS = (1, 7, 31, 33, 1025)
MID = (37, 45)  # the other two dimensions when one sweeps TAILS


def auto_is_package(m: int = 100) -> bool:
    """Whether ops/linear.cpp routes m tokens to the packed kernel by itself (24 <= m < 512,
    not on AVX-512, not measured there yet); the forced routes run everywhere."""
    return lk.simd_arch() != "avx512" and 24 <= m < 512


@pytest.fixture
def route() -> Iterator[None]:
    """Restores the automatic route after a test that forces one."""
    yield
    _core._set_gemm_route("auto")


def linear(x, w, bias=None, y=None, route="auto"):
    previous = _core._set_gemm_route(route)
    try:
        return _core._linear(x, w, "float32", bias, y)
    finally:
        _core._set_gemm_route(previous)


def check(got, x, w, bias=None, y=None):
    """float64 ``x . w^T (+ bias) (+ y)`` within the bound of a float32 fma chain over k."""
    check_fma_bound(got, x, w, bias, y)


def shapes() -> list[tuple[int, int, int]]:
    """(m, k, n): each dimension through the tails, the other two mid-sized."""
    out = []
    for t in TAILS:
        out += [(t, *MID), (MID[0], t, MID[1]), (*MID, t)]
    return out


@pytest.mark.parametrize("mkn", shapes(), ids=lambda s: "x".join(map(str, s)))
def test_vs_float64_every_route(isa, route, mkn):
    m, k, n = mkn
    rng = np.random.default_rng(m * 1_000_003 + k * 1009 + n)
    x = rng.standard_normal((m, k), dtype=np.float32)
    w = rng.standard_normal((n, k), dtype=np.float32)
    bias = rng.standard_normal(n, dtype=np.float32)
    y0 = rng.standard_normal((m, n), dtype=np.float32)
    for b, y in ((None, None), (bias, None), (None, y0), (bias, y0)):
        results = {r: linear(x, w, b, y, r) for r in ("packed", "tokens", "auto")}
        for got in results.values():
            check(got, x, w, b, y)
        # one fma chain per output in both kernels: the same bits
        np.testing.assert_array_equal(results["packed"], results["tokens"])


@pytest.mark.parametrize("m", [9, 130, 601])
def test_routes_agree_bitwise_past_the_blocks(isa, route, m):
    # k and n past the packed kernel's blocks (kGemmPackKc = 512, feature panels of 8-32,
    # weight blocks of 256 features for m = 9 and 130, of 1024 for m = 601, whose packed x
    # passes 2 MiB: ops.hpp's gemm_pack_nc): the chain continues through y across k blocks
    rng = np.random.default_rng(m)
    k, n = 1025, 1030
    x = rng.standard_normal((m, k), dtype=np.float32)
    w = rng.standard_normal((n, k), dtype=np.float32)
    bias = rng.standard_normal(n, dtype=np.float32)
    y0 = rng.standard_normal((m, n), dtype=np.float32)
    packed = linear(x, w, bias, y0, "packed")
    check(packed, x, w, bias, y0)
    np.testing.assert_array_equal(linear(x, w, bias, y0, "tokens"), packed)
    if auto_is_package(m):
        np.testing.assert_array_equal(linear(x, w, bias, y0, "auto"), packed)


@pytest.mark.parametrize("m", [9, 128, 601])
def test_bitwise_across_thread_counts(route, threads, m):
    rng = np.random.default_rng(m + 5)
    k, n = 300, 1030  # several thread shares and weight blocks
    x = rng.standard_normal((m, k), dtype=np.float32)
    w = rng.standard_normal((n, k), dtype=np.float32)
    bias = rng.standard_normal(n, dtype=np.float32)
    for r in ("packed", "tokens", "auto"):
        lk.set_num_threads(1)
        want = linear(x, w, bias, None, r)
        for t in (2, 3):
            lk.set_num_threads(t)
            np.testing.assert_array_equal(linear(x, w, bias, None, r), want)


def test_rows_do_not_depend_on_the_token_count(isa, route):
    # a row's chain is the same whatever m is and whichever kernel takes it
    rng = np.random.default_rng(3)
    k, n = 257, 99
    x = rng.standard_normal((700, k), dtype=np.float32)
    w = rng.standard_normal((n, k), dtype=np.float32)
    full = linear(x, w, route="packed")
    routes = ("packed", "tokens", "auto") if auto_is_package() else ("packed", "tokens")
    for lo, hi in ((0, 1), (0, 9), (13, 77), (600, 700), (5, 200)):
        for r in routes:
            if r == "auto" and hi - lo <= gemv_tokens():
                continue  # matrix-vector products (gemv.hpp): horizontal sums
            np.testing.assert_array_equal(linear(x[lo:hi], w, route=r), full[lo:hi])


@pytest.mark.parametrize("fmt", ["bfloat16", "float16"])
def test_16_bit_weights_equal_the_packed_kernel(isa, route, fmt, exact_bf16):
    # the 16-bit prefill kernel (gemm_xt_w16: gemm.hpp's body with the Widen16 policy) and the
    # float32 packed kernel on the widened weights: one chain each, the same bits
    rng = np.random.default_rng(11)
    m, k, n = 40, 513, 70
    x = rng.standard_normal((m, k), dtype=np.float32)
    low = rng.standard_normal((n, k), dtype=np.float32).astype(FORMATS[fmt])
    words, wide = low.view(np.uint16), low.astype(np.float32)
    bias = rng.standard_normal(n, dtype=np.float32)
    y0 = rng.standard_normal((m, n), dtype=np.float32)
    got = _core._linear(x, words, fmt, bias, y0)
    np.testing.assert_array_equal(got, linear(x, wide, bias, y0, "packed"))


def test_nan_and_inf_propagate(route):
    rng = np.random.default_rng(2)
    m, k, n = 140, 40, 50
    x = rng.standard_normal((m, k), dtype=np.float32)
    w = rng.standard_normal((n, k), dtype=np.float32)
    x[3, 7] = np.nan
    w[5, 2] = np.inf
    got = linear(x, w, None, None, "packed")
    with np.errstate(invalid="ignore"):
        want = x.astype(np.float64) @ w.astype(np.float64).T
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    np.testing.assert_array_equal(np.isinf(got), np.isinf(want))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("m", [7, 130])
def test_in_out_layout_through_swiglu_ffn(isa, route, dtype, m):
    # the functional API's (in, out) weights: packed (forced, and automatic from 24 tokens)
    # against the BLAS and float64; x non-contiguous
    rng = np.random.default_rng(m)
    k, h, n = 33, 1025, 31
    x = rng.standard_normal((m, 2 * k)).astype(dtype)[:, ::2]
    wg = (rng.standard_normal((k, h)) * 0.3).astype(dtype)
    wu = (rng.standard_normal((k, h)) * 0.3).astype(dtype)
    wd = (rng.standard_normal((h, n)) * 0.3).astype(dtype)
    x64 = x.astype(np.float64)
    gate, up = x64 @ wg.astype(np.float64), x64 @ wu.astype(np.float64)
    want = (gate / (1 + np.exp(-gate)) * up) @ wd.astype(np.float64)
    tol = {"rtol": 1e-4, "atol": 1e-5} if dtype == np.float32 else {"rtol": 1e-12, "atol": 1e-12}
    scale = max(float(np.abs(want).max()), 1.0)
    out = {}
    for r in ("packed", "blas", "auto"):
        _core._set_gemm_route(r)
        out[r] = lk.swiglu_ffn(x, wg, wu, wd)
        assert out[r].dtype == dtype
        np.testing.assert_allclose(out[r], want, rtol=tol["rtol"], atol=tol["atol"] * scale)
    if auto_is_package(m):
        np.testing.assert_array_equal(out["auto"], out["packed"])


def test_float64_packed_vs_float64_reference(route):
    # linear<double> takes the same kernels (swiglu_ffn's projections in float64)
    rng = np.random.default_rng(8)
    m, k, h = 601, 300, 70
    x = rng.standard_normal((m, k))
    wg, wu = rng.standard_normal((k, h)) * 0.1, rng.standard_normal((k, h)) * 0.1
    _core._set_gemm_route("packed")
    got = lk.swiglu_ffn(x, wg, wu)
    gate, up = x @ wg, x @ wu
    np.testing.assert_allclose(got, gate / (1 + np.exp(-gate)) * up, rtol=1e-12, atol=1e-12)


def test_route_names():
    assert _core._set_gemm_route("auto") == "auto"
    assert _core._set_gemm_route("packed") == "auto"
    assert _core._set_gemm_route("auto") == "packed"
    with pytest.raises(ValueError, match=r"^\[_set_gemm_route\] route"):
        _core._set_gemm_route("fast")
