"""swiglu against its formula: kernel cpp/kernels/silu.hpp (swiglu_kernel), driver
cpp/ops/silu.cpp, binding cpp/bindings/silu.cpp, wrapper llmkernels._ops.swiglu."""

from __future__ import annotations

import llmkernels as lk
import numpy as np
from llmkernels import reference as ref
from op_helpers import data, op_tests


def ref_swiglu(gate, up):
    """swiglu(gate, up) = silu(gate) * up = gate / (1 + exp(-gate)) * up, in float64."""
    g = np.asarray(gate, np.float64)
    with np.errstate(over="ignore"):
        return g / (1.0 + np.exp(-g)) * np.asarray(up, np.float64)


def op_swiglu(x, rng):
    up = data(rng, x.shape, x.dtype)
    return lk.swiglu(x * 4, up), ref_swiglu(x * 4, up)


OPS = {"swiglu": op_swiglu}

test_sweep, test_layouts = op_tests(OPS)


def test_formula_is_the_package_reference(rng):
    g, u = rng.standard_normal(200) * 30, rng.standard_normal(200)
    np.testing.assert_allclose(ref_swiglu(g, u), ref.swiglu(g, u), rtol=1e-14, atol=1e-300)
