"""rms_norm against its formula: kernel cpp/kernels/rms_norm.hpp, driver cpp/ops/rms_norm.cpp,
binding cpp/bindings/rms_norm.cpp, wrapper llmkernels._ops.rms_norm."""

from __future__ import annotations

import llmkernels as lk
import numpy as np
from llmkernels import reference as ref
from op_helpers import data, op_tests


def ref_rms_norm(x, weight=None, eps=1e-6):
    """y = x / sqrt(mean(x^2) + eps) * weight over the last axis, in float64."""
    x = np.asarray(x, np.float64)
    y = x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps)
    return y if weight is None else y * np.asarray(weight, np.float64)


def op_rms_norm(x, rng):
    w = data(rng, x.shape[-1:], x.dtype)
    return lk.rms_norm(x, w, 1e-6), ref_rms_norm(x, w, 1e-6)


def op_rms_norm_noweight(x, rng):
    return lk.rms_norm(x, eps=1e-5), ref_rms_norm(x, eps=1e-5)


OPS = {"rms_norm": op_rms_norm, "rms_norm_noweight": op_rms_norm_noweight}

test_sweep, test_layouts = op_tests(OPS)


def test_formula_is_the_package_reference(rng):
    x, w = rng.standard_normal((3, 40)), rng.standard_normal(40)
    np.testing.assert_allclose(ref_rms_norm(x, w, 1e-5), ref.rms_norm(x, w, 1e-5), rtol=1e-14)
    np.testing.assert_allclose(ref_rms_norm(x), ref.rms_norm(x), rtol=1e-14)
