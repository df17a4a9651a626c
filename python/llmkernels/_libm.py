"""Float64 transcendental functions whose results are the same on every host.

NumPy picks the inner loops of its float64 ufuncs at import, by CPU: on AVX-512 hosts
``np.power`` and ``np.exp`` (and, on some CPUs, ``np.sin`` / ``np.cos`` / ``np.tanh``) run SIMD
code that differs from the C library by an ulp on a few percent of inputs, while on AVX2 hosts
they call the C library. One ulp of a RoPE frequency moves the angle at position 2**24 by ~4e-10,
so a frequency table or a reference built on those ufuncs is a property of the host, not of the
formula.

The functions here avoid those loops:

- :func:`pow` calls the C library's ``pow`` (``math.pow``) once per element: the very function
  the C++ core's ``std::pow`` calls, so a frequency table built here equals the core's bit for
  bit on the same machine.
- :func:`exp`, :func:`log`, :func:`cos`, :func:`sin`, :func:`tanh` evaluate in x87 extended
  precision (NumPy's ``longdouble``, whose loops are scalar C library calls on every host) and
  round once to float64: the correctly rounded value, up to a double rounding that is rarer than
  one input in a thousand.

They take and return float64 arrays (NaN / inf propagate as IEEE arithmetic does; callers
silence NumPy's floating-point warnings where they want).
"""

from __future__ import annotations

import math

import numpy as np
from numpy.typing import ArrayLike

__all__ = ["cos", "exp", "log", "pow", "sin", "tanh"]

_LD = np.longdouble


def _pow1(base: float, exponent: float) -> float:
    try:
        return math.pow(base, exponent)
    except OverflowError:
        return math.inf
    except ValueError:  # a negative base to a non-integer power
        return math.nan


_pow_ufunc = np.frompyfunc(_pow1, 2, 1)


def pow(base: ArrayLike, exponent: ArrayLike) -> np.ndarray:  # noqa: A001 - the libm name
    """``base ** exponent`` elementwise, by the C library's ``pow`` (float64)."""
    b = np.asarray(base, np.float64)
    e = np.asarray(exponent, np.float64)
    return np.asarray(_pow_ufunc(b, e), dtype=np.float64)


def _wide(fn: np.ufunc, x: ArrayLike) -> np.ndarray:
    return fn(np.asarray(x, np.float64).astype(_LD)).astype(np.float64)


def exp(x: ArrayLike) -> np.ndarray:
    """``e ** x`` (float64, rounded once from extended precision)."""
    return _wide(np.exp, x)


def log(x: ArrayLike) -> np.ndarray:
    """Natural logarithm (float64, rounded once from extended precision)."""
    return _wide(np.log, x)


def cos(x: ArrayLike) -> np.ndarray:
    """Cosine (float64, rounded once from extended precision; exact range reduction)."""
    return _wide(np.cos, x)


def sin(x: ArrayLike) -> np.ndarray:
    """Sine (float64, rounded once from extended precision; exact range reduction)."""
    return _wide(np.sin, x)


def tanh(x: ArrayLike) -> np.ndarray:
    """Hyperbolic tangent (float64, rounded once from extended precision)."""
    return _wide(np.tanh, x)
