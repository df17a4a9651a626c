"""MultiHeadAttention with a partial_rotary_factor (HF rule): only the first
``rotary_dim = 2 * len(inv_freq)`` features of each q/k head are rotated, the rest pass through.

The C++ forward used to loop over head_dim/2 frequencies whatever the frequency vector's length
(an out-of-bounds read, garbage logits). Checked here against a float64 NumPy reference of the
whole layer, and through TransformerBlock, a KV cache and a dynamic (per-call) schedule.
"""

from __future__ import annotations

import llmkernels as lk
import numpy as np
import pytest
from llmkernels import _libm


def _reference_mha(
    mha: lk.MultiHeadAttention, x: np.ndarray, positions: np.ndarray, inv_freq: np.ndarray
) -> np.ndarray:
    """float64: q/k/v projections, RoPE (rotate_half) on the first 2*len(inv_freq) features of
    each head, causal softmax(q k^T / sqrt(hd)) v per head (GQA: head h reads kv head
    h // (H / Hkv)), o projection."""
    sd = {k: v.astype(np.float64) for k, v in mha.state_dict().items()}
    b, t, _ = x.shape
    h, hkv, hd = mha.n_heads, mha.n_kv_heads, mha.head_dim
    x = x.astype(np.float64)
    q = (x @ sd["q_proj.weight"].T).reshape(b, t, h, hd).transpose(0, 2, 1, 3)
    k = (x @ sd["k_proj.weight"].T).reshape(b, t, hkv, hd).transpose(0, 2, 1, 3)
    v = (x @ sd["v_proj.weight"].T).reshape(b, t, hkv, hd).transpose(0, 2, 1, 3)
    half = len(inv_freq)
    ang = positions[:, None, :, None].astype(np.float64) * inv_freq  # (B, 1, T, half)
    cos, sin = _libm.cos(ang), _libm.sin(ang)

    def rot(a: np.ndarray) -> np.ndarray:
        a1, a2, rest = a[..., :half], a[..., half : 2 * half], a[..., 2 * half :]
        return np.concatenate([a1 * cos - a2 * sin, a2 * cos + a1 * sin, rest], -1)

    q, k = rot(q), rot(k)
    k = np.repeat(k, h // hkv, axis=1)
    v = np.repeat(v, h // hkv, axis=1)
    s = q @ k.transpose(0, 1, 3, 2) / np.sqrt(hd)
    s = np.where(np.tril(np.ones((t, t), bool)), s, -np.inf)
    p = np.exp(s - s.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    o = (p @ v).transpose(0, 2, 1, 3).reshape(b, t, h * hd)
    return o @ sd["o_proj.weight"].T


@pytest.mark.parametrize("factor", [0.25, 0.5, 1.0])
@pytest.mark.parametrize("n_kv", [4, 2])
def test_partial_rotary_matches_reference(isa: str, factor: float, n_kv: int) -> None:
    scaling = {"rope_type": "default", "partial_rotary_factor": factor}
    mha = lk.MultiHeadAttention(64, 4, n_kv, head_dim=16, rope_scaling=scaling, seed=0)
    inv_freq = lk.rope_inv_freq(16, 10000.0, scaling)
    assert len(inv_freq) == int(16 * factor) // 2
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 7, 64)).astype(np.float32)
    pos = np.broadcast_to(np.arange(7), (2, 7))
    got = mha(x)
    np.testing.assert_allclose(got, _reference_mha(mha, x, pos, inv_freq), rtol=2e-4, atol=2e-5)
    # explicit positions, and decode step by step through a KV cache: the same rows
    pos2 = np.array([[3, 4, 5, 6, 7, 8, 9], [0, 1, 2, 3, 4, 5, 6]])
    np.testing.assert_allclose(
        mha(x, positions=pos2), _reference_mha(mha, x, pos2, inv_freq), rtol=2e-4, atol=2e-5
    )
    cache = mha.new_cache(2, 7)
    steps = np.concatenate([mha(x[:, i : i + 1], cache=cache) for i in range(7)], axis=1)
    np.testing.assert_allclose(steps, got, rtol=2e-4, atol=2e-5)


def test_partial_rotary_with_a_per_call_schedule() -> None:
    """dynamic NTK + partial rotary: the per-call frequencies have the partial length too."""
    scaling = {
        "rope_type": "dynamic",
        "factor": 2.0,
        "partial_rotary_factor": 0.5,
        "original_max_position_embeddings": 4,
    }
    mha = lk.MultiHeadAttention(32, 2, head_dim=16, rope_scaling=scaling, seed=1)
    x = np.random.default_rng(1).standard_normal((1, 9, 32)).astype(np.float32)
    inv_freq = lk.rope_inv_freq(16, 10000.0, scaling, seq_len=9)
    assert len(inv_freq) == 4
    pos = np.arange(9)[None]
    np.testing.assert_allclose(mha(x), _reference_mha(mha, x, pos, inv_freq), rtol=2e-4, atol=2e-5)
    block = lk.TransformerBlock(
        attention=mha,
        feed_forward=lk.FeedForward(32, 64, seed=2),
        attention_norm=lk.RMSNorm(32),
        ffn_norm=lk.RMSNorm(32),
    )
    assert np.all(np.isfinite(block(x)))


def test_too_many_frequencies_are_refused() -> None:
    with pytest.raises(ValueError, match=r"^\[MultiHeadAttention\] inv_freq must have at most"):
        lk._core.MultiHeadAttentionImpl(32, 2, 2, 16, [1.0] * 9, 1.0, False, False, True)
    mha = lk.MultiHeadAttention(32, 2, head_dim=16, seed=0)
    x = np.zeros((1, 2, 32), np.float32)
    pos = np.zeros((1, 2), np.int64)
    with pytest.raises(
        ValueError, match=r"^\[MultiHeadAttention\] inv_freq must have shape \(8,\)"
    ):
        mha._impl.forward(x, pos, None, None, np.ones(4))
