"""silu against its formula: kernel cpp/kernels/silu.hpp (silu_kernel), driver cpp/ops/silu.cpp,
binding cpp/bindings/silu.cpp, wrapper llmkernels._ops.silu. (The kernel's exp and sigmoid, and
the subnormal / extreme ranges: tests/ops/test_simd_math.py.)"""

from __future__ import annotations

import llmkernels as lk
import numpy as np
from llmkernels import reference as ref
from op_helpers import op_tests


def ref_silu(x):
    """silu(x) = x * sigmoid(x) = x / (1 + exp(-x)), in float64."""
    x = np.asarray(x, np.float64)
    with np.errstate(over="ignore"):
        return x / (1.0 + np.exp(-x))


def op_silu(x, rng):
    return lk.silu(x * 4), ref_silu(x * 4)


OPS = {"silu": op_silu}

test_sweep, test_layouts = op_tests(OPS)


def test_formula_is_the_package_reference(rng):
    x = rng.standard_normal(200) * 30
    np.testing.assert_allclose(ref_silu(x), ref.silu(x), rtol=1e-14, atol=1e-300)
