"""KVCache.crop / ModelCache.crop (transformers' ``DynamicCache.crop``): keep the first n tokens.

Reference: the same tokens run without a cache, at once -- a crop followed by the tokens after
the kept ones must give their logits (the dropped tokens leave no trace)."""

from __future__ import annotations

import llmkernels as lk
import numpy as np
import pytest

MODEL = lk.Transformer(
    {"dim": 32, "n_layers": 2, "n_heads": 4, "n_kv_heads": 2, "hidden_dim": 64, "vocab_size": 50},
    seed=0,
)


@pytest.mark.parametrize("keep", [0, 1, 3, 5])
def test_crop_then_continue_equals_the_whole_sequence(keep: int) -> None:
    ids = np.array([[5, 9, 2, 7, 3, 8, 1]])
    want = MODEL(ids)
    cache = MODEL.new_cache(1, 16)
    MODEL(np.array([[5, 9, 2, 7, 3, 4, 4, 4]])[:, : max(keep, 1) + 3], cache=cache)
    cache.crop(keep)
    assert cache.length == keep and all(c.length == keep for c in cache.layers)
    assert int(cache.next_positions[0]) == keep
    got = MODEL(ids[:, keep:], cache=cache)
    np.testing.assert_allclose(got, want[:, keep:], rtol=1e-5, atol=1e-5)


def test_negative_n_drops_the_last_tokens() -> None:
    cache = MODEL.new_cache(2, 16)
    MODEL(np.array([[1, 2, 3, 4, 5], [6, 7, 8, 9, 10]]), cache=cache)
    cache.crop(-2)
    assert cache.length == 3 and list(cache.next_positions) == [3, 3]
    cache.crop(-3)
    assert cache.length == 0


@pytest.mark.parametrize("bad", [6, -6, 1.5, True, "2"])
def test_bad_n_raises_and_leaves_the_cache(bad) -> None:
    cache = MODEL.new_cache(1, 16)
    MODEL(np.array([[1, 2, 3, 4, 5]]), cache=cache)
    exc = ValueError if isinstance(bad, int) and not isinstance(bad, bool) else TypeError
    with pytest.raises(exc, match=r"\[(KV|Model)Cache.crop\] n"):
        cache.crop(bad)
    assert cache.length == 5 and int(cache.next_positions[0]) == 5


def test_padding_is_not_cropped() -> None:
    """A left-padded batch's positions differ per sequence: which ones the dropped tokens had
    is not known."""
    cache = MODEL.new_cache(2, 16)
    MODEL(np.array([[0, 5, 9], [4, 5, 9]]), cache=cache, mask=np.array([[0, 1, 1], [1, 1, 1]]))
    with pytest.raises(ValueError, match="padding"):
        cache.crop(2)
    assert cache.length == 3
    cache.crop(3)  # (nothing dropped)


def test_wrapped_rolling_cache_drops_its_last_token_only() -> None:
    """A sliding-window cache that wrapped holds the last `window` tokens: dropping one keeps
    everything the next token sees; dropping more would need overwritten slots."""
    attn = lk.MultiHeadAttention(16, 4, 2, window=3, seed=0)
    x = np.random.default_rng(0).standard_normal((1, 7, 16)).astype(np.float32)
    want = attn(x)
    cache = attn.new_cache(1, 16)
    attn(x[:, :6], cache=cache)
    with pytest.raises(ValueError, match="wrapped"):
        cache.crop(-2)
    cache.crop(-1)
    np.testing.assert_allclose(attn(x[:, 5:], cache=cache), want[:, 5:], rtol=1e-5, atol=1e-6)
