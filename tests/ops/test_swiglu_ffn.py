"""swiglu_ffn against its formula: the projections cpp/ops/linear.cpp (the one projection path,
shared with the FeedForward module), the activation kernel cpp/kernels/silu.hpp, entry
cpp/ops/swiglu_ffn.cpp, binding cpp/bindings/swiglu_ffn.cpp, wrapper llmkernels._ops.swiglu_ffn.
(The module: tests/models/test_modules.py.)"""

from __future__ import annotations

import llmkernels as lk
import numpy as np
import pytest
from llmkernels import reference as ref
from op_helpers import DTYPES, data


def ref_swiglu_ffn(x, w_gate, w_up, w_down=None, b_gate=None, b_up=None, b_down=None):
    """(silu(x @ w_gate + b_gate) * (x @ w_up + b_up)) @ w_down + b_down in float64, weights in
    (in, out) layout; without w_down, the hidden activation."""
    f = [None if a is None else np.asarray(a, np.float64) for a in (x, w_gate, w_up, w_down)]
    x, w_gate, w_up, w_down = f
    gate = x @ w_gate + (0.0 if b_gate is None else np.asarray(b_gate, np.float64))
    up = x @ w_up + (0.0 if b_up is None else np.asarray(b_up, np.float64))
    with np.errstate(over="ignore"):
        hidden = gate / (1.0 + np.exp(-gate)) * up
    if w_down is None:
        return hidden
    return hidden @ w_down + (0.0 if b_down is None else np.asarray(b_down, np.float64))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n", [1, 7, 33, 1025])
def test_swiglu_ffn(n, dtype, isa, rng):
    x = data(rng, (2, 3, n), dtype)
    wg, wu = data(rng, (n, 37), dtype, 0.3), data(rng, (n, 37), dtype, 0.3)
    wd = data(rng, (37, 9), dtype, 0.3)
    bg, bu, bd = data(rng, (37,), dtype), data(rng, (37,), dtype), data(rng, (9,), dtype)
    got = lk.swiglu_ffn(x, wg, wu, wd, b_gate=bg, b_up=bu, b_down=bd)
    check_matmul(got, ref_swiglu_ffn(x, wg, wu, wd, b_gate=bg, b_up=bu, b_down=bd), dtype)
    hidden = lk.swiglu_ffn(x, wg, wu)
    check_matmul(hidden, ref_swiglu_ffn(x, wg, wu), dtype)
    one = lk.swiglu_ffn(x[0, 0], wg, wu, wd)  # 1-D x
    check_matmul(one, ref_swiglu_ffn(x[0, 0], wg, wu, wd), dtype)


def check_matmul(actual: np.ndarray, expected: np.ndarray, dtype: type) -> None:
    """Outputs of float32 matmuls: a dot product of K terms carries a rounding error of about
    eps * sqrt(K) * (scale of its terms), so entries that cancel to small values cannot meet an
    elementwise atol of 1e-6; the block-output tolerance (conftest.ATTN_TOL), relative to the
    output's scale, is the honest bound (float64: the same reasoning at float64 epsilon)."""
    assert actual.dtype == np.dtype(dtype) and actual.shape == expected.shape
    if np.dtype(dtype) == np.float32:
        scale = float(np.max(np.abs(expected))) if expected.size else 1.0
        np.testing.assert_allclose(actual, expected, rtol=1e-4, atol=1e-5 * max(scale, 1.0))
    else:
        scale = float(np.max(np.abs(expected))) if expected.size else 1.0
        np.testing.assert_allclose(actual, expected, rtol=1e-12, atol=1e-13 * max(scale, 1.0))


def test_formula_is_the_package_reference(rng):
    x, wg, wu, wd = (rng.standard_normal(s) for s in ((4, 6), (6, 5), (6, 5), (5, 3)))
    bg, bu, bd = rng.standard_normal(5), rng.standard_normal(5), rng.standard_normal(3)
    np.testing.assert_allclose(
        ref_swiglu_ffn(x, wg, wu, wd, bg, bu, bd),
        ref.swiglu_ffn(x, wg, wu, wd, b_gate=bg, b_up=bu, b_down=bd),
        rtol=1e-13,
    )
    np.testing.assert_allclose(ref_swiglu_ffn(x, wg, wu), ref.swiglu_ffn(x, wg, wu), rtol=1e-13)
