"""The int8-activation prefill on VNNI's vpdpbusd, on AMX's tdpbssd and on AVX2's maddubs
(kernels cpp/kernels/quant_vnni.hpp, built natively for AVX512_VNNI / AMX, against SIMDe /
emulated tiles for every host, and for AVX2; selection common/dot.hpp).

Integer dot products are exact whatever the instruction, and the kernel keeps the AVX2
int8-activation GEMV's float arithmetic per (row, token) -- the same lanes, products
d = s_w * s_x, FMA order and horizontal sum -- so a prefill of m tokens must equal, bit for bit,
the AVX2 GEMV run on each token alone; the SIMDe build and the native one must agree bit for bit;
and both must be within the int8-activation error of the float64 formula
(ref_quantized_linear(..., activations="int8")).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import llmkernels as lk
import numpy as np
import pytest
from conftest import run_python
from llmkernels.quant import INT8_ACTIVATION_TOKENS, int8_activations_used
from llmkernels.reference import quantized_linear as ref_quantized_linear

# the portable twins everywhere, the native paths where the CPU has them
PATHS = (
    ["vnni_simde", "vnni512_simde", "amx_emu", "avx2"]
    + (["vnni", "vnni512"] if lk._core.cpu_has_avx512_vnni else [])
    + (["amx"] if lk._core.cpu_has_amx else [])
)
HAS_AVX2 = "avx2" in lk._core.isa_names[: lk._core.isa_names.index(lk._core.best_simd_arch()) + 1]
pytestmark = pytest.mark.skipif(not HAS_AVX2, reason="the VNNI kernels run on AVX2 hosts and up")


@pytest.fixture(params=PATHS)
def dot(request: pytest.FixtureRequest) -> Iterator[str]:
    previous = lk._core._set_int8_dot(request.param)
    assert lk._core.int8_dot() == request.param
    yield request.param
    lk._core._set_int8_dot("auto")
    assert previous  # (restored to the automatic choice)


def weights(rng: np.random.Generator, rows: int, k: int) -> np.ndarray:
    w = rng.standard_normal((rows, k)).astype(np.float32) * 0.02
    w *= rng.uniform(0.2, 3.0, size=(rows, 1)).astype(np.float32)
    w.flat[rng.integers(0, rows * k, max(1, rows * k // 500))] *= 8
    return w


@contextmanager
def avx2_gemv() -> Iterator[None]:
    """The AVX2 path with no dot-product extension (not even a forced twin)."""
    previous, dot = lk.simd_arch(), lk._core.int8_dot()
    lk.set_simd_arch("avx2")
    lk._core._set_int8_dot("none")
    try:
        yield
    finally:
        lk.set_simd_arch(previous)
        lk._core._set_int8_dot(dot)


def per_token_avx2(x, q, s, bits, g, bias=None):
    """The AVX2 int8-activation GEMV, one token at a time (its per-token arithmetic does not
    depend on how many tokens share a call)."""
    with avx2_gemv():
        return np.concatenate(
            [lk.quantized_linear(x[i : i + 1], q, s, bits, g, bias) for i in range(len(x))]
        )


# drivers/qlinear.cpp's int8_gemv_max_tokens: per tile kernel, bits and (AMX) one thread or more,
# the tokens the GEMV keeps (above: the tile kernel); INT8_ACTIVATION_TOKENS for the others
GEMV_TOKENS = {"avx2": {8: (5, 5), 4: (8, 8)}, "amx": {8: (5, 8), 4: (7, 9)}}
GEMV_TOKENS["vnni"] = {8: (4, 4), 4: (8, 8)}
GEMV_TOKENS["vnni512"] = {8: (6, 5), 4: (6, 5)}
for twin, native in (("amx_emu", "amx"), ("vnni512_simde", "vnni512"), ("vnni_simde", "vnni")):
    GEMV_TOKENS[twin] = GEMV_TOKENS[native]


def gemv_takes(dot: str, bits: int, m: int) -> bool:
    one, more = GEMV_TOKENS.get(dot, {}).get(bits, (INT8_ACTIVATION_TOKENS,) * 2)
    return m <= (one if lk.get_num_threads() == 1 else more)


# (group, k): int4 with k = 96 has an odd last block (stored in natural order)
# k = 320 with groups of 32: ten blocks, the scale products of eight formed at once, then two
GROUP_K = [(32, 32), (32, 96), (32, 256), (32, 320), (64, 128), (64, 320), (128, 256), (128, 384)]


@pytest.mark.parametrize("bits", [8, 4])
@pytest.mark.parametrize(("g", "k"), GROUP_K)
@pytest.mark.parametrize("rows", [1, 7, 69])  # the 4-row tiles' tails, a 64-row block + 5
# 3-token tiles (AMX: 16) and their tails; 6 and 9: where AVX2's tile kernel takes over from the
# GEMV (int8 / int4 weights), 9 and 16 AMX's (one 16-token tile: the second of the pair skipped);
# elsewhere up to 16 tokens are the GEMV's
@pytest.mark.parametrize("m", [6, 9, 16, 17, 23])
def test_prefill_equals_avx2_gemv_per_token(bits, g, k, rows, m, dot, rng):
    if gemv_takes(dot, bits, m):
        pytest.skip("the GEMV takes these tokens (on the active path, maybe SSE2's)")
    w = weights(rng, rows, k)
    q, s = lk.quantize(w, bits=bits, group_size=g)
    x = rng.standard_normal((m, k)).astype(np.float32)
    bias = rng.standard_normal(rows).astype(np.float32)
    got = lk.quantized_linear(x, q, s, bits, g, bias)
    want = per_token_avx2(x, q, s, bits, g, bias)
    np.testing.assert_array_equal(got, want)
    ref = ref_quantized_linear(x, q, s, bits, g, bias, "int8")
    np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("bits", [8, 4])
def test_real_size_and_threads(bits, dot, rng, threads):
    """A TinyLlama-sized k with 2 threads (rows split in blocks of 256) and 1 thread agree."""
    w = weights(rng, 300, 2048)
    q, s = lk.quantize(w, bits=bits, group_size=32)
    x = rng.standard_normal((40, 2048)).astype(np.float32)  # (AMX: two 16-token tiles + 8)
    lk.set_num_threads(1)
    one = lk.quantized_linear(x, q, s, bits, 32)
    lk.set_num_threads(2)
    two = lk.quantized_linear(x, q, s, bits, 32)
    np.testing.assert_array_equal(one, two)
    np.testing.assert_array_equal(one, per_token_avx2(x, q, s, bits, 32))


@pytest.mark.parametrize("bits", [8, 4])
def test_accumulate_into_y(bits, dot, rng):
    """The modules' projection path adding into y (a residual): equal to the AVX2 GEMV adding
    into each token's row alone."""
    w = weights(rng, 37, 320)
    q, s = lk.quantize(w, bits=bits, group_size=32)
    x = rng.standard_normal((21, 320)).astype(np.float32)
    y0 = rng.standard_normal((21, 37)).astype(np.float32)
    dtype = f"int{bits}"
    got = lk._core._linear(x, q, dtype, None, y0.copy(), s, 32)
    with avx2_gemv():
        rows = [lk._core._linear(x[i : i + 1], q, dtype, None, y0[i : i + 1].copy(), s, 32)
                for i in range(len(x))]  # fmt: skip
    np.testing.assert_array_equal(got, np.concatenate(rows))


def skip_unless_vnni_gemv() -> None:
    """The native VNNI GEMV runs only where the quantized family runs AVX2 or AVX-512 code
    (else the family's own GEMV runs: SSE2's arithmetic is not AVX2's); the SIMDe twin wherever
    it is forced."""
    if lk._core.int8_dot() == "avx2":
        pytest.skip("no decode kernel of its own: the AVX2 GEMV is the one it equals")
    if lk._int8_decode_dot() == "none":
        pytest.skip(f"the quantized family runs {lk._core.family_simd_archs()['quant']} here")


# The decode GEMV on vpdpbusd (int8 / int4 weights, up to INT8_ACTIVATION_TOKENS tokens): the
# same arithmetic per (row, token) as the AVX2 GEMV, so equal to it bit for bit. Natively where
# the quantized family runs AVX2 or AVX-512 code (and the CPU has VNNI), as the SIMDe twin
# wherever forced. int4: the AVX2 kernel itself with two vpdpbusd per pair of blocks.
@pytest.mark.parametrize("bits", [8, 4])
@pytest.mark.parametrize(("g", "k"), GROUP_K)
@pytest.mark.parametrize("rows", [1, 3, 69])  # 2 stripes of 2 rows, and the rows left over
@pytest.mark.parametrize("m", [1, 2, 3, 5, INT8_ACTIVATION_TOKENS])  # passes of 4 tokens
def test_gemv_equals_avx2_gemv(bits, g, k, rows, m, dot, rng):
    skip_unless_vnni_gemv()
    w = weights(rng, rows, k)
    q, s = lk.quantize(w, bits=bits, group_size=g)
    x = rng.standard_normal((m, k)).astype(np.float32)
    bias = rng.standard_normal(rows).astype(np.float32)
    got = lk.quantized_linear(x, q, s, bits, g, bias)
    with avx2_gemv():
        want = lk.quantized_linear(x, q, s, bits, g, bias)
    np.testing.assert_array_equal(got, want)


def test_gemv_any_int8_code(dot, rng):
    """Codes of -128 (not made by quantize, but an int8 checkpoint may hold them: w + 128 = 0
    on vpdpbusd's unsigned side) and a NaN activation block."""
    skip_unless_vnni_gemv()
    q = rng.integers(-128, 128, (40, 256)).astype(np.int8)
    q[:, :40] = -128
    s = rng.uniform(1e-3, 0.1, (40, 8)).astype(np.float16)
    x = rng.standard_normal((3, 256)).astype(np.float32)
    x[1, 5] = np.nan
    got = lk.quantized_linear(x, q, s, 8, 32)
    with avx2_gemv():
        want = lk.quantized_linear(x, q, s, 8, 32)
    np.testing.assert_array_equal(got, want)
    assert np.isnan(got[1]).all() and not np.isnan(got[[0, 2]]).any()


def test_prefill_any_int8_code(dot, rng):
    """Codes of -128 and 127 against activations of +-127 -- the largest pairs AVX2's maddubs
    takes (|w| = 128 times sign(w) * x: 2 * 128 * 127 < 2^15, no saturation) -- and a NaN
    activation block, in a prefill."""
    q = rng.integers(-128, 128, (40, 256)).astype(np.int8)
    q[:, :40] = -128
    q[:, 40:80] = 127
    s = rng.uniform(1e-3, 0.1, (40, 8)).astype(np.float16)
    x = rng.standard_normal((20, 256)).astype(np.float32)
    x[:, :80] = np.where(rng.random((20, 80)) < 0.5, -1.0, 1.0)  # codes +-127
    x[1, 5] = np.nan
    got = lk.quantized_linear(x, q, s, 8, 32)
    np.testing.assert_array_equal(got, per_token_avx2(x, q, s, 8, 32))
    assert np.isnan(got[1]).all() and not np.isnan(np.delete(got, 1, axis=0)).any()


@pytest.mark.parametrize("min_code_rows", [(), (5,), (0, 39)])
def test_prefill_extreme_codes(dot, rng, min_code_rows):
    """Codes of +-127 (lk.quantize's range) against activations of +-127 -- AVX2 multiplies |x|
    by sign(x) * w there: pairs of 2 * 127 * 127 < 2^15 -- and a -128 code in some rows, whose
    64-row block takes |w| times sign(w) * x instead (the same sums)."""
    q = rng.integers(-127, 128, (70, 256)).astype(np.int8)
    q[:, :40] = -127
    q[:, 40:80] = 127
    for r in min_code_rows:
        q[r, 100] = -128
    s = rng.uniform(1e-3, 0.1, (70, 8)).astype(np.float16)
    x = rng.standard_normal((23, 256)).astype(np.float32)
    x[:, :80] = np.where(rng.random((23, 80)) < 0.5, -1.0, 1.0)  # codes +-127
    got = lk.quantized_linear(x, q, s, 8, 32)
    np.testing.assert_array_equal(got, per_token_avx2(x, q, s, 8, 32))


def test_out_of_range_scales_fall_back_to_float(dot, rng):
    """A token of |x| ~ 3e38 (its scale past the kernels' range) sends the call to float
    activations, as the GEMV does: 0 where the integer dot is 0, never NaN."""
    w = np.zeros((2, 64), np.float32)
    w[0, 0] = w[1, 1] = 1e5
    q, s = lk.quantize(w, bits=8, group_size=32)
    x = np.zeros((20, 64), np.float32)
    x[3, 1] = 3e38
    got = lk.quantized_linear(x, q, s, 8, 32)
    with np.errstate(over="ignore"):  # 3e43 -> inf in float32
        want = ref_quantized_linear(x, q, s, 8, 32, None, "int8").astype(np.float32)
    assert not np.isnan(got).any()
    np.testing.assert_array_equal(got, want)


def test_selection():
    # never a twin unless forced
    assert lk._core.int8_dot() in ("none", "vnni", "vnni512", "amx", "avx2")
    if lk.simd_arch() == "avx512":
        if lk._core.cpu_has_amx:
            assert lk._core.int8_dot() == "amx"
        elif lk._core.cpu_has_avx512_vnni:  # 256-bit vectors where the CPU splits 512-bit ones
            assert lk._core.int8_dot() == ("vnni" if lk._core.cpu_splits_512 else "vnni512")
        else:
            assert lk._core.int8_dot() == "avx2"
    assert int8_activations_used(INT8_ACTIVATION_TOKENS)
    assert int8_activations_used(INT8_ACTIVATION_TOKENS + 1) == (lk._core.int8_dot() != "none")
    previous = lk.simd_arch()
    try:
        lk.set_simd_arch("avx2")  # LLMKERNELS_ARCH / set_simd_arch below avx512: no VNNI
        assert lk._core.int8_dot() == "avx2"
        lk.set_simd_arch("sse2")  # no integer prefill kernel
        assert lk._core.int8_dot() == "none"
        assert not int8_activations_used(INT8_ACTIVATION_TOKENS + 1)
    finally:
        lk.set_simd_arch(previous)
    with pytest.raises(ValueError, match=r"^\[_set_int8_dot\] path must be"):
        lk._core._set_int8_dot("vpdpbusd")


@pytest.mark.parametrize(
    ("value", "want"),
    [("none", "none"), ("vnni_simde", "vnni_simde"), ("vnni512_simde", "vnni512_simde"),
     ("amx_emu", "amx_emu"), ("avx2", "avx2")],
)  # fmt: skip
def test_environment_forces_the_path(value, want):
    # (bf16 has no avx2 kernel, one width)
    bf16 = {"avx2": "none", "vnni512_simde": "bf16_simde"}.get(value, value.replace("vnni", "bf16"))
    r = run_python(
        "import llmkernels as lk; print(lk._core.int8_dot(), lk._core.bf16_dot())",
        env={"LLMKERNELS_INT8_DOT": value, "LLMKERNELS_BF16_DOT": bf16},
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == [want, bf16]
