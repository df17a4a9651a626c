"""What the elementwise and row-wise ops (rms_norm, layer_norm, silu, swiglu, rope) share, against
llmkernels.reference: out= and aliasing, dtype rules, special values, empty arrays, threads,
streaming stores. Each op's own tests (its formula beside them, the size/shape/dtype/SIMD sweep,
non-contiguous layouts) are in tests/ops/test_<op>.py.
"""

from __future__ import annotations

import llmkernels as lk
import numpy as np
import pytest
from conftest import TOL, cxx_inv_freq
from llmkernels import reference as ref
from op_helpers import DTYPES, check, data

# --- out= and aliasing ----------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES)
def test_out_and_aliasing(dtype, rng):
    x = data(rng, (3, 33), dtype)
    w = data(rng, (33,), dtype)
    b = data(rng, (33,), dtype)
    up = data(rng, (3, 33), dtype)
    cases = [
        (lambda o: lk.rms_norm(x, w, out=o), lambda: ref.rms_norm(x, w)),
        (lambda o: lk.layer_norm(x, w, b, out=o), lambda: ref.layer_norm(x, w, b)),
        (lambda o: lk.silu(x, out=o), lambda: ref.silu(x)),
        (lambda o: lk.swiglu(x, up, out=o), lambda: ref.swiglu(x, up)),
        (
            lambda o: lk.rope(x[None], rotary_dim=32, out=o),
            lambda: ref.rope(x[None], rotary_dim=32),
        ),
    ]
    for call, expect in cases:
        e = expect()
        o = np.empty(e.shape, dtype)
        assert call(o) is o
        check(o, e, dtype)
    # out aliasing the input (in place)
    for fn, expect in [
        (lambda a: lk.rms_norm(a, w, out=a), ref.rms_norm(x, w)),
        (lambda a: lk.layer_norm(a, w, b, out=a), ref.layer_norm(x, w, b)),
        (lambda a: lk.silu(a, out=a), ref.silu(x)),
        (lambda a: lk.swiglu(a, up, out=a), ref.swiglu(x, up)),
        (lambda a: lk.rope(a, rotary_dim=32, out=a), ref.rope(x, rotary_dim=32)),
    ]:
        a = x.copy()
        assert fn(a) is a
        check(a, expect, dtype)
    # up aliasing out
    u = up.copy()
    lk.swiglu(x, u, out=u)
    check(u, ref.swiglu(x, up), dtype)
    # partial overlap: out is a shifted view of the same buffer as x -> the input is copied first
    buf = data(rng, (4, 33), dtype)
    xin, o = buf[:3], buf[1:]
    expected = ref.rms_norm(xin.copy(), w)
    lk.rms_norm(xin, w, out=o)
    check(o, expected, dtype)


# --- dtypes ------------------------------------------------------------------------------------


def test_dtype_rules(rng):
    x32 = data(rng, (2, 8), np.float32)
    w64 = data(rng, (8,), np.float64)
    assert lk.rms_norm(x32).dtype == np.float32
    assert lk.rms_norm(x32, w64).dtype == np.float64  # NumPy promotion
    assert lk.rms_norm(x32.astype(np.float64)).dtype == np.float64
    ints = np.arange(16).reshape(2, 8)
    assert lk.rms_norm(ints).dtype == np.float64
    check(lk.rms_norm(ints), ref.rms_norm(ints), np.float64)
    assert lk.silu(np.array([True, False])).dtype == np.float64
    assert lk.silu([1, 2, 3]).dtype == np.float64  # array-likes
    assert lk.silu([1.0, 2.0]).dtype == np.float64
    assert lk.silu(x32.astype(np.float16)).dtype == np.float16  # computed in float32
    assert lk.swiglu(x32, x32.astype(np.float64)).dtype == np.float64
    assert lk.rope(x32[None]).dtype == np.float32
    # 0-d input to an elementwise op
    s = lk.silu(np.float32(1.5))
    assert s.shape == () and s.dtype == np.float32
    np.testing.assert_allclose(s, ref.silu(1.5), rtol=2e-6)


# --- special values ----------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES)
def test_huge_and_tiny_rows(dtype, isa):
    base = np.array([[2.0, -1.0, 3.0, 0.5] * 9])
    huge, tiny = (1e38, 1e-40) if dtype == np.float32 else (1e300, 1e-310)  # tiny: subnormal
    for scale in [1e30, 1e-30, huge, tiny]:
        x = (base * scale).astype(dtype)
        # with eps = 0 both norms are scale-invariant: the expected values are those of `base`
        # (the float64 reference itself would overflow/underflow at 1e300 / 1e-310)
        unit = x.astype(np.float64) / scale
        check(lk.rms_norm(x, eps=0.0), ref.rms_norm(unit, eps=0.0), dtype)
        check(lk.layer_norm(x, eps=0.0), ref.layer_norm(unit, eps=0.0), dtype)
    # nearly-constant rows (found by hypothesis): deviations of 1e-3 on values of 2 stay accurate
    nc = np.array([[1.9375] * 12 + [1.953125]], dtype)
    check(lk.layer_norm(nc), ref.layer_norm(nc), dtype)
    # constant rows: LayerNorm gives exactly the bias
    c = np.full((2, 7), 3333.3333, dtype)
    np.testing.assert_array_equal(
        lk.layer_norm(c, bias=np.arange(7, dtype=dtype)),
        np.broadcast_to(np.arange(7, dtype=dtype), (2, 7)),
    )
    x = np.full((2, 33), 1e30, dtype)
    x[1] = -1e30
    check(lk.rms_norm(x), ref.rms_norm(x), dtype)
    z = np.zeros((3, 33), dtype)
    np.testing.assert_array_equal(lk.rms_norm(z), z)
    np.testing.assert_array_equal(lk.layer_norm(z), z)
    np.testing.assert_array_equal(lk.silu(z), z)


@pytest.mark.parametrize("dtype", DTYPES)
def test_nan_inf_propagate(dtype, isa):
    x = np.ones((3, 33), dtype)
    x[0, 5] = np.nan
    x[1, 7] = np.inf
    x[2, 32] = -np.inf
    for got, want in [
        (lk.rms_norm(x), ref.rms_norm(x)),
        (lk.layer_norm(x), ref.layer_norm(x)),
        (lk.silu(x), ref.silu(x)),
        (lk.swiglu(x, x), ref.swiglu(x, x)),
        (lk.rope(x, rotary_dim=32), ref.rope(x, rotary_dim=32)),
    ]:
        np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
        np.testing.assert_array_equal(np.isinf(got), np.isinf(want))
        fin = np.isfinite(want)
        np.testing.assert_allclose(got[fin], want[fin], **TOL[np.dtype(dtype)])
    v = np.array(
        [-1e4, -100.0, -88.0, -20.0, 0.0, 20.0, 100.0, 1e4, np.inf, -np.inf, np.nan], dtype
    )
    got, want = lk.silu(v), ref.silu(v)
    np.testing.assert_allclose(got, want, **TOL[np.dtype(dtype)])


def test_empty_arrays():
    for shape in [(0, 8), (2, 0, 8), (0,)]:
        x = np.zeros(shape, np.float32)
        assert lk.silu(x).shape == shape
        if len(shape) >= 1 and shape[-1]:
            assert lk.rms_norm(x, np.ones(8, np.float32)).shape == shape
            assert lk.layer_norm(x).shape == shape
        if len(shape) >= 2:
            assert lk.rope(x).shape == shape
    assert lk.swiglu(np.zeros((0, 4)), np.zeros((0, 4))).shape == (0, 4)
    assert lk.swiglu_ffn(
        np.zeros((0, 4)), np.ones((4, 3)), np.ones((4, 3)), np.ones((3, 2))
    ).shape == (0, 2)
    assert lk.rms_norm(np.zeros((3, 0))).shape == (3, 0)


# --- threads: bitwise identical results --------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES)
def test_bitwise_identical_across_threads(dtype, threads, rng):
    x = data(rng, (257, 1031), dtype)
    w = data(rng, (1031,), dtype)
    up = data(rng, (257, 1031), dtype)
    wg, wu, wd = (
        data(rng, (1031, 64), dtype),
        data(rng, (1031, 64), dtype),
        data(rng, (64, 5), dtype),
    )
    calls = [
        lambda: lk.rms_norm(x, w),
        lambda: lk.layer_norm(x, w, w),
        lambda: lk.silu(x),
        lambda: lk.swiglu(x, up),
        lambda: lk.rope(x[:, :1030], np.arange(257)),
        lambda: lk.rope(x.reshape(1, 257, 1031)[..., :1030]),
        lambda: lk.swiglu_ffn(x[:64], wg, wu, wd),
    ]
    for call in calls:
        lk.set_num_threads(1)
        one = call()
        for n in (2, 3):
            lk.set_num_threads(n)
            np.testing.assert_array_equal(call(), one)
    lk.set_num_threads(2)
    for call in calls:  # repeated runs
        np.testing.assert_array_equal(call(), call())


def test_thread_control(threads):
    lk.set_num_threads(3)
    assert lk.get_num_threads() == 3
    with pytest.raises(ValueError, match=r"\[set_num_threads\] n"):
        lk.set_num_threads(0)
    with pytest.raises(TypeError, match=r"\[set_num_threads\] n"):
        lk.set_num_threads(1.5)  # type: ignore[arg-type]


@pytest.mark.parametrize("dtype", DTYPES)
def test_large_outputs_streaming_stores(dtype, isa, rng):
    """Outputs >= 16 MiB that llmkernels allocates (64-byte aligned) are written with
    non-temporal stores; the results must be the same as with regular stores."""
    rows = (16 << 20) // (4096 * np.dtype(dtype).itemsize)
    x = data(rng, (rows, 4096), dtype)
    w = data(rng, (4096,), dtype)
    check(lk.rms_norm(x, w), ref.rms_norm(x, w), dtype)
    check(lk.layer_norm(x, w, w), ref.layer_norm(x, w, w), dtype)
    check(lk.swiglu(x, x), ref.swiglu(x, x), dtype)
    xr = x.reshape(1, 4, rows * 8, 128)
    check(lk.rope(xr), ref.rope(xr, inv_freq=cxx_inv_freq(128)), dtype)
    out = np.empty_like(x)  # user-provided out: usually not 64-byte aligned -> regular stores
    check(lk.silu(x, out=out), ref.silu(x), dtype)
    check(lk.silu(x), out, dtype)
    # out starting at an odd element offset: the row kernels peel a scalar head to alignment
    buf = np.empty(x.size + 1, dtype)
    odd = buf[1:].reshape(x.shape)
    check(lk.rms_norm(x, w, out=odd), ref.rms_norm(x, w), dtype)
    check(lk.layer_norm(x, w, w, out=odd), ref.layer_norm(x, w, w), dtype)
    check(lk.swiglu(x, x, out=odd), ref.swiglu(x, x), dtype)
