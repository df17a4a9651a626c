"""Validation once, in C++ for rope and attention: their ``_core`` entries
check every argument themselves, with the public messages, so ``_ops.py`` only converts.

The public ops' messages are checked in test_errors.py, tests/ops/test_rope.py and
tests/ops/test_attention*.py; here the entries are called directly, as ``_ops`` calls them
after converting, so a check that moved back to Python would fail here.
"""

from __future__ import annotations

import numpy as np
import pytest
from llmkernels import _core

X = np.ones((2, 4, 8), np.float32)


def rope(x=X, positions=None, theta=10000.0, inv_freq=None, interleaved=False, rotary_dim=None,
         attention_factor=1.0, out=None):  # fmt: skip
    return _core._fast_rope(
        x, positions, theta, inv_freq, interleaved, rotary_dim, attention_factor, out, None
    )


@pytest.mark.parametrize(
    ("kw", "exc", "pattern"),
    [
        (
            {"x": np.ones(8, np.float32)},
            ValueError,
            r"x must have shape \(\.\.\., T, D\), got \(8,\)",
        ),
        ({"rotary_dim": 5}, ValueError, r"rotary_dim must be even, got 5"),
        (
            {"x": np.ones((4, 7), np.float32)},
            ValueError,
            r"rotary_dim \(default D=7\) must be even",
        ),
        ({"rotary_dim": 10}, ValueError, r"rotary_dim must be in \[0, D=8\], got 10"),
        ({"rotary_dim": 10**30}, ValueError, r"rotary_dim must be in \[0, D=8\], got 10{30}"),
        ({"rotary_dim": 4.0}, TypeError, r"rotary_dim must be an int, got float"),
        ({"rotary_dim": True}, TypeError, r"rotary_dim must be an int, got bool"),
        ({"interleaved": 1}, TypeError, r"interleaved must be a bool, got int"),
        ({"attention_factor": float("inf")}, ValueError, r"attention_factor must be finite"),
        ({"theta": 0.0}, ValueError, r"theta must be > 0, got 0.0"),
        ({"theta": "1"}, TypeError, r"theta must be a real number, got str"),
        ({"theta": 10**400}, ValueError, r"theta must be finite \(got an integer beyond"),
        (
            {"inv_freq": np.ones(3)},
            ValueError,
            r"inv_freq must have shape \(rotary_dim/2,\) = \(4,\)",
        ),
        ({"inv_freq": np.array([1.0, np.nan, 1.0, 1.0])}, ValueError, r"inv_freq must be finite"),
        (
            {"positions": np.arange(4.0)},
            TypeError,
            r"positions must be an integer array, got dtype",
        ),
        (
            {"positions": np.arange(5)},
            ValueError,
            r"positions must have shape \(T,\) or be broadcast",
        ),
        ({"positions": np.full(4, 2**63, np.uint64)}, ValueError, r"positions must be < 2\*\*63"),
        ({"out": np.ones((2, 4, 8))}, TypeError, r"out must have dtype float32, got float64"),
        ({"out": np.ones((2, 4, 9), np.float32)}, ValueError, r"out must have shape \(2, 4, 8\)"),
    ],
)
def test_rope_entry_checks(kw, exc, pattern):
    with pytest.raises(exc, match=r"^\[rope\] " + pattern):
        rope(**kw)


def test_rope_entry_returns_none_only_for_conversions():
    assert rope(X.tolist()) is None  # array-like x
    assert rope(X.astype(np.float16)) is None  # promoted
    assert rope(X, positions=[0, 1, 2, 3]) is None  # array-like positions
    assert rope(X, inv_freq=[1.0, 1.0, 1.0, 1.0]) is None  # array-like inv_freq
    big = np.zeros(2 * 4 * 8 + 1, np.float32)
    assert rope(big[1:].reshape(X.shape), out=big[:-1].reshape(X.shape)) is None  # overlap
    np.testing.assert_array_equal(rope(X, positions=np.arange(4)), rope(X))


def attn(q, k=None, v=None, causal=False, scale=None, out=None, **kw):
    k = q if k is None else k
    v = q if v is None else v
    return _core._fast_attention(q, k, v, causal, scale, out, **kw)


Q = np.ones((1, 4, 3, 8), np.float32)
K = np.ones((1, 2, 5, 8), np.float32)
V = np.ones((1, 2, 5, 6), np.float32)


@pytest.mark.parametrize(
    ("args", "kw", "exc", "pattern"),
    [
        ((Q[0, 0],), {}, ValueError, r"q must have shape \(B, Hq, Tq, D\) or \(Hq, Tq, D\)"),
        ((Q, K[0], V), {}, ValueError, r"q, k and v must have the same number of dimensions"),
        ((Q, np.ones((2, 2, 5, 8), np.float32), V), {}, ValueError, r"leading \(batch\)"),
        (
            (Q, np.ones((1, 2, 5, 4), np.float32), V),
            {},
            ValueError,
            r"k must have q's head dimension D=8, got 4",
        ),
        ((Q, K, V[:, :1]), {}, ValueError, r"v must have k's heads and length"),
        ((Q[:, :3], K, V), {}, ValueError, r"Hq % Hkv must be 0 \(grouped-query\)"),
        ((Q[..., :0], K[..., :0], V), {}, ValueError, r"the head dimension D must be >= 1"),
        ((Q, K, V), {"return_weights": 1}, TypeError, r"return_weights must be a bool, got int"),
        ((Q, K, V), {"return_lse": "no"}, TypeError, r"return_lse must be a bool, got str"),
        ((Q, K, V), {"window": 0}, ValueError, r"window must be >= 1, got 0"),
        ((Q, K, V), {"window": 2.0}, TypeError, r"window must be an int or None, got float"),
        ((Q, K, V), {"softcap": -1.0}, ValueError, r"softcap must be finite and > 0, got -1.0"),
        ((Q, K, V), {"softcap": float("nan")}, ValueError, r"softcap must be finite, got nan"),
        ((Q, K, V, False, float("inf")), {}, ValueError, r"scale must be finite, got inf"),
        ((Q, K, V), {"mask": np.ones((3, 4), bool)}, ValueError, r"mask of shape \(3, 4\) is not"),
        (
            (Q, K, V),
            {"sinks": np.ones(3, np.float32)},
            ValueError,
            r"sinks must have shape \(Hq,\)",
        ),
        ((Q, K, V, False, None, np.ones((1, 4, 3, 8), np.float32)), {}, ValueError, r"out must"),
    ],
)
def test_attention_entry_checks(args, kw, exc, pattern):
    with pytest.raises(exc, match=r"^\[attention\] " + pattern):
        attn(*args, **kw)
    # the direct entry (_ops' second call) checks the same way: (q, k, v, causal, scale, out)
    full = list(args) * 3 if len(args) == 1 else list(args)
    full += [False, None, None][len(full) - 3 :]
    with pytest.raises(exc, match=r"^\[attention\] " + pattern):
        _core.attention(*full, **kw)


def test_attention_entry_returns_none_only_for_conversions():
    assert attn(Q.tolist()) is None  # array-like q
    assert attn(Q, K.astype(np.float64), V) is None  # mixed dtypes
    assert attn(Q, K, V, True, 2) is None  # an int scale (the direct entry takes it)
    assert attn(Q, K, V, mask=[[True] * 5] * 3) is None  # array-like mask
    assert attn(Q, K, V, mask=np.ones((3, 5))) is None  # float64 mask for float32 q
    assert attn(Q, K, V, mask=np.ones((3, 5), np.int64)) is None  # refused by the direct entry:
    with pytest.raises(TypeError, match=r"^\[attention\] mask must be boolean .* got dtype int64"):
        _core.attention(Q, K, V, False, None, None, mask=np.ones((3, 5), np.int64))
    assert attn(Q, K, V, sinks=[0.0] * 4) is None  # array-like sinks
    assert attn(Q, out=Q) is None  # out overlaps q
    with pytest.raises(ValueError, match=r"^\[attention\] operands must be NumPy arrays"):
        _core.attention(Q.tolist(), K, V, False, None, None)
    out, w, lse = attn(Q, K, V, causal=True, return_weights=True, return_lse=True)
    assert out.shape == (1, 4, 3, 6) and w.shape == (1, 4, 3, 5) and lse.shape == (1, 4, 3)
    np.testing.assert_array_equal(  # the direct entry takes NumPy bools and integer scales
        _core.attention(Q, K, V, np.True_, 2, None), attn(Q, K, V, True, 2.0)
    )


def test_rope_entry_checks_what_the_tables_callback_returns():
    """The tables callback is _ops' LRU; _core checks its result all the same (the kernel
    trusts the tables' shape and dtype)."""
    x = np.ones((2, 5, 8), np.float32)  # (a shape no other test caches)
    for bad in [(), (1,), lambda c, s: (c[:1], s[:1]), lambda c, s: (c.astype(np.float64), s)]:
        if isinstance(bad, tuple):
            tables = lambda *a, bad=bad: bad  # noqa: E731
        else:
            tables = lambda p, f, af, dt, bad=bad: bad(*_core.rope_tables(p, f, af, dt))  # noqa: E731
        with pytest.raises((ValueError, TypeError), match=r"^\[rope\] (tables|cos)"):
            _core._fast_rope(x, np.arange(5), 10000.0, None, False, None, 1.0, None, tables)
