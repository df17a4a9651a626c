"""Group-wise int8 / int4 weights: quantize (bit-exact against the NumPy twin), dequantize
(error bounds), quantized_linear (every SIMD path, tails, both activation strategies, thread
counts) and the errors.

Formulas (llmkernels.quant, docs/quantization.md), per (row, group of G elements along k):
  int8: s = smallest float16 >= max|w| / 127,   code = rint(w / s) in [-127, 127]
  int4: s = (element of largest |w|) / -8, away from zero to float16, code = rint(w / s) in [-8, 7]
  W_deq = code * s;   quantized_linear(x) = x @ W_deq.T + bias
  activations="int8" (the GEMV, m <= INT8_ACTIVATION_TOKENS = 16): x replaced per token and
  block of 32 by q * s_x, s_x = max|x| / 127, q = rint(x / s_x); above, float activations.
"""

from __future__ import annotations

import llmkernels as lk
import numpy as np
import pytest
from llmkernels.quant import int8_activations_used
from llmkernels.reference import dequantize as ref_dequantize
from llmkernels.reference import quant_codes as ref_codes
from llmkernels.reference import quantize as ref_quantize
from llmkernels.reference import quantize_activations as ref_quantize_activations
from llmkernels.reference import quantized_linear as ref_quantized_linear

GROUPS = [32, 64, 128]
BITS = [8, 4]
ACTS = ["float32", "int8"]


def weights(rng: np.random.Generator, rows: int, k: int) -> np.ndarray:
    """Realistic-ish weights: normal with per-row scale spread and a few outliers."""
    w = rng.standard_normal((rows, k)).astype(np.float32) * 0.02
    w *= rng.uniform(0.2, 3.0, size=(rows, 1)).astype(np.float32)
    n_out = max(1, rows * k // 500)
    w.flat[rng.integers(0, rows * k, n_out)] *= 8
    return w


def acts_of(activations: str, m: int) -> str:
    """The activations quantized_linear uses for m tokens: int8 ones in the GEMV, and above it
    on CPUs whose int8 dot product the prefill uses (VNNI)."""
    return activations if int8_activations_used(m) else "float32"


def check_linear(y: np.ndarray, x, q, s, bits, g, bias=None, activations="float32"):
    """y within float32 accumulation error of the float64 reference, relative to the sum of
    |terms| (a bound that holds whatever the cancellation)."""
    ref = ref_quantized_linear(x, q, s, bits, g, bias, activations)
    w = np.abs(ref_dequantize(q, s, bits, g).astype(np.float64))
    if activations == "int8":
        qx, sx = ref_quantize_activations(x)
        xa = np.abs(qx.astype(np.float64) * np.repeat(sx.astype(np.float64), 32, axis=1))
    else:
        xa = np.abs(np.asarray(x, np.float64))
    bound = 1e-5 * (xa @ w.T) + (0 if bias is None else 1e-6 * np.abs(bias)) + 1e-30
    assert y.dtype == np.float32 and y.shape == ref.shape
    err = np.abs(y.astype(np.float64) - ref)
    assert np.all(err <= bound), f"max err / bound = {np.max(err / bound)}"


# --- quantize / dequantize -----------------------------------------------------------------------


@pytest.mark.parametrize("bits", BITS)
@pytest.mark.parametrize("g", GROUPS)
@pytest.mark.parametrize("rows,mult", [(1, 1), (7, 7), (33, 3)])
def test_quantize_bit_exact(rng, bits, g, rows, mult):
    w = weights(rng, rows, g * mult)
    q, s = lk.quantize(w, bits, g)
    rq, rs = ref_quantize(w, bits, g)
    assert q.dtype == (np.int8 if bits == 8 else np.uint8) and s.dtype == np.float16
    assert q.shape == ((rows, g * mult) if bits == 8 else (rows, g * mult // 2))
    assert s.shape == (rows, mult)
    np.testing.assert_array_equal(s.view(np.uint16), rs.view(np.uint16))
    np.testing.assert_array_equal(q, rq)
    np.testing.assert_array_equal(lk.dequantize(q, s, bits, g), ref_dequantize(q, s, bits, g))


@pytest.mark.parametrize("bits", BITS)
def test_quantize_special_values(bits):
    """Zero groups, ties at .5 (half to even), subnormal-range scales, equal +-max, a huge group."""
    g = 32
    rows = [
        np.zeros(g),
        np.arange(g) - 15.5,  # halves everywhere
        np.full(g, 1e-7) * (np.arange(g) - 16),  # scales in float16's subnormal range
        np.where(np.arange(g) % 2 == 0, 3.0, -3.0),  # + and - extreme of the same magnitude
        np.linspace(-1e5, 2e5, g),
        np.concatenate([[1e-30], np.zeros(g - 1)]),
        np.concatenate([np.zeros(g - 1), [-7.5]]),
    ]
    w = np.array(rows, np.float32)
    q, s = lk.quantize(w, bits, g)
    rq, rs = ref_quantize(w, bits, g)
    np.testing.assert_array_equal(s.view(np.uint16), rs.view(np.uint16))
    np.testing.assert_array_equal(q, rq)
    assert s[0, 0] == 0 and np.all(ref_codes(q, bits)[0] == 0)


@pytest.mark.parametrize("bits", BITS)
@pytest.mark.parametrize("g", GROUPS)
def test_dequantize_error_bound(rng, bits, g):
    """|w - deq| <= |s| / 2 per element; int4 elements clamped at +7 (w / s > 7.5, the side
    opposite the group's extreme) within |s|."""
    w = weights(rng, 65, 4 * g)
    q, s = lk.quantize(w, bits, g)
    deq = lk.dequantize(q, s, bits, g)
    sf = np.abs(np.repeat(s.astype(np.float32), g, axis=1))
    err = np.abs(w.astype(np.float64) - deq)
    if bits == 8:
        assert np.all(err <= sf / 2)
        # the scale is not larger than it must be: within float16 rounding of max|w| / 127
        amax = np.abs(w.reshape(65, 4, g)).max(-1)
        assert np.all(np.abs(s.astype(np.float32)) <= amax / 127 * (1 + 2**-10))
    else:
        ratio = w / np.repeat(s.astype(np.float32), g, axis=1)
        clamped = ratio > 7.5
        assert np.all(err[~clamped] <= sf[~clamped] / 2)
        assert np.all(err[clamped] <= sf[clamped])
        assert np.all(ref_codes(q, bits) >= -8) and np.all(ref_codes(q, bits) <= 7)


def test_int4_packing_order():
    """Q4_0's order: in each block of 32, element i in the low nibble of byte i, i + 16 high."""
    w = np.zeros((1, 64), np.float32)
    w[0, 0] = -8.0  # the extreme: code -8, scale 1
    w[0, 16] = 7.0
    w[0, 33] = -8.0
    w[0, 49] = 3.0
    q, s = lk.quantize(w, 4, 64)
    assert s[0, 0] == 1.0
    assert q[0, 0] == (0 | (15 << 4))  # element 0: -8 + 8 = 0; element 16: 7 + 8 = 15
    assert q[0, 16 + 1] == (0 | (11 << 4))  # block 1: element 33 low, element 49 high
    assert q[0, 2] == (8 | (8 << 4))  # zeros


# --- quantized_linear ----------------------------------------------------------------------------


@pytest.mark.parametrize("acts", ACTS)
@pytest.mark.parametrize("bits", BITS)
@pytest.mark.parametrize("rows", [1, 7, 31, 33, 1025])
@pytest.mark.parametrize("m", [1, 2, 3, 4, 5, 8, 9, 16, 17, 64])
def test_linear_tails(isa, rng, acts, bits, rows, m):
    g, k = 32, 7 * 32
    w = weights(rng, rows, k)
    q, s = lk.quantize(w, bits, g)
    x = rng.standard_normal((m, k)).astype(np.float32)
    y = lk.quantized_linear(x, q, s, bits, g, activations=acts)
    # the int8 activations are the GEMV's (up to 16 tokens); the GEMM takes float activations
    check_linear(y, x, q, s, bits, g, activations=acts_of(acts, m))


@pytest.mark.parametrize("acts", ACTS)
@pytest.mark.parametrize("bits", BITS)
@pytest.mark.parametrize("g", GROUPS)
@pytest.mark.parametrize("mult", [1, 7, 33])
def test_linear_group_sizes(isa, rng, acts, bits, g, mult):
    k, rows = g * mult, 33
    w = weights(rng, rows, k)
    q, s = lk.quantize(w, bits, g)
    bias = rng.standard_normal(rows).astype(np.float32)
    for m in (1, 5, 9, 17):
        x = rng.standard_normal((m, k)).astype(np.float32)
        y = lk.quantized_linear(x, q, s, bits, g, bias, activations=acts)
        check_linear(y, x, q, s, bits, g, bias, acts_of(acts, m))


def test_linear_layouts(rng):
    """Leading dims, strided and float64 inputs (converted), list inputs."""
    g, k, rows = 32, 96, 10
    w = weights(rng, rows, k)
    q, s = lk.quantize(w.astype(np.float64), 8, g)
    x = rng.standard_normal((2, 3, 2 * k))[..., ::2]
    y = lk.quantized_linear(x, q, s, 8, g)
    assert y.shape == (2, 3, rows)
    x2 = x.reshape(6, k).astype(np.float32)
    check_linear(y.reshape(6, rows), x2, q, s, 8, g, activations="int8")  # the default, m <= 16
    y1 = lk.quantized_linear(x[0, 0].tolist(), q, s, 8, g)  # one token (the m = 1 kernel)
    np.testing.assert_array_equal(y1, lk.quantized_linear(x[0, 0].astype(np.float32), q, s, 8, g))


@pytest.mark.parametrize("acts", ACTS)
@pytest.mark.parametrize("bits", BITS)
@pytest.mark.parametrize("m", [1, 3, 8, 64])
def test_linear_thread_count_bitwise(threads, rng, acts, bits, m):
    g, k, rows = 64, 256, 1025
    q, s = lk.quantize(weights(rng, rows, k), bits, g)
    x = rng.standard_normal((m, k)).astype(np.float32)
    lk.set_num_threads(1)
    y1 = lk.quantized_linear(x, q, s, bits, g, activations=acts)
    lk.set_num_threads(2)
    y2 = lk.quantized_linear(x, q, s, bits, g, activations=acts)
    np.testing.assert_array_equal(y1, y2)


def test_linear_nan_propagates():
    g, k = 32, 64
    q, s = lk.quantize(np.ones((3, k), np.float32), 8, g)
    x = np.ones((1, k), np.float32)
    x[0, 5] = np.nan
    for acts in ACTS:
        assert np.all(np.isnan(lk.quantized_linear(x, q, s, 8, g, activations=acts)))


@pytest.mark.parametrize("bits", BITS)
@pytest.mark.parametrize("m", [1, 3, 16])
def test_linear_int8_activations_near_float_max(isa, bits, m):
    """|x| ~ 3e38: s_w * s_x overflowed float32, and inf times a zero integer dot product gave
    NaN where the reference gives 0 (and inf where it overflows)."""
    w = np.zeros((2, 32), np.float32)
    w[0, 0] = w[1, 1] = 1e5
    x = np.zeros((m, 32), np.float32)
    x[:, 1] = 3e38
    q, s = lk.quantize(w, bits, 32)
    y = lk.quantized_linear(x, q, s, bits, 32, activations="int8")
    exact = x.astype(np.float64) @ ref_dequantize(q, s, bits, 32).astype(np.float64).T
    with np.errstate(over="ignore"):
        want = exact.astype(np.float32)
        ref = ref_quantized_linear(x, q, s, bits, 32, activations="int8").astype(np.float32)
    np.testing.assert_array_equal(want[:, 0], 0)
    assert np.all(np.isposinf(want[:, 1]))
    np.testing.assert_array_equal(y, want)
    np.testing.assert_array_equal(y, ref)


@pytest.mark.parametrize("bits", BITS)
@pytest.mark.parametrize("value", [1e-40, -3e-44, 2e-30])
def test_linear_int8_activations_of_subnormal_size(isa, rng, bits, value):
    """Blocks of subnormal x: s_x (and s_w * s_x) subnormal, a few significant bits, were 3.4%
    off the reference on every row; now within the int8 activations' rounding (1/254 of each
    block's max |x| per element) of the float64 product."""
    w = weights(rng, 33, 128)
    q, s = lk.quantize(w, bits, 32)
    x = np.full((3, 128), value, np.float32)
    x[1, 40:] *= np.linspace(0.5, 1, 88, dtype=np.float32)  # not constant
    y = lk.quantized_linear(x, q, s, bits, 32, activations="int8")
    wd = ref_dequantize(q, s, bits, 32).astype(np.float64)
    exact = x.astype(np.float64) @ wd.T
    xmax = np.repeat(np.abs(x.reshape(3, 4, 32)).max(-1).astype(np.float64), 32, axis=1)
    bound = (1 / 254 + 1e-5) * (xmax @ np.abs(wd).T) + 1e-43  # (+ the output's subnormal ulps)
    err = np.abs(y.astype(np.float64) - exact)
    assert np.all(err <= bound), f"max err / bound = {np.max(err / bound)}"
    np.testing.assert_allclose(
        y, ref_quantized_linear(x, q, s, bits, 32, activations="int8"), rtol=0, atol=bound.max()
    )


def test_quantize_fast_path_equals_ref_on_large(rng):
    """A TinyLlama-sized row count through the threaded quantizer."""
    w = weights(rng, 2048, 256)
    for bits in BITS:
        q, s = lk.quantize(w, bits, 32)
        rq, rs = ref_quantize(w, bits, 32)
        np.testing.assert_array_equal(q, rq)
        np.testing.assert_array_equal(s.view(np.uint16), rs.view(np.uint16))


# --- errors --------------------------------------------------------------------------------------


def test_errors():
    w = np.ones((4, 64), np.float32)
    with pytest.raises(ValueError, match=r"^\[quantize\] bits must be 4 or 8, got 3"):
        lk.quantize(w, 3, 32)
    with pytest.raises(ValueError, match=r"^\[quantize\] group_size must be 32, 64 or 128"):
        lk.quantize(w, 8, 16)
    with pytest.raises(ValueError, match=r"^\[quantize\] w's k = 64 .* multiple of group_size"):
        lk.quantize(w, 8, 128)
    with pytest.raises(ValueError, match=r"^\[quantize\] w must have shape \(rows, k\)"):
        lk.quantize(np.ones(64, np.float32), 8, 32)
    bad = w.copy()
    bad[2, 40] = np.nan
    with pytest.raises(ValueError, match=r"^\[quantize\] w must be finite: row 2, group 1"):
        lk.quantize(bad, 8, 32)
    with pytest.raises(ValueError, match=r"^\[quantize\] w row 0, group 0: .*float16"):
        lk.quantize(np.full((1, 32), 1e7, np.float32), 8, 32)
    with pytest.raises(TypeError, match=r"^\[quantize\] w must be a real array"):
        lk.quantize(np.ones((1, 32), complex), 8, 32)

    q8, s8 = lk.quantize(w, 8, 32)
    q4, s4 = lk.quantize(w, 4, 32)
    with pytest.raises(TypeError, match=r"^\[dequantize\] q has dtype uint8, expected int8"):
        lk.dequantize(q4, s4, 8, 32)
    with pytest.raises(TypeError, match=r"^\[dequantize\] scales has dtype float32"):
        lk.dequantize(q8, s8.astype(np.float32), 8, 32)
    with pytest.raises(ValueError, match=r"^\[dequantize\] scales must have shape \(4, 2\)"):
        lk.dequantize(q8, s8[:, :1], 8, 32)
    with pytest.raises(ValueError, match=r"^\[dequantize\] q's shape \(4, 32\) gives k = 64, not"):
        lk.dequantize(q4, s4, 4, 128)

    x = np.ones((2, 64), np.float32)
    with pytest.raises(ValueError, match=r"^\[quantized_linear\] x must have shape \(m, 64\)"):
        lk.quantized_linear(np.ones((2, 63)), q8, s8, 8, 32)
    with pytest.raises(ValueError, match=r"^\[quantized_linear\] bias must have shape \(4,\)"):
        lk.quantized_linear(x, q8, s8, 8, 32, np.ones(3))
    with pytest.raises(ValueError, match=r"^\[quantized_linear\] activations must be"):
        lk.quantized_linear(x, q8, s8, 8, 32, activations="int4")
    with pytest.raises(ValueError, match=r"^\[quantized_linear\] bits must be 4 or 8"):
        lk.quantized_linear(x, q8, s8, 2, 32)
    with pytest.raises(ValueError, match=r"^\[quantized_linear\] x must have shape \(\.\.\., k\)"):
        lk.quantized_linear(np.float32(1), q8, s8, 8, 32)
    # _core directly: checked too (never reaches a kernel with bad operands)
    with pytest.raises(TypeError, match=r"^\[quantized_linear\] x has dtype float64"):
        lk._core.quantized_linear(x.astype(np.float64), q8, s8, 8, 32)
    with pytest.raises(ValueError, match=r"^\[quantized_linear\] x must be C-contiguous"):
        lk._core.quantized_linear(np.ones((64, 2), np.float32).T, q8, s8, 8, 32)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"bits": 8.0}, r"bits must be 4 or 8, got 8\.0"),
        ({"bits": "8"}, r"bits must be 4 or 8, got '8'"),
        ({"bits": True}, r"bits must be 4 or 8, got True"),
        ({"bits": None}, r"bits must be 4 or 8, got None"),
        ({"group_size": 2**64}, r"group_size must be 32, 64 or 128, got 18446744073709551616"),
        ({"group_size": 32.0}, r"group_size must be 32, 64 or 128, got 32\.0"),
        ({"group_size": -(2**70)}, r"group_size must be 32, 64 or 128"),
    ],
)
def test_wrong_typed_scalars(kwargs, match):
    """bits / group_size of the wrong type are refused by name (were pybind11's "incompatible
    function arguments" dump of the signatures); NumPy integers are integers."""
    w = np.ones((4, 64), np.float32)
    q, s = lk.quantize(w, 8, 32)
    x = np.ones((1, 64), np.float32)
    args = {"bits": 8, "group_size": 32, **kwargs}
    with pytest.raises(ValueError, match=r"^\[quantize\] " + match):
        lk.quantize(w, **args)
    with pytest.raises(ValueError, match=r"^\[dequantize\] " + match):
        lk.dequantize(q, s, **args)
    with pytest.raises(ValueError, match=r"^\[quantized_linear\] " + match):
        lk.quantized_linear(x, q, s, **args)


def test_wrong_typed_activations_and_numpy_integers():
    w = np.ones((4, 64), np.float32)
    q, s = lk.quantize(w, 8, 32)
    x = np.ones((1, 64), np.float32)
    for bad in (None, 8, b"int8"):
        with pytest.raises(
            ValueError, match=r"^\[quantized_linear\] activations must be 'float32' or 'int8'"
        ):
            lk.quantized_linear(x, q, s, 8, 32, activations=bad)
    # NumPy integer scalars are integers: the same results as Python ints
    q2, s2 = lk.quantize(w, np.int64(8), np.uint8(32))
    np.testing.assert_array_equal(q2, q)
    np.testing.assert_array_equal(
        lk.dequantize(q, s, np.int32(8), np.int16(32)), lk.dequantize(q, s, 8, 32)
    )
    np.testing.assert_array_equal(
        lk.quantized_linear(x, q, s, np.int8(8), np.int64(32)), lk.quantized_linear(x, q, s, 8, 32)
    )


def test_empty():
    q, s = lk.quantize(np.ones((0, 64), np.float32), 8, 32)
    assert q.shape == (0, 64) and s.shape == (0, 2)
    q, s = lk.quantize(np.ones((3, 64), np.float32), 4, 32)
    assert lk.quantized_linear(np.ones((0, 64)), q, s, 4, 32).shape == (0, 3)
