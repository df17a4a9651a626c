"""rope against its formula: kernel cpp/kernels/rope.hpp, driver cpp/ops/rope.cpp (cos/sin
tables: cpp/common/rope_tables.hpp, shared with the attention module), binding
cpp/bindings/rope.cpp, wrapper llmkernels._ops.rope. (Frequency scaling:
tests/models/test_rope_scaling.py, partial rotary in the modules:
tests/models/test_partial_rotary.py.)"""

from __future__ import annotations

import llmkernels as lk
import numpy as np
import pytest
from conftest import PERTURB_ULP, cxx_inv_freq
from llmkernels import _libm
from llmkernels import reference as ref
from op_helpers import DTYPES, check, data, op_tests


def ref_rope(
    x,
    positions=None,
    *,
    theta=10000.0,
    inv_freq=None,
    interleaved=False,
    rotary_dim=None,
    attention_factor=1.0,
):
    """x (..., T, D): the pair (x1, x2) of frequency k at position p becomes
    (x1 cos a - x2 sin a, x2 cos a + x1 sin a) * attention_factor, a = p * inv_freq[k] in float64,
    inv_freq = 1 / theta^(2k / r) (r = rotary_dim, default D; the C library's pow). Pairs
    (x[k], x[k + r/2]) (half-split) or (x[2k], x[2k+1]) (interleaved); features r..D-1 pass
    through; positions default arange(T) and broadcast to x.shape[:-1]."""
    x = np.asarray(x, np.float64)
    t, d = x.shape[-2:]
    r = d if rotary_dim is None else rotary_dim
    freqs = np.asarray(inv_freq, float) if inv_freq is not None else None
    if freqs is None:
        freqs = cxx_inv_freq(r, theta)  # the C library's pow, as the core's
    pos = np.arange(t, dtype=np.float64) if positions is None else np.asarray(positions, float)
    angles = np.broadcast_to(pos, x.shape[:-1])[..., None] * freqs
    cos = _libm.cos(angles) * attention_factor
    sin = _libm.sin(angles) * attention_factor
    half = (slice(0, r // 2), slice(r // 2, r))
    i1, i2 = (slice(0, r, 2), slice(1, r, 2)) if interleaved else half
    out = x.copy()
    out[..., i1] = x[..., i1] * cos - x[..., i2] * sin
    out[..., i2] = x[..., i2] * cos + x[..., i1] * sin
    return out


def op_rope(x, rng):
    # x (..., n) is read as (..., T=n_rows_last, D): use the size as D with T = 5 prepended
    xr = data(rng, x.shape[:-1] + (5, x.shape[-1]), x.dtype)
    r = x.shape[-1] - x.shape[-1] % 2  # odd D: rotate the even part, pass the last feature
    pos = np.arange(5) * 3 + 2
    return (
        lk.rope(xr, pos, rotary_dim=r, theta=500.0),
        ref_rope(xr, pos, rotary_dim=r, theta=500.0),
    )


def op_rope_interleaved(x, rng):
    xr = data(rng, x.shape[:-1] + (3, x.shape[-1]), x.dtype)
    r = x.shape[-1] - x.shape[-1] % 2
    return (
        lk.rope(xr, rotary_dim=r, interleaved=True),
        ref_rope(xr, rotary_dim=r, interleaved=True),
    )


OPS = {"rope": op_rope, "rope_interleaved": op_rope_interleaved}

test_sweep, test_layouts = op_tests(OPS)


@pytest.mark.parametrize("dtype", DTYPES)
def test_rope_positions_and_options(dtype, rng):
    x = data(rng, (2, 4, 6, 16), dtype)  # (B, H, T, D)
    # per-batch positions (B, 1, T)
    pos = np.array([[0, 1, 2, 3, 4, 5], [7, 8, 9, 10, 11, 12]])[:, None, :]
    check(lk.rope(x, pos), ref_rope(x, pos), dtype)
    # full per-row positions (B, H, T)
    pos_full = rng.integers(0, 5000, size=(2, 4, 6))
    check(lk.rope(x, pos_full), ref_rope(x, pos_full), dtype)
    # scalar-like (1,) broadcast
    check(lk.rope(x, np.array([3])), ref_rope(x, np.array([3])), dtype)
    # large offsets: angles formed in float64 stay exact
    big = np.arange(6) + 10**6
    check(lk.rope(x, big), ref_rope(x, big), dtype)
    big2 = np.arange(6, dtype=np.uint32) + 2**31
    check(lk.rope(x, big2), ref_rope(x, big2), dtype)
    # explicit inv_freq, partial rotary, attention factor, interleaved
    inv = np.linspace(1.0, 1e-3, 4)
    check(lk.rope(x, inv_freq=inv, rotary_dim=8), ref_rope(x, inv_freq=inv, rotary_dim=8), dtype)
    check(
        lk.rope(x, attention_factor=1.2, interleaved=True),
        ref_rope(x, attention_factor=1.2, interleaved=True),
        dtype,
    )
    # rotary_dim=0 is the identity
    np.testing.assert_array_equal(lk.rope(x, rotary_dim=0), x)
    # scaled frequencies from rope_inv_freq
    scaling = {
        "rope_type": "llama3",
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192,
    }
    inv = lk.rope_inv_freq(16, 500000.0, scaling)
    check(lk.rope(x, big, inv_freq=inv), ref_rope(x, big, inv_freq=inv), dtype)


def test_rope_relative_property(rng):
    """q(m)·k(n) depends only on m - n: the defining property of RoPE."""
    q = rng.standard_normal((1, 64))
    k = rng.standard_normal((1, 64))
    s1 = lk.rope(q, [5])[0] @ lk.rope(k, [2])[0]
    s2 = lk.rope(q, [1005])[0] @ lk.rope(k, [1002])[0]
    np.testing.assert_allclose(s1, s2, rtol=1e-10)


def test_rope_repeated_calls_use_consistent_tables(rng):
    x = data(rng, (3, 8), np.float32)
    a = lk.rope(x, [1, 2, 3])
    b = lk.rope(x, [1, 2, 3])
    np.testing.assert_array_equal(a, b)
    c = lk.rope(x, [1, 2, 4])
    assert not np.array_equal(a, c)


def rope_perturbation_bound(x, pos):
    """How far k ulp on the reference's frequencies and cos/sin (LLMK_TEST_PERTURB_ULP=k; 0 when
    unset) can move an output: the angle p * f by |p| * k * ulp(f) (f <= 1), cos and sin by k
    ulp, each weighing on two features."""
    k = PERTURB_ULP
    return 2 * float(np.abs(x).max()) * k * np.spacing(1.0) * (float(np.abs(pos).max()) + 1)


@pytest.mark.parametrize("interleaved", [False, True])
def test_formula_is_the_package_reference(interleaved, rng):
    x, pos = rng.standard_normal((2, 3, 5, 12)), rng.integers(0, 10**6, (2, 1, 5))
    for kw in (
        {},
        {"rotary_dim": 8, "theta": 500.0},
        {"inv_freq": np.linspace(1, 1e-3, 6)},
        {"attention_factor": 1.2},
    ):
        np.testing.assert_allclose(
            ref_rope(x, pos, interleaved=interleaved, **kw),
            ref.rope(x, pos, interleaved=interleaved, **kw),
            rtol=1e-13,
            atol=1e-13 + rope_perturbation_bound(x, pos),
        )
