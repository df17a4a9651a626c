"""llmkernels against independent peers: PyTorch functional ops, HF transformers LLaMA layers
(LlamaRMSNorm, LlamaRotaryEmbedding + apply_rotary_pos_emb, LlamaMLP) and Meta's complex-number
RoPE.

Tolerances are conftest.py's (``TOL``) wherever the peer computes in the tested dtype. Where a
peer rounds internally to float32 (LlamaRMSNorm on float64 input, HF's float32 RoPE angles) its
own error is measured against the float64 reference first, the bound is derived from that
rounding, and llmkernels is held to the DESIGN tolerance against the reference on top.
"""

from __future__ import annotations

from collections.abc import Callable

import llmkernels as lk
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from _models import hf_llama_config, hf_rope_config, llama3_scaling
from conftest import TOL, cxx_inv_freq
from llmkernels import _libm
from llmkernels import reference as ref
from transformers.models.llama.modeling_llama import (
    LlamaMLP,
    LlamaRMSNorm,
    LlamaRotaryEmbedding,
    apply_rotary_pos_emb,
)

SIZES = [1, 7, 33, 128, 1025]
LEADS = [(5,), (2, 3)]
DTYPES = [np.float32, np.float64]


def sweep(test: Callable[..., None]) -> Callable[..., None]:
    """Runs ``test(n, lead, dtype, ...)`` for every row length ``n`` of SIZES, leading shape
    of LEADS and dtype of DTYPES."""
    for mark in (
        pytest.mark.parametrize("n", SIZES),
        pytest.mark.parametrize("lead", LEADS, ids=str),
        pytest.mark.parametrize("dtype", DTYPES),
    ):
        test = mark(test)
    return test


EPS32 = float(np.finfo(np.float32).eps)  # 2**-23
EPS = {np.dtype(np.float32): EPS32, np.dtype(np.float64): float(np.finfo(np.float64).eps)}


def data(rng: np.random.Generator, shape: tuple[int, ...], dtype: type, scale: float = 1.0):
    return (rng.standard_normal(shape) * scale).astype(dtype)


def t(a: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(a))


def check(actual: np.ndarray, expected: np.ndarray, dtype: type, **tol: float) -> None:
    dt = np.dtype(dtype)
    assert actual.dtype == dt
    assert actual.shape == expected.shape
    np.testing.assert_allclose(actual, expected, **(tol or TOL[dt]))


# --- torch.nn.functional ----------------------------------------------------------------------


@sweep
def test_rms_norm_vs_torch(n, lead, dtype, isa, rng):
    x = data(rng, lead + (n,), dtype)
    w = data(rng, (n,), dtype)
    for eps in (1e-6, 1e-5, 0.25):
        check(lk.rms_norm(x, w, eps), F.rms_norm(t(x), (n,), t(w), eps=eps).numpy(), dtype)
        check(lk.rms_norm(x, eps=eps), F.rms_norm(t(x), (n,), eps=eps).numpy(), dtype)


@sweep
def test_layer_norm_vs_torch(n, lead, dtype, isa, rng):
    x = data(rng, lead + (n,), dtype) + 3.0  # a non-zero mean exercises the centring
    w, b = data(rng, (n,), dtype), data(rng, (n,), dtype)
    for eps in (1e-5, 1e-3):
        check(
            lk.layer_norm(x, w, b, eps),
            F.layer_norm(t(x), (n,), t(w), t(b), eps=eps).numpy(),
            dtype,
        )
        check(lk.layer_norm(x, eps=eps), F.layer_norm(t(x), (n,), eps=eps).numpy(), dtype)


@sweep
def test_silu_swiglu_vs_torch(n, lead, dtype, isa, rng):
    g = data(rng, lead + (n,), dtype, 6.0)
    u = data(rng, lead + (n,), dtype)
    check(lk.silu(g), F.silu(t(g)).numpy(), dtype)
    check(lk.swiglu(g, u), (F.silu(t(g)) * t(u)).numpy(), dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_silu_swiglu_vs_torch_wide_range(dtype, isa, rng):
    """Large |x| (exp(-x) near overflow, sigmoid saturated) and exact zeros."""
    g = np.concatenate(
        [np.linspace(-80, 80, 4001), [0.0, -0.0, 1e-30, -1e-30, 30.0, -30.0, 60.0, -60.0]]
    ).astype(dtype)
    u = data(rng, g.shape, dtype)
    check(lk.silu(g), F.silu(t(g)).numpy(), dtype)
    check(lk.swiglu(g, u), (F.silu(t(g)) * t(u)).numpy(), dtype)


# --- HF LlamaRMSNorm --------------------------------------------------------------------------

# LlamaRMSNorm casts its input to float32, normalises there and casts back. For float64 input its
# result therefore carries float32 rounding (measured: <= 1.6 float32 eps, relative); 4 eps32
# bounds the rounding of the input cast, the float32 mean of squares, rsqrt and the product.
HF_F32_RTOL = 4 * EPS32


@sweep
def test_rms_norm_vs_hf_llama(n, lead, dtype, isa, rng):
    x = data(rng, lead + (n,), dtype)
    w = data(rng, (n,), dtype)
    for eps in (1e-6, 1e-5):
        norm = LlamaRMSNorm(n, eps=eps).to(torch.float64 if dtype == np.float64 else torch.float32)
        with torch.no_grad():
            norm.weight.copy_(t(w))
            hf = norm(t(x)).numpy()
        got = lk.rms_norm(x, w, eps)
        expected = ref.rms_norm(x, w, eps)
        assert hf.dtype == got.dtype == np.dtype(dtype)
        if dtype == np.float32:
            check(got, hf, dtype)
        else:
            # justify the looser bound: HF itself is float32-accurate, llmkernels float64-accurate
            check(hf, expected, dtype, rtol=HF_F32_RTOL, atol=0)
            check(got, expected, dtype)
            check(got, hf, dtype, rtol=HF_F32_RTOL, atol=0)


# --- HF rotary embedding ----------------------------------------------------------------------

LLAMA31 = llama3_scaling(8192)
SCALINGS = {
    "default": None,
    "linear": {"rope_type": "linear", "factor": 4.0},
    "llama3": LLAMA31,
    "yarn": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 4096},
    "yarn_mscale": {
        "rope_type": "yarn",
        "factor": 16.0,
        "mscale": 1.0,
        "mscale_all_dim": 0.5,
        "beta_fast": 32,
        "beta_slow": 1,
        "original_max_position_embeddings": 1024,  # 16384 / 16: consistent for HF
    },
}
HEADS = [(64, 10000.0), (128, 500000.0), (34, 10000.0)]  # (head_dim, rope_theta); 34: half = 17

# per batch row: from 0, a strided run, a large offset (HF's float32 angles lose ~1e-2 rad there)
POSITION_IDS = np.stack([np.arange(6), 17 + 3 * np.arange(6), 10**5 + np.arange(6)]).astype(
    np.int64
)


def hf_rotary(head_dim: int, theta: float, scaling: dict | None, hq: int) -> LlamaRotaryEmbedding:
    config = hf_rope_config(
        scaling, head_dim=head_dim, theta=theta, max_position_embeddings=16384, n_heads=hq,
        num_key_value_heads=2,
    )  # fmt: skip
    return LlamaRotaryEmbedding(config)


def pair_norm(x: np.ndarray) -> np.ndarray:
    """|(x[k], x[k + D/2])| broadcast back to (..., D) (the half-split pairs)."""
    half = x.shape[-1] // 2
    r = np.hypot(x[..., :half].astype(np.float64), x[..., half:].astype(np.float64))
    return np.concatenate([r, r], axis=-1)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("scaling", list(SCALINGS))
@pytest.mark.parametrize("head", HEADS, ids=lambda h: f"D{h[0]}-theta{h[1]:g}")
def test_rope_vs_hf_llama(head, scaling, dtype, isa, rng):
    d, theta = head
    sc = SCALINGS[scaling]
    b, hq, hkv = POSITION_IDS.shape[0], 4, 2
    tt = POSITION_IDS.shape[1]
    q = data(rng, (b, hq, tt, d), dtype)
    k = data(rng, (b, hkv, tt, d), dtype)

    rot = hf_rotary(d, theta, sc, hq)
    inv_freq = lk.rope_inv_freq(d, theta, sc)
    factor = lk.rope_attention_factor(sc)
    # the same frequencies and cos/sin multiplier as HF (which holds them in float32)
    np.testing.assert_allclose(inv_freq, rot.inv_freq.double().numpy(), rtol=1e-6, atol=0)
    assert factor == pytest.approx(rot.attention_scaling, rel=1e-12)

    pos_t = t(POSITION_IDS)
    with torch.no_grad():
        cos, sin = rot(t(q), pos_t)  # (B, T, D) in q's dtype, computed in float32
        q_hf, k_hf = (a.numpy() for a in apply_rotary_pos_emb(t(q), t(k), cos, sin))
    pos = POSITION_IDS[:, None, :]  # (B, 1, T) broadcasts over heads
    if sc is None:
        q_lk, k_lk = lk.rope(q, pos, theta=theta), lk.rope(k, pos, theta=theta)
    else:
        q_lk = lk.rope(q, pos, inv_freq=inv_freq, attention_factor=factor)
        k_lk = lk.rope(k, pos, inv_freq=inv_freq, attention_factor=factor)

    # llmkernels against the float64 reference (exact angles): the DESIGN tolerance
    ref_freq = cxx_inv_freq(d, theta) if sc is None else inv_freq  # the frequencies lk used
    for x, got in ((q, q_lk), (k, k_lk)):
        check(got, ref.rope(x, pos, inv_freq=ref_freq, attention_factor=factor), dtype)

    # HF's angles and amplitude, read back from its cos/sin tables, against the exact ones
    half = d // 2
    c64 = cos.numpy()[..., :half].astype(np.float64)
    s64 = sin.numpy()[..., :half].astype(np.float64)
    exact = POSITION_IDS[..., None].astype(np.float64) * inv_freq  # (B, T, half)
    dtheta = np.angle(np.exp(1j * (np.arctan2(s64, c64) - exact)))  # wrapped to (-pi, pi]
    damp = np.abs(np.hypot(c64, s64) - factor)
    # HF's deviation is float32 rounding of inv_freq, of pos * inv_freq and of cos/sin
    assert np.all(np.abs(dtheta) <= 8 * EPS32 * (np.abs(exact) + 1)), np.abs(dtheta).max()
    assert np.all(damp <= 4 * EPS32 * factor), damp.max()

    # so lk and HF may differ by HF's angle/amplitude error (per pair) plus rounding of both
    dtheta_d = np.concatenate([dtheta, dtheta], axis=-1)[:, None]  # (B, 1, T, D)
    damp_d = np.concatenate([damp, damp], axis=-1)[:, None]
    rounding = 4 * EPS[np.dtype(dtype)] * factor
    for x, got, hf in ((q, q_lk, q_hf), (k, k_lk, k_hf)):
        bound = pair_norm(x) * (factor * np.abs(dtheta_d) + damp_d + rounding)
        diff = np.abs(got.astype(np.float64) - hf.astype(np.float64))
        assert hf.dtype == got.dtype == np.dtype(dtype)
        worst = np.max(diff / (bound + 1e-300))
        assert worst <= 1.0, (
            f"lk vs HF differs by {worst:.3g}x the bound from HF's own float32 rounding "
            f"(max HF angle error {np.abs(dtheta).max():.3g} rad)"
        )
    # at small positions HF's rounding is small: the bound there is tight
    if dtype == np.float32:
        check(q_lk[0, :, :3], q_hf[0, :, :3], dtype, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("head", HEADS, ids=lambda h: f"D{h[0]}-theta{h[1]:g}")
def test_rope_hf_convention_exact(head, dtype, isa, rng):
    """HF's apply_rotary_pos_emb fed with exact (float64-angle) cos/sin: the half-split
    convention alone, at the DESIGN tolerance."""
    d, theta = head
    sc = LLAMA31
    q = data(rng, (3, 4, 6, d), dtype)
    k = data(rng, (3, 2, 6, d), dtype)
    inv_freq = lk.rope_inv_freq(d, theta, sc)
    angles = POSITION_IDS[..., None].astype(np.float64) * inv_freq
    emb = np.concatenate([angles, angles], axis=-1)
    cos, sin = t(_libm.cos(emb)), t(_libm.sin(emb))  # float64
    q_hf, k_hf = (a.numpy() for a in apply_rotary_pos_emb(t(q).double(), t(k).double(), cos, sin))
    pos = POSITION_IDS[:, None, :]
    check(lk.rope(q, pos, inv_freq=inv_freq), q_hf.astype(dtype), dtype)
    check(lk.rope(k, pos, inv_freq=inv_freq), k_hf.astype(dtype), dtype)


# --- Meta's interleaved RoPE (complex numbers) ------------------------------------------------


def meta_precompute_freqs_cis(
    dim: int, positions: torch.Tensor, theta: float
) -> tuple[torch.Tensor, np.ndarray]:
    """Meta LLaMA's precompute_freqs_cis, in float64 (Meta uses float32 angles); also returns
    the frequencies."""
    freqs = 1.0 / (theta ** (torch.arange(0, dim, 2, dtype=torch.float64)[: dim // 2] / dim))
    angles = torch.outer(positions.to(torch.float64), freqs)
    return torch.polar(torch.ones_like(angles), angles), freqs.numpy()  # (T, dim/2) complex128


def meta_apply_rotary_emb(
    xq: torch.Tensor, xk: torch.Tensor, freqs_cis: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Meta LLaMA's apply_rotary_emb: x (B, T, H, D), pairs (x[2i], x[2i+1]) as complex numbers."""
    xq_ = torch.view_as_complex(xq.double().reshape(*xq.shape[:-1], -1, 2))
    xk_ = torch.view_as_complex(xk.double().reshape(*xk.shape[:-1], -1, 2))
    shape = [d if i in (1, xq_.ndim - 1) else 1 for i, d in enumerate(xq_.shape)]
    freqs = freqs_cis.view(*shape)  # reshape_for_broadcast: (1, T, 1, D/2)
    xq_out = torch.view_as_real(xq_ * freqs).flatten(3)
    xk_out = torch.view_as_real(xk_ * freqs).flatten(3)
    return xq_out.type_as(xq), xk_out.type_as(xk)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("start_pos", [0, 10**5])
@pytest.mark.parametrize("d", [2, 8, 34, 128, 1026])
def test_rope_interleaved_vs_meta_complex(d, start_pos, dtype, isa, rng):
    b, tt, hq, hkv, theta = 2, 5, 4, 2, 10000.0
    xq = data(rng, (b, tt, hq, d), dtype)  # Meta layout (B, T, H, D)
    xk = data(rng, (b, tt, hkv, d), dtype)
    positions = np.arange(start_pos, start_pos + tt)
    freqs_cis, inv_freq = meta_precompute_freqs_cis(d, t(positions), theta)
    mq, mk = (a.numpy() for a in meta_apply_rotary_emb(t(xq), t(xk), freqs_cis))
    # Both sides get the same float64 frequencies: at position 1e5 one ulp of a frequency (torch
    # and NumPy pow may differ by one) moves the angle by ~1e-11, beyond the float64 tolerance.
    # llmkernels wants (..., T, D): move the heads in front of T
    gq = lk.rope(xq.transpose(0, 2, 1, 3), positions, inv_freq=inv_freq, interleaved=True)
    gk = lk.rope(xk.transpose(0, 2, 1, 3), positions, inv_freq=inv_freq, interleaved=True)
    check(gq.transpose(0, 2, 1, 3), mq, dtype)
    check(gk.transpose(0, 2, 1, 3), mk, dtype)
    if start_pos == 0:  # theta= gives the same frequencies
        by_theta = lk.rope(xq.transpose(0, 2, 1, 3), positions, theta=theta, interleaved=True)
        check(by_theta.transpose(0, 2, 1, 3), mq, dtype)
    # and the two conventions really differ (a permutation of the features maps one to other)
    if d > 2:
        assert not np.allclose(lk.rope(xq.transpose(0, 2, 1, 3), positions, inv_freq=inv_freq), gq)
    perm = np.concatenate([np.arange(0, d, 2), np.arange(1, d, 2)])  # interleaved -> half-split
    half_split = lk.rope(xq.transpose(0, 2, 1, 3)[..., perm], positions, inv_freq=inv_freq)
    check(half_split[..., np.argsort(perm)], gq, dtype)


# --- HF LlamaMLP ------------------------------------------------------------------------------


def ffn_rounding_scale(x, wg, wu, wd, bg=None, bu=None, bd=None) -> np.ndarray:
    """Per output element, the sum of |terms| its dot products add up (gate/up errors carried
    through |w_down|): float32 matmuls are accurate to a few eps times this, not to the size of
    the result, which cancellation can make far smaller (D=1025, hidden=2053: errors of ~1.3e-6
    on outputs of ~1e-3, for both llmkernels and torch)."""
    x = np.asarray(x, np.float64)
    wg, wu, wd = (np.asarray(w, np.float64) for w in (wg, wu, wd))
    bg, bu, bd = (np.zeros(1) if b is None else np.asarray(b, np.float64) for b in (bg, bu, bd))
    g, u = x @ wg + bg, x @ wu + bu
    dg = np.abs(x) @ np.abs(wg) + np.abs(bg)  # rounding scales of the gate/up dot products
    du = np.abs(x) @ np.abs(wu) + np.abs(bu)
    h = np.abs(ref.swiglu(g, u)) + dg * np.abs(u) + np.abs(ref.silu(g)) * du
    return h @ np.abs(wd) + np.abs(bd)


def check_ffn(actual: np.ndarray, expected: np.ndarray, dtype: type, scale: np.ndarray) -> None:
    """|actual - expected| <= rtol |expected| + eps * scale (measured: <= 0.3 eps * scale for
    llmkernels and torch, D up to 4096)."""
    dt = np.dtype(dtype)
    assert actual.dtype == dt
    assert actual.shape == expected.shape
    err = np.abs(actual.astype(np.float64) - expected.astype(np.float64))
    bound = TOL[dt]["rtol"] * np.abs(expected) + EPS[dt] * scale
    worst = np.max(err / bound)
    assert worst <= 1.0, f"error {worst:.3g}x the bound (max abs error {err.max():.3g})"


@pytest.mark.parametrize("bias", [False, True], ids=["nobias", "bias"])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n", SIZES)
def test_swiglu_ffn_vs_hf_llama_mlp(n, dtype, bias, isa, rng):
    hidden = 2 * n + 3
    config = hf_llama_config(
        hidden_size=n, intermediate_size=hidden, hidden_act="silu", mlp_bias=bias,
        num_attention_heads=1, num_key_value_heads=1, head_dim=2,
    )  # fmt: skip
    mlp = LlamaMLP(config).to(torch.float64 if dtype == np.float64 else torch.float32)
    scale = 1 / np.sqrt(n)
    wg, wu = data(rng, (hidden, n), dtype, scale), data(rng, (hidden, n), dtype, scale)
    wd = data(rng, (n, hidden), dtype, 1 / np.sqrt(hidden))  # (out, in) as nn.Linear
    bg, bu, bd = data(rng, (hidden,), dtype), data(rng, (hidden,), dtype), data(rng, (n,), dtype)
    with torch.no_grad():
        mlp.gate_proj.weight.copy_(t(wg))
        mlp.up_proj.weight.copy_(t(wu))
        mlp.down_proj.weight.copy_(t(wd))
        if bias:
            mlp.gate_proj.bias.copy_(t(bg))
            mlp.up_proj.bias.copy_(t(bu))
            mlp.down_proj.bias.copy_(t(bd))
    x = data(rng, (2, 3, n), dtype)
    with torch.no_grad():
        hf = mlp(t(x)).numpy()
    biases = {"b_gate": bg, "b_up": bu, "b_down": bd} if bias else {}
    got = lk.swiglu_ffn(x, wg.T, wu.T, wd.T, **biases)
    expected = ref.swiglu_ffn(x, wg.T, wu.T, wd.T, **biases)
    sc = ffn_rounding_scale(
        x, wg.T, wu.T, wd.T, bg if bias else None, bu if bias else None, bd if bias else None
    )
    check_ffn(got, expected, dtype, sc)
    check_ffn(hf, expected, dtype, sc)  # the peer meets the same bound: the mapping (.T) is right
    check_ffn(got, hf, dtype, 2 * sc)
