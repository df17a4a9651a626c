"""rms_norm, layer_norm, silu, swiglu, swiglu_ffn, rope against llmkernels.reference.

The reference (NumPy, float64) is the specification. Each op is swept over sizes (SIMD tails
1, 7, 31, 33 and the large sizes 128, 1025, 4096), leading shapes, both dtypes and every SIMD
path; layouts (strided, Fortran order, out=, aliasing) are swept one at a time from the defaults.
"""

from __future__ import annotations

import llmkernels as lk
import numpy as np
import pytest
from conftest import TOL
from llmkernels import reference as ref

SIZES = [1, 7, 31, 33, 128, 1025, 4096]
LEADS = [(), (3,), (2, 5)]
DTYPES = [np.float32, np.float64]


def check(actual: np.ndarray, expected: np.ndarray, dtype: type) -> None:
    dt = np.dtype(dtype)
    assert actual.dtype == dt
    assert actual.shape == expected.shape
    np.testing.assert_allclose(actual, expected, **TOL[dt])


def data(rng: np.random.Generator, shape: tuple[int, ...], dtype: type, scale: float = 1.0):
    return (rng.standard_normal(shape) * scale).astype(dtype)


# --- each op as (llmkernels call, reference call) on an x of shape (..., n) -------------------


def op_rms_norm(x, rng):
    w = data(rng, x.shape[-1:], x.dtype)
    return lk.rms_norm(x, w, 1e-6), ref.rms_norm(x, w, 1e-6)


def op_rms_norm_noweight(x, rng):
    return lk.rms_norm(x, eps=1e-5), ref.rms_norm(x, eps=1e-5)


def op_layer_norm(x, rng):
    w = data(rng, x.shape[-1:], x.dtype)
    b = data(rng, x.shape[-1:], x.dtype)
    return lk.layer_norm(x, w, b, 1e-5), ref.layer_norm(x, w, b, 1e-5)


def op_layer_norm_noaffine(x, rng):
    return lk.layer_norm(x), ref.layer_norm(x)


def op_silu(x, rng):
    return lk.silu(x * 4), ref.silu(x * 4)


def op_swiglu(x, rng):
    up = data(rng, x.shape, x.dtype)
    return lk.swiglu(x * 4, up), ref.swiglu(x * 4, up)


def op_rope(x, rng):
    # x (..., n) is read as (..., T=n_rows_last, D): use the size as D with T = 5 prepended
    xr = data(rng, x.shape[:-1] + (5, x.shape[-1]), x.dtype)
    r = x.shape[-1] - x.shape[-1] % 2  # odd D: rotate the even part, pass the last feature
    pos = np.arange(5) * 3 + 2
    return (
        lk.rope(xr, pos, rotary_dim=r, theta=500.0),
        ref.rope(xr, pos, rotary_dim=r, theta=500.0),
    )


def op_rope_interleaved(x, rng):
    xr = data(rng, x.shape[:-1] + (3, x.shape[-1]), x.dtype)
    r = x.shape[-1] - x.shape[-1] % 2
    return (
        lk.rope(xr, rotary_dim=r, interleaved=True),
        ref.rope(xr, rotary_dim=r, interleaved=True),
    )


OPS = {
    "rms_norm": op_rms_norm,
    "rms_norm_noweight": op_rms_norm_noweight,
    "layer_norm": op_layer_norm,
    "layer_norm_noaffine": op_layer_norm_noaffine,
    "silu": op_silu,
    "swiglu": op_swiglu,
    "rope": op_rope,
    "rope_interleaved": op_rope_interleaved,
}


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("lead", LEADS, ids=str)
@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("op", list(OPS))
def test_sweep(op, n, lead, dtype, isa, rng):
    x = data(rng, lead + (n,), dtype)
    actual, expected = OPS[op](x, rng)
    check(actual, expected, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n", [1, 7, 33, 1025])
def test_swiglu_ffn(n, dtype, isa, rng):
    x = data(rng, (2, 3, n), dtype)
    wg, wu = data(rng, (n, 37), dtype, 0.3), data(rng, (n, 37), dtype, 0.3)
    wd = data(rng, (37, 9), dtype, 0.3)
    bg, bu, bd = data(rng, (37,), dtype), data(rng, (37,), dtype), data(rng, (9,), dtype)
    got = lk.swiglu_ffn(x, wg, wu, wd, b_gate=bg, b_up=bu, b_down=bd)
    check_matmul(got, ref.swiglu_ffn(x, wg, wu, wd, b_gate=bg, b_up=bu, b_down=bd), dtype)
    hidden = lk.swiglu_ffn(x, wg, wu)
    check_matmul(hidden, ref.swiglu_ffn(x, wg, wu), dtype)
    one = lk.swiglu_ffn(x[0, 0], wg, wu, wd)  # 1-D x
    check_matmul(one, ref.swiglu_ffn(x[0, 0], wg, wu, wd), dtype)


def check_matmul(actual: np.ndarray, expected: np.ndarray, dtype: type) -> None:
    """Outputs of float32 matmuls: a dot product of K terms carries a rounding error of about
    eps * sqrt(K) * (scale of its terms), so entries that cancel to small values cannot meet an
    elementwise atol of 1e-6; DESIGN.md §4's block-output tolerance, relative to the output's
    scale, is the honest bound (float64: the same reasoning at float64 epsilon)."""
    assert actual.dtype == np.dtype(dtype) and actual.shape == expected.shape
    if np.dtype(dtype) == np.float32:
        scale = float(np.max(np.abs(expected))) if expected.size else 1.0
        np.testing.assert_allclose(actual, expected, rtol=1e-4, atol=1e-5 * max(scale, 1.0))
    else:
        scale = float(np.max(np.abs(expected))) if expected.size else 1.0
        np.testing.assert_allclose(actual, expected, rtol=1e-12, atol=1e-13 * max(scale, 1.0))


# --- layouts: one at a time from the default shape (2, 5, 33) ---------------------------------


def layouts(rng, dtype):
    base = data(rng, (4, 10, 66), dtype)
    return {
        "strided_rows": base[::2, ::2, :33],
        "strided_last_axis": base[:2, :5, ::2],
        "fortran": np.asfortranarray(base[:2, :5, :33]),
        "transposed": base[:2, :5, :33].transpose(1, 0, 2),
        "negative_stride": base[:2, :5, 32::-1],
    }


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    "layout", ["strided_rows", "strided_last_axis", "fortran", "transposed", "negative_stride"]
)
@pytest.mark.parametrize("op", list(OPS))
def test_layouts(op, layout, dtype, rng):
    x = layouts(rng, dtype)[layout]
    assert not x.flags.c_contiguous
    actual, expected = OPS[op](x, np.random.default_rng(0))
    check(actual, expected, dtype)


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
    assert lk.silu(x32.astype(np.float16)).dtype == np.float32
    assert lk.swiglu(x32, x32.astype(np.float64)).dtype == np.float64
    assert lk.rope(x32[None]).dtype == np.float32
    # 0-d input to an elementwise op
    s = lk.silu(np.float32(1.5))
    assert s.shape == () and s.dtype == np.float32
    np.testing.assert_allclose(s, ref.silu(1.5), rtol=2e-6)


# --- RoPE specifics ----------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES)
def test_rope_positions_and_options(dtype, rng):
    x = data(rng, (2, 4, 6, 16), dtype)  # (B, H, T, D)
    # per-batch positions (B, 1, T)
    pos = np.array([[0, 1, 2, 3, 4, 5], [7, 8, 9, 10, 11, 12]])[:, None, :]
    check(lk.rope(x, pos), ref.rope(x, pos), dtype)
    # full per-row positions (B, H, T)
    pos_full = rng.integers(0, 5000, size=(2, 4, 6))
    check(lk.rope(x, pos_full), ref.rope(x, pos_full), dtype)
    # scalar-like (1,) broadcast
    check(lk.rope(x, np.array([3])), ref.rope(x, np.array([3])), dtype)
    # large offsets: angles formed in float64 stay exact
    big = np.arange(6) + 10**6
    check(lk.rope(x, big), ref.rope(x, big), dtype)
    big2 = np.arange(6, dtype=np.uint32) + 2**31
    check(lk.rope(x, big2), ref.rope(x, big2), dtype)
    # explicit inv_freq, partial rotary, attention factor, interleaved
    inv = np.linspace(1.0, 1e-3, 4)
    check(lk.rope(x, inv_freq=inv, rotary_dim=8), ref.rope(x, inv_freq=inv, rotary_dim=8), dtype)
    check(
        lk.rope(x, attention_factor=1.2, interleaved=True),
        ref.rope(x, attention_factor=1.2, interleaved=True),
        dtype,
    )
    # rotary_dim=0 is the identity
    np.testing.assert_array_equal(lk.rope(x, rotary_dim=0), x)
    # scaled frequencies from rope_inv_freq
    scaling = {
        "rope_type": "llama3",
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192,
    }
    inv = lk.rope_inv_freq(16, 500000.0, scaling)
    check(lk.rope(x, big, inv_freq=inv), ref.rope(x, big, inv_freq=inv), dtype)


def test_rope_relative_property(rng):
    """q(m)·k(n) depends only on m - n: the defining property of RoPE."""
    q = rng.standard_normal((1, 64))
    k = rng.standard_normal((1, 64))
    s1 = lk.rope(q, [5])[0] @ lk.rope(k, [2])[0]
    s2 = lk.rope(q, [1005])[0] @ lk.rope(k, [1002])[0]
    np.testing.assert_allclose(s1, s2, rtol=1e-10)


def test_rope_repeated_calls_use_consistent_tables(rng):
    x = data(rng, (3, 8), np.float32)
    a = lk.rope(x, [1, 2, 3])
    b = lk.rope(x, [1, 2, 3])
    np.testing.assert_array_equal(a, b)
    c = lk.rope(x, [1, 2, 4])
    assert not np.array_equal(a, c)


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
    check(lk.rope(xr), ref.rope(xr), dtype)
    out = np.empty_like(x)  # user-provided out: usually not 64-byte aligned -> regular stores
    check(lk.silu(x, out=out), ref.silu(x), dtype)
    check(lk.silu(x), out, dtype)
    # out starting at an odd element offset: the row kernels peel a scalar head to alignment
    buf = np.empty(x.size + 1, dtype)
    odd = buf[1:].reshape(x.shape)
    check(lk.rms_norm(x, w, out=odd), ref.rms_norm(x, w), dtype)
    check(lk.layer_norm(x, w, w, out=odd), ref.layer_norm(x, w, w), dtype)
    check(lk.swiglu(x, x, out=odd), ref.swiglu(x, x), dtype)
