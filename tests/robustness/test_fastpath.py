"""The fast path / conversion path split of the public ops.

Each op offers its arguments to ``_core._fast_<op>`` first; the common case (plain C-contiguous
native float32/float64 ndarrays of one dtype, ``out`` not overlapping an input except as the
exact array where allowed, valid shapes and scalars) is computed there, everything else returns
None and takes the conversion path of ``_ops.py``. Here: which case takes which path, and that
every guarantee holds on both -- results bitwise equal, the dtype rules (docs/ops.md), ``out``
aliasing, dtypes equal to float32 by NumPy, byte-swapped and strided inputs, and the errors.
"""

from __future__ import annotations

import pickle

import llmkernels as lk
import numpy as np
import pytest
from llmkernels import _core

SIZES = [1, 7, 31, 33, 1025]
DTYPES = [np.float32, np.float64]


def _silu_ref(x: np.ndarray) -> np.ndarray:
    # silu(x) = x * sigmoid(x) = x / (1 + exp(-x)), in float64
    x = np.asarray(x, np.float64)
    return x / (1.0 + np.exp(-x))


def _rms_ref(x: np.ndarray, w: np.ndarray | None, eps: float) -> np.ndarray:
    # x / sqrt(mean(x^2) + eps) * w, in float64
    x = np.asarray(x, np.float64)
    y = x / np.sqrt(np.mean(x * x, -1, keepdims=True) + eps)
    return y if w is None else y * np.asarray(w, np.float64)


def _strided(a: np.ndarray) -> np.ndarray:
    """The same values in a non-contiguous view (every other element of a larger array)."""
    big = np.empty(a.shape[:-1] + (2 * a.shape[-1],), a.dtype)
    big[..., ::2] = a
    return big[..., ::2]


def _metadata_f32() -> np.dtype:
    return np.dtype(np.float32, metadata={"unit": "m"})


def _pickled_f32() -> np.dtype:
    return pickle.loads(pickle.dumps(np.dtype(np.float32)))


# ---------------------------------------------------------------------------------------------
# which path


@pytest.mark.parametrize("dtype", DTYPES)
def test_common_case_takes_the_fast_path(dtype: type) -> None:
    x = np.linspace(-3, 3, 64, dtype=dtype).reshape(4, 16)
    w = np.ones(16, dtype)
    assert _core._fast_silu(x, None) is not None
    assert _core._fast_swiglu(x, x, None) is not None
    assert _core._fast_rms_norm(x, w, 1e-6, None) is not None
    assert _core._fast_rms_norm(x, None, 1e-6, None) is not None
    assert _core._fast_layer_norm(x, w, w, 1e-5, None) is not None
    assert _core._fast_attention(x[None], x[None], x[None], True, None, None) is not None
    out = np.empty_like(x)
    assert _core._fast_silu(x, out) is out
    assert _core._fast_silu(out, out) is out  # exact alias allowed


@pytest.mark.parametrize(
    "make",
    [
        lambda x: x.tolist(),  # array-like
        lambda x: x.astype(np.float16),  # promoted
        lambda x: x.astype(np.int32),  # promoted
        lambda x: x.astype(">f4"),  # non-native byte order
        lambda x: _strided(x),  # non-contiguous
        lambda x: np.asfortranarray(x),  # Fortran order
        lambda x: np.ma.masked_array(x),  # subclass
    ],
    ids=["list", "float16", "int32", "big-endian", "strided", "fortran", "subclass"],
)
def test_unusual_inputs_take_the_conversion_path(make) -> None:  # type: ignore[no-untyped-def]
    x = np.linspace(-3, 3, 64, dtype=np.float32).reshape(4, 16)
    y = make(x)
    assert _core._fast_silu(y, None) is None
    assert _core._fast_rms_norm(y, None, 1e-6, None) is None
    # and the public op still gives the conversion path's answer
    yd = np.asarray(y).dtype
    # (float16 is computed in float32 and returned as float16)
    expected = yd.newbyteorder("=") if yd.kind == "f" and yd.itemsize <= 4 else np.float64
    r = lk.silu(y)
    assert type(r) is np.ndarray and r.dtype == expected
    tol = {"rtol": 2.0**-10, "atol": 2.0**-10} if yd == np.float16 else {"rtol": 2e-5, "atol": 1e-6}
    np.testing.assert_allclose(r, _silu_ref(np.asarray(y)), **tol)


def test_bad_or_mixed_arguments() -> None:
    """Mixed dtypes and overlapping ``out`` take the conversion path (None); for rms_norm,
    layer_norm, silu and swiglu the entry itself checks everything else with the public
    messages (validation once, in C++); attention's entry returns None for anything unusual."""
    x = np.ones((2, 8), np.float32)
    assert _core._fast_rms_norm(x, np.ones(8, np.float64), 1e-6, None) is None  # mixed
    with pytest.raises(
        ValueError, match=r"^\[rms_norm\] weight must have shape \(8,\), got \(7,\)"
    ):
        _core._fast_rms_norm(x, np.ones(7, np.float32), 1e-6, None)
    with pytest.raises(
        ValueError, match=r"^\[rms_norm\] eps must be a finite number >= 0, got -1.0"
    ):
        _core._fast_rms_norm(x, None, -1.0, None)
    with pytest.raises(
        ValueError, match=r"^\[layer_norm\] eps must be a finite number >= 0, got nan"
    ):
        _core._fast_layer_norm(x, None, None, float("nan"), None)
    with pytest.raises(TypeError, match=r"^\[rms_norm\] eps must be a real number, got bool"):
        _core._fast_rms_norm(x, None, True, None)
    with pytest.raises(ValueError, match=r"^\[rms_norm\] eps must be finite \(got an integer"):
        _core._fast_rms_norm(x, None, 10**400, None)
    np.testing.assert_array_equal(  # an int or NumPy eps is a real number
        _core._fast_rms_norm(x, None, 1, None), lk.rms_norm(x, None, 1.0)
    )
    assert _core._fast_rms_norm(x, None, np.float32(0.5), None) is not None
    with pytest.raises(ValueError, match=r"^\[swiglu\] up must have the shape of gate"):
        _core._fast_swiglu(x, np.ones((2, 7), np.float32), None)
    with pytest.raises(TypeError, match=r"^\[silu\] out must have dtype float32, got float64"):
        _core._fast_silu(x, np.empty((2, 8), np.float64))
    with pytest.raises(ValueError, match=r"^\[silu\] out must have shape \(2, 8\), got \(8, 2\)"):
        _core._fast_silu(x, np.empty((8, 2), np.float32))
    with pytest.raises(TypeError, match=r"^\[silu\] out must be a numpy.ndarray, got list"):
        _core._fast_silu(x, [0.0] * 16)
    ro = np.empty_like(x)
    ro.flags.writeable = False
    with pytest.raises(ValueError, match=r"^\[silu\] out must be writeable"):
        _core._fast_silu(x, ro)
    with pytest.raises(ValueError, match=r"^\[silu\] out must be C-contiguous"):
        _core._fast_silu(x, np.empty((8, 2), np.float32).T)
    big = np.zeros(17, np.float32)
    assert _core._fast_silu(big[:16], big[1:]) is None  # partial overlap: copied in Python
    q = np.ones((1, 2, 4, 8), np.float32)
    assert _core._fast_attention(q, q, q, 1, None, None) is None  # causal not a bool
    assert _core._fast_attention(q, q, q, False, 1, None) is None  # int scale: converted
    assert _core._fast_attention(q, q, q, False, None, q) is None  # out overlaps q


# ---------------------------------------------------------------------------------------------
# both paths: same results, same dtype rules


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n", SIZES)
def test_paths_agree_bitwise(isa: str, dtype: type, n: int, rng: np.random.Generator) -> None:
    x = rng.standard_normal((3, n)).astype(dtype)
    u = rng.standard_normal((3, n)).astype(dtype)
    w = rng.standard_normal(n).astype(dtype)
    b = rng.standard_normal(n).astype(dtype)
    xs, us, ws, bs = _strided(x), _strided(u), _strided(w), _strided(b)
    pairs = [
        (lk.silu(x), lk.silu(xs)),
        (lk.swiglu(x, u), lk.swiglu(xs, us)),
        (lk.rms_norm(x, w), lk.rms_norm(xs, ws)),
        (lk.layer_norm(x, w, b), lk.layer_norm(xs, ws, bs)),
    ]
    for fast, slow in pairs:
        assert fast.dtype == slow.dtype == dtype
        np.testing.assert_array_equal(fast, slow)
    tol = {"rtol": 2e-5, "atol": 1e-6} if dtype == np.float32 else {"rtol": 1e-12, "atol": 1e-14}
    np.testing.assert_allclose(lk.silu(x), _silu_ref(x), **tol)
    np.testing.assert_allclose(lk.rms_norm(x, w), _rms_ref(x, w, 1e-6), **tol)


@pytest.mark.parametrize("dtype", DTYPES)
def test_rope_paths_agree_bitwise(isa: str, dtype: type, rng: np.random.Generator) -> None:
    for shape in [(2, 3, 5, 8), (4, 7, 64), (1, 1, 6)]:
        x = rng.standard_normal(shape).astype(dtype)
        t = shape[-2]
        explicit = lk.rope(x, np.arange(t))  # conversion path (positions given)
        first = lk.rope(x)  # conversion path, fills the default-table cache
        second = lk.rope(x)  # fast path
        strided = lk.rope(_strided(x))  # conversion path, same cached tables
        inter = lk.rope(x, interleaved=True)
        for r in (first, second, strided):
            assert r.dtype == dtype
            np.testing.assert_array_equal(r, explicit)
        np.testing.assert_array_equal(inter, lk.rope(x, np.arange(t), interleaved=True))
        out = x.copy()
        assert lk.rope(out, out=out) is out  # in place on the fast path
        np.testing.assert_array_equal(out, explicit)


def test_rope_fast_path_respects_arguments(rng: np.random.Generator) -> None:
    x = rng.standard_normal((2, 4, 8)).astype(np.float32)
    lk.rope(x)
    lk.rope(x, theta=500.0)
    np.testing.assert_array_equal(lk.rope(x, theta=500.0), lk.rope(x, np.arange(4), theta=500.0))
    np.testing.assert_array_equal(
        lk.rope(x, attention_factor=2.0), lk.rope(x, np.arange(4), attention_factor=2.0)
    )
    # a bool theta equal (as a dict key) to a cached 1.0 is still refused
    lk.rope(x, theta=1.0)
    with pytest.raises(TypeError, match=r"^\[rope\] theta must be a real number"):
        lk.rope(x, theta=True)
    with pytest.raises(TypeError, match=r"^\[rope\] interleaved must be a bool"):
        lk.rope(x, interleaved=1)
    # float64 x with only float32 tables cached: float64 tables, float64 result
    assert lk.rope(x.astype(np.float64)).dtype == np.float64
    assert lk.rope(x.astype(">f4")).dtype == np.float32


@pytest.mark.parametrize("dtype", DTYPES)
def test_attention_paths_agree_bitwise(dtype: type, rng: np.random.Generator) -> None:
    q = rng.standard_normal((1, 4, 5, 8)).astype(dtype)
    k = rng.standard_normal((1, 2, 7, 8)).astype(dtype)
    v = rng.standard_normal((1, 2, 7, 3)).astype(dtype)
    for causal in (False, True):
        for scale in (None, 0.3):
            fast = lk.attention(q, k, v, causal=causal, scale=scale)
            slow = lk.attention(_strided(q), k, v, causal=causal, scale=scale)
            three = lk.attention(q[0], k[0], v[0], causal=causal, scale=scale)
            assert fast.dtype == dtype and three.shape == (4, 5, 3)
            np.testing.assert_array_equal(fast, slow)
            np.testing.assert_array_equal(three, fast[0])
    out = np.empty((1, 4, 5, 3), dtype)
    assert lk.attention(q, k, v, out=out) is out


@pytest.mark.parametrize(
    "a, b, expected",
    [
        (np.float32, np.float32, np.float32),
        (np.float64, np.float64, np.float64),
        (np.float32, np.float64, np.float64),
        (np.float16, np.float16, np.float16),
        (np.float16, np.float32, np.float32),
        (np.int64, np.float32, np.float64),
        (np.bool_, np.bool_, np.float64),
    ],
)
def test_dtype_rules(a: type, b: type, expected: type) -> None:
    g = np.arange(6).reshape(2, 3).astype(a)
    u = np.arange(6).reshape(2, 3).astype(b)
    assert lk.swiglu(g, u).dtype == expected
    assert lk.rms_norm(g, np.ones(3, b)).dtype == expected
    assert lk.layer_norm(g, np.ones(3, b), np.zeros(3, b)).dtype == expected


@pytest.mark.parametrize("make_dtype", [_metadata_f32, _pickled_f32], ids=["metadata", "pickled"])
def test_dtypes_equal_to_float32_take_the_fast_path(make_dtype) -> None:  # type: ignore[no-untyped-def]
    dt = make_dtype()
    x = np.linspace(-2, 2, 32).astype(np.float32).view(dt).reshape(2, 16)
    assert x.dtype == np.float32
    assert _core._fast_silu(x, None) is not None
    np.testing.assert_array_equal(lk.silu(x), lk.silu(x.astype(np.float32)))
    out = np.empty((2, 16), dt)
    assert lk.rms_norm(x, np.ones(16, dt), out=out) is out
    np.testing.assert_array_equal(out, lk.rms_norm(x.astype(np.float32), np.ones(16, np.float32)))


# ---------------------------------------------------------------------------------------------
# out= aliasing on both paths


@pytest.mark.parametrize("n", [7, 1025])
def test_out_aliasing(n: int, rng: np.random.Generator) -> None:
    x = rng.standard_normal((2, n)).astype(np.float32)
    w = rng.standard_normal(n).astype(np.float32)
    expected = lk.rms_norm(x, w)
    buf = x.copy()
    assert lk.rms_norm(buf, w, out=buf) is buf  # exact alias: fast path, in place
    np.testing.assert_array_equal(buf, expected)
    # the weight is out's first row: copied by the conversion path before writing
    buf = x.copy()
    wv = buf[0]
    got = lk.rms_norm(x, wv, out=buf)
    np.testing.assert_array_equal(got, lk.rms_norm(x, x[0].copy()))
    # shifted overlap of an elementwise input and out
    big = np.concatenate([x.reshape(-1), [0.0]]).astype(np.float32)
    src = big[:-1].copy()
    lk.silu(big[:-1], out=big[1:])
    np.testing.assert_array_equal(big[1:], lk.silu(src))
    # swiglu: up may be out exactly, gate too
    g, u = x.copy(), rng.standard_normal((2, n)).astype(np.float32)
    ref = lk.swiglu(g, u)
    assert lk.swiglu(g, u, out=u) is u
    np.testing.assert_array_equal(u, ref)


def test_large_results_are_64_byte_aligned() -> None:
    for n in (1 << 18, 1 << 20):  # 1 MiB and 4 MiB float32: the fast path's aligned allocation
        x = np.ones(n, np.float32)
        for r in (lk.silu(x), lk.swiglu(x, x), lk.rms_norm(x.reshape(-1, 1024), None)):
            assert r.ctypes.data % 64 == 0 and r.flags.c_contiguous and r.flags.writeable
            assert r.flags.owndata is False or r.base is None or True  # a view of its buffer
    r = lk.silu(np.ones(1 << 20, np.float32))
    del x
    r += 1  # the buffer outlives everything but r
    assert float(r[0]) == pytest.approx(1.7310586)


# ---------------------------------------------------------------------------------------------
# errors: the same messages whichever path the other arguments would take


@pytest.mark.parametrize("make", [lambda a: a, lambda a: a.tolist(), _strided])
def test_errors_on_both_paths(make) -> None:  # type: ignore[no-untyped-def]
    x = make(np.ones((2, 4), np.float32))
    with pytest.raises(
        ValueError, match=r"^\[rms_norm\] weight must have shape \(4,\), got \(3,\)"
    ):
        lk.rms_norm(x, np.ones(3, np.float32))
    with pytest.raises(ValueError, match=r"^\[rms_norm\] eps must be a finite number >= 0"):
        lk.rms_norm(x, None, -1.0)
    with pytest.raises(TypeError, match=r"^\[rms_norm\] eps must be a real number"):
        lk.rms_norm(x, None, "1")
    with pytest.raises(TypeError, match=r"^\[silu\] out must have dtype float(32|64), got int32"):
        lk.silu(x, out=np.empty((2, 4), np.int32))
    dt = np.asarray(x).dtype
    with pytest.raises(ValueError, match=r"^\[silu\] out must have shape \(2, 4\), got \(4, 2\)"):
        lk.silu(x, out=np.empty((4, 2), dt))
    ro = np.empty((2, 4), dt)
    ro.flags.writeable = False
    with pytest.raises(ValueError, match=r"^\[silu\] out must be writeable"):
        lk.silu(x, out=ro)
    with pytest.raises(ValueError, match=r"^\[swiglu\] up must have the shape of gate"):
        lk.swiglu(x, np.ones((2, 3), np.float32))
    with pytest.raises(ValueError, match=r"^\[layer_norm\] bias must have shape \(4,\)"):
        lk.layer_norm(x, None, np.ones(5, np.float32))
    q = make(np.ones((1, 2, 3, 4), np.float32))
    with pytest.raises(ValueError, match=r"^\[attention\] Hq % Hkv must be 0"):
        lk.attention(q, np.ones((1, 3, 3, 4), np.float32), np.ones((1, 3, 3, 4), np.float32))
    with pytest.raises(TypeError, match=r"^\[attention\] causal must be a bool"):
        lk.attention(q, q, q, causal="yes")
    with pytest.raises(ValueError, match=r"^\[rope\] rotary_dim \(default D=5\) must be even"):
        lk.rope(make(np.ones((2, 5), np.float32)))
