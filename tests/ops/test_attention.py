"""llmkernels.attention (tile kernel cpp/kernels/attention.hpp, driver and entries
cpp/ops/attention.cpp, binding cpp/bindings/attention.cpp, wrapper llmkernels._ops.attention)
against its formula (ref_attention below, which is llmkernels.reference.attention), PyTorch's
scaled_dot_product_attention and the LLaMA notes' RoPE attention numbers; streaming memory,
determinism across threads / runs, bad input and empty shapes.

The reference sweep goes one parameter at a time from the defaults (B=1, Hq=Hkv=4,
Tq=Tk=17, D=Dv=32, non-causal), for both dtypes and on every SIMD path.
"""

from __future__ import annotations

import json
import math

import llmkernels as lk
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from conftest import run_python
from llmkernels import pure
from llmkernels import reference as ref

DTYPES = [np.float32, np.float64]

# The attention tolerance: float32 is held to rtol=1e-4, atol=1e-5 against the float64
# reference; float64 to what only accumulation order can explain.
ATTN_TOL = {
    np.dtype(np.float32): {"rtol": 1e-4, "atol": 1e-5},
    np.dtype(np.float64): {"rtol": 1e-10, "atol": 1e-12},
}


def check(actual: np.ndarray, expected: np.ndarray, dtype) -> None:
    dt = np.dtype(dtype)
    assert actual.dtype == dt
    assert actual.shape == expected.shape
    assert not np.isnan(actual).any()
    np.testing.assert_allclose(actual, expected, **ATTN_TOL[dt])


def data(rng: np.random.Generator, shape, dtype, scale: float = 1.0) -> np.ndarray:
    return (rng.standard_normal(shape) * scale).astype(dtype)


def qkv(rng, b=1, hq=4, hkv=4, tq=17, tk=17, d=32, dv=None, dtype=np.float32):
    """q (B, Hq, Tq, D), k (B, Hkv, Tk, D), v (B, Hkv, Tk, Dv); b=None gives 3-D inputs."""
    dv = d if dv is None else dv
    lead = () if b is None else (b,)
    return (
        data(rng, lead + (hq, tq, d), dtype),
        data(rng, lead + (hkv, tk, d), dtype),
        data(rng, lead + (hkv, tk, dv), dtype),
    )


def ref_attention(q, k, v, causal=False, mask=None, scale=None, return_weights=False):
    """softmax(q @ k^T * scale + mask) @ v per head, in float64. q (..., Hq, Tq, D), k (..., Hkv,
    Tk, D), v (..., Hkv, Tk, Dv); query head h uses KV head h // (Hq // Hkv); scale defaults to
    1/sqrt(D); causal: query i sees key j iff j <= i + Tk - Tq (bottom-right aligned); mask: bool
    (True = may attend) or additive, broadcast to (..., Hq, Tq, Tk). A row with no key to attend
    gives zeros (output and weights)."""
    q, k, v = (np.asarray(a, np.float64) for a in (q, k, v))
    group = q.shape[-3] // k.shape[-3]
    k, v = np.repeat(k, group, axis=-3), np.repeat(v, group, axis=-3)
    tq, tk = q.shape[-2], k.shape[-2]
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    scores = q @ np.swapaxes(k, -1, -2) * scale  # (..., Hq, Tq, Tk)
    allowed = np.ones(scores.shape, bool)
    if causal:
        allowed &= np.arange(tk)[None, :] <= np.arange(tq)[:, None] + (tk - tq)
    if mask is not None and np.asarray(mask).dtype == bool:
        allowed &= np.asarray(mask)
    elif mask is not None:
        scores = scores + np.asarray(mask, np.float64)
    scores = np.where(allowed, scores, -np.inf)
    m = scores.max(axis=-1, keepdims=True)
    e = np.exp(scores - np.where(np.isfinite(m), m, 0.0))
    total = e.sum(axis=-1, keepdims=True)
    w = np.divide(e, total, out=np.zeros_like(e), where=total > 0)
    return (w @ v, w) if return_weights else w @ v


def check_weights(w: np.ndarray, expected_w: np.ndarray, dtype) -> None:
    check(w, expected_w, dtype)
    sums = w.astype(np.float64).sum(-1)
    ones = np.isclose(sums, 1.0, rtol=0, atol=1e-5 if np.dtype(dtype) == np.float32 else 1e-12)
    zeros = sums == 0.0
    assert (ones | zeros).all(), "every weights row sums to 1 (or is all zeros)"
    # zero rows are exactly the rows with nothing to attend
    np.testing.assert_array_equal(zeros, expected_w.sum(-1) == 0.0)


# --- 1. sweep against the reference, one parameter at a time ---------------------------------

SWEEP = {
    "default": {},
    # head dimension (SIMD tails), Dv = D
    "d1": {"d": 1},
    "d7": {"d": 7},
    "d33": {"d": 33},
    "d64": {"d": 64},
    "d128": {"d": 128},
    # sequence lengths, equal and unequal (tiles of 64 rows / keys and their tails)
    "t1": {"tq": 1, "tk": 1},
    "t2": {"tq": 2, "tk": 2},
    "t64": {"tq": 64, "tk": 64},
    "t257": {"tq": 257, "tk": 257},
    "tq1_tk257": {"tq": 1, "tk": 257},
    "tq2_tk17": {"tq": 2, "tk": 17},
    "tq17_tk64": {"tq": 17, "tk": 64},
    "tq1_tk64": {"tq": 1, "tk": 64},
    "tq64_tk17": {"tq": 64, "tk": 17},
    "tq257_tk2": {"tq": 257, "tk": 2},
    "tq17_tk1": {"tq": 17, "tk": 1},
    # heads: MHA, GQA, MQA
    "h1_1": {"hq": 1, "hkv": 1},
    "h8_2": {"hq": 8, "hkv": 2},
    "h8_1": {"hq": 8, "hkv": 1},
    "h8_1_t257": {"hq": 8, "hkv": 1, "tq": 257, "tk": 257},  # tiles span query heads
    # non-causal tiles of up to 192 rows, balanced: 385 rows -> 3 x 144 (last 97), GQA 4 x 200
    # rows -> 5 x 160; causal keeps 64-row tiles
    "t385": {"tq": 385, "tk": 70},
    "h8_2_t200": {"hq": 8, "hkv": 2, "tq": 200, "tk": 33},
    "causal_t385": {"causal": True, "tq": 385, "tk": 385, "hq": 2, "hkv": 1},
    # batch, 3-D inputs
    "b3": {"b": 3},
    "3d": {"b": None},
    "3d_gqa": {"b": None, "hq": 8, "hkv": 2},
    # Dv != D
    "dv1": {"dv": 1},
    "dv7": {"dv": 7},
    "dv48": {"dv": 48},
    "d7_dv64": {"d": 7, "dv": 64},
    # causal (bottom-right aligned) with Tq = Tk, Tq < Tk, Tq > Tk (rows with no key -> 0)
    "causal": {"causal": True},
    "causal_tq1_tk257": {"causal": True, "tq": 1, "tk": 257},
    "causal_tq17_tk64": {"causal": True, "tq": 17, "tk": 64},
    "causal_tq64_tk17": {"causal": True, "tq": 64, "tk": 17},
    "causal_tq257_tk2": {"causal": True, "tq": 257, "tk": 2},
    "causal_t257_gqa": {"causal": True, "tq": 257, "tk": 257, "hq": 8, "hkv": 2},
    "causal_t1": {"causal": True, "tq": 1, "tk": 1},
    # scale
    "scale0.3": {"scale": 0.3},
    "scale2": {"scale": 2.0},
    "scale_neg": {"scale": -0.5},
}

SHAPE_KEYS = ("b", "hq", "hkv", "tq", "tk", "d", "dv")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", list(SWEEP))
def test_sweep(case, dtype, isa, rng):
    params = SWEEP[case]
    shape = {key: params[key] for key in SHAPE_KEYS if key in params}
    q, k, v = qkv(rng, dtype=dtype, **shape)
    kwargs = {key: params[key] for key in ("causal", "scale") if key in params}
    got = lk.attention(q, k, v, **kwargs)
    want = ref_attention(q, k, v, **kwargs)
    check(got, want, dtype)
    got_o, got_w = lk.attention(q, k, v, return_weights=True, **kwargs)
    want_o, want_w = ref_attention(q, k, v, return_weights=True, **kwargs)
    check(got_o, want_o, dtype)
    check_weights(got_w, want_w, dtype)
    if params.get("causal") and q.shape[-2] > k.shape[-2]:
        blind = q.shape[-2] - k.shape[-2]  # first rows see no key
        assert (got[..., :blind, :] == 0).all() and (got_w[..., :blind, :] == 0).all()


def test_formula_is_the_package_reference(rng):
    """The formula above is llmkernels.reference.attention (GQA, causal, both mask kinds)."""
    q, k, v = (rng.standard_normal(s) for s in ((2, 4, 5, 8), (2, 2, 7, 8), (2, 2, 7, 3)))
    keep = rng.random((5, 7)) > 0.3
    add = np.where(keep, rng.standard_normal((5, 7)), -np.inf)
    for kw in ({}, {"causal": True, "scale": 0.7}, {"mask": keep}, {"mask": add, "causal": True}):
        for got, want in zip(
            ref_attention(q, k, v, return_weights=True, **kw),
            ref.attention(q, k, v, return_weights=True, **kw),
            strict=True,
        ):
            np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-15)


# --- masks ------------------------------------------------------------------------------------

B, HQ, HKV, TQ, TK = 2, 4, 2, 17, 23
MASK_SHAPES = {
    "keys": (TK,),
    "rows_keys": (TQ, TK),
    "one_keys": (1, TK),
    "heads": (HQ, 1, TK),
    "key_padding": (B, 1, 1, TK),
    "full": (B, HQ, TQ, TK),
}


def make_mask(rng, shape, kind: str, dtype) -> np.ndarray:
    allowed = rng.random(shape) < 0.7
    if kind == "bool":
        return allowed
    # additive: finite values where allowed, -inf elsewhere
    return np.where(allowed, rng.standard_normal(shape) * 2.0, -np.inf).astype(dtype)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("kind", ["bool", "additive"])
@pytest.mark.parametrize("shape", list(MASK_SHAPES))
@pytest.mark.parametrize("dtype", DTYPES)
def test_masks(shape, kind, causal, dtype, rng):
    q, k, v = qkv(rng, B, HQ, HKV, TQ, TK, 32, dtype=dtype)
    mask = make_mask(rng, MASK_SHAPES[shape], kind, dtype)
    got_o, got_w = lk.attention(q, k, v, mask=mask, causal=causal, return_weights=True)
    want_o, want_w = ref.attention(q, k, v, mask=mask, causal=causal, return_weights=True)
    check(got_o, want_o, dtype)
    check_weights(got_w, want_w, dtype)
    check(lk.attention(q, k, v, mask=mask, causal=causal), want_o, dtype)


def test_masks_every_isa(isa, rng):
    q, k, v = qkv(rng, B, HQ, HKV, 70, 130, 33, dv=9)
    for kind in ["bool", "additive"]:
        mask = make_mask(rng, (B, 1, 70, 130), kind, np.float32)
        for causal in [False, True]:
            check(
                lk.attention(q, k, v, mask=mask, causal=causal),
                ref.attention(q, k, v, mask=mask, causal=causal),
                np.float32,
            )


@pytest.mark.parametrize("dtype", DTYPES)
def test_mask_3d_inputs_and_dtypes(dtype, rng):
    q, k, v = qkv(rng, None, 8, 2, 9, 12, 16, dtype=dtype)
    for mask in [
        rng.random((12,)) < 0.6,
        rng.random((8, 9, 12)) < 0.6,
        rng.standard_normal((9, 12)).astype(np.float64),  # float64 mask with float32 data
        rng.standard_normal((1, 12)).astype(np.float16),
        (rng.random((12, 9)) < 0.6).T,  # non-contiguous bool mask
        rng.standard_normal((8, 12, 9)).transpose(0, 2, 1),  # non-contiguous additive mask
        (rng.random((9, 24)) < 0.6)[:, ::-2],  # negative strides
    ]:
        check(lk.attention(q, k, v, mask=mask), ref.attention(q, k, v, mask=mask), dtype)
        check(
            lk.attention(q, k, v, mask=mask, causal=True),
            ref.attention(q, k, v, mask=mask, causal=True),
            dtype,
        )


@pytest.mark.parametrize("dtype", DTYPES)
def test_fully_masked_rows(dtype, isa, rng):
    """Rows with nothing to attend: zero output and zero weights, never NaN."""
    q, k, v = qkv(rng, B, HQ, HKV, TQ, TK, 32, dtype=dtype)
    allowed = rng.random((B, HQ, TQ, TK)) < 0.7
    allowed[0, 1, 3] = False
    allowed[1, :, 0] = False
    allowed[:, 2, 16] = False
    dead = ~allowed.any(-1)
    additive = np.where(allowed, 0.5, -np.inf).astype(dtype)
    for mask in [allowed, additive]:
        for causal in [False, True]:
            out, w = lk.attention(q, k, v, mask=mask, causal=causal, return_weights=True)
            want_o, want_w = ref.attention(q, k, v, mask=mask, causal=causal, return_weights=True)
            assert not np.isnan(out).any() and not np.isnan(w).any()
            assert (out[dead] == 0).all() and (w[dead] == 0).all()
            check(out, want_o, dtype)
            check_weights(w, want_w, dtype)
    # everything masked
    nothing = np.zeros((TQ, TK), bool)
    out, w = lk.attention(q, k, v, mask=nothing, return_weights=True)
    assert (out == 0).all() and (w == 0).all()
    out = lk.attention(q, k, v, mask=np.full((TK,), -np.inf, dtype))
    assert (out == 0).all()
    # causal with Tq > Tk and a mask that kills the remaining rows of one head
    q2, k2, v2 = qkv(rng, 1, 2, 1, 9, 4, 8, dtype=dtype)
    m = np.ones((2, 9, 4), bool)
    m[1, 5:] = False
    out, w = lk.attention(q2, k2, v2, mask=m, causal=True, return_weights=True)
    assert (out[0, 0, :5] == 0).all() and (out[0, 1] == 0).all()
    check(out, ref.attention(q2, k2, v2, mask=m, causal=True), dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_scores_far_below_the_max(dtype, isa, rng):
    """Scores 80-100 below their row's max, where exp leaves float32's normal range (the
    kernel's exp gives +0 from 87.68 below the max down, subnormals just above): the softmax
    is the reference's within the tolerance, weights sum to 1, -inf gives exactly 0."""
    tq, tk = 9, 8
    q = np.zeros((1, 1, tq, 4), dtype)
    k = np.zeros((1, 1, tk, 4), dtype)
    v = rng.standard_normal((1, 1, tk, 5)).astype(dtype)
    gaps = [0.0, -80.0, -87.3, -87.5, -87.7, -88.0, -100.0, -np.inf]
    mask = np.array([np.roll(gaps, i) for i in range(tq)], dtype)
    got_o, got_w = lk.attention(q, k, v, mask=mask, return_weights=True)
    want_o, want_w = ref.attention(q, k, v, mask=mask, return_weights=True)
    check(got_o, want_o, dtype)
    check_weights(got_w, want_w, dtype)
    np.testing.assert_allclose(got_w.sum(-1), 1.0, rtol=1e-6)
    assert (got_w[np.isneginf(np.broadcast_to(mask, got_w.shape))] == 0).all()


@pytest.mark.parametrize("tq", [1, 9])
def test_softcap_does_not_hide_an_overflowed_score(tq, isa):
    """q.k = 0 whose float32 partial sums overflow (+-4e38): the kernel's score is +-inf or
    NaN, which tanh would cap to a finite +-c of an arbitrary sign; the row must go to the
    exact path as it does without softcap, and equal the float64 reference."""
    q = np.full((1, 1, tq, 4), 1e19, np.float32)
    k = np.array([[[[2e19, 2e19, -2e19, -2e19], [0.0, 0.0, 0.0, 0.0]]]], np.float32)
    v = np.array([[[[1.0], [0.0]]]], np.float32)
    for softcap in (None, 1.0):
        got, w = lk.attention(q, k, v, scale=1.0, softcap=softcap, return_weights=True)
        want, want_w = ref.attention(q, k, v, scale=1.0, softcap=softcap, return_weights=True)
        np.testing.assert_allclose(got, want, rtol=1e-6)
        np.testing.assert_allclose(w, want_w, rtol=1e-6)
        np.testing.assert_allclose(got, 0.5, rtol=1e-6)


@pytest.mark.parametrize(("tq", "tk"), [(1, 5), (2, 5), (9, 70), (1, 1100)])
def test_row_with_nothing_to_attend_is_zeros_whatever_v_holds(tq, tk, isa, rng):
    """A row whose every key is masked gives zeros even when V holds NaN or inf at those keys
    (a preallocated buffer's unused slots): written as zeros, not O * 0. Decode rows, a tile,
    and a decode split over keys (Tk = 1100)."""
    q, k = rng.standard_normal((1, 2, tq, 8)), rng.standard_normal((1, 2, tk, 8))
    v = rng.standard_normal((1, 2, tk, 8))
    v[0, 0, 1], v[0, 1, 2] = np.nan, np.inf
    mask = np.ones((tq, tk), bool)
    mask[-1] = False  # the last query row sees nothing
    # no row sees the non-finite values (rows that attend other keys are NaN: probability 0
    # times NaN, as in torch's SDPA -- README, attention; equal_nan compares them below)
    mask[:, 1:3] = False
    got, lse = lk.attention(q, k, v, mask=mask, return_lse=True)
    want, want_lse = ref.attention(q, k, v, mask=mask, return_lse=True)
    assert (got[:, :, -1] == 0).all() and np.isneginf(lse[:, :, -1]).all()
    np.testing.assert_array_equal(want[:, :, -1], 0.0)
    np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-12)


def test_wide_mask_past_the_compute_range(isa, rng):
    """A float64 additive mask with finite entries past float32's range (1e39; float64's min,
    as an HF float64 mask on every key of a row) and float32 q/k/v: not cast to +-inf (NaN
    rows, zeros) but computed as the float64 reference, results rounded to float32."""
    q, k, v = (rng.standard_normal((1, 2, 3, 4)).astype(np.float32) for _ in range(3))
    fmin = np.finfo(np.float64).min
    masks = [
        np.array([[1e39, 0.0, 0.0], [1e39, 0.0, 0.0], [0.0, 0.0, 0.0]]),
        np.array([[0.0, fmin, fmin], [fmin, fmin, fmin], [0.0, 0.0, -np.inf]]),
    ]
    for mask in masks:
        out = np.full((1, 2, 3, 4), np.nan, np.float32)
        got, lse = lk.attention(q, k, v, mask=mask, out=out, return_lse=True)
        want, want_lse = ref.attention(q, k, v, mask=mask, return_lse=True)
        assert got is out and got.dtype == np.float32 and lse.dtype == np.float32
        np.testing.assert_allclose(got, want.astype(np.float32), rtol=1e-5, atol=1e-6)
        with np.errstate(over="ignore"):  # lse of 1e39: inf in float32
            np.testing.assert_allclose(lse, want_lse.astype(np.float32), rtol=1e-6)


def test_pure_reads_a_numpy_bool_mask_as_bool(rng):
    q, k, v = (
        rng.standard_normal((1, 2, 4)),
        rng.standard_normal((1, 3, 4)),
        rng.standard_normal((1, 3, 2)),
    )
    mask = np.array([[True, False, True], [False, True, True]])
    want = ref.attention(q, k, v, mask=mask)
    np.testing.assert_allclose(pure.attention(q.tolist(), k.tolist(), v.tolist(), mask=mask), want)


@pytest.mark.parametrize("dtype", DTYPES)
def test_large_logits(dtype, isa, rng):
    """Logits of about ±1e4 (from q·k and from the additive mask): no overflow, no NaN, the
    right softmax. Integer-valued data and power-of-two scales keep every score exact in
    float32 too, so the comparison stays at the attention tolerance."""
    d, tq, tk = 32, 19, 70
    base = rng.integers(150, 200, size=d).astype(np.float64)  # q·base ~ 1e4
    q = rng.integers(1, 3, size=(1, 2, tq, d)).astype(np.float64)
    q[:, 1] *= -1  # head 1: logits near -1e4
    k = base + rng.integers(-1, 2, size=(1, 2, tk, d))
    v = rng.standard_normal((1, 2, tk, 16))
    q, k, v = q.astype(dtype), k.astype(dtype), v.astype(dtype)
    got_o, got_w = lk.attention(q, k, v, scale=1.0, return_weights=True)
    want_o, want_w = ref.attention(q, k, v, scale=1.0, return_weights=True)
    check(got_o, want_o, dtype)
    check_weights(got_w, want_w, dtype)
    # ±1e4 from an additive mask on small exact scores: rows all +1e4, all -1e4, mixed
    qs = rng.integers(-2, 3, size=(1, 2, tq, d)).astype(dtype)
    ks = rng.integers(-2, 3, size=(1, 2, tk, d)).astype(dtype)
    mask = np.where(rng.random((tq, tk)) < 0.5, 1e4, -1e4)
    mask[0] = 1e4
    mask[1] = -1e4
    mask = mask.astype(dtype)
    for causal in [False, True]:
        got_o, got_w = lk.attention(
            qs, ks, v, mask=mask, scale=0.25, causal=causal, return_weights=True
        )
        want_o, want_w = ref.attention(
            qs, ks, v, mask=mask, scale=0.25, causal=causal, return_weights=True
        )
        check(got_o, want_o, dtype)
        check_weights(got_w, want_w, dtype)
        # a row of -1e4 logits is an ordinary softmax, not zeros
        assert (got_w[0, :, 1].sum(-1) > 0.99).all()


@pytest.mark.parametrize("tk", [17, 1100])  # 1100: decode shapes take the key-split path
@pytest.mark.parametrize("dtype", DTYPES)
def test_nan_inf_propagate(dtype, tk, isa, rng):
    """NaN/Inf in the data propagate as IEEE arithmetic would, on every path."""
    q, k, v = qkv(rng, 1, 4, 2, 3, tk, 8, dtype=dtype)
    q[0, 0, 1, 0] = np.nan  # one query row: its output row is NaN
    q[0, 2, 2, 3] = np.inf  # inf score - inf max -> NaN
    k[0, 1, 5, 2] = np.nan  # one key of KV head 1: every row of query heads 2, 3 -> NaN
    v[0, 0, 7, 1] = np.inf  # one value: column 1 of query heads 0, 1 -> inf
    mask = np.zeros((4, 3, tk), dtype)
    mask[1, 0, 9] = np.inf  # +inf logit: inf - inf -> NaN
    for kwargs in [{}, {"causal": True}, {"mask": mask}]:
        got, want = lk.attention(q, k, v, **kwargs), ref.attention(q, k, v, **kwargs)
        np.testing.assert_array_equal(np.isnan(got), np.isnan(want), err_msg=str(kwargs))
        np.testing.assert_array_equal(np.isinf(got), np.isinf(want), err_msg=str(kwargs))
        fin = np.isfinite(want)
        np.testing.assert_allclose(got[fin], want[fin], **ATTN_TOL[np.dtype(dtype)])


# --- layouts, dtypes, out= ---------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES)
def test_non_contiguous_inputs(dtype, rng):
    b, hq, hkv, tq, tk, d = 2, 8, 2, 13, 21, 32
    # (B, T, H, D) as produced by a projection, viewed as (B, H, T, D)
    q = data(rng, (b, tq, hq, d), dtype).transpose(0, 2, 1, 3)
    k = data(rng, (b, tk, hkv, d), dtype).transpose(0, 2, 1, 3)
    v = data(rng, (b, tk, hkv, d), dtype).transpose(0, 2, 1, 3)
    assert not q.flags.c_contiguous
    for causal in [False, True]:
        check(lk.attention(q, k, v, causal=causal), ref.attention(q, k, v, causal=causal), dtype)
    # strided slices, negative strides, Fortran order
    big = data(rng, (b, hq, 2 * tq, 2 * d), dtype)
    qs = big[:, :, ::2, ::2]
    ks = data(rng, (b, 2 * hkv, tk, d + 5), dtype)[:, ::2, :, 3 : 3 + d]
    vs = data(rng, (b, hkv, tk, 40), dtype)[:, :, ::-1, 7:23]
    vf = np.asfortranarray(data(rng, (b, hkv, tk, 16), dtype))
    check(lk.attention(qs, ks, vs), ref.attention(qs, ks, vs), dtype)
    check(lk.attention(qs, ks, vf, causal=True), ref.attention(qs, ks, vf, causal=True), dtype)
    # a broadcast (zero-stride) k
    kb = np.broadcast_to(data(rng, (1, 1, tk, d), dtype), (b, hkv, tk, d))
    check(lk.attention(qs, kb, vs), ref.attention(qs, kb, vs), dtype)


def test_dtype_rules(rng):
    q, k, v = qkv(rng, 1, 4, 2, 5, 6, 8)
    assert lk.attention(q, k, v).dtype == np.float32
    mixed = lk.attention(q, k.astype(np.float64), v)
    assert mixed.dtype == np.float64
    check(mixed, ref.attention(q, k, v), np.float64)
    ints = rng.integers(-3, 4, size=(4, 5, 8))
    got = lk.attention(ints, ints[:2], ints[:2])
    check(got, ref.attention(ints, ints[:2], ints[:2]), np.float64)
    lists = lk.attention(q[0].tolist(), k[0].tolist(), v[0].tolist())
    assert lists.dtype == np.float64
    check(lists, ref.attention(q[0], k[0], v[0]), np.float64)
    # numpy scalars for the flags and the scale
    check(
        lk.attention(q, k, v, causal=np.True_, scale=np.float32(0.5)),
        ref.attention(q, k, v, causal=True, scale=0.5),
        np.float32,
    )
    # scale = 0: uniform weights
    check(lk.attention(q, k, v, scale=0.0), ref.attention(q, k, v, scale=0.0), np.float32)
    # float32 weights for float32 data
    assert lk.attention(q, k, v, return_weights=True)[1].dtype == np.float32


@pytest.mark.parametrize("dtype", DTYPES)
def test_out(dtype, rng):
    q, k, v = qkv(rng, 2, 8, 2, 17, 30, 32, dv=24, dtype=dtype)
    want = ref.attention(q, k, v, causal=True)
    out = np.full((2, 8, 17, 24), 7.0, dtype)
    assert lk.attention(q, k, v, causal=True, out=out) is out
    check(out, want, dtype)
    out2 = np.full((2, 8, 17, 24), 7.0, dtype)
    res = lk.attention(q, k, v, causal=True, out=out2, return_weights=True)
    assert res[0] is out2
    check(out2, want, dtype)
    check_weights(res[1], ref.attention(q, k, v, causal=True, return_weights=True)[1], dtype)
    # 3-D
    out3 = np.empty((8, 17, 24), dtype)
    assert lk.attention(q[1], k[1], v[1], out=out3) is out3
    check(out3, ref.attention(q[1], k[1], v[1]), dtype)
    # out aliasing q (Dv = D, Hq = Hkv): the result must not read overwritten queries
    qa, ka, va = qkv(rng, 1, 2, 2, 150, 150, 16, dtype=dtype)
    want = ref.attention(qa, ka, va, causal=True)
    lk.attention(qa, ka, va, causal=True, out=qa)
    check(qa, want, dtype)
    # out partially overlapping k (shifted by one row of the same buffer) and out = k = v
    buf = data(rng, (2 * 150 * 16 + 16,), dtype)
    kk, oo = buf[:-16].reshape(1, 2, 150, 16), buf[16:].reshape(1, 2, 150, 16)
    want = ref.attention(ka, kk.copy(), va)
    lk.attention(ka, kk, va, out=oo)
    check(oo, want, dtype)
    full = data(rng, (1, 2, 150, 16), dtype)
    want = ref.attention(ka, full, full)
    lk.attention(ka, full, full, out=full)
    check(full, want, dtype)


# --- 1b. every SIMD path, determinism -----------------------------------------------------------

DECODE = {"b": 1, "hq": 32, "hkv": 8, "tq": 1, "tk": 4096, "d": 128}  # key-split path
PREFILL = {"b": 1, "hq": 8, "hkv": 2, "tq": 300, "tk": 300, "d": 64}


@pytest.mark.parametrize("dtype", DTYPES)
def test_key_split_path(dtype, isa, rng):
    """Decode-like shapes (one row tile, long Tk) split the keys and merge partial softmaxes."""
    q, k, v = qkv(rng, dtype=dtype, **DECODE)
    check(lk.attention(q, k, v), ref.attention(q, k, v), dtype)
    check(lk.attention(q, k, v, causal=True), ref.attention(q, k, v, causal=True), dtype)
    # key padding that blanks whole 512-key splits, and -inf in others
    pad = np.ones((1, 1, 1, 4096), bool)
    pad[..., :1100] = False
    pad[..., 3000:3600] = False
    check(lk.attention(q, k, v, mask=pad), ref.attention(q, k, v, mask=pad), dtype)
    add = np.where(rng.random((32, 1, 4096)) < 0.5, 0.0, -np.inf).astype(dtype)
    add[:, :, 2048:] = -np.inf
    add[5] = -np.inf  # a fully masked head: zeros
    got = lk.attention(q, k, v, mask=add)
    assert (got[0, 5] == 0).all()
    check(got, ref.attention(q, k, v, mask=add), dtype)
    # only the last key allowed
    last = np.zeros(4096, bool)
    last[-1] = True
    got = lk.attention(q, k, v, mask=last)
    np.testing.assert_allclose(
        got[0], np.repeat(v[0, :, -1:], 4, axis=0), **ATTN_TOL[np.dtype(dtype)]
    )
    # several query rows (Tq = 4 < 64), causal, large logits, odd Tk
    q4, k4, v4 = qkv(rng, 2, 4, 4, 4, 2500, 33, dv=7, dtype=dtype)
    for causal in [False, True]:
        check(
            lk.attention(q4, k4, v4, causal=causal, scale=3.0),
            ref.attention(q4, k4, v4, causal=causal, scale=3.0),
            dtype,
        )
    # ±1e4 additive logits on exact (integer, power-of-two scaled) scores: a random float32
    # score + 1e4 would be rounded to ulp(1e4) ~ 1e-3, beyond the attention tolerance
    qi = rng.integers(-2, 3, size=q4.shape).astype(dtype)
    ki = rng.integers(-2, 3, size=k4.shape).astype(dtype)
    big = np.where(rng.random(2500) < 0.3, 1e4, -1e4).astype(dtype)
    for causal in [False, True]:
        check(
            lk.attention(qi, ki, v4, mask=big, scale=0.25, causal=causal),
            ref.attention(qi, ki, v4, mask=big, scale=0.25, causal=causal),
            dtype,
        )
    # a non-causal group of 65-192 rows is one tile too (ops.hpp: kAttnRowTile), so its keys
    # are split: 4 heads x 40 queries of one KV head, and 150 rows of one head; lse merges
    for shape in ((1, 4, 1, 40, 1300, 32), (1, 1, 1, 150, 1100, 16)):
        qg, kg, vg = qkv(rng, *shape, dv=9, dtype=dtype)
        got, lse = lk.attention(qg, kg, vg, return_lse=True)
        want, want_lse = ref.attention(qg, kg, vg, return_lse=True)
        check(got, want, dtype)
        np.testing.assert_allclose(lse, want_lse, **ATTN_TOL[np.dtype(dtype)])
        np.testing.assert_array_equal(lk.attention(qg, kg, vg), got)


@pytest.mark.parametrize("dtype", DTYPES)
def test_bitwise_identical_across_threads_and_runs(dtype, threads, rng):
    cases = []
    q, k, v = qkv(rng, dtype=dtype, **DECODE)
    pad = np.ones((1, 1, 1, 4096), bool)
    pad[..., 1000:1700] = False
    cases += [lambda: lk.attention(q, k, v), lambda: lk.attention(q, k, v, mask=pad)]
    qp, kp, vp = qkv(rng, dtype=dtype, **PREFILL)
    holes = np.where(rng.random(300) < 0.9, 0.0, -np.inf).astype(dtype)
    cases += [
        lambda: lk.attention(qp, kp, vp, causal=True),
        lambda: lk.attention(qp, kp, vp, causal=True, return_weights=True)[1],
        lambda: lk.attention(qp[:, :, :100], kp, vp, causal=True, mask=holes),
    ]
    qb, kb, vb = qkv(rng, 3, 4, 4, 70, 90, 48, dtype=dtype)
    cases.append(lambda: lk.attention(qb, kb, vb))
    lk.set_num_threads(1)
    ones = [call() for call in cases]
    for n in (2, 3):
        lk.set_num_threads(n)
        for call, one in zip(cases, ones, strict=True):
            np.testing.assert_array_equal(call(), one)
    lk.set_num_threads(2)
    for call in cases:
        np.testing.assert_array_equal(call(), call())
    # the prefill result is also right
    check(ones[2], ref.attention(qp, kp, vp, causal=True), dtype)


def test_pure_twin(rng):
    """The pure-Python teaching twin agrees (one sequence, GQA, causal, 2-D mask)."""
    q, k, v = qkv(rng, None, 4, 2, 5, 7, 3, dv=2, dtype=np.float64)
    mask = (rng.random((5, 7)) < 0.7).tolist()
    for causal in [False, True]:
        got = lk.attention(q, k, v, causal=causal, mask=np.array(mask))
        twin = np.array(
            pure.attention(q.tolist(), k.tolist(), v.tolist(), causal=causal, mask=mask)
        )
        np.testing.assert_allclose(got, twin, rtol=1e-12, atol=1e-14)


# --- 2. PyTorch ----------------------------------------------------------------------------------


def sdpa(q, k, v, **kwargs) -> np.ndarray:
    t = [torch.from_numpy(np.ascontiguousarray(a)) for a in (q, k, v)]
    if isinstance(kwargs.get("attn_mask"), np.ndarray):
        kwargs["attn_mask"] = torch.from_numpy(np.ascontiguousarray(kwargs["attn_mask"]))
    return F.scaled_dot_product_attention(*t, **kwargs).numpy()


@pytest.mark.parametrize("dtype", DTYPES)
def test_torch_sdpa(dtype, rng):
    tol = ATTN_TOL[np.dtype(dtype)] if dtype == np.float64 else {"rtol": 1e-4, "atol": 2e-5}
    b, tq, tk, d = 2, 19, 19, 32
    q, k, v = qkv(rng, b, 8, 2, tq, tk, d, dtype=dtype)
    # GQA
    np.testing.assert_allclose(lk.attention(q, k, v), sdpa(q, k, v, enable_gqa=True), **tol)
    # causal with Tq = Tk: is_causal agrees
    np.testing.assert_allclose(
        lk.attention(q, k, v, causal=True), sdpa(q, k, v, is_causal=True, enable_gqa=True), **tol
    )
    # scale
    np.testing.assert_allclose(
        lk.attention(q, k, v, scale=0.7), sdpa(q, k, v, scale=0.7, enable_gqa=True), **tol
    )
    # bool mask (True = may attend; every row keeps its diagonal) and float mask
    allowed = rng.random((b, 1, tq, tk)) < 0.6
    allowed[..., np.arange(tq), np.arange(tq)] = True
    np.testing.assert_allclose(
        lk.attention(q, k, v, mask=allowed),
        sdpa(q, k, v, attn_mask=allowed, enable_gqa=True),
        **tol,
    )
    additive = data(rng, (8, tq, tk), dtype, 3.0)
    np.testing.assert_allclose(
        lk.attention(q, k, v, mask=additive),
        sdpa(q, k, v, attn_mask=additive, enable_gqa=True),
        **tol,
    )
    # Tq < Tk: our causal is bottom-right aligned = torch with the explicit shifted mask
    tq2, tk2 = 7, 19
    q2 = data(rng, (b, 8, tq2, d), dtype)
    bottom_right = torch.ones(tq2, tk2).tril(tk2 - tq2).bool().numpy()
    ours = lk.attention(q2, k, v, causal=True)
    np.testing.assert_allclose(ours, sdpa(q2, k, v, attn_mask=bottom_right, enable_gqa=True), **tol)
    # ... and differs from torch's top-left is_causal
    assert not np.allclose(ours, sdpa(q2, k, v, is_causal=True, enable_gqa=True), **tol)
    # causal combined with a bool mask = torch given the conjunction
    pad = np.ones((b, 1, 1, tk2), bool)
    pad[1, ..., :3] = False
    np.testing.assert_allclose(
        lk.attention(q2, k, v, causal=True, mask=pad),
        sdpa(q2, k, v, attn_mask=bottom_right & pad, enable_gqa=True),
        **tol,
    )


@pytest.mark.parametrize("dtype", DTYPES)
def test_decode_step_equals_last_row(dtype, rng):
    tol = ATTN_TOL[np.dtype(dtype)]
    q, k, v = qkv(rng, 2, 8, 2, 37, 37, 32, dtype=dtype)
    full = lk.attention(q, k, v, causal=True)
    step = lk.attention(q[:, :, -1:], k, v, causal=True)
    np.testing.assert_allclose(step, full[:, :, -1:], **tol)
    torch_full = sdpa(q, k, v, is_causal=True, enable_gqa=True)
    np.testing.assert_allclose(step, torch_full[:, :, -1:], rtol=1e-4, atol=2e-5)
    # token-by-token decode against a growing cache
    for t in range(30, 37):
        one = lk.attention(q[:, :, t : t + 1], k[:, :, : t + 1], v[:, :, : t + 1], causal=True)
        np.testing.assert_allclose(one, full[:, :, t : t + 1], **tol)
    # chunked prefill (Tq < Tk) matches the rows of the full pass
    chunk = lk.attention(q[:, :, 20:], k, v, causal=True)
    np.testing.assert_allclose(chunk, full[:, :, 20:], **tol)


# --- 3. the LLaMA notes' RoPE attention numbers ---------------------------------------------

THETA = 0.1  # rad/position, the notes' single frequency


def rot(x: tuple[float, float], pos: int) -> tuple[float, float]:
    c, s = math.cos(pos * THETA), math.sin(pos * THETA)
    return (x[0] * c - x[1] * s, x[1] * c + x[0] * s)


def softmax(row: list[float]) -> list[float]:
    top = max(row)
    e = [math.exp(x - top) for x in row]
    return [x / sum(e) for x in e]


def roped(vectors, positions, dtype) -> np.ndarray:
    x = np.array(vectors, dtype)[None]  # (H=1, T, D=2)
    return lk.rope(x, np.array(positions), inv_freq=[THETA])


@pytest.mark.parametrize("dtype", DTYPES)
def test_worked_example_rope_scores(dtype):
    tol = {"rtol": 1e-12, "atol": 1e-14} if dtype == np.float64 else {"rtol": 2e-6, "atol": 1e-7}
    qs, ks = [(1.0, 0.5), (0.9, 0.7)], [(0.8, 0.6), (0.7, 0.5)]  # tokens at positions 1 and 2
    scores = [
        [
            sum(a * b for a, b in zip(rot(qs[i], i + 1), rot(ks[j], j + 1), strict=True))
            for j in range(2)
        ]
        for i in range(2)
    ]
    # the notes' q2'·k1' = 1.133 (from rounded intermediates); exactly 1.1323
    assert abs(scores[1][0] - 1.1323) < 5e-5
    assert abs(scores[1][0] - 1.133) < 1e-3
    q, k = roped(qs, [1, 2], dtype), roped(ks, [1, 2], dtype)
    np.testing.assert_allclose(q[0, 1], rot(qs[1], 2), **tol)  # q2' = [0.743, 0.865]
    np.testing.assert_allclose(q[0, 1], [0.743, 0.865], atol=1e-3)
    np.testing.assert_allclose(k[0, 0], [0.736, 0.677], atol=1e-3)  # k1'
    v = np.eye(2, dtype=dtype)[None]  # output row = weights row
    out, w = lk.attention(q, k, v, scale=1.0, return_weights=True)
    want = [softmax(row) for row in scores]
    np.testing.assert_allclose(w[0], want, **tol)
    np.testing.assert_allclose(out[0], want, **tol)
    # the score difference is recoverable from the weights: log(w21 / w22) = q2'k1' - q2'k2'
    np.testing.assert_allclose(
        math.log(w[0, 1, 0] / w[0, 1, 1]), scores[1][0] - scores[1][1], rtol=1e-5, atol=1e-6
    )
    # causal: the query at position 1 sees only key 1
    _, wc = lk.attention(q, k, v, scale=1.0, causal=True, return_weights=True)
    np.testing.assert_allclose(wc[0], [[1.0, 0.0], want[1]], **tol)


@pytest.mark.parametrize("dtype", DTYPES)
def test_math_notes_relative_position(dtype):
    """q1'·k3' = 1.25 cos(0.2) = 1.2251: with q = k = [1, 0.5] the score is |v|^2 cos(Δ θ), so
    the weights depend only on position differences."""
    tol = {"rtol": 1e-12, "atol": 1e-14} if dtype == np.float64 else {"rtol": 2e-6, "atol": 1e-7}
    vec = (1.0, 0.5)
    score13 = sum(a * b for a, b in zip(rot(vec, 1), rot(vec, 3), strict=True))
    assert abs(score13 - 1.25 * math.cos(0.2)) < 1e-12
    assert abs(score13 - 1.2251) < 5e-5  # the notes' 1.225
    v = np.eye(3, dtype=dtype)[None]
    # query at position 1, keys at positions 1, 2, 3: scores 1.25 cos(0), cos(0.1), cos(0.2)
    want = softmax([1.25 * math.cos(THETA * dist) for dist in (0, 1, 2)])
    for shift in (0, 100, 1000, 100000):
        q = roped([vec], [1 + shift], dtype)
        k = roped([vec] * 3, [1 + shift, 2 + shift, 3 + shift], dtype)
        out, w = lk.attention(q, k, v, scale=1.0, return_weights=True)
        np.testing.assert_allclose(w[0, 0], want, **tol)
        np.testing.assert_allclose(out[0, 0], want, **tol)
        np.testing.assert_allclose(
            math.log(w[0, 0, 2] / w[0, 0, 0]), score13 - 1.25, rtol=1e-5, atol=1e-6
        )
    # a query in the middle: keys equally far before and after get equal weights
    q = roped([vec], [5], dtype)
    k = roped([vec] * 5, [3, 4, 5, 6, 7], dtype)
    _, w = lk.attention(q, k, np.eye(5, dtype=dtype)[None], scale=1.0, return_weights=True)
    np.testing.assert_allclose(w[0, 0], w[0, 0, ::-1], **tol)
    np.testing.assert_allclose(
        w[0, 0], softmax([1.25 * math.cos(THETA * d) for d in (2, 1, 0, 1, 2)]), **tol
    )


# --- 4. memory: streaming, never a Tq x Tk score matrix ----------------------------------------

MEMORY_SCRIPT = """
import json, resource
import numpy as np
import llmkernels as lk
from llmkernels import reference as ref

def peak():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux: KiB

T, D = 16384, 64
rng = np.random.default_rng(0)
q, k, v = (rng.standard_normal((1, 1, T, D), dtype=np.float32) for _ in range(3))
out = np.zeros((1, 1, T, D), np.float32)
lk.attention(q[:, :, :100], k[:, :, :100], v[:, :, :100])  # warm up the thread pool
base = peak()
report = {"base": base, "io": q.nbytes * 4}
lk.attention(q, k, v, out=out)
report["out"] = peak()
lk.attention(q, k, v, causal=True, out=out)
report["out_causal"] = peak()
a = lk.attention(q, k, v)
report["alloc"] = peak()
c = lk.attention(q, k, v, causal=True)
report["alloc_causal"] = peak()
# spot-check rows against the reference
rows = [0, 4097, T - 1]
want = ref.attention(q[:, :, rows], k, v)
report["err"] = float(np.abs(a[:, :, rows] - want).max())
report["err_out"] = float(np.abs(c[:, :, rows[-1:]] - want[:, :, -1:]).max())
i = rows[1]
want_c = ref.attention(q[:, :, i : i + 1], k[:, :, : i + 1], v[:, :, : i + 1])
report["err_causal"] = float(np.abs(c[:, :, i : i + 1] - want_c).max())
report["out_equal"] = bool(np.array_equal(out, c))
print(json.dumps(report))
"""


@pytest.mark.slow
def test_memory_is_streaming():
    proc = run_python(MEMORY_SCRIPT, timeout=120)
    assert proc.returncode == 0, proc.stderr
    r = json.loads(proc.stdout.strip().splitlines()[-1])
    mib = 1 << 20
    out_bytes = r["io"] // 4
    # inputs and the preallocated out are already resident in "base"
    assert r["out"] - r["base"] < 64 * mib, r
    assert r["out_causal"] - r["base"] < 64 * mib, r
    # allocated outputs (both kept alive) count on top
    assert r["alloc"] - r["base"] < 64 * mib + out_bytes, r
    assert r["alloc_causal"] - r["base"] < 64 * mib + 2 * out_bytes, r
    assert r["err"] < 1e-4 and r["err_causal"] < 1e-4 and r["err_out"] < 1e-4, r
    assert r["out_equal"], r


# --- 5. bad input----------------------------------------------------------------------------------


def _bad_cases(rng):
    q, k, v = qkv(rng, 2, 4, 2, 5, 6, 8)
    ok_out = lambda: np.empty((2, 4, 5, 8), np.float32)  # noqa: E731
    return {
        "batch_mismatch": (lambda o: lk.attention(q, k[:1], v[:1], out=o), ValueError, "batch"),
        "batch_mismatch_v": (lambda o: lk.attention(q, k, v[:1], out=o), ValueError, "v"),
        "heads": (
            lambda o: lk.attention(q, k[:, :1].repeat(3, 1), v[:, :1].repeat(3, 1), out=o),
            ValueError,
            "Hkv",
        ),
        "kv_length": (lambda o: lk.attention(q, k, v[:, :, :5], out=o), ValueError, "v"),
        "kv_heads": (lambda o: lk.attention(q, k, v[:, :1], out=o), ValueError, "v"),
        "d_mismatch": (lambda o: lk.attention(q, k[..., :7], v, out=o), ValueError, "k"),
        "mask_shape": (
            lambda o: lk.attention(q, k, v, mask=np.ones((5, 5), bool), out=o),
            ValueError,
            "mask",
        ),
        "mask_shape_batch": (
            lambda o: lk.attention(q, k, v, mask=np.ones((3, 1, 1, 6), bool), out=o),
            ValueError,
            "mask",
        ),
        "mask_int": (
            lambda o: lk.attention(q, k, v, mask=np.ones((5, 6), np.int64), out=o),
            TypeError,
            "mask",
        ),
        "mask_uint8": (
            lambda o: lk.attention(q, k, v, mask=np.ones(6, np.uint8), out=o),
            TypeError,
            "mask",
        ),
        "mask_complex": (
            lambda o: lk.attention(q, k, v, mask=np.ones(6, np.complex64), out=o),
            TypeError,
            "mask",
        ),
        "causal_int": (lambda o: lk.attention(q, k, v, causal=1, out=o), TypeError, "causal"),
        "causal_str": (lambda o: lk.attention(q, k, v, causal="yes", out=o), TypeError, "causal"),
        "return_weights_int": (
            lambda o: lk.attention(q, k, v, return_weights=1, out=o),
            TypeError,
            "return_weights",
        ),
        "scale_str": (lambda o: lk.attention(q, k, v, scale="0.5", out=o), TypeError, "scale"),
        "scale_nan": (
            lambda o: lk.attention(q, k, v, scale=float("nan"), out=o),
            ValueError,
            "scale",
        ),
        "q_1d": (lambda o: lk.attention(q[0, 0, 0], k, v, out=o), ValueError, "q"),
        "q_2d": (lambda o: lk.attention(q[0, 0], k[0, 0], v[0, 0], out=o), ValueError, "q"),
        "q_5d": (lambda o: lk.attention(q[None], k[None], v[None], out=o), ValueError, "q"),
        "ndim_mismatch": (lambda o: lk.attention(q, k[0], v[0], out=o), ValueError, "k"),
        "q_complex": (lambda o: lk.attention(q.astype(np.complex64), k, v, out=o), TypeError, "q"),
        "k_complex": (lambda o: lk.attention(q, k.astype(np.complex128), v, out=o), TypeError, "k"),
        "v_object": (lambda o: lk.attention(q, k, v.astype(object), out=o), TypeError, "v"),
        "d_zero": (lambda o: lk.attention(q[..., :0], k[..., :0], v, out=o), ValueError, "D"),
        "out_shape": (
            lambda o: lk.attention(q, k, v, out=np.zeros((2, 4, 5, 9), np.float32)),
            ValueError,
            "out",
        ),
        "out_dtype": (lambda o: lk.attention(q, k, v, out=o.astype(np.float64)), TypeError, "out"),
        "out_order": (
            lambda o: lk.attention(q, k, v, out=np.zeros((8, 5, 4, 2), np.float32).T),
            ValueError,
            "out",
        ),
        "out_list": (lambda o: lk.attention(q, k, v, out=o.tolist()), TypeError, "out"),
    }, ok_out


BAD_NAMES = [
    "batch_mismatch",
    "batch_mismatch_v",
    "heads",
    "kv_length",
    "kv_heads",
    "d_mismatch",
    "mask_shape",
    "mask_shape_batch",
    "mask_int",
    "mask_uint8",
    "mask_complex",
    "causal_int",
    "causal_str",
    "return_weights_int",
    "scale_str",
    "scale_nan",
    "q_1d",
    "q_2d",
    "q_5d",
    "ndim_mismatch",
    "q_complex",
    "k_complex",
    "v_object",
    "d_zero",
    "out_shape",
    "out_dtype",
    "out_order",
    "out_list",
]


@pytest.mark.parametrize("name", BAD_NAMES)
def test_bad_input(name, rng):
    cases, ok_out = _bad_cases(rng)
    assert sorted(cases) == sorted(BAD_NAMES)
    call, exc, argname = cases[name]
    out = ok_out()
    out.fill(12345.0)
    with pytest.raises(exc, match=r"^\[attention\] .*" + argname) as info:
        call(out)
    assert str(info.value).startswith("[attention]")
    assert (out == 12345.0).all(), "out must be left untouched"


def test_bad_out_readonly_and_untouched(rng):
    q, k, v = qkv(rng, 2, 4, 2, 5, 6, 8)
    out = np.full((2, 4, 5, 8), 12345.0, np.float32)
    out.flags.writeable = False
    with pytest.raises(ValueError, match=r"^\[attention\] out .*writeable"):
        lk.attention(q, k, v, out=out)
    assert (out == 12345.0).all()
    # non-contiguous view with the right shape
    base = np.full((2, 4, 5, 16), 12345.0, np.float32)
    with pytest.raises(ValueError, match=r"^\[attention\] out .*C-contiguous"):
        lk.attention(q, k, v, out=base[..., ::2])
    assert (base == 12345.0).all()
    # 3-D inputs want a 3-D out
    o4 = np.full((1, 4, 5, 8), 12345.0, np.float32)
    with pytest.raises(ValueError, match=r"^\[attention\] out"):
        lk.attention(q[0], k[0], v[0], out=o4)
    assert (o4 == 12345.0).all()


# --- 6. empty shapes-------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES)
def test_empty(dtype, rng):
    q, k, v = qkv(rng, 2, 4, 2, 5, 0, 8, dv=3, dtype=dtype)
    # Tk = 0: nothing to attend -> zeros (also into a dirty out), zero-width weights
    for causal in [False, True]:
        out = np.full((2, 4, 5, 3), np.nan, dtype)
        assert lk.attention(q, k, v, causal=causal, out=out) is out
        np.testing.assert_array_equal(out, np.zeros((2, 4, 5, 3)))
        o, w = lk.attention(q, k, v, causal=causal, return_weights=True)
        np.testing.assert_array_equal(o, np.zeros((2, 4, 5, 3)))
        assert o.dtype == dtype and w.shape == (2, 4, 5, 0) and w.dtype == dtype
    np.testing.assert_array_equal(lk.attention(q, k, v, mask=np.ones((5, 0), bool)), 0.0)
    # Tq = 0
    q0, k0, v0 = qkv(rng, 2, 4, 2, 0, 6, 8, dv=3, dtype=dtype)
    for causal in [False, True]:
        r = lk.attention(q0, k0, v0, causal=causal)
        assert r.shape == (2, 4, 0, 3) and r.dtype == dtype
        o, w = lk.attention(q0, k0, v0, causal=causal, return_weights=True)
        assert o.shape == (2, 4, 0, 3) and w.shape == (2, 4, 0, 6)
    # Tq = Tk = 0
    e, _, _ = qkv(rng, 2, 4, 2, 0, 0, 8, dtype=dtype)
    assert lk.attention(e, k, v).shape == (2, 4, 0, 3)
    # B = 0
    qb, kb, vb = qkv(rng, 0, 4, 2, 5, 6, 8, dtype=dtype)
    assert lk.attention(qb, kb, vb).shape == (0, 4, 5, 8)
    assert lk.attention(qb, kb, vb, causal=True, mask=np.ones(6, bool)).shape == (0, 4, 5, 8)
    o, w = lk.attention(qb, kb, vb, return_weights=True)
    assert o.shape == (0, 4, 5, 8) and w.shape == (0, 4, 5, 6)
    # Dv = 0
    qd, kd, vd = qkv(rng, 1, 4, 2, 5, 6, 8, dv=0, dtype=dtype)
    assert lk.attention(qd, kd, vd).shape == (1, 4, 5, 0)
    # 3-D with Tk = 0
    np.testing.assert_array_equal(lk.attention(q[0], k[0], v[0]), np.zeros((4, 5, 3)))
