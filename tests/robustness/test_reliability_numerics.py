"""Numerical reliability at the edges, on every SIMD path.

* Index limits are integers: causal limits past 2**24 keys (float32 would round them).
* Subnormal operands follow the float64 reference (no DAZ/FTZ), also when the calling thread
  set DAZ/FTZ itself (``torch.set_flush_denormal(True)``).
* Attention is finite wherever the float64 reference is: scales and scores past float32's range.
* Long rows (2**18 values around 1e8, 2**24 values) stay within the contract's tolerance.

Each test states the reference formula it compares against (``llmkernels.reference`` is the
specification). The heavy ones (rows of 2**24 values, 2**24 keys) are marked ``slow``; they
still run in ``make test`` and take a few seconds each.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import llmkernels as lk
import numpy as np
import pytest
from conftest import TOL
from llmkernels import reference as ref

F32, F64 = np.float32, np.float64
# The attention tolerance: outputs against the float64 reference
ATTN_TOL = {
    np.dtype(F32): {"rtol": 1e-4, "atol": 1e-5},
    np.dtype(F64): {"rtol": 1e-9, "atol": 1e-12},
}
TAILS = [1, 7, 31, 33, 1025]


@contextlib.contextmanager
def caller_flush_denormal(on: bool) -> Iterator[None]:
    """The calling thread's MXCSR with DAZ + FTZ set (as torch.set_flush_denormal(True) does):
    the kernels must give the reference's answer regardless (no DAZ on operands: docs/ops.md,
    Numerics)."""
    if not on:
        yield
        return
    torch = pytest.importorskip("torch")
    if not torch.set_flush_denormal(True):
        pytest.skip("this CPU cannot flush denormals")
    try:
        yield
    finally:
        torch.set_flush_denormal(False)


def relative_close(got: np.ndarray, want: np.ndarray, dtype: type, rtol: float | None = None):
    """Relative comparison: a result like 5e-11 must match the reference to rtol, not merely be
    below atol. Absolute slack only for results below the dtype's normal range (a subnormal
    output carries fewer bits)."""
    fi = np.finfo(dtype)
    rtol = TOL[np.dtype(dtype)]["rtol"] if rtol is None else rtol
    assert got.dtype == np.dtype(dtype)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    with np.errstate(over="ignore"):  # a reference past the dtype's range is inf in it too
        want = want.astype(dtype)
    np.testing.assert_allclose(got, want, rtol=rtol, atol=float(fi.tiny))


# --------------------------------------------------------------------------------------------
# item 5: index arithmetic is integer arithmetic
# --------------------------------------------------------------------------------------------


def _causal_late_keys_reference(
    tq: int, tk: int, first_hot: int, hot_score: float, v_hot: np.ndarray
) -> np.ndarray:
    """reference.attention's formula, softmax(q k^T scale, causal bottom-right) v, for queries
    i < tq against tk keys of which keys j < first_hot score 0 with value 0 and keys
    j >= first_hot score `hot_score` with values v_hot[j - first_hot]. Query i may attend keys
    j <= i + tk - tq; the cold keys enter the softmax denominator only, as a count."""
    out = np.empty((tq, 1))
    for i in range(tq):
        last = i + tk - tq  # integer causal limit
        n_cold = min(first_hot, last + 1)
        hot = v_hot[: max(0, last + 1 - first_hot)]
        m = hot_score if hot.size else 0.0
        num = np.sum(np.exp(hot_score - m) * hot)
        den = n_cold * np.exp(0.0 - m) + hot.size * np.exp(hot_score - m)
        out[i, 0] = num / den
    return out


@pytest.mark.slow
@pytest.mark.parametrize("exact_path", [False, True], ids=["fast", "exact"])
def test_causal_limit_past_2_24_keys(isa, exact_path):
    """Tk = 2**24 + 6 keys, D = 1, causal bottom-right: query i may attend keys
    j <= i + Tk - Tq. The last keys are "hot" (score 40, distinct values): a limit compared in
    float32 rounds 2**24 + 1 down to 2**24 and lets query 1 see key 2**24 + 1. exact_path:
    a scale past float32's range (1e39) sends every row through the exact (double) path, whose
    limits must be integers too."""
    tq, tk = 4, (1 << 24) + 6
    first_hot = (1 << 24) - 3
    scale, qv = (1e39, 40e-39) if exact_path else (40.0, 1.0)
    q = np.full((1, tq, 1), qv, F32)
    k = np.zeros((1, tk, 1), F32)
    k[0, first_hot:, 0] = 1.0
    v = np.zeros((1, tk, 1), F32)
    v_hot = np.arange(1, tk - first_hot + 1, dtype=F32)  # 1, 2, ..., 9
    v[0, first_hot:, 0] = v_hot
    got = lk.attention(q, k, v, causal=True, scale=scale)
    del k, v
    want = _causal_late_keys_reference(tq, tk, first_hot, 40.0, v_hot.astype(F64))
    np.testing.assert_allclose(got[0], want, **ATTN_TOL[np.dtype(F32)])


@pytest.mark.slow
def test_causal_limit_past_2_24_keys_many_rows(isa):
    """The same past 2**24 keys with a tile of 65 query rows (no key splits: every row tile
    streams over all keys; limits made tile-relative per key tile) and a boolean key mask."""
    tq, tk = 65, (1 << 24) + 70
    first_hot = (1 << 24) - 2
    q = np.full((1, tq, 1), 1.0, F32)
    k = np.zeros((1, tk, 1), F32)
    k[0, first_hot:, 0] = 1.0
    v = np.zeros((1, tk, 1), F32)
    v_hot = np.arange(1, tk - first_hot + 1, dtype=F32)
    v[0, first_hot:, 0] = v_hot
    mask = np.ones(tk, bool)  # broadcast (Tk,) boolean mask: every key allowed
    got = lk.attention(q, k, v, causal=True, scale=40.0, mask=mask)
    del k, v, mask
    want = _causal_late_keys_reference(tq, tk, first_hot, 40.0, v_hot.astype(F64))
    np.testing.assert_allclose(got[0], want, **ATTN_TOL[np.dtype(F32)])


# --------------------------------------------------------------------------------------------
# item 8: subnormal operands follow the float64 reference
# --------------------------------------------------------------------------------------------


def _gate_up_cases(dtype: type) -> tuple[np.ndarray, np.ndarray]:
    """Gates that are subnormal, tiny, hugely negative or ordinary, against large and ordinary
    ups: silu(g) underflows for the first kinds although silu(g) * up is a normal number."""
    fi = np.finfo(dtype)
    if dtype == F32:
        gates = [
            1e-40,
            -1e-40,
            float(fi.smallest_subnormal),
            -3 * float(fi.smallest_subnormal),
            float(fi.tiny),
            1e-20,
            -1e-25,
            -87.5,
            -90.0,
            -100.0,
            -150.0,
            -180.0,
            95.0,
            0.0,
            3.0,
            -3.0,
        ]
        ups = [1e30, 3e38, -1e38, 1.0, 1e-30]
    else:  # float64: cases where the float64 reference itself stays exact
        gates = [
            1e-310,
            -1e-310,
            1e-300,
            1e-170,
            -1e-200,
            -600.0,
            -700.0,
            -705.0,
            720.0,
            0.0,
            3.0,
            -3.0,
        ]
        ups = [1e300, -1e290, 1.0, 1e-30]
    g, u = np.meshgrid(np.array(gates, dtype), np.array(ups, dtype))
    return g.ravel(), u.ravel()


@pytest.mark.parametrize("n", TAILS)
@pytest.mark.parametrize("dtype", [F32, F64])
@pytest.mark.parametrize("daz", [False, True], ids=["mxcsr-default", "caller-daz"])
def test_swiglu_silu_subnormal_and_extreme_gates(isa, n, dtype, daz):
    """reference: swiglu(g, up) = g * sigmoid(g) * up, silu(g) = g * sigmoid(g) in float64
    (swiglu(1e-40, 1e30) = 5e-11, not 0). Every case at every position of arrays of each tail
    length, and as a non-contiguous view."""
    g, u = _gate_up_cases(dtype)
    reps = -(-n // g.size) + 1
    gates = np.resize(np.concatenate([g, np.roll(g, 3)]), (reps * g.size,))[:n].astype(dtype)
    ups = np.resize(np.concatenate([u, np.roll(u, 5)]), (reps * u.size,))[:n].astype(dtype)
    with caller_flush_denormal(daz):
        got_swiglu = lk.swiglu(gates, ups)
        got_silu = lk.silu(gates)
        strided = lk.swiglu(np.repeat(gates, 2)[::2], np.repeat(ups, 2)[::2])
    relative_close(got_swiglu, ref.swiglu(gates, ups), dtype)
    relative_close(got_silu, ref.silu(gates), dtype)
    relative_close(strided, ref.swiglu(gates, ups), dtype)


@pytest.mark.parametrize("dtype", [F32, F64])
@pytest.mark.parametrize("daz", [False, True], ids=["mxcsr-default", "caller-daz"])
def test_swiglu_runs_of_subnormal_gates(isa, dtype, daz):
    """Long runs of subnormal and hugely negative gates (whole blocks of them), between ordinary
    data, in place (out aliases the gate) and not. reference: g * sigmoid(g) * up."""
    rng = np.random.default_rng(5)
    fi = np.finfo(dtype)
    n = 5000
    gates = rng.standard_normal(n).astype(dtype)
    # even multiples of the smallest subnormal: the float64 reference's own g * 0.5 is exact
    gates[700:2500] = (fi.smallest_subnormal * 2 * rng.integers(1, 1 << 20, 1800)).astype(dtype)
    gates[3000:3900] = -rng.uniform(90, 170 if dtype == F32 else 700, 900).astype(dtype)
    ups = (
        np.where(np.arange(n) % 2, 1e30, -3e37).astype(dtype)
        if dtype == F32
        else np.where(np.arange(n) % 2, 1e300, -1e290).astype(dtype)
    )
    want = ref.swiglu(gates, ups)
    with caller_flush_denormal(daz):
        got = lk.swiglu(gates, ups)
        inplace = gates.copy()
        lk.swiglu(inplace, ups, out=inplace)
    relative_close(got, want, dtype)
    relative_close(inplace, want, dtype)


@pytest.mark.parametrize("d", [1, 7, 33, 1025])
@pytest.mark.parametrize("dtype", [F32, F64])
@pytest.mark.parametrize("daz", [False, True], ids=["mxcsr-default", "caller-daz"])
def test_norms_of_subnormal_rows(isa, d, dtype, daz):
    """reference: rms_norm = x / sqrt(mean(x**2) + eps) * w; layer_norm = (x - mean) /
    sqrt(var + eps) * w + b. With eps = 0 a row of subnormals normalises to O(1) values."""
    fi = np.finfo(dtype)
    rng = np.random.default_rng(d)
    x = (fi.smallest_subnormal * rng.integers(-(1 << 16), 1 << 16, (3, d))).astype(dtype)
    x[:, 0] = fi.smallest_subnormal * 12345  # nonzero, and not a constant row
    x[1] += dtype(fi.tiny)  # normal values with subnormal deviations
    w = rng.standard_normal(d).astype(dtype)
    with caller_flush_denormal(daz):
        got_rms = lk.rms_norm(x, w, eps=0.0)
        got_ln = lk.layer_norm(x, w, w, eps=0.0)
    # with eps = 0 both are invariant under x -> c x: the float64 reference on x * 2**600 for a
    # float64 x (its own squares of subnormals would underflow to 0 in float64)
    xs = x.astype(F64) * (2.0**600 if dtype == F64 else 1.0)
    np.testing.assert_allclose(got_rms, ref.rms_norm(xs, w, eps=0.0), **TOL[np.dtype(dtype)])
    # layer_norm is also shift-invariant: exactly (x - x[0]) * 2**600, well conditioned in float64
    want_ln = ref.layer_norm((x.astype(F64) - x[:, :1]) * 2.0**600, w, w, eps=0.0)
    if d > 1:
        np.testing.assert_allclose(got_ln, want_ln, **TOL[np.dtype(dtype)])


@pytest.mark.parametrize("dtype", [F32, F64])
@pytest.mark.parametrize("daz", [False, True], ids=["mxcsr-default", "caller-daz"])
def test_rope_of_subnormal_x(isa, dtype, daz):
    """reference: x1' = x1 cos(p f) a - x2 sin(p f) a, x2' = x2 cos(p f) a + x1 sin(p f) a
    (a = attention_factor). Subnormal x with a large attention factor gives normal results."""
    fi = np.finfo(dtype)
    rng = np.random.default_rng(3)
    top = 1 << (20 if dtype == F32 else 50)  # subnormal: below 2**23 / 2**52 units
    x = (fi.smallest_subnormal * rng.integers(top // 4, top, (2, 5, 34))).astype(dtype)
    af = 1e38 if dtype == F32 else 1e307
    with caller_flush_denormal(daz):
        got = lk.rope(x, attention_factor=af)
    want = ref.rope(x, attention_factor=af)
    np.testing.assert_allclose(got, want, rtol=TOL[np.dtype(dtype)]["rtol"], atol=float(fi.tiny))
    assert np.any(np.abs(want) > 1e-6)


@pytest.mark.parametrize(("tq", "tk"), [(3, 9), (1, 1500)])  # one tile; key splits + merge
@pytest.mark.parametrize("path", ["fast", "exact"])
@pytest.mark.parametrize("dtype", [F32, F64])
@pytest.mark.parametrize("daz", [False, True], ids=["mxcsr-default", "caller-daz"])
def test_attention_subnormal_q(isa, dtype, daz, path, tq, tk):
    """reference: softmax(q k^T scale) v. Subnormal q against huge k gives O(1) scores; with
    path="exact" the scale is past the dtype's range (every row takes the exact double path)."""
    if path == "exact" and dtype == F64:
        pytest.skip("no finite float64 scale past the range keeps subnormal-q scores O(1)")
    fi = np.finfo(dtype)
    rng = np.random.default_rng(4)
    q = (fi.smallest_subnormal * rng.integers(1, 1 << 16, (2, tq, 8))).astype(dtype)
    v = rng.standard_normal((2, tk, 5)).astype(dtype)
    if path == "fast":
        k = (rng.standard_normal((2, tk, 8)) * (fi.max / 2**20)).astype(dtype)
        scale = float(1 / (fi.smallest_subnormal * 2**16 * fi.max / 2**20 * 8))
    else:
        k = rng.standard_normal((2, tk, 8)).astype(dtype)
        scale = float(fi.max) * 4.0  # past float32's range: every row exact, in double
    with caller_flush_denormal(daz):
        got = lk.attention(q, k, v, scale=scale)
    want = ref.attention(q, k, v, scale=scale)
    np.testing.assert_allclose(got, want, **ATTN_TOL[np.dtype(dtype)])


# --------------------------------------------------------------------------------------------
# item 9: softmax results are finite wherever the float64 reference is
# --------------------------------------------------------------------------------------------


def _attention_case(kind: str, dtype: type, rng: np.random.Generator, tq: int, tk: int):
    """(q, k, v, kwargs) of an extreme attention whose float64 reference is finite."""
    big = 1e20 if dtype == F32 else 1e155  # big**2 is past float32's range, not float64's
    q = rng.standard_normal((2, tq, 4))
    k = rng.standard_normal((2, tk, 4))
    v = rng.standard_normal((2, tk, 3))
    kw: dict = {}
    if kind == "scale-times-q-overflows":  # scale * q past the range, (q . k) * scale finite
        q, kw["scale"] = q * big, big
        k = k / big
    elif kind == "scores-overflow":  # q . k * scale past float32's range: a one-hot softmax
        big = 1e20 if dtype == F32 else 1e150
        q, kw["scale"] = q * big, big
    elif kind == "scores-overflow-negative":  # every score -huge: the softmax is still finite
        big = 1e20 if dtype == F32 else 1e150
        q, k, kw["scale"] = -np.abs(q) * big, np.abs(k) + 0.5, big
    elif kind == "qk-overflows-tiny-scale":  # q . k overflows, the scaled score does not
        big = 1e20 if dtype == F32 else 1e150  # (the float64 reference's own q . k must not)
        q, k, kw["scale"] = q * big, k * big, 1.0 / big / big
    elif kind == "scale-below-normal":  # scale not a normal float32 (or tiny float64)
        kw["scale"] = 1e-39 if dtype == F32 else 1e-310
        q = q * (1e30 if dtype == F32 else 1e290)
        k = k * (1e9 if dtype == F32 else 1e10)
    elif kind == "scale-above-max":
        kw["scale"] = 1e39 if dtype == F32 else 1e300
        q = q * (1e-39 if dtype == F32 else 1e-300)
    elif kind == "additive-mask-overflows":  # score + mask past float32's range, finite in f64
        q = np.abs(q) * (1e19 if dtype == F32 else 1e150)
        k = np.abs(k) * (1e19 if dtype == F32 else 1e150)
        kw["scale"] = 1.0
        kw["mask"] = np.full((tq, tk), 3e38 if dtype == F32 else 1e300)
    return q.astype(dtype), k.astype(dtype), v.astype(dtype), kw


KINDS = [
    "scale-times-q-overflows",
    "scores-overflow",
    "scores-overflow-negative",
    "qk-overflows-tiny-scale",
    "scale-below-normal",
    "scale-above-max",
    "additive-mask-overflows",
]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("dtype", [F32, F64])
@pytest.mark.parametrize(
    ("tq", "tk", "causal"),
    [(1, 7, False), (5, 33, True), (70, 100, True), (1, 1500, False), (2, 1500, True)],
)
def test_attention_finite_where_reference_is(isa, kind, dtype, tq, tk, causal):
    """reference: softmax over allowed keys of (q @ k^T) * scale + mask, max-subtracted, in
    float64; wherever that is finite our result is finite and within the attention tolerance.
    Shapes cover single rows, row tiles, several row tiles and key splits (Tk > 1024)."""
    rng = np.random.default_rng(hash((kind, tq, tk)) % 2**32)
    q, k, v, kw = _attention_case(kind, dtype, rng, tq, tk)
    if "mask" in kw:
        kw["mask"] = kw["mask"].astype(dtype)
    want, want_w = ref.attention(q, k, v, causal=causal, return_weights=True, **kw)
    assert np.all(np.isfinite(want)), "the case must have a finite reference"
    got = lk.attention(q, k, v, causal=causal, **kw)
    assert np.all(np.isfinite(got)), f"non-finite output where the reference is finite ({kind})"
    np.testing.assert_allclose(got, want, **ATTN_TOL[np.dtype(dtype)])
    got2, got_w = lk.attention(q, k, v, causal=causal, return_weights=True, **kw)
    np.testing.assert_allclose(got2, want, **ATTN_TOL[np.dtype(dtype)])
    np.testing.assert_allclose(got_w, want_w, **ATTN_TOL[np.dtype(dtype)])


def test_attention_issue_example_scale_1e20(isa):
    """The reported example: scale = 1e20 with q = 1e20 gave NaN; the reference is finite."""
    q = np.full((1, 1, 2), 1e20, F32)
    k = np.array([[[1.0, 0.0], [0.0, 2.0], [0.5, 0.5]]], F32)
    v = np.array([[[1.0], [2.0], [3.0]]], F32)
    got = lk.attention(q, k, v, scale=1e20)
    np.testing.assert_allclose(got, ref.attention(q, k, v, scale=1e20), **ATTN_TOL[np.dtype(F32)])


def test_attention_nan_and_inf_still_propagate(isa):
    """NaN/Inf data keep IEEE semantics through the exact path: reference.attention gives NaN
    rows for a NaN or +inf score, and a -inf score is a masked key."""
    rng = np.random.default_rng(9)
    q = rng.standard_normal((1, 4, 3)).astype(F32)
    k = rng.standard_normal((1, 6, 3)).astype(F32)
    v = rng.standard_normal((1, 6, 2)).astype(F32)
    q[0, 1, 0] = np.nan
    k[0, 2, :] = np.inf
    with np.errstate(invalid="ignore"):
        want = ref.attention(q, k, v)
    got = lk.attention(q, k, v)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    fin = np.isfinite(want)
    np.testing.assert_allclose(got[fin], want[fin], **ATTN_TOL[np.dtype(F32)])


# --------------------------------------------------------------------------------------------
# item 10: accurate at every row length
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("spread", [1.0, 100.0, 1e4])
@pytest.mark.parametrize("dtype", [F32, F64])
def test_layer_norm_long_row_around_1e8(isa, spread, dtype):
    """reference: (x - mean) / sqrt(var + eps) * w + b with var = mean((x - mean)**2), float64;
    2**18 values around 1e8 (the reported case was 1,400x over the tolerance)."""
    rng = np.random.default_rng(int(spread))
    n = 1 << 18
    x = (1e8 + spread * rng.standard_normal(n)).astype(dtype)[None]
    w = rng.standard_normal(n).astype(dtype)
    b = rng.standard_normal(n).astype(dtype)
    tol = dict(TOL[np.dtype(dtype)])
    if dtype == F64:  # the float64 reference itself is only good to ~eps * 1e8 / spread here
        tol["atol"] = 64 * np.finfo(F64).eps * 1e8 / spread
    np.testing.assert_allclose(lk.layer_norm(x, w, b), ref.layer_norm(x, w, b), **tol)
    np.testing.assert_allclose(lk.rms_norm(x, w), ref.rms_norm(x, w), **TOL[np.dtype(dtype)])


@pytest.mark.slow
@pytest.mark.parametrize("dist", ["uniform", "normal", "offset"])
def test_norms_rows_of_2_24_values(isa, dist):
    """reference: rms_norm = x / sqrt(mean(x**2) + eps) * w and layer_norm as above, float64,
    on one float32 row of 2**24 values (the reported plain rows were 4x over the tolerance)."""
    rng = np.random.default_rng(24)
    n = 1 << 24
    if dist == "uniform":
        x = rng.random(n, dtype=F32)
    elif dist == "normal":
        x = rng.standard_normal(n, dtype=F32)
    else:
        x = (rng.standard_normal(n, dtype=F32) + F32(3.0)).astype(F32)
    x = x[None]
    got = lk.rms_norm(x)
    np.testing.assert_allclose(got, ref.rms_norm(x), **TOL[np.dtype(F32)])
    del got
    got = lk.layer_norm(x)
    np.testing.assert_allclose(got, ref.layer_norm(x), **TOL[np.dtype(F32)])


@pytest.mark.parametrize("n", [1, 7, 31, 33, 1025, 2048, 2049, 4097, 65537])
@pytest.mark.parametrize("dtype", [F32, F64])
def test_norms_block_boundaries(isa, n, dtype):
    """The blocked sums at and around block boundaries (2048 elements) and tails, offset data
    (mean far from 0). reference: rms_norm / layer_norm formulas above, float64."""
    rng = np.random.default_rng(n)
    x = (50.0 + rng.standard_normal((3, n))).astype(dtype)
    w = rng.standard_normal(n).astype(dtype)
    np.testing.assert_allclose(lk.rms_norm(x, w), ref.rms_norm(x, w), **TOL[np.dtype(dtype)])
    np.testing.assert_allclose(
        lk.layer_norm(x, w, w), ref.layer_norm(x, w, w), **TOL[np.dtype(dtype)]
    )
    xs = x[:, ::-1]  # non-contiguous
    np.testing.assert_allclose(lk.layer_norm(xs), ref.layer_norm(xs), **TOL[np.dtype(dtype)])
