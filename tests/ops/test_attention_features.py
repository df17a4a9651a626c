"""Attention features of the LLaMA family: sliding ``window``, score
``softcap``, attention ``sinks`` and ``return_lse`` — the float64 reference and the pure-Python
twin against transformers' own implementations (Mistral/Gemma 2 masks, Gemma 2's soft-capping,
gpt-oss's sinks) and against each other.

The formulas, as the reference computes them (per head, query i at position i + Tk - Tq):
    s_ij = q_i . k_j * scale;  s_ij = c * tanh(s_ij / c)                    (softcap=c)
    visible(i, j) = [causal: j <= i + Tk - Tq] and [window=w: (i + Tk - Tq) - j < w] and mask
    lse_i = log(sum_{j visible} exp(s_ij) + exp(sink_h))                      (sinks)
    out_i = sum_{j visible} exp(s_ij - lse_i) v_j
"""

from __future__ import annotations

import types

import numpy as np
import pytest
import torch
from llmkernels import pure
from llmkernels import reference as ref
from transformers.masking_utils import causal_mask_function, sliding_window_causal_mask_function
from transformers.models.gemma2.modeling_gemma2 import eager_attention_forward as gemma2_eager
from transformers.models.gpt_oss.modeling_gpt_oss import eager_attention_forward as gpt_oss_eager


def qkv(rng, b=1, hq=4, hkv=2, tq=9, tk=13, d=8, dv=None):
    dv = d if dv is None else dv
    return (
        rng.standard_normal((b, hq, tq, d)),
        rng.standard_normal((b, hkv, tk, d)),
        rng.standard_normal((b, hkv, tk, dv)),
    )


def hf_mask(fn, tq: int, tk: int) -> torch.Tensor:
    """transformers' mask function evaluated at query positions Tk - Tq ... Tk - 1 (a cache of
    Tk - Tq tokens before the queries), as an additive float mask."""
    t = torch.tensor
    allowed = torch.tensor(
        [[bool(fn(t(0), t(0), t(i + tk - tq), t(j))) for j in range(tk)] for i in range(tq)]
    )
    return torch.where(allowed, 0.0, float("-inf")).to(torch.float64)


# Gemma 2's eager attention takes its softmax in float32 whatever the input dtype
GEMMA2_TOL = {"rtol": 1e-6, "atol": 1e-7}


def module(hq: int, hkv: int, d: int, sinks=None) -> types.SimpleNamespace:
    m = types.SimpleNamespace(num_key_value_groups=hq // hkv, head_dim=d, training=False)
    if sinks is not None:
        m.sinks = torch.from_numpy(sinks)
    return m


@pytest.mark.parametrize(("tq", "tk"), [(9, 9), (1, 13), (5, 13), (16, 16)])
@pytest.mark.parametrize("window", [1, 3, 8, 100])
def test_window_matches_transformers_sliding_window_mask(rng, tq, tk, window):
    q, k, v = qkv(rng, tq=tq, tk=tk)
    mask = hf_mask(sliding_window_causal_mask_function(window), tq, tk)
    want, _ = gemma2_eager(
        module(4, 2, 8), *(torch.from_numpy(a) for a in (q, k, v)), mask, scaling=8**-0.5
    )
    got = ref.attention(q, k, v, causal=True, window=window)
    np.testing.assert_allclose(got, want.transpose(1, 2).numpy(), **GEMMA2_TOL)


@pytest.mark.parametrize("softcap", [0.5, 2.0, 50.0])
def test_softcap_matches_gemma2(rng, softcap):
    q, k, v = qkv(rng, tq=7, tk=11)
    q *= 4  # scores large enough that the cap clips
    mask = hf_mask(causal_mask_function, 7, 11)
    want, want_w = gemma2_eager(
        module(4, 2, 8),
        *(torch.from_numpy(a) for a in (q, k, v)),
        mask,
        scaling=0.3,
        softcap=softcap,
    )
    got, got_w = ref.attention(
        q, k, v, causal=True, scale=0.3, softcap=softcap, return_weights=True
    )
    np.testing.assert_allclose(got, want.transpose(1, 2).numpy(), **GEMMA2_TOL)
    np.testing.assert_allclose(got_w, want_w.numpy(), **GEMMA2_TOL)


@pytest.mark.parametrize("causal", [False, True])
def test_sinks_match_gpt_oss(rng, causal):
    q, k, v = qkv(rng, tq=6, tk=10)
    sinks = rng.standard_normal(4) * 2
    mask = hf_mask(causal_mask_function, 6, 10) if causal else None
    want, want_w = gpt_oss_eager(
        module(4, 2, 8, sinks), *(torch.from_numpy(a) for a in (q, k, v)), mask, scaling=0.35
    )
    got, got_w = ref.attention(q, k, v, causal=causal, scale=0.35, sinks=sinks, return_weights=True)
    np.testing.assert_allclose(got, want.transpose(1, 2).numpy(), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(got_w, want_w.numpy(), rtol=1e-12, atol=1e-12)
    assert np.all(got_w.sum(-1) < 1)  # the sink takes its share of every row


def test_lse_is_the_log_sum_exp_of_the_visible_scores(rng):
    q, k, v = qkv(rng, tq=5, tk=12)
    sinks = rng.standard_normal(4)
    for kw in [{}, {"causal": True, "window": 4}, {"sinks": sinks, "softcap": 1.5}]:
        _, lse = ref.attention(q, k, v, scale=0.4, return_lse=True, **kw)
        kk = np.repeat(k, 2, axis=1)
        s = q @ kk.swapaxes(-1, -2) * 0.4
        if "softcap" in kw:
            s = 1.5 * np.tanh(s / 1.5)
        i = np.arange(5)[:, None] + 7
        j = np.arange(12)[None, :]
        if kw.get("causal"):
            s = np.where((j <= i) & (i - j < 4), s, -np.inf)
        if "sinks" in kw:
            s = np.concatenate([s, np.broadcast_to(sinks[:, None, None], (1, 4, 5, 1))], -1)
        want = torch.logsumexp(torch.from_numpy(s), -1).numpy()
        np.testing.assert_allclose(lse, want, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("kw", [{}, {"causal": True}, {"causal": True, "window": 5}])
def test_lse_merges_two_halves_exactly(rng, kw):
    # attention over keys [0, 6) and [6, 13) separately, merged with their lse = the whole
    q, k, v = qkv(rng, tq=4, tk=13)
    whole, lse = ref.attention(q, k, v, return_lse=True, **kw)
    mask = np.ones((4, 13), bool)
    if kw:  # the causal / window pattern of the whole, cut in two
        i = np.arange(4)[:, None] + 9
        j = np.arange(13)[None, :]
        mask = (j <= i) & (i - j < kw.get("window", 100))
    a, lse_a = ref.attention(q, k[..., :6, :], v[..., :6, :], mask=mask[:, :6], return_lse=True)
    b, lse_b = ref.attention(q, k[..., 6:, :], v[..., 6:, :], mask=mask[:, 6:], return_lse=True)
    merged_lse = np.logaddexp(lse_a, lse_b)
    merged = np.exp(lse_a - merged_lse)[..., None] * a + np.exp(lse_b - merged_lse)[..., None] * b
    np.testing.assert_allclose(merged_lse, lse, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(merged, whole, rtol=1e-12, atol=1e-12)


def test_rows_with_nothing_visible(rng):
    # window 1 without causal over a 0-key prefix is fine; a fully masked row gives zeros,
    # lse -inf, or (with a sink) zeros and lse = the sink
    q, k, v = qkv(rng, tq=3, tk=4)
    mask = np.ones((3, 4), bool)
    mask[1] = False
    out, w, lse = ref.attention(q, k, v, mask=mask, return_weights=True, return_lse=True)
    assert np.all(out[..., 1, :] == 0) and np.all(w[..., 1, :] == 0)
    assert np.all(lse[..., 1] == -np.inf) and np.all(np.isfinite(lse[..., [0, 2]]))
    sinks = np.array([0.5, -1.0, 2.0, 0.0])
    out, lse = ref.attention(q, k, v, mask=mask, sinks=sinks, return_lse=True)
    assert np.all(out[..., 1, :] == 0)
    np.testing.assert_array_equal(lse[0, :, 1], sinks)


@pytest.mark.parametrize(
    "kw",
    [{"window": 3, "causal": True}, {"window": 2}, {"softcap": 0.7}, {"causal": True}],
)
def test_pure_twin_agrees_with_the_reference(rng, kw):
    q, k, v = qkv(rng, hq=4, hkv=2, tq=5, tk=7, d=4, dv=3)
    sinks = rng.standard_normal(4)
    for extra in [{}, {"sinks": sinks}]:
        want = ref.attention(q, k, v, scale=0.6, **kw, **extra)[0]
        got = pure.attention(
            q[0].tolist(),
            k[0].tolist(),
            v[0].tolist(),
            scale=0.6,
            **kw,
            **({"sinks": sinks.tolist()} if extra else {}),
        )
        np.testing.assert_allclose(np.array(got), want, rtol=1e-12, atol=1e-12)


# --------------------------------------------------------------------------------------------
# the fused kernel (lk.attention) against the reference: every SIMD path, both dtypes, the
# tile edges (1, 63, 64, 65 rows / keys), GQA, decode key splits (Tk > 1024), weights, masks
# --------------------------------------------------------------------------------------------

ATTN_TOL = {
    np.dtype(np.float32): {"rtol": 1e-4, "atol": 1e-5},
    np.dtype(np.float64): {"rtol": 1e-10, "atol": 1e-12},
}
DTYPES = [np.float32, np.float64]
SHAPES = [  # (B, Hq, Hkv, Tq, Tk, D, Dv)
    (1, 2, 1, 1, 1, 8, 8),
    (2, 4, 2, 7, 7, 16, 12),
    (1, 8, 2, 65, 65, 32, 32),
    (1, 4, 4, 33, 130, 8, 8),
    (1, 4, 1, 1, 1500, 16, 16),  # decode: key splits merged
    (1, 8, 2, 2, 1100, 8, 24),
]


def lk_qkv(rng, shape, dtype):
    b, hq, hkv, tq, tk, d, dv = shape
    return (
        rng.standard_normal((b, hq, tq, d)).astype(dtype),
        rng.standard_normal((b, hkv, tk, d)).astype(dtype),
        rng.standard_normal((b, hkv, tk, dv)).astype(dtype),
    )


def check_all(got, want, dtype):
    got = got if isinstance(got, tuple) else (got,)
    want = want if isinstance(want, tuple) else (want,)
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        assert g.dtype == np.dtype(dtype) and g.shape == w.shape
        np.testing.assert_array_equal(np.isneginf(g), np.isneginf(w))
        fin = np.isfinite(w)
        np.testing.assert_allclose(g[fin], w[fin], **ATTN_TOL[np.dtype(dtype)])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("window", [1, 5, 64, 200])
def test_kernel_window(isa, rng, dtype, shape, window):
    import llmkernels as lk

    q, k, v = lk_qkv(rng, shape, dtype)
    for causal in (True, False):
        kw = {"causal": causal, "window": window, "return_lse": True}
        check_all(lk.attention(q, k, v, **kw), ref.attention(q, k, v, **kw), dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_kernel_softcap_and_sinks(isa, rng, dtype, shape):
    import llmkernels as lk

    q, k, v = lk_qkv(rng, shape, dtype)
    q *= 3  # scores the cap clips
    sinks = (rng.standard_normal(shape[1]) * 2).astype(dtype)
    for kw in (
        {"softcap": 2.5},
        {"sinks": sinks},
        {"softcap": 30.0, "sinks": sinks, "causal": True, "window": 9},
    ):
        kw = {**kw, "return_lse": True}
        check_all(lk.attention(q, k, v, **kw), ref.attention(q, k, v, **kw), dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_kernel_features_with_weights_and_masks(isa, rng, dtype):
    import llmkernels as lk

    shape = (2, 4, 2, 9, 70, 8, 8)
    q, k, v = lk_qkv(rng, shape, dtype)
    sinks = rng.standard_normal(4).astype(dtype)
    bool_mask = rng.random((2, 1, 9, 70)) > 0.3
    add_mask = np.where(rng.random((9, 70)) > 0.2, 0.0, -np.inf).astype(dtype)
    for mask in (bool_mask, add_mask):
        kw = {"mask": mask, "window": 20, "softcap": 5.0, "sinks": sinks, "causal": True}
        kw |= {"return_weights": True, "return_lse": True}
        check_all(lk.attention(q, k, v, **kw), ref.attention(q, k, v, **kw), dtype)


def test_kernel_lse_merges_two_halves(rng):
    import llmkernels as lk

    q, k, v = lk_qkv(rng, (1, 8, 2, 16, 300, 32, 32), np.float64)
    whole, lse = lk.attention(q, k, v, return_lse=True)
    a, lse_a = lk.attention(q, k[..., :170, :], v[..., :170, :], return_lse=True)
    b, lse_b = lk.attention(q, k[..., 170:, :], v[..., 170:, :], return_lse=True)
    merged_lse = np.logaddexp(lse_a, lse_b)
    merged = np.exp(lse_a - merged_lse)[..., None] * a + np.exp(lse_b - merged_lse)[..., None] * b
    np.testing.assert_allclose(merged_lse, lse, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(merged, whole, rtol=1e-12, atol=1e-12)


def test_kernel_empty_rows_and_extremes(isa, rng):
    import llmkernels as lk

    q, k, v = lk_qkv(rng, (1, 4, 2, 3, 5, 8, 8), np.float64)
    sinks = np.array([0.5, -np.inf, 2.0, 0.0])
    mask = np.ones((3, 5), bool)
    mask[1] = False
    for kw in ({"mask": mask}, {"mask": mask, "sinks": sinks}, {"window": 1, "sinks": sinks}):
        kw = {**kw, "return_lse": True, "return_weights": True}
        check_all(lk.attention(q, k, v, **kw), ref.attention(q, k, v, **kw), np.float64)
    # no keys at all: zeros, lse -inf or the sink
    out, lse = lk.attention(q, k[..., :0, :], v[..., :0, :], sinks=sinks, return_lse=True)
    assert np.all(out == 0)
    np.testing.assert_array_equal(lse[0, :, 0], sinks)
    # a huge scale takes the exact path: features still apply there
    kw = {"scale": 1e200, "window": 2, "softcap": 3.0, "sinks": sinks[[0, 2, 2, 3]]}
    check_all(
        lk.attention(q, k, v, return_lse=True, **kw),
        ref.attention(q, k, v, return_lse=True, **kw),
        np.float64,
    )
    # NaN in a sink: that head's rows are NaN (IEEE softmax)
    out = lk.attention(q, k, v, sinks=np.array([np.nan, 0.0, 0.0, 0.0]))
    assert np.all(np.isnan(out[0, 0])) and np.all(np.isfinite(out[0, 1:]))


def test_kernel_feature_arguments_are_validated(rng):
    import llmkernels as lk

    q, k, v = lk_qkv(rng, (1, 4, 2, 3, 5, 8, 8), np.float32)
    bad = [
        ({"window": 0}, ValueError, r"\[attention\] window must be >= 1"),
        ({"window": 2.0}, TypeError, r"\[attention\] window must be an int"),
        ({"window": True}, TypeError, r"\[attention\] window must be an int"),
        ({"softcap": 0.0}, ValueError, r"\[attention\] softcap must be finite and > 0"),
        ({"softcap": -1.0}, ValueError, r"\[attention\] softcap must be finite and > 0"),
        ({"softcap": float("inf")}, ValueError, r"\[attention\] softcap must be finite"),
        ({"softcap": "1"}, TypeError, r"\[attention\] softcap must be a real number"),
        ({"sinks": np.zeros(3)}, ValueError, r"\[attention\] sinks must have shape \(Hq,\)"),
        ({"sinks": np.zeros((4, 1))}, ValueError, r"\[attention\] sinks must have shape"),
        ({"return_lse": 1}, TypeError, r"\[attention\] return_lse must be a bool"),
    ]
    for kw, exc, msg in bad:
        with pytest.raises(exc, match=msg):
            lk.attention(q, k, v, **kw)
    # a window wider than any sequence is no window
    np.testing.assert_array_equal(
        lk.attention(q, k, v, causal=True, window=2**70), lk.attention(q, k, v, causal=True)
    )
