"""Host independence, proved on one host: with ``LLMK_TEST_PERTURB_ULP=k`` in the environment
the test session replaces the transcendental functions the references are built on
(``llmkernels._libm``: pow, exp, log, cos, sin, tanh) by versions whose every inexact result is
moved by a whole number of ulp in [-k, k] (a hash of the inputs) -- what a host whose libm rounds
differently would give. The suite must stay green: no test's tolerance may be tighter than the
condition of its reference (for RoPE at position p with frequency f: p * k * ulp(f) on the
angle)."""

from __future__ import annotations

import functools
import os
from collections.abc import Callable

import numpy as np

ENV = "LLMK_TEST_PERTURB_ULP"


def _steps(args: tuple[object, ...], shape: tuple[int, ...], k: int) -> np.ndarray:
    """A whole number in [-k, k] per element, a hash of the arguments' bits: the same inputs
    always get the same error, as from a real (deterministic) libm."""
    h = np.zeros(shape, np.uint64)
    with np.errstate(over="ignore"):
        for a in args:
            bits = np.broadcast_to(np.asarray(a, np.float64), shape).view(np.uint64)
            h = (h ^ bits) * np.uint64(0x9E3779B97F4A7C15)
            h ^= h >> np.uint64(29)
    return (h % np.uint64(2 * k + 1)).astype(np.int64) - k


def perturb(values: np.ndarray, k: int, steps: np.ndarray) -> np.ndarray:
    """values moved by steps (whole numbers of ulp, |steps| <= k) element by element;
    exact-looking results (0, +-1, inf, NaN) are left alone, as a libm returns them exactly."""
    v = np.asarray(values, np.float64)
    keep = ~np.isfinite(v) | (v == 0) | (np.abs(v) == 1)
    out = v.copy()
    for i in range(k):
        out = np.where(steps > i, np.nextafter(out, np.inf), out)
        out = np.where(steps < -i, np.nextafter(out, -np.inf), out)
    return np.where(keep, v, out)


def install(k: int) -> None:
    """Wraps every function of llmkernels._libm (the module attributes its callers look up)."""
    from llmkernels import _libm

    def wrap(fn: Callable[..., np.ndarray]) -> Callable[..., np.ndarray]:
        @functools.wraps(fn)
        def perturbed(*args: object) -> np.ndarray:
            with np.errstate(all="ignore"):
                result = fn(*args)
                return perturb(result, k, _steps(args, result.shape, k))

        return perturbed

    for name in _libm.__all__:
        setattr(_libm, name, wrap(getattr(_libm, name)))


def install_from_env() -> int:
    k = int(os.environ.get(ENV, "0") or 0)
    if k > 0:
        install(k)
    return k
