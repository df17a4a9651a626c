"""Rolling KV caches of sliding-window layers: memory O(window) for any
length, and prefill in chunks / token-by-token decode past the window equal to the full forward.

Reference: the same layer without a cache (its attention masks keys j with
``(i + Tk - Tq) - j >= window``), and a plain (non-rolling) cache of the same layer."""

from __future__ import annotations

import llmkernels as lk
import numpy as np
import pytest


def _layer(window: int, n_kv: int = 2, seed: int = 0) -> lk.MultiHeadAttention:
    return lk.MultiHeadAttention(32, 4, n_kv, window=window, seed=seed)


def _x(b: int, t: int, seed: int = 1) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((b, t, 32)).astype(np.float32)


def _run_chunks(attn, x, chunks, cache, mask=None):
    outs, t0 = [], 0
    for c in chunks:
        m = None if mask is None else mask[:, t0 : t0 + c]
        outs.append(attn(x[:, t0 : t0 + c], cache=cache, mask=m))
        t0 += c
    assert t0 == x.shape[1]
    return np.concatenate(outs, axis=1)


@pytest.mark.parametrize("window", [1, 2, 5, 8])
@pytest.mark.parametrize(
    "chunks",
    [[1] * 23, [3, 1, 7, 2, 1, 9], [23], [4, 19], [6, 6, 6, 5], [1, 1, 12, 1, 8]],
)
def test_chunks_equal_full_forward(window, chunks):
    attn = _layer(window)
    x = _x(2, 23)
    full = attn(x)
    cache = attn.new_cache(2, 64)
    assert cache.window == window and cache._impl.slots == window  # memory: window slots only
    got = _run_chunks(attn, x, chunks, cache)
    np.testing.assert_allclose(got, full, rtol=1e-5, atol=1e-5)
    assert cache.length == 23


@pytest.mark.parametrize("window", [3, 6])
def test_keys_are_the_last_window_positions(window):
    attn = _layer(window)
    x = _x(1, 17)
    rolling = attn.new_cache(1, 32)
    plain = lk.KVCache(1, 32, attn.n_kv_heads, attn.head_dim)  # window 0: every position kept
    plain_attn = lk.MultiHeadAttention(32, 4, 2, seed=0)  # same weights, no window
    _run_chunks(attn, x, [5, 1, 1, 4, 1, 5], rolling)
    _run_chunks(plain_attn, x, [17], plain)
    assert rolling.keys().shape == (1, 2, window, 8)
    np.testing.assert_allclose(rolling.keys(), plain.keys()[:, :, -window:], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(
        rolling.values(), plain.values()[:, :, -window:], rtol=1e-5, atol=1e-6
    )


def test_padded_batch_through_rolling_cache():
    # left padding: the padded rows' keys are masked wherever they sit in the ring
    attn = _layer(4)
    x = _x(2, 14)
    mask = np.ones((2, 14), bool)
    mask[1, :3] = False
    full = attn(x, mask=mask)
    cache = attn.new_cache(2, 20)
    got = _run_chunks(attn, x, [5, 1, 1, 2, 1, 1, 3], cache, mask)
    np.testing.assert_allclose(got[mask], full[mask], rtol=1e-5, atol=1e-5)


def test_window_longer_than_capacity_is_a_plain_cache():
    attn = _layer(50)
    cache = attn.new_cache(1, 10)
    assert cache._impl.slots == 10
    x = _x(1, 10)
    np.testing.assert_allclose(
        _run_chunks(attn, x, [4, 1, 5], cache), attn(x), rtol=1e-5, atol=1e-6
    )


def test_rolling_cache_needs_its_window():
    cache = _layer(4).new_cache(1, 16)
    for other in (lk.MultiHeadAttention(32, 4, 2, seed=0), _layer(5)):
        with pytest.raises(ValueError, match=r"\[MultiHeadAttention\] cache is a rolling buffer"):
            other(_x(1, 2), cache=cache)
    # a plain cache works for a windowed layer (it keeps everything)
    attn = _layer(4)
    plain = lk.KVCache(1, 16, 2, 8)
    x = _x(1, 9)
    np.testing.assert_allclose(
        _run_chunks(attn, x, [3, 1, 5], plain), attn(x), rtol=1e-5, atol=1e-6
    )


@pytest.mark.parametrize("bad", [-1, 1.5, True, "4"])
def test_window_argument_checked(bad):
    with pytest.raises(ValueError, match=r"\[KVCache\] window"):
        lk.KVCache(1, 8, 2, 8, window=bad)


def test_reset_then_reuse():
    attn = _layer(3)
    x = _x(1, 11)
    cache = attn.new_cache(1, 16)
    _run_chunks(attn, x, [11], cache)
    cache.reset()
    assert cache.keys().shape == (1, 2, 0, 8)
    np.testing.assert_allclose(
        _run_chunks(attn, x, [2, 1, 8], cache), attn(x), rtol=1e-5, atol=1e-6
    )


def test_model_cache_memory_is_window_sized():
    cfg = {
        "dim": 32, "n_layers": 2, "n_heads": 4, "n_kv_heads": 2, "hidden_dim": 64,
        "vocab_size": 50, "sliding_window": 4, "model_type": "mistral",
    }  # fmt: skip
    model = lk.Transformer(cfg, seed=0)
    cache = model.new_cache(1, 1000)
    assert [c._impl.slots for c in cache.layers] == [4, 4]
    ids = np.random.default_rng(0).integers(0, 50, (1, 13))
    full = model(ids)
    step = [model(ids[:, :6], cache=cache)]
    step += [model(ids[:, t : t + 1], cache=cache) for t in range(6, 13)]
    np.testing.assert_allclose(np.concatenate(step, axis=1), full, rtol=1e-4, atol=1e-5)
