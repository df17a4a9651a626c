"""Accuracy of the vectorized exp / sigmoid the kernels use (``lk._core._exp``, ``_sigmoid``) and of
``lk.silu``, over the whole float32 range, on every SIMD path.

Samples: every finite float32 bit pattern with a stride of 2**7 (both signs, ~33M values, every
binade equally), a dense grid on [-2, 2], and 2**16 consecutive floats around each threshold
(exp overflow ln(FLT_MAX), the underflow to subnormal ln(FLT_MIN), the end of the subnormals,
sigmoid's saturation, xsimd's own cut-off 88.376). The reference is float64 (``np.exp``);
errors are in ulps of the float32 result: ``|got - ref| / 2**(e - 24)`` with ``ref = m * 2**e``,
``0.5 <= m < 1``. Exact results below FLT_MIN are flushed to 0 by design: there the result must
be 0 or within FLT_MIN absolute.

``python tests/ops/test_simd_math.py`` prints the measured figures (for docs/ops.md).
"""

from __future__ import annotations

import functools
from typing import Any

import llmkernels as lk
import numpy as np
import pytest
import torch
from conftest import SUPPORTED_ISAS

F32 = np.finfo(np.float32)
FLT_MIN = float(F32.tiny)  # smallest normal
FLT_MAX = float(F32.max)
# exact results at or above this round to +inf in float32 (FLT_MAX + half an ulp)
F32_OVERFLOW = float(np.ldexp(1.0, 128) * (1 - 2.0**-25))
LN_FLT_MAX = float(np.log(FLT_MAX))  # 88.7228...
ULP_TARGET = 4.0  # the exp / sigmoid error bound (docs/ops.md, Numerics)
STRIDE = 2**7
CHUNK = 1 << 22


def _window(center: float, half_width: int = 2**15) -> np.ndarray:
    """2 * half_width consecutive float32 values around |center|, both signs."""
    bits = np.float32(abs(center)).view(np.uint32).astype(np.int64)
    run = (bits + np.arange(-half_width, half_width)).clip(0, 0x7F7FFFFF).astype(np.uint32)
    x = run.view(np.float32)
    return np.concatenate([x, -x])


@functools.lru_cache(maxsize=1)
def float32_samples() -> np.ndarray:
    """The float32 inputs every measurement uses (read-only)."""
    finite = np.arange(0, 0x7F800000, STRIDE, dtype=np.uint32).view(np.float32)
    finite = np.append(finite, F32.max)
    thresholds = [
        0.0,  # subnormal and tiny inputs
        1.0,
        16.635532,  # sigmoid(x) rounds to 1 above this
        87.33654,  # ln(FLT_MIN): exp(-x) becomes subnormal
        88.37626,  # xsimd's exp cut-off (maxlog of cephes)
        LN_FLT_MAX,  # exp overflows
        103.27893,  # ln(smallest subnormal)
        104.0,
    ]
    parts = [finite, -finite, np.linspace(-2.0, 2.0, 2**21, dtype=np.float32)]
    parts += [_window(c) for c in thresholds]
    x = np.unique(np.concatenate(parts))  # sorted, no duplicates
    x.flags.writeable = False
    return x


def _ulp(ref: np.ndarray) -> np.ndarray:
    """ulp of the float32 binade of the (float64) exact value."""
    _, e = np.frexp(ref)
    return np.ldexp(1.0, e - 24)


def _reference(fn: str, x64: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):
        if fn == "exp":
            return np.exp(x64)
        if fn == "sigmoid":
            return 1.0 / (1.0 + np.exp(-x64))
        return x64 / (1.0 + np.exp(-x64))  # silu


def _compute(fn: str, x: np.ndarray) -> np.ndarray:
    if fn == "silu":
        return lk.silu(x)
    out = np.empty_like(x)
    (lk._core._exp if fn == "exp" else lk._core._sigmoid)(x, out)
    return out


def measure(fn: str, isa: str | None = None) -> dict[str, Any]:
    """Error figures of ``fn`` ("exp", "sigmoid" or "silu") on the float32 samples.

    Returns a dict with ``max_ulp`` (over exact results in [FLT_MIN, FLT_MAX], inf if an
    output is wrongly inf/0/NaN there), ``max_ulp_finite`` and ``worst_x`` (the same over the
    outputs that are finite and non-zero), ``max_rel`` (relative error, same set),
    ``spurious`` (count and first few inputs whose output is inf, 0 or NaN although the exact
    result is normal), ``overflow_wrong`` (exact result rounds to inf, output is not inf),
    ``max_abs_below_min`` (max |got - exact| where |exact| < FLT_MIN), ``subnormal_outputs``
    and ``n``. ``isa`` selects the SIMD path for the call (restored afterwards).
    """
    previous = lk.simd_arch()
    if isa is not None:
        lk.set_simd_arch(isa)
    try:
        x_all = float32_samples()
        res: dict[str, Any] = {
            "fn": fn,
            "isa": lk.simd_arch(),
            "n": int(x_all.size),
            "max_ulp": 0.0,
            "max_ulp_finite": 0.0,
            "worst_x": None,
            "max_rel": 0.0,
            "spurious": 0,
            "spurious_x": [],  # a few examples
            "spurious_range": None,  # (min x, max x) of the spurious outputs
            "overflow_wrong": 0,
            "max_abs_below_min": 0.0,
            "subnormal_outputs": 0,
        }
        for start in range(0, x_all.size, CHUNK):
            x = x_all[start : start + CHUNK]
            got32 = _compute(fn, x)
            got = got32.astype(np.float64)
            ref = _reference(fn, x.astype(np.float64))
            mag = np.abs(ref)
            normal = (mag >= FLT_MIN) & (mag < F32_OVERFLOW)
            gn, rn = got[normal], ref[normal]
            ok = np.isfinite(gn) & (gn != 0)
            res["spurious"] += int((~ok).sum())
            if (~ok).any():
                bad_x = x[normal][~ok]
                lo, hi = float(bad_x.min()), float(bad_x.max())
                if res["spurious_range"] is not None:
                    lo, hi = min(lo, res["spurious_range"][0]), max(hi, res["spurious_range"][1])
                res["spurious_range"] = (lo, hi)
                some = [float(v) for v in bad_x[:: max(1, bad_x.size // 4)]]
                res["spurious_x"] = (res["spurious_x"] + some)[:6]
            err = np.abs(gn[ok] - rn[ok])
            if err.size:
                ulps = err / _ulp(rn[ok])
                i = int(np.argmax(ulps))
                if ulps[i] > res["max_ulp_finite"]:
                    res["max_ulp_finite"] = float(ulps[i])
                    res["worst_x"] = float(x[normal][ok][i])
                res["max_rel"] = max(res["max_rel"], float(np.max(err / np.abs(rn[ok]))))
            over = mag >= F32_OVERFLOW
            res["overflow_wrong"] += int((got[over] != ref[over] * np.inf).sum())  # +-inf
            below = mag < FLT_MIN
            if below.any():
                d = np.abs(got[below] - ref[below])
                res["max_abs_below_min"] = max(res["max_abs_below_min"], float(np.nanmax(d)))
                if np.isnan(d).any():
                    res["max_abs_below_min"] = float("nan")
            if fn != "silu":  # silu of a subnormal input is legitimately subnormal
                a = np.abs(got32)
                res["subnormal_outputs"] += int(((a > 0) & (a < FLT_MIN)).sum())
        res["max_ulp"] = float("inf") if res["spurious"] else res["max_ulp_finite"]
        return res
    finally:
        lk.set_simd_arch(previous)


def describe(res: dict[str, Any]) -> str:
    text = (
        f"{res['fn']} [{res['isa']}]: max {res['max_ulp_finite']:.3f} ulp over finite outputs "
        f"(at x={res['worst_x']!r}, max rel {res['max_rel']:.3g}), {res['n']} samples"
    )
    if res["spurious"]:
        text += (
            f"; {res['spurious']} outputs are inf/0/NaN where the exact result is a normal "
            f"float32, for x in [{res['spurious_range'][0]!r}, {res['spurious_range'][1]!r}], "
            f"e.g. x={res['spurious_x'][:4]}"
        )
    if res["overflow_wrong"]:
        text += f"; {res['overflow_wrong']} outputs fail to overflow to inf"
    return text


def measure_exp_sigmoid_ulps() -> dict[str, dict[str, dict[str, Any]]]:
    """``{isa: {"exp": ..., "sigmoid": ..., "silu": ...}}`` for every supported SIMD path."""
    fns = ("exp", "sigmoid", "silu")
    return {isa: {fn: measure(fn, isa) for fn in fns} for isa in SUPPORTED_ISAS}


# --- exp / sigmoid over the float32 range -----------------------------------------------------


def test_exp_ulp(isa):
    res = measure("exp")
    assert res["overflow_wrong"] == 0, describe(res)
    assert res["max_abs_below_min"] <= FLT_MIN, describe(res)
    assert res["subnormal_outputs"] == 0, describe(res)  # flushed, never subnormal
    assert res["max_ulp"] <= ULP_TARGET, describe(res)


def test_sigmoid_ulp(isa):
    res = measure("sigmoid")
    assert res["overflow_wrong"] == 0, describe(res)
    assert res["max_abs_below_min"] <= FLT_MIN, describe(res)
    assert res["subnormal_outputs"] == 0, describe(res)
    assert res["max_ulp"] <= ULP_TARGET, describe(res)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_exp_finite_up_to_overflow_threshold(dtype, isa):
    """exp(x) is finite for every x with exp(x) <= the dtype's max (ln(max) = 88.7228 in float32,
    709.7827 in float64), and inf just above."""
    info = np.finfo(dtype)
    wide = np.float64 if dtype == np.float32 else np.longdouble  # exact enough for the check
    ln_max = dtype(np.log(wide(info.max)))
    while np.exp(wide(ln_max)) > info.max:  # the largest x whose exp is finite
        ln_max = np.nextafter(ln_max, dtype(0))
    below = [ln_max - dtype(2), ln_max - dtype(0.5), ln_max - dtype(0.2), ln_max]
    x = np.array(below, dtype)
    exact = np.exp(x.astype(wide))
    assert np.all(exact <= info.max)
    got = np.empty_like(x)
    lk._core._exp(x, got)
    bad = {float(a): float(g) for a, g in zip(x, got, strict=True) if not np.isfinite(g)}
    assert not bad, f"exp overflows early: {bad} (exact results are finite, <= {info.max:g})"
    np.testing.assert_allclose(got, exact.astype(np.float64), rtol=8 * info.eps)
    above = np.array([ln_max + dtype(0.01), ln_max + 1], dtype)
    lk._core._exp(above, got[:2])
    assert np.all(np.isposinf(got[:2]))


# --- silu -------------------------------------------------------------------------------------


def test_silu_relative_error(isa):
    """lk.silu against float64 x / (1 + exp(-x)) where |exact| >= FLT_MIN.

    For x < -ln(FLT_MAX) (about -88.72) the float32 intermediate exp(-x) of the formula
    x / (1 + exp(-x)) overflows, so silu returns -0 there although the exact value stays a normal
    float32 down to x ~ -91.8 (|silu| <= 2.4e-37): torch.nn.functional.silu does the same. That
    region is checked separately (absolute error, sign); everywhere else the error is in ulps.
    """
    res = measure("silu")
    assert res["overflow_wrong"] == 0, describe(res)
    assert res["max_abs_below_min"] <= FLT_MIN, describe(res)
    # spurious -0 outputs are only allowed where the formula's intermediate overflows
    if res["spurious"]:
        assert res["spurious_range"][1] < -LN_FLT_MAX, describe(res)
    x = float32_samples()
    deep = x[(x < -LN_FLT_MAX) & (x > -120)]
    got = lk.silu(deep).astype(np.float64)
    exact = _reference("silu", deep.astype(np.float64))
    # |silu(x)| = |x| exp(x) / (1 + exp(x)) decreases for x < -1: its largest value there is at
    # x = -ln(FLT_MAX), i.e. ln(FLT_MAX) / FLT_MAX = 2.6e-37
    assert np.all(got <= 0)
    assert np.max(np.abs(got - exact)) <= LN_FLT_MAX / FLT_MAX * (1 + 1e-6)
    assert res["max_ulp_finite"] <= ULP_TARGET, describe(res)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_special_values(dtype, isa):
    x = np.array(
        [np.inf, -np.inf, np.nan, 0.0, -0.0, 88.7, -88.7, 104.0, -104.0, 1e-30, -1e-30], dtype
    )
    exp_got, sig_got = np.empty_like(x), np.empty_like(x)
    lk._core._exp(x, exp_got)
    lk._core._sigmoid(x, sig_got)
    silu_got = lk.silu(x)
    tx = torch.from_numpy(x)
    with np.errstate(over="ignore"):
        x64 = x.astype(np.float64)
        exp_exact = np.exp(x64)
    # exp: IEEE results; a subnormal exact result (exp(-104) in float32) may be flushed to 0
    assert np.isposinf(exp_got[0]), f"exp(inf) = {exp_got[0]}"
    assert exp_got[1] == 0, f"exp(-inf) = {exp_got[1]}"
    assert np.isnan(exp_got[2]), f"exp(nan) = {exp_got[2]!r}, expected nan"
    assert exp_got[3] == exp_got[4] == 1.0
    tiny, big = np.finfo(dtype).tiny, np.finfo(dtype).max
    normal = np.isfinite(exp_exact) & (exp_exact >= tiny) & (exp_exact <= big)
    np.testing.assert_allclose(exp_got[normal], exp_exact[normal], rtol=8 * np.finfo(dtype).eps)
    assert np.all(np.abs(exp_got[exp_exact < tiny]) < tiny)
    # sigmoid and silu: as torch (IEEE propagation; silu(-inf) = -inf / inf = NaN in both)
    np.testing.assert_allclose(
        sig_got,
        torch.sigmoid(tx).numpy(),
        rtol=8 * np.finfo(dtype).eps,
        atol=float(np.finfo(dtype).tiny),
    )
    torch_silu = torch.nn.functional.silu(tx).numpy()
    np.testing.assert_array_equal(np.isnan(silu_got), np.isnan(torch_silu))
    np.testing.assert_allclose(
        silu_got,
        torch_silu,
        rtol=8 * np.finfo(dtype).eps,
        atol=float(np.finfo(dtype).tiny),
    )
    assert np.signbit(silu_got[4]) and silu_got[4] == 0  # silu(-0.0) = -0.0
    assert np.signbit(silu_got[8])  # silu(-104) is -0 or a tiny negative


# --- float64 exp ------------------------------------------------------------------------------


def test_exp_float64_ulp(isa):
    """The float64 exp against an 80-bit long double reference, in float64 ulps."""
    if np.finfo(np.longdouble).nmant < 63:  # pragma: no cover - x86-64 Linux has 80-bit
        pytest.fail("this test needs an extended-precision np.longdouble")
    rng = np.random.default_rng(7)
    x = np.concatenate(
        [
            rng.uniform(-708.39, 709.78, 1 << 20),
            rng.uniform(-1, 1, 1 << 18),
            rng.standard_normal(1 << 18) * 1e-8,
        ]
    )
    got = np.empty_like(x)
    lk._core._exp(x, got)
    ok = np.isfinite(got) & (got > 0)
    ref = np.exp(x.astype(np.longdouble))
    _, e = np.frexp(ref)
    ulps = np.abs(got[ok].astype(np.longdouble) - ref[ok]) / np.ldexp(np.longdouble(1), e[ok] - 53)
    worst = float(ulps.max())
    text = f"float64 exp: max {worst:.3f} ulp over finite outputs at x={x[ok][np.argmax(ulps)]!r}"
    bad = np.sort(x[~ok])
    assert bad.size == 0, (
        f"{text}; but exp returns inf/0 at {bad.size} inputs whose result is a normal float64, "
        f"x in [{bad[0]!r}, {bad[-1]!r}]"
    )
    assert worst <= ULP_TARGET, text


if __name__ == "__main__":
    for per_fn in measure_exp_sigmoid_ulps().values():
        for r in per_fn.values():
            print(describe(r))
