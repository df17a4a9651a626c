"""The bfloat16-weight prefill on vdpbf16ps (kernel cpp/kernels/gemm_bf16.hpp, built natively for
AVX512_BF16 and against SIMDe for every host; selection common/dot.hpp; driver ops/linear.cpp's
linear_bf16_dot).

Formula: y = bf16(x) @ W.T + bias, where bf16(x) rounds each activation to bfloat16 (nearest
even) and W is the stored bfloat16 matrix; products of two bfloat16 are exact in float32 and the
sums are float32. The tolerance is float32 accumulation over k terms (|terms| summed); against
the float32 model of the bf16 weights (x not rounded) the error is that of rounding x: at most
2^-9 of sum |x * w|.
"""

from __future__ import annotations

from collections.abc import Iterator

import llmkernels as lk
import ml_dtypes
import numpy as np
import pytest
from llmkernels import _core

# the portable twins everywhere, the native paths where the CPU has them
PATHS = (
    ["bf16_simde", "amx_emu"]
    + (["avx512bf16"] if _core.cpu_has_avx512_bf16 else [])
    + (["amx"] if _core.cpu_has_amx else [])
)
BEST = _core.isa_names[: _core.isa_names.index(_core.best_simd_arch()) + 1]
pytestmark = pytest.mark.skipif("avx2" not in BEST, reason="the bf16 kernels run on AVX2 and up")


@pytest.fixture(params=PATHS)
def dot(request: pytest.FixtureRequest) -> Iterator[str]:
    _core._set_bf16_dot(request.param)
    assert _core.bf16_dot() == request.param
    yield request.param
    _core._set_bf16_dot("auto")


def bf16(a: np.ndarray) -> np.ndarray:
    """Round to bfloat16 (nearest even) and back to float64."""
    return np.asarray(a, np.float32).astype(ml_dtypes.bfloat16).astype(np.float64)


def ref_bf16_linear(x, w16, bias=None):
    """float64 of the formula: bf16(x) @ W.T + bias."""
    y = bf16(x) @ w16.astype(np.float64).T
    return y if bias is None else y + np.asarray(bias, np.float64)


def check(got, x, w16, bias=None):
    want = ref_bf16_linear(x, w16, bias)
    terms = np.abs(bf16(x)) @ np.abs(w16.astype(np.float64)).T
    bound = 2e-6 * terms + (0 if bias is None else 1e-6 * np.abs(bias)) + 1e-30
    err = np.abs(got.astype(np.float64) - want)
    assert got.dtype == np.float32
    assert np.all(err <= bound), f"max err / bound = {np.max(err / bound)}"


def run(x, w16, bias=None, y=None):
    return _core._linear(x, w16.view(np.uint16), "bfloat16", bias, y, None, 0)


@pytest.mark.parametrize("n", [1, 31, 33, 300])  # panel (32) and column-block (256) tails
# odd k: the pad element (AMX: to 32); 512: rows of x padded past a multiple of 1 KiB
@pytest.mark.parametrize("k", [1, 7, 64, 512, 1025])
@pytest.mark.parametrize("m", [9, 13, 200])  # token tiles of 12 (AMX: 32), the 192-token block
def test_against_formula(n, k, m, dot, rng):
    w16 = (rng.standard_normal((n, k)) * 0.05).astype(ml_dtypes.bfloat16)
    x = rng.standard_normal((m, k)).astype(np.float32)
    bias = rng.standard_normal(n).astype(np.float32)
    check(run(x, w16, bias), x, w16, bias)
    check(run(x, w16), x, w16)


def test_accumulate_into_out(dot, rng):
    w16 = rng.standard_normal((70, 600)).astype(ml_dtypes.bfloat16)
    x = rng.standard_normal((30, 600)).astype(np.float32)
    y0 = rng.standard_normal((30, 70)).astype(np.float32)
    got = run(x, w16, None, y0.copy())  # y + x . w^T
    check(got - y0, x, w16)  # (the float32 sum y0 + p rounds once more: within the bound)


@pytest.mark.parametrize(
    "native, twin", [("avx512bf16", "bf16_simde"), ("amx", "amx_emu"), ("amx", "avx512bf16")]
)
@pytest.mark.parametrize("m", [40, 77])  # whole and partial 32-token AMX blocks
def test_native_and_twin_agree(native, twin, m, rng):
    """Two builds of one source (and the two native kernels): equal within the float32 rounding
    of the order of the adds (SIMDe adds a pair's two products first; the AMX hardware orders a
    row's adds otherwise than its pseudo-code, which the emulation follows) -- the documented
    bound, not bit equality."""
    if native not in PATHS:
        pytest.skip(f"this CPU cannot run {native}")
    w16 = (rng.standard_normal((100, 2048)) * 0.02).astype(ml_dtypes.bfloat16)
    x = rng.standard_normal((m, 2048)).astype(np.float32)
    out = {}
    for p in (native, twin):
        _core._set_bf16_dot(p)
        out[p] = run(x, w16)
    _core._set_bf16_dot("auto")
    terms = np.abs(bf16(x)) @ np.abs(w16.astype(np.float64)).T
    assert np.all(np.abs(out[native] - out[twin]) <= 4e-6 * terms)


def test_amx_emulation_is_the_pseudo_code(rng):
    """The emulated tiles add each product in the order of k, rounding every add, as the
    vdpbf16ps kernel does: on normal numbers the AMX kernel's twin equals it bit for bit."""
    if "avx512bf16" not in PATHS:
        pytest.skip("no AVX512_BF16 here")
    w16 = (rng.standard_normal((70, 300)) * 0.1).astype(ml_dtypes.bfloat16)
    x = rng.standard_normal((45, 300)).astype(np.float32)
    out = {}
    for p in ("avx512bf16", "amx_emu"):
        _core._set_bf16_dot(p)
        out[p] = run(x, w16)
    _core._set_bf16_dot("auto")
    np.testing.assert_array_equal(out["amx_emu"], out["avx512bf16"])


def test_threads_and_repeats_bitwise(dot, rng, threads):
    w16 = rng.standard_normal((600, 300)).astype(ml_dtypes.bfloat16)
    x = rng.standard_normal((50, 300)).astype(np.float32)
    lk.set_num_threads(1)
    one = run(x, w16)
    lk.set_num_threads(2)
    np.testing.assert_array_equal(run(x, w16), one)
    np.testing.assert_array_equal(run(x, w16), one)


def test_error_against_float32_model(dot, rng):
    """What rounding x costs against the float32 model of the rounded weights: at most 2^-9 of
    sum |x w| per output (measured: see docs/quantization.md)."""
    w16 = (rng.standard_normal((256, 2048)) * 0.02).astype(ml_dtypes.bfloat16)
    x = rng.standard_normal((64, 2048)).astype(np.float32)
    got = run(x, w16).astype(np.float64)
    exact = x.astype(np.float64) @ w16.astype(np.float64).T
    terms = np.abs(x.astype(np.float64)) @ np.abs(w16.astype(np.float64)).T
    assert np.all(np.abs(got - exact) <= 2.0**-9 * terms)


def test_special_values(dot):
    """NaN and inf propagate as float arithmetic would; subnormal activations are rounded like
    any other (the native instruction then treats bf16 subnormals as zero)."""
    w16 = np.ones((3, 4), ml_dtypes.bfloat16)
    x = np.array([[1.0, 2.0, 3.0, 4.0]] * 20, np.float32)
    x[1, 0] = np.nan
    x[2, 1] = np.inf
    y = run(x, w16)
    assert np.isnan(y[1]).all() and np.isposinf(y[2]).all()
    np.testing.assert_array_equal(y[0], [10.0, 10.0, 10.0])


@pytest.mark.parametrize("k", [1, 7, 31, 33, 1025])  # SIMD tails of the rounding
def test_rounding_of_x_is_nearest_even(dot, k, rng):
    """y = bf16(x) . I: each output is one activation rounded to bfloat16 (ties to even, at
    every position of a row), bit for bit ml_dtypes' rounding; subnormal activations on the
    twin, which keeps them (the native instruction reads bf16 subnormals as zero)."""
    m = 9
    bits = rng.integers(0x3F000000, 0x40800000, size=(m, k), dtype=np.uint32)
    bits[::2, ::3] = (bits[::2, ::3] & 0xFFFF0000) | 0x8000  # exact ties, odd and even halves
    bits[1::2] |= 0x80000000  # negative rows
    if dot == "bf16_simde":
        bits[3] = rng.integers(1, 0x00800000, size=k, dtype=np.uint32)  # subnormal floats
    x = bits.view(np.float32)
    got = run(x, np.eye(k, dtype=ml_dtypes.bfloat16))
    want = x.astype(ml_dtypes.bfloat16).astype(np.float32)
    np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))


def test_selection():
    assert _core.bf16_dot() in ("none", "avx512bf16", "amx")  # never a twin unless forced
    if lk.simd_arch() == "avx512":
        if _core.cpu_has_amx:
            assert _core.bf16_dot() == "amx"
        elif _core.cpu_has_avx512_bf16:
            assert _core.bf16_dot() == "avx512bf16"
    previous = lk.simd_arch()
    lk.set_simd_arch("avx2")
    try:
        assert _core.bf16_dot() == "none"
    finally:
        lk.set_simd_arch(previous)
    with pytest.raises(ValueError, match=r"^\[_set_bf16_dot\] path must be"):
        _core._set_bf16_dot("amx2")
