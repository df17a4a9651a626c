"""The packed GEMM on weights stored as bfloat16 / float16 words or group-wise int8 / int4 codes
(gemm_packed_w_kernel, cpp/kernels/gemm_packed_w.hpp): the prefill of the modules' projection
path (ops/linear.cpp, from 9 tokens) and of ``lk.quantized_linear`` (ops/quant.cpp's qlinear).

Formula (the reference): ``y = x . W^T (+ bias) (+ y0)`` with W the exact float32 value of the
stored weights -- ``widen(W16)`` (bf16: the high half of a float32; f16: IEEE binary16) or
``dequantize(q, scales) = code * scale`` (exact in float32). The kernel converts the weights
while it packs them into the float32 kernel's panels, so it must give the float32 packed
kernel's result on that matrix BIT FOR BIT (every output is one fma chain over k, kernels/
gemm.hpp), and the float64 product within the bound of a sequential float32 sum,
``|error| <= gamma_(k+2) * (|x| . |W|^T + |y0| + |bias|)``.

Routes are forced with ``_core._set_gemm_route``; ``_core._linear`` is the modules' path
(``dtype`` and, for int8 / int4, ``scales`` and ``group``).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import llmkernels as lk
import ml_dtypes
import numpy as np
import pytest
from llmkernels import _core
from llmkernels.quant import INT8_ACTIVATION_TOKENS, int8_activations_used
from llmkernels.reference import quantized_linear as ref_quantized_linear
from op_helpers import check_fma_bound, gemv_tokens

FORMATS16 = {"bfloat16": ml_dtypes.bfloat16, "float16": np.float16}
# (dtype, group): every format the kernel converts
FORMATS = [("bfloat16", 0), ("float16", 0)] + [
    (q, g) for q in ("int8", "int4") for g in (32, 64, 128)
]
TOKENS = (9, 24, 25, 31, 33, 97, 512)


def fmt_id(f: tuple[str, int]) -> str:
    return f"{f[0]}-g{f[1]}" if f[1] else f[0]


@dataclass
class Weights:
    """A weight matrix in one storage format and its exact float32 value."""

    dtype: str
    group: int
    stored: np.ndarray  # uint16 words (n, k), int8 (n, k) or uint8 nibbles (n, k / 2)
    scales: np.ndarray | None  # float16 (n, k / group) for int8 / int4
    dense: np.ndarray  # float32 (n, k): widened / dequantized


def make_weights(w: np.ndarray, dtype: str, group: int) -> Weights:
    if dtype in FORMATS16:
        low = np.ascontiguousarray(w.astype(FORMATS16[dtype]))
        return Weights(dtype, 0, low.view(np.uint16), None, low.astype(np.float32))
    bits = 8 if dtype == "int8" else 4
    q, s = lk.quantize(w, bits, group)
    return Weights(dtype, group, q, s, lk.dequantize(q, s, bits, group))


def linear(x, wt: Weights, bias=None, y=None, route="auto"):
    """The modules' projection path on the stored weights, with ``route`` forced."""
    previous = _core._set_gemm_route(route)
    try:
        return _core._linear(x, wt.stored, wt.dtype, bias, y, wt.scales, wt.group)
    finally:
        _core._set_gemm_route(previous)


def float32_packed(x, dense, bias=None, y=None):
    """The float32 packed kernel (gemm_packed_kernel) on the exact float32 weights."""
    previous = _core._set_gemm_route("packed")
    try:
        return _core._linear(x, dense, "float32", bias, y)
    finally:
        _core._set_gemm_route(previous)


def auto_is_packed(m: int, dtype: str) -> bool:
    """Whether the automatic route takes the packed kernel for m tokens: above gemv_tokens() for
    16-bit weights, above INT8_ACTIVATION_TOKENS (16) for quantized ones, whose GEMV (int8
    activations: the modules' path) runs up to there, and past it only where no integer prefill
    kernel takes int8 activations (``_core.int8_dot()``: none on SSE2); not on AVX-512, where the
    packed kernel is not measured yet."""
    if dtype in FORMATS16:
        return lk.simd_arch() != "avx512" and m > gemv_tokens()
    no_dot = lk._core.int8_dot() == "none"
    return lk.simd_arch() != "avx512" and m > INT8_ACTIVATION_TOKENS and no_dot


def shapes(dtype: str) -> list[tuple[int, int]]:
    """(k, n): k and n tails, a k past one packed block (kGemmPackKc = 512) and n past one
    weight block (kGemmPackNc = 1024 features). Quantized k is a multiple of 128 (every group)."""
    if dtype in FORMATS16:
        return [(33, 1025), (1025, 33), (7, 31), (1, 9)]
    return [(128, 1025), (640, 33), (256, 7)]


@pytest.fixture
def route() -> Iterator[None]:
    """Restores the automatic route after a test that forces one."""
    yield
    _core._set_gemm_route("auto")


@pytest.mark.parametrize("fmt", FORMATS, ids=fmt_id)
@pytest.mark.parametrize("m", TOKENS)
def test_bitwise_equal_to_float32_packed(isa, route, fmt, m):
    dtype, group = fmt
    for k, n in shapes(dtype):
        if m == 512 and n > 40 and k > 40:
            continue  # the large token count on the smaller shapes (time)
        rng = np.random.default_rng(m * 100_003 + k * 101 + n)
        x = rng.standard_normal((m, k), dtype=np.float32)
        wt = make_weights(rng.standard_normal((n, k), dtype=np.float32), dtype, group)
        bias = rng.standard_normal(n, dtype=np.float32)
        y0 = rng.standard_normal((m, n), dtype=np.float32)
        for b, y in ((None, None), (bias, None), (None, y0), (bias, y0)):
            want = float32_packed(x, wt.dense, b, y)
            got = linear(x, wt, b, y, "packed")
            np.testing.assert_array_equal(got, want)
            if auto_is_packed(m, dtype):
                np.testing.assert_array_equal(linear(x, wt, b, y, "auto"), want)
            check_fma_bound(got, x, wt.dense, b, y)


@pytest.mark.parametrize("fmt", FORMATS, ids=fmt_id)
def test_routes_agree_bitwise(isa, route, fmt):
    # the kernels the packed one replaced (gemm_xt_w16: 16-bit words converted in place; gemm_q:
    # dequantized tiles) compute the same fma chains: moving the crossover changes no bit
    dtype, group = fmt
    rng = np.random.default_rng(7)
    k, n = (640, 70) if group else (513, 70)
    wt = make_weights(rng.standard_normal((n, k), dtype=np.float32), dtype, group)
    bias = rng.standard_normal(n, dtype=np.float32)
    for m in (9, 23, 24, 130):
        x = rng.standard_normal((m, k), dtype=np.float32)
        packed = linear(x, wt, bias, None, "packed")
        np.testing.assert_array_equal(linear(x, wt, bias, None, "tokens"), packed)
        if auto_is_packed(m, dtype):
            np.testing.assert_array_equal(linear(x, wt, bias, None, "auto"), packed)


@pytest.mark.parametrize("fmt", FORMATS, ids=fmt_id)
@pytest.mark.parametrize("m", [24, 97, 512])
def test_bitwise_across_thread_counts(route, threads, fmt, m):
    dtype, group = fmt
    rng = np.random.default_rng(m + 3)
    k, n = (256, 1030) if group else (300, 1030)  # several thread shares of 32 features
    x = rng.standard_normal((m, k), dtype=np.float32)
    wt = make_weights(rng.standard_normal((n, k), dtype=np.float32), dtype, group)
    bias = rng.standard_normal(n, dtype=np.float32)
    lk.set_num_threads(1)
    want = linear(x, wt, bias, None, "packed")
    np.testing.assert_array_equal(want, float32_packed(x, wt.dense, bias))
    for t in (2, 3):
        lk.set_num_threads(t)
        np.testing.assert_array_equal(linear(x, wt, bias, None, "packed"), want)
        np.testing.assert_array_equal(linear(x, wt, bias, None, "auto"), linear(x, wt, bias))


@pytest.mark.parametrize("bits", [8, 4])
@pytest.mark.parametrize("group", [32, 64, 128])
@pytest.mark.parametrize("m", [17, 24, 33, 97])
def test_quantized_linear_prefill(isa, bits, group, m):
    # the public function reaches the same kernel (qlinear, m > 16): float activations whatever
    # `activations` says (int8 activations are the GEMV's, up to 16 tokens) -- but on a CPU with
    # VNNI, where int8 activations take every m (tests/ops/test_quant_vnni.py); x non-contiguous
    rng = np.random.default_rng(bits * 1000 + group + m)
    k, n = 384, 45
    q, s = lk.quantize(rng.standard_normal((n, k), dtype=np.float32), bits, group)
    dense = lk.dequantize(q, s, bits, group)
    x = rng.standard_normal((m, 2 * k), dtype=np.float32)[:, ::2]
    bias = rng.standard_normal(n, dtype=np.float32)
    want = float32_packed(np.ascontiguousarray(x), dense, bias)
    for acts in ("float32", "int8"):
        got = lk.quantized_linear(x, q, s, bits, group, bias, activations=acts)
        if acts == "int8" and int8_activations_used(m):
            want8 = ref_quantized_linear(np.ascontiguousarray(x), q, s, bits, group, bias, acts)
            np.testing.assert_allclose(got, want8, rtol=1e-4, atol=1e-4)
            continue
        if lk.simd_arch() != "avx512":
            np.testing.assert_array_equal(got, want)
        check_fma_bound(got, np.ascontiguousarray(x), dense, bias)


@pytest.mark.parametrize("dtype", ["int8", "int4"])
def test_quantized_special_scales(isa, route, dtype):
    # zero rows (scale 0), rows small enough for float16 subnormal scales, large rows, negative
    # int4 scales: the packed scales' conversion (scales_to_float) against dequantize's
    rng = np.random.default_rng(5)
    k, n, m = 256, 40, 30
    w = rng.standard_normal((n, k), dtype=np.float32)
    w[0] = 0.0
    w[1:9] *= np.float32(1e-6)
    w[9:12] *= np.float32(1e3)
    w[12, :32] = 0.0
    wt = make_weights(w, dtype, 32)
    x = rng.standard_normal((m, k), dtype=np.float32)
    got = linear(x, wt, None, None, "packed")
    np.testing.assert_array_equal(got, float32_packed(x, wt.dense))
    check_fma_bound(got, x, wt.dense)


@pytest.mark.parametrize("dtype", list(FORMATS16))
def test_16_bit_special_words(isa, route, dtype):
    # subnormal, infinite and NaN words widen exactly; NaN / Inf propagate as IEEE arithmetic
    rng = np.random.default_rng(6)
    k, n, m = 70, 40, 30
    low = rng.standard_normal((n, k), dtype=np.float32).astype(FORMATS16[dtype])
    words = low.view(np.uint16)
    words[0, :5] = [0x0001, 0x8001, 0x03FF, 0x0000, 0x8000]  # subnormals (both formats), zeros
    words[1, 3] = 0x7F80 if dtype == "bfloat16" else 0x7C00  # +inf
    words[2, 4] = 0x7FC0 if dtype == "bfloat16" else 0x7E00  # NaN
    wt = Weights(dtype, 0, words, None, low.astype(np.float32))
    x = rng.standard_normal((m, k), dtype=np.float32)
    with np.errstate(invalid="ignore"):
        got = linear(x, wt, None, None, "packed")
        np.testing.assert_array_equal(got, float32_packed(x, wt.dense))
    assert np.all(np.isnan(got[:, 2])) and not np.any(np.isnan(got[:, 3:]))
    finite = np.isfinite(wt.dense).all(axis=1)
    check_fma_bound(got[:, finite], x, wt.dense[finite])


def test_nan_activations_propagate(route):
    rng = np.random.default_rng(4)
    m, k, n = 40, 128, 33
    x = rng.standard_normal((m, k), dtype=np.float32)
    x[5, 17] = np.nan
    for dtype, group in FORMATS:
        wt = make_weights(rng.standard_normal((n, k), dtype=np.float32), dtype, group)
        got = linear(x, wt, None, None, "packed")
        assert np.all(np.isnan(got[5])) and not np.any(np.isnan(np.delete(got, 5, axis=0)))


def test_module_prefill_equals_float32_model_on_dequantized_weights(route):
    # a quantized FeedForward's prefill (the modules' path, WeightRef q8 / q4) equals the float32
    # module holding the dequantized matrices, bit for bit, once both take the packed kernel
    rng = np.random.default_rng(9)
    d, h, m = 128, 256, 40
    x = rng.standard_normal((m, d), dtype=np.float32)
    for bits in (8, 4):
        ffn = lk.FeedForward(d, h, seed=1).quantize(bits=bits, group_size=64)
        dense = lk.FeedForward(d, h, seed=1)
        sd = ffn.state_dict()
        dense.load_state_dict(
            {
                f"{p}.weight": lk.dequantize(sd[f"{p}.qweight"], sd[f"{p}.scales"], bits, 64)
                for p in ("gate_proj", "up_proj", "down_proj")
            }
        )
        _core._set_gemm_route("packed")
        np.testing.assert_array_equal(ffn(x), dense(x))
