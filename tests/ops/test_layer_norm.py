"""layer_norm against its formula: kernel cpp/kernels/layer_norm.hpp, driver
cpp/ops/layer_norm.cpp, binding cpp/bindings/layer_norm.cpp, wrapper llmkernels._ops.layer_norm."""

from __future__ import annotations

import llmkernels as lk
import numpy as np
from llmkernels import reference as ref
from op_helpers import data, op_tests


def ref_layer_norm(x, weight=None, bias=None, eps=1e-5):
    """y = (x - mean) / sqrt(var + eps) * weight + bias over the last axis (biased variance),
    in float64."""
    x = np.asarray(x, np.float64)
    mean = x.mean(axis=-1, keepdims=True)
    y = (x - mean) / np.sqrt(((x - mean) ** 2).mean(axis=-1, keepdims=True) + eps)
    if weight is not None:
        y = y * np.asarray(weight, np.float64)
    return y if bias is None else y + np.asarray(bias, np.float64)


def op_layer_norm(x, rng):
    w = data(rng, x.shape[-1:], x.dtype)
    b = data(rng, x.shape[-1:], x.dtype)
    return lk.layer_norm(x, w, b, 1e-5), ref_layer_norm(x, w, b, 1e-5)


def op_layer_norm_noaffine(x, rng):
    return lk.layer_norm(x), ref_layer_norm(x)


OPS = {"layer_norm": op_layer_norm, "layer_norm_noaffine": op_layer_norm_noaffine}

test_sweep, test_layouts = op_tests(OPS)


def test_formula_is_the_package_reference(rng):
    x, w, b = rng.standard_normal((3, 40)), rng.standard_normal(40), rng.standard_normal(40)
    np.testing.assert_allclose(ref_layer_norm(x, w, b), ref.layer_norm(x, w, b), rtol=1e-13)
    np.testing.assert_allclose(ref_layer_norm(x), ref.layer_norm(x), rtol=1e-13)
