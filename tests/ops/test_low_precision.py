"""Low-precision arrays in the functional ops (float16 / bfloat16: computed in float32, returned
in their dtype).

``ml_dtypes.bfloat16`` and ``np.float16`` arrays, and torch bfloat16/float16 tensors, are
accepted by silu, swiglu, rms_norm, layer_norm, rope, attention and swiglu_ffn: computed in
float32 and returned in the input's dtype (``out=`` of that dtype is accepted and written).
Mixed dtypes follow NumPy's promotion (bfloat16 with float32 gives float32; integers count as
float64); bfloat16 with float16, which NumPy does not promote, gives float32.

Each op is checked two ways: bitwise against the float32 call on the widened inputs, rounded
to the low dtype once (what "computed in float32" means), and against the float64 formula of
the rounded inputs with the low dtype's tolerance.
"""

from __future__ import annotations

import llmkernels as lk
import ml_dtypes
import numpy as np
import pytest
from llmkernels import reference as ref

BF16 = np.dtype(ml_dtypes.bfloat16)
F16, F32, F64 = np.dtype(np.float16), np.dtype(np.float32), np.dtype(np.float64)
LOW = [F16, BF16]
# one rounding to the low dtype (half an ulp: 2^-11 for float16, 2^-8 for bfloat16) on top of
# the float32 kernel's error, with a margin of 2
TOL = {F16: {"rtol": 2.0**-10, "atol": 2.0**-10}, BF16: {"rtol": 2.0**-7, "atol": 2.0**-7}}
SIZES = [1, 7, 31, 33, 1025]


# --- the formulas (float64, of the rounded inputs) ----------------------------------------------


def ref_silu(x):
    x = np.asarray(x, F64)
    return x / (1.0 + np.exp(-x))  # silu(x) = x * sigmoid(x)


def ref_swiglu(g, u):
    return ref_silu(g) * np.asarray(u, F64)  # silu(gate) * up


def ref_rms_norm(x, w, eps=1e-6):
    x = np.asarray(x, F64)  # x / sqrt(mean(x^2) + eps) * w
    return x / np.sqrt(np.mean(x * x, -1, keepdims=True) + eps) * np.asarray(w, F64)


def ref_layer_norm(x, w, b, eps=1e-5):
    x = np.asarray(x, F64)  # (x - mean) / sqrt(var + eps) * w + b, biased variance
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    return (x - mu) / np.sqrt(var + eps) * np.asarray(w, F64) + np.asarray(b, F64)


def ref_swiglu_ffn(x, wg, wu, wd):
    x, wg, wu, wd = (np.asarray(a, F64) for a in (x, wg, wu, wd))
    return ref_swiglu(x @ wg, x @ wu) @ wd  # (silu(x @ Wg) * (x @ Wu)) @ Wd


# rope and attention: llmkernels.reference (float64 NumPy, the formulas in their docstrings)


def _low(rng, shape, dtype, scale=1.0):
    return (rng.standard_normal(shape) * scale).astype(dtype)


def _check(got, expected_f64, dtype, widened_result=None):
    assert type(got) is np.ndarray and got.dtype == dtype
    if widened_result is not None:  # computed in float32, rounded once
        assert widened_result.dtype == F32
        np.testing.assert_array_equal(
            got.view(np.uint16), widened_result.astype(dtype).view(np.uint16)
        )
    np.testing.assert_allclose(got.astype(F64), expected_f64, **TOL[dtype])


def _up(a):
    return a.astype(F32)


# --- elementwise and norms, every SIMD path and tail --------------------------------------------


@pytest.mark.parametrize("dtype", LOW, ids=str)
@pytest.mark.parametrize("n", SIZES)
def test_elementwise_and_norms(isa, dtype, n, rng):
    x = _low(rng, (3, n), dtype, 2.0)
    u = _low(rng, (3, n), dtype)
    w = _low(rng, (n,), dtype)
    b = _low(rng, (n,), dtype)
    _check(lk.silu(x), ref_silu(x), dtype, lk.silu(_up(x)))
    _check(lk.swiglu(x, u), ref_swiglu(x, u), dtype, lk.swiglu(_up(x), _up(u)))
    _check(lk.rms_norm(x, w), ref_rms_norm(x, w), dtype, lk.rms_norm(_up(x), _up(w)))
    _check(lk.rms_norm(x), ref_rms_norm(x, 1.0), dtype, lk.rms_norm(_up(x)))
    _check(
        lk.layer_norm(x, w, b),
        ref_layer_norm(x, w, b),
        dtype,
        lk.layer_norm(_up(x), _up(w), _up(b)),
    )
    # non-contiguous low-precision inputs
    xs = np.repeat(x, 2, axis=-1)[..., ::2]
    assert not xs.flags.c_contiguous
    _check(lk.silu(xs), ref_silu(x), dtype, lk.silu(_up(x)))
    _check(lk.rms_norm(xs, w), ref_rms_norm(x, w), dtype, lk.rms_norm(_up(x), _up(w)))


@pytest.mark.parametrize("dtype", LOW, ids=str)
def test_rope(isa, dtype, rng):
    x = _low(rng, (2, 3, 7, 16), dtype)
    _check(lk.rope(x), ref.rope(_up(x)), dtype, lk.rope(_up(x)))
    pos = rng.integers(0, 1000, (2, 1, 7))
    kw = {"interleaved": True, "rotary_dim": 8, "theta": 500.0}
    _check(lk.rope(x, pos, **kw), ref.rope(_up(x), pos, **kw), dtype, lk.rope(_up(x), pos, **kw))
    # in place
    y = x.copy()
    assert lk.rope(y, out=y) is y
    _check(y, ref.rope(_up(x)), dtype, lk.rope(_up(x)))


@pytest.mark.parametrize("dtype", LOW, ids=str)
@pytest.mark.parametrize("causal", [False, True])
def test_attention(dtype, causal, rng):
    q = _low(rng, (2, 4, 5, 16), dtype)
    k = _low(rng, (2, 2, 9, 16), dtype)
    v = _low(rng, (2, 2, 9, 8), dtype)
    q32, k32, v32 = _up(q), _up(k), _up(v)
    _check(
        lk.attention(q, k, v, causal=causal),
        ref.attention(q32, k32, v32, causal=causal),
        dtype,
        lk.attention(q32, k32, v32, causal=causal),
    )
    # every output in the low dtype; a low-precision additive mask and sinks
    mask = _low(rng, (5, 9), dtype)
    sinks = _low(rng, (4,), dtype)
    kw = {"causal": causal, "mask": mask, "sinks": sinks, "window": 4}
    out, w, lse = lk.attention(q, k, v, return_weights=True, return_lse=True, **kw)
    o32, w32, l32 = lk.attention(q32, k32, v32, return_weights=True, return_lse=True, **kw)
    r_out, r_w, r_lse = ref.attention(q32, k32, v32, return_weights=True, return_lse=True, **kw)
    _check(out, r_out, dtype, o32)
    _check(w, r_w, dtype, w32)
    assert lse.dtype == dtype
    np.testing.assert_array_equal(lse.view(np.uint16), l32.astype(dtype).view(np.uint16))
    fin = np.isfinite(r_lse)
    np.testing.assert_allclose(lse.astype(F64)[fin], r_lse[fin], **TOL[dtype])
    # 3-D inputs
    _check(
        lk.attention(q[0], k[0], v[0], causal=causal),
        ref.attention(q32[0], k32[0], v32[0], causal=causal),
        dtype,
        lk.attention(q32[0], k32[0], v32[0], causal=causal),
    )


@pytest.mark.parametrize("dtype", LOW, ids=str)
def test_swiglu_ffn(dtype, rng):
    x = _low(rng, (3, 8), dtype)
    wg, wu, wd = (
        _low(rng, (8, 12), dtype, 0.3),
        _low(rng, (8, 12), dtype, 0.3),
        _low(rng, (12, 8), dtype, 0.3),
    )
    _check(
        lk.swiglu_ffn(x, wg, wu, wd),
        ref_swiglu_ffn(x, wg, wu, wd),
        dtype,
        lk.swiglu_ffn(_up(x), _up(wg), _up(wu), _up(wd)),
    )
    # the hidden activation (w_down=None)
    h = lk.swiglu_ffn(x, wg, wu)
    assert h.dtype == dtype and h.shape == (3, 12)


# --- out= ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", LOW, ids=str)
def test_out_of_the_low_dtype(dtype, rng):
    x = _low(rng, (4, 34), dtype)
    w = _low(rng, (34,), dtype)
    for call, expected in [
        (lambda o: lk.silu(x, out=o), lk.silu(x)),
        (lambda o: lk.swiglu(x, x, out=o), lk.swiglu(x, x)),
        (lambda o: lk.rms_norm(x, w, out=o), lk.rms_norm(x, w)),
        (lambda o: lk.layer_norm(x, w, w, out=o), lk.layer_norm(x, w, w)),
        (lambda o: lk.rope(x, out=o), lk.rope(x)),
    ]:
        out = np.zeros(x.shape, dtype)
        assert call(out) is out
        np.testing.assert_array_equal(out.view(np.uint16), expected.view(np.uint16))
    # aliasing: out is the input itself
    y = x.copy()
    assert lk.silu(y, out=y) is y
    np.testing.assert_array_equal(y.view(np.uint16), lk.silu(x).view(np.uint16))
    q = _low(rng, (1, 2, 3, 8), dtype)
    out = np.zeros((1, 2, 3, 8), dtype)
    res = lk.attention(q, q, q, causal=True, return_lse=True, out=out)
    assert res[0] is out and res[1].dtype == dtype
    np.testing.assert_array_equal(
        out.view(np.uint16), lk.attention(q, q, q, causal=True).view(np.uint16)
    )


@pytest.mark.parametrize("dtype", LOW, ids=str)
def test_bad_out_is_refused_and_left_untouched(dtype, rng):
    x = _low(rng, (4, 8), dtype)
    other = F16 if dtype == BF16 else BF16
    cases = [
        (np.zeros((4, 8), F32), TypeError, rf"^\[silu\] out must have dtype {dtype}, got float32"),
        (np.zeros((4, 8), other), TypeError, rf"^\[silu\] out must have dtype {dtype}"),
        (
            np.zeros((4, 9), dtype),
            ValueError,
            r"^\[silu\] out must have shape \(4, 8\), got \(4, 9\)",
        ),
        (np.zeros((8, 4), dtype).T, ValueError, r"^\[silu\] out must be C-contiguous"),
    ]
    for out, exc, msg in cases:
        before = out.copy()
        with pytest.raises(exc, match=msg):
            lk.silu(x, out=out)
        np.testing.assert_array_equal(out.view(np.uint16), before.view(np.uint16))
    ro = np.zeros((4, 8), dtype)
    ro.flags.writeable = False
    with pytest.raises(ValueError, match=r"^\[rms_norm\] out must be writeable"):
        lk.rms_norm(x, out=ro)
    with pytest.raises(TypeError, match=r"^\[rms_norm\] out must be a numpy.ndarray, got list"):
        lk.rms_norm(x, out=[0.0])
    # argument errors keep their messages (and come before out's)
    with pytest.raises(
        ValueError, match=r"^\[rms_norm\] weight must have shape \(8,\), got \(7,\)"
    ):
        lk.rms_norm(x, np.ones(7, dtype), out=np.zeros((4, 8), F32))
    with pytest.raises(ValueError, match=r"^\[attention\] Hq % Hkv must be 0"):
        lk.attention(
            x[None, None].repeat(3, 1), x[None, None].repeat(2, 1), x[None, None].repeat(2, 1)
        )
    # a float32 out for float16 input is the wrong dtype, not a silent float32 result
    with pytest.raises(TypeError, match=rf"^\[rope\] out must have dtype {dtype}"):
        lk.rope(x, out=np.zeros((4, 8), F32))


# --- mixed dtypes: NumPy's promotion ------------------------------------------------------------


@pytest.mark.parametrize(
    ("a", "b", "expected"),
    [
        (BF16, BF16, BF16),
        (F16, F16, F16),
        (BF16, F32, F32),
        (F16, F32, F32),
        (BF16, F64, F64),
        (F16, F64, F64),
        (BF16, F16, F32),  # NumPy has no common dtype: float32, where both are exact
        (F16, np.dtype(np.int32), F64),  # integers count as float64
        (BF16, np.dtype(np.bool_), F64),
    ],
    ids=lambda d: str(d),
)
def test_mixed_dtypes(a, b, expected, rng):
    x = rng.standard_normal((2, 8)).astype(a)
    y = (rng.standard_normal((2, 8)) > 0).astype(b) if b.kind in "iub" else _low(rng, (2, 8), b)
    w = np.ones(8, b)
    assert lk.swiglu(x, y).dtype == expected
    assert lk.rms_norm(x, w).dtype == expected
    assert lk.layer_norm(x, w, w).dtype == expected
    np.testing.assert_allclose(
        lk.swiglu(x, y).astype(F64), ref_swiglu(x.astype(F32), y.astype(F32)), **TOL[BF16]
    )
    q = x[None, None]
    assert lk.attention(q, q.astype(b), q.astype(b)).dtype == expected


# --- torch tensors ------------------------------------------------------------------------------


@pytest.mark.parametrize("tdtype", ["bfloat16", "float16"])
def test_torch_tensors(tdtype, rng):
    torch = pytest.importorskip("torch")
    dt = getattr(torch, tdtype)
    np_dtype = BF16 if tdtype == "bfloat16" else F16
    x32 = rng.standard_normal((3, 4, 16)).astype(F32)
    xt = torch.from_numpy(x32).to(dt)
    xn = x32.astype(np_dtype)  # the same rounding (to nearest even) as torch's .to()
    assert np.array_equal(xt.float().numpy(), xn.astype(F32))
    w = torch.ones(16, dtype=dt)
    for got, expected in [
        (lk.silu(xt), lk.silu(xn)),
        (lk.swiglu(xt, xt), lk.swiglu(xn, xn)),
        (lk.rms_norm(xt, w), lk.rms_norm(xn, np.ones(16, np_dtype))),
        (lk.layer_norm(xt, w, w), lk.layer_norm(xn, np.ones(16, np_dtype), np.ones(16, np_dtype))),
        (lk.rope(xt), lk.rope(xn)),
        (lk.attention(xt, xt, xt, causal=True), lk.attention(xn, xn, xn, causal=True)),
        (
            lk.swiglu_ffn(xt[0], w[:, None], w[:, None]),
            lk.swiglu_ffn(xn[0], np.ones((16, 1), np_dtype), np.ones((16, 1), np_dtype)),
        ),
    ]:
        assert type(got) is np.ndarray and got.dtype == np_dtype
        np.testing.assert_array_equal(got.view(np.uint16), expected.view(np.uint16))
    # a tensor that requires grad is refused (as torch's __array__ refuses it); a non-contiguous
    # one is read through its strides
    with pytest.raises(TypeError, match=r"^\[silu\] x could not be converted to an array"):
        lk.silu(xt.clone().requires_grad_(True))
    np.testing.assert_array_equal(
        lk.silu(xt.transpose(0, 1)).view(np.uint16), lk.silu(xn.transpose(1, 0, 2)).view(np.uint16)
    )
    # a bfloat16 torch mask (additive)
    m = torch.zeros(4, 4, dtype=dt)
    m[:, 0] = -float("inf")
    np.testing.assert_array_equal(
        lk.attention(xt, xt, xt, mask=m).view(np.uint16),
        lk.attention(xn, xn, xn, mask=m.float().numpy()).view(np.uint16),
    )


def test_overflow_to_the_dtype_is_an_infinity_not_a_warning():
    # float16 holds at most 65504: a float32 result past it rounds to -inf, silently (as torch)
    x = np.full(7, -7.0, np.float16)
    wg = np.full((7, 7), -2.0, np.float16)
    wu = np.ones((7, 7), np.float16)
    wd = np.full((7, 1), 2.0, np.float16)
    got = lk.swiglu_ffn(x, wg, wu, wd)  # pytest turns a warning into an error
    assert got.dtype == np.float16 and np.isneginf(got).all()
    h = np.full(7, 300.0, np.float16)  # silu(300) * 300 = 90000: past float16 too, into out=
    out = np.empty(7, np.float16)
    assert lk.swiglu(h, h, out=out) is out and np.isposinf(out).all()
