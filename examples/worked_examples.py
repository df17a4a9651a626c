"""The worked numerical examples of the LLaMA notes, as data and code.

Three notes this project was built from compute RMSNorm, LayerNorm, SwiGLU and RoPE by hand:
"The Math: RMSNorm, SwiGLU, and RoPE", "Worked Example: Computing RMSNorm, SwiGLU, and RoPE" and
an RMSNorm tutorial (see :data:`NOTES`). Every number they state is listed here as a
:class:`Stated` item: the string exactly as the notes write it (its digits fix the precision the
notes claim), plus, where the notes derive it from their own earlier rounded numbers, that
derivation (``chain``).

Each :class:`Example` has a ``compute(ops, dtype)`` function that recomputes all its stated
quantities with an ``ops`` namespace: :mod:`llmkernels` (the C++ kernels) or
:mod:`llmkernels.reference` (the float64 NumPy specification). The same code serves both, so
the "exact" value of a quantity is ``compute(llmkernels.reference, np.float64)``. Quantities
that no kernel returns are recovered from a kernel's output (the RMS of ``x`` is
``x·x / x·y`` for ``y = rms_norm(x)``; ``σ(z) = silu(z) / z``; ``cos, sin`` of an angle are
``rope([1, 0])``); plain arithmetic on the notes' given numbers (sums, ``z = x·W + b``) is
done in float64 NumPy.

Verdicts (:func:`classify`), with ``u`` one unit in the last digit the notes wrote:

* ``"ok"``: ``|stated - exact| <= u/2``: the notes' number is the exact value rounded.
* ``"rounded"``: ``|stated - exact| <= 2u``; or ``<= 5u`` when the notes' own step on their own
  rounded numbers (``chain``) reproduces the stated value (e.g. ``0.7 · 0.199 = 0.1393`` where
  ``0.7 · sin 0.2 = 0.1391``): the deviation comes from rounding intermediate values.
* ``"wrong"``: anything else: an error in the notes' arithmetic. Each such item carries a one-line
  reason (``why``), and a comment in :data:`EXAMPLES` re-derives the correct value by hand.

Usage::

    import llmkernels
    from worked_examples import evaluate
    for row in evaluate(llmkernels, np.float32):
        print(row.item.label, row.item.stated, row.value, row.exact, row.verdict)
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import DTypeLike

__all__ = [
    "EXAMPLES",
    "NOTES",
    "OK",
    "ROUNDED",
    "WRONG",
    "Example",
    "Row",
    "Stated",
    "classify",
    "decimals",
    "evaluate",
    "exact_values",
]

OK = "ok"
ROUNDED = "rounded"
WRONG = "wrong"

#: A deviation of at most this many units in the last stated digit counts as rounding.
ROUNDED_UNITS = 2.0
#: ... and up to this many when the notes' own chain of rounded numbers reproduces the value.
CHAIN_UNITS = 5.0

#: The ``ops`` namespace: ``llmkernels`` or ``llmkernels.reference`` (anything with the
#: public functions ``rms_norm``, ``layer_norm``, ``silu``, ``swiglu``, ``swiglu_ffn``, ``rope``).
Ops = Any
Values = dict[str, float]

MATH = "The Math: RMSNorm, SwiGLU, and RoPE"
WORKED = "Worked Example: Computing RMSNorm, SwiGLU, and RoPE"
TUTORIAL = "RMSNorm tutorial"
#: The notes' titles, each with the short name that prefixes its examples' keys.
NOTES: dict[str, str] = {MATH: "math", WORKED: "worked", TUTORIAL: "tutorial"}


# --------------------------------------------------------------------------------------
# data model and verdict rule
# --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Stated:
    """One number the notes state.

    Attributes:
        key: name of the quantity in its example's ``compute`` result.
        label: what the quantity is, as the notes describe it.
        stated: the number exactly as the notes write it (its digits set the precision).
        chain: the notes' own step evaluated on their own rounded numbers, if any.
        why: for a wrong value, the one-line reason; for a rounded one, an optional note.
    """

    key: str
    label: str
    stated: str
    chain: float | None = None
    why: str = ""


@dataclass(frozen=True)
class Example:
    """A worked example of one note: its inputs (in ``compute``) and its stated numbers.

    ``source`` is the note's title (a key of :data:`NOTES`).
    """

    source: str
    name: str
    title: str
    compute: Callable[[Ops, DTypeLike], Values]
    items: tuple[Stated, ...]

    @property
    def id(self) -> str:
        """``"<note>.<name>"`` (``note`` from :data:`NOTES`), the prefix of every item's key."""
        return f"{NOTES[self.source]}.{self.name}"


@dataclass(frozen=True)
class Row:
    """One stated number, recomputed: ``value`` with the ops under test, ``exact`` in float64."""

    example: Example
    item: Stated
    value: float
    exact: float
    verdict: str

    @property
    def key(self) -> str:
        """Global key, ``"<note>.<example>.<quantity>"``."""
        return f"{self.example.id}.{self.item.key}"

    @property
    def correct(self) -> str:
        """The exact value written with as many decimals as the notes used."""
        return f"{self.exact:.{decimals(self.item.stated)}f}"


def decimals(stated: str) -> int:
    """Number of digits after the decimal point in a number as written (``"2015"`` → 0)."""
    _, _, frac = stated.strip().partition(".")
    return len(frac)


def classify(stated: str, exact: float, chain: float | None = None) -> str:
    """Verdict on a stated number against its exact value (see the module docstring)."""
    unit = 10.0 ** -decimals(stated)
    slack = 1e-9  # binary floating point: 0.4975 may be 0.49749999...
    err = abs(float(stated) - exact) / unit
    if err <= 0.5 + slack:
        return OK
    if err <= ROUNDED_UNITS + slack:
        return ROUNDED
    reproduced = chain is not None and abs(float(stated) - chain) / unit <= 0.5 + slack
    if reproduced and err <= CHAIN_UNITS + slack:
        return ROUNDED
    return WRONG


# --------------------------------------------------------------------------------------
# helpers: recover intermediate quantities from kernel outputs
# --------------------------------------------------------------------------------------


def _f64(a: Any) -> np.ndarray:
    return np.asarray(a, dtype=np.float64)


def _rms_from_output(x: np.ndarray, y: Any) -> float:
    """``sqrt(mean(x**2) + eps)`` as implied by ``y = rms_norm(x, eps)``: ``x·x / x·y``."""
    x64, y64 = _f64(x).ravel(), _f64(y).ravel()
    return float(x64 @ x64 / (x64 @ y64))


def _mean_std_from_output(x: np.ndarray, y: Any) -> tuple[float, float]:
    """``(mean, std)`` with ``y = (x - mean) / std``: least-squares fit of ``x = std·y + mean``."""
    x64, y64 = _f64(x).ravel(), _f64(y).ravel()
    xc, yc = x64 - x64.mean(), y64 - y64.mean()
    std = float(xc @ yc / (yc @ yc))
    return float(x64.mean() - std * y64.mean()), std


def _rotate(ops: Ops, dtype: DTypeLike, v: Sequence[float], position: int) -> np.ndarray:
    """The notes' 2-D RoPE: rotate ``v`` by ``position · 0.1`` rad (one frequency, 0.1)."""
    x = np.asarray([v], dtype=dtype)  # (T=1, D=2)
    out = ops.rope(x, np.asarray([position]), inv_freq=np.asarray([0.1]))
    return _f64(out)[0]


def _rotate_seq(ops: Ops, dtype: DTypeLike, vs: Sequence[Sequence[float]]) -> np.ndarray:
    """RoPE of a (T, 2) sequence at positions 1..T (the notes number tokens from 1)."""
    x = np.asarray(vs, dtype=dtype)
    return _f64(ops.rope(x, np.arange(1, len(vs) + 1), inv_freq=np.asarray([0.1])))


def _spread(prefix: str, values: Any) -> Values:
    """``{"prefix0": v0, "prefix1": v1, ...}``."""
    return {f"{prefix}{i}": float(v) for i, v in enumerate(_f64(values).ravel())}


def _rotation_terms(ops: Ops, dtype: DTypeLike, name: str, v: Sequence[float], p: int) -> Values:
    """The four products of the notes' matrix-vector product ``R(p·0.1) · v``, and the result.

    ``R v = [v0 cos - v1 sin, v0 sin + v1 cos]``; the notes write each product separately:
    ``<name>_c0 = v0 cos``, ``<name>_s1 = v1 sin`` (subtracted), ``<name>_s0 = v0 sin``,
    ``<name>_c1 = v1 cos``. Rotating ``[v0, 0]`` and ``[0, v1]`` gives them as kernel outputs.
    """
    a = _rotate(ops, dtype, [v[0], 0.0], p)  # [v0 cos, v0 sin]
    b = _rotate(ops, dtype, [0.0, v[1]], p)  # [-v1 sin, v1 cos]
    out = {f"{name}_c0": a[0], f"{name}_s1": -b[0], f"{name}_s0": a[1], f"{name}_c1": b[1]}
    out.update(_spread(name, _rotate(ops, dtype, v, p)))
    return {k: float(v) for k, v in out.items()}


def _cos_sin(ops: Ops, dtype: DTypeLike, p: int) -> Values:
    c, s = _rotate(ops, dtype, [1.0, 0.0], p)
    return {f"cos{p}": float(c), f"sin{p}": float(s)}


# --------------------------------------------------------------------------------------
# "The Math: RMSNorm, SwiGLU, and RoPE": RMSNorm, LayerNorm, scalar SwiGLU, 2-D RoPE
# --------------------------------------------------------------------------------------

X_MATH = [2.0, -1.0, 3.0, 0.0]


def _math_rms(ops: Ops, dtype: DTypeLike) -> Values:
    x = np.asarray(X_MATH, dtype=dtype)
    y = _f64(ops.rms_norm(x, eps=0.0))
    rms = _rms_from_output(x, y)
    ms_out = float(y @ y) / y.size
    return {
        "sumsq": x.size * rms**2,
        "rms": rms,
        **_spread("y", y),
        "out_sumsq": float(y @ y),
        "out_ms": ms_out,
        "out_rms": math.sqrt(ms_out),
    }


def _math_ln(ops: Ops, dtype: DTypeLike) -> Values:
    x = np.asarray(X_MATH, dtype=dtype)
    y = ops.layer_norm(x, eps=0.0)
    mean, std = _mean_std_from_output(x, y)
    return {"mean": mean, "var": std**2, "std": std, **_spread("y", y)}


def _math_swiglu(ops: Ops, dtype: DTypeLike) -> Values:
    x = np.asarray([[1.5]], dtype=dtype)
    w1, b1 = np.asarray([[2.0]], dtype=dtype), np.asarray([0.5], dtype=dtype)
    w2, b2 = np.asarray([[3.0]], dtype=dtype), np.asarray([0.0], dtype=dtype)
    z1, z2 = x @ w1 + b1, x @ w2 + b2
    swish = _f64(ops.silu(z1)).item()
    sigma = swish / float(z1.item())
    ffn = _f64(ops.swiglu_ffn(x, w1, w2, b_gate=b1, b_up=b2)).item()
    relu_ffn = max(float(z1.item()), 0.0) * float(w2.item()) + float(b2.item())
    return {
        "z1": float(z1.item()),
        "exp": 1.0 / sigma - 1.0,  # sigma = 1 / (1 + e^-z)
        "sigma": sigma,
        "swish": swish,
        "z2": float(z2.item()),
        "ffn": ffn,
        "relu_ffn": relu_ffn,
    }


def _math_rope(ops: Ops, dtype: DTypeLike) -> Values:
    out = {**_cos_sin(ops, dtype, 1), **_cos_sin(ops, dtype, 3)}
    out.update(_rotation_terms(ops, dtype, "q1", [1.0, 0.5], 1))
    out.update(_rotation_terms(ops, dtype, "k3", [1.0, 0.5], 3))
    q1, k3 = np.array([out["q10"], out["q11"]]), np.array([out["k30"], out["k31"]])
    out.update(_spread("score_t", q1 * k3))
    out["score"] = float(q1 @ k3)
    return out


# --------------------------------------------------------------------------------------
# "Worked Example": a token through RMSNorm, residual, RMSNorm, SwiGLU FFN; RoPE on 2 tokens
# --------------------------------------------------------------------------------------

X_WORKED = [0.5, -1.2, 0.8, 0.3]
ATTN_WORKED = [0.6, -1.5, 1.0, 0.4]
# (in, out) weights, the notes' "[a, b; c, d; ...]" rows
W1_WORKED = [[0.5, -0.3], [0.2, 0.4], [-0.1, 0.6], [0.3, -0.2]]
B1_WORKED = [0.1, -0.1]
W2_WORKED = [[0.4, 0.2], [-0.1, 0.5], [0.3, -0.2], [-0.2, 0.4]]
B2_WORKED = [0.0, 0.05]


def _rms_block(ops: Ops, x: np.ndarray) -> tuple[np.ndarray, Values]:
    y = ops.rms_norm(x, eps=0.0)
    rms = _rms_from_output(x, y)
    vals = {"sumsq": x.size * rms**2, "ms": rms**2, "rms": rms, **_spread("y", y)}
    return np.asarray(y), vals


def _worked_rms(ops: Ops, dtype: DTypeLike) -> Values:
    return _rms_block(ops, np.asarray(X_WORKED, dtype=dtype))[1]


def _worked_residual(ops: Ops, dtype: DTypeLike) -> Values:
    h = np.asarray(X_WORKED, dtype=dtype) + np.asarray(ATTN_WORKED, dtype=dtype)
    return {**_spread("h", h), **_rms_block(ops, h)[1]}


def _worked_ffn(ops: Ops, dtype: DTypeLike) -> Values:
    h = np.asarray(X_WORKED, dtype=dtype) + np.asarray(ATTN_WORKED, dtype=dtype)
    y, _ = _rms_block(ops, h)  # the exact RMSNorm output feeds the FFN, not the rounded one
    w1, b1 = np.asarray(W1_WORKED, dtype=dtype), np.asarray(B1_WORKED, dtype=dtype)
    w2, b2 = np.asarray(W2_WORKED, dtype=dtype), np.asarray(B2_WORKED, dtype=dtype)
    y64 = _f64(y)
    t1, t2 = y64[:, None] * _f64(w1), y64[:, None] * _f64(w2)  # the notes' products y_i·W_ij
    z1, z2 = t1.sum(0) + _f64(b1), t2.sum(0) + _f64(b2)
    swish = _f64(ops.silu(z1.astype(dtype)))
    sigma = swish / z1
    out = _f64(ops.swiglu_ffn(y[None, :], w1, w2, b_gate=b1, b_up=b2))[0]
    vals: Values = {}
    for j in range(2):
        vals.update({f"t1_{i}{j}": float(t1[i, j]) for i in range(4)})
        vals.update({f"t2_{i}{j}": float(t2[i, j]) for i in range(4)})
        vals[f"z1nb{j}"], vals[f"z1_{j}"] = float(t1[:, j].sum()), float(z1[j])
        vals[f"z2nb{j}"], vals[f"z2_{j}"] = float(t2[:, j].sum()), float(z2[j])
        vals[f"exp{j}"] = float(1.0 / sigma[j] - 1.0)  # e^{-z}
        vals[f"sigma{j}"], vals[f"swish{j}"] = float(sigma[j]), float(swish[j])
        vals[f"out{j}"] = float(out[j])
    return vals


def _worked_rope(ops: Ops, dtype: DTypeLike) -> Values:
    # Without RoPE: learned absolute embeddings added (plain arithmetic).
    q2a = _f64(np.asarray([0.9, 0.7], dtype=dtype) + np.asarray([0.15, 0.08], dtype=dtype))
    k1a = _f64(np.asarray([0.8, 0.6], dtype=dtype) + np.asarray([0.1, 0.05], dtype=dtype))
    out = {**_spread("abs_t", q2a * k1a), "abs_score": float(q2a @ k1a)}
    # With RoPE: positions 1 and 2 as the notes number them, one frequency 0.1 rad/position.
    out.update({**_cos_sin(ops, dtype, 1), **_cos_sin(ops, dtype, 2)})
    out.update(_rotation_terms(ops, dtype, "q1", [1.0, 0.5], 1))
    out.update(_rotation_terms(ops, dtype, "k1", [0.8, 0.6], 1))
    out.update(_rotation_terms(ops, dtype, "q2", [0.9, 0.7], 2))
    out.update(_rotation_terms(ops, dtype, "k2", [0.7, 0.5], 2))
    # one call with both tokens as a (T=2, D=2) sequence gives the same rotated vectors
    q = _rotate_seq(ops, dtype, [[1.0, 0.5], [0.9, 0.7]])
    k = _rotate_seq(ops, dtype, [[0.8, 0.6], [0.7, 0.5]])
    out.update(_spread("score_t", q[1] * k[0]))
    out["score"] = float(q[1] @ k[0])
    return out


# --------------------------------------------------------------------------------------
# the RMSNorm tutorial: microgpt's rmsnorm (eps = 1e-5)
# --------------------------------------------------------------------------------------


def _tutorial_small(ops: Ops, dtype: DTypeLike) -> Values:
    x = np.asarray([3.0, 4.0], dtype=dtype)
    y = ops.rms_norm(x, eps=1e-5)
    r = _rms_from_output(x, y)  # sqrt(ms + eps)
    return {"ms": r**2 - 1e-5, "scale": 1.0 / r, **_spread("y", y)}


def _tutorial_large(ops: Ops, dtype: DTypeLike) -> Values:
    x = np.asarray([1000.0, 2000.0, 3000.0], dtype=dtype)
    y = _f64(ops.rms_norm(x, eps=1e-5))
    r = _rms_from_output(x, y)
    return {"rms": math.sqrt(r**2 - 1e-5), **_spread("y", y), "out_rms": math.sqrt(y @ y / 3)}


# --------------------------------------------------------------------------------------
# the stated numbers
# --------------------------------------------------------------------------------------

S = Stated
_W1_SLIP = "the notes multiply by -0.3 (that is W1[0,1]) where W1[1,0] = 0.2"

# The math notes and the worked example both rotate q1 = [1, 0.5] at position 1 (0.1 rad) and
# state the same numbers.
_Q1_AT_1 = (
    S("cos1", "cos(0.1)", "0.995"),
    S("sin1", "sin(0.1)", "0.0998"),
    S("q1_s1", "q1': 0.5 sin(0.1) (subtracted)", "0.0499"),
    S("q1_c1", "q1': 0.5 cos(0.1)", "0.4975"),
    S("q10", "q1'[0]", "0.945"),
    S("q11", "q1'[1]", "0.597"),
)

EXAMPLES: tuple[Example, ...] = (
    Example(
        MATH,
        "rms",
        "RMSNorm of x = [2, -1, 3, 0] (gamma = 1, eps = 0)",
        _math_rms,
        (
            S("sumsq", "sum of squares", "14"),
            S("rms", "RMS(x)", "1.871"),
            S("y0", "RMSNorm(x)[0]", "1.069"),
            S("y1", "RMSNorm(x)[1]", "-0.535"),
            S("y2", "RMSNorm(x)[2]", "1.604"),
            S("y3", "RMSNorm(x)[3]", "0.000"),
            # By hand: sum((x/RMS)^2) = 14/3.5 = 4 exactly; from the notes' own rounded outputs
            # 1.069^2 + 0.535^2 + 1.604^2 = 1.142761 + 0.286225 + 2.572816 = 4.0018 -> 4.00.
            # 3.50 is the *input's* mean square 14/4, so this is not a rounding effect.
            S(
                "out_sumsq",
                "verification: sum of squares of the output",
                "3.50",
                chain=1.069**2 + 0.535**2 + 1.604**2,
                why="sum((x/RMS)^2) = 14/3.5 = 4 (1.069^2+0.535^2+1.604^2 = 4.002); "
                "3.50 is the input's mean square 14/4",
            ),
            # By hand: 4.00 / 4 = 1.000; and the notes' sqrt(0.875) is 0.9354, not ~1.0.
            S(
                "out_ms",
                "verification: mean square of the output",
                "0.875",
                why="the output's mean square is 4/4 = 1 (and sqrt(0.875) = 0.935, not ~1.0)",
            ),
            S("out_rms", "verification: RMS of the output", "1.0"),
        ),
    ),
    Example(
        MATH,
        "ln",
        "LayerNorm of x = [2, -1, 3, 0] (gamma = 1, beta = 0, eps = 0)",
        _math_ln,
        (
            S("mean", "mean", "1.0"),
            S("var", "variance (biased)", "2.5"),
            S("std", "std", "1.581"),
            S("y0", "LayerNorm(x)[0]", "0.632"),
            S("y1", "LayerNorm(x)[1]", "-1.265"),
            S("y2", "LayerNorm(x)[2]", "1.265"),
            S("y3", "LayerNorm(x)[3]", "-0.632"),
        ),
    ),
    Example(
        MATH,
        "swiglu",
        "scalar SwiGLU: x = 1.5, W1 = 2, b1 = 0.5, W2 = 3, b2 = 0",
        _math_swiglu,
        (
            S("z1", "z1 = x W1 + b1", "3.5"),
            S("exp", "e^-3.5", "0.0302"),
            # By hand: 1 + 0.0302 = 1.0302; 1/1.0302 = 0.970685 (1.0302 * 0.9707 = 1.00001);
            # exactly 1/(1 + e^-3.5) = 1/1.030197 = 0.970688 -> 0.9707. 0.9704 is 3 units off
            # and not what the notes' own numbers give: a slip in the division.
            S(
                "sigma",
                "sigma(3.5)",
                "0.9704",
                chain=1.0 / (1.0 + 0.0302),
                why="1/(1 + 0.0302) = 0.97069, not 0.9704 (a slip in the division)",
            ),
            S(
                "swish",
                "Swish(3.5) = 3.5 sigma(3.5)",
                "3.396",
                chain=3.5 * 0.9704,
                why="3.5 x 0.9704 carries the sigma slip; exactly 3.3974",
            ),
            S("z2", "z2 = x W2 + b2", "4.5"),
            S(
                "ffn",
                "FFN_SwiGLU(1.5) = Swish(z1) z2",
                "15.28",
                chain=3.396 * 4.5,
                why="3.396 x 4.5 = 15.282 carries the sigma slip; exactly 15.288",
            ),
            S("relu_ffn", "FFN_ReLU(1.5) = ReLU(z1) W2 + b2", "10.5"),
        ),
    ),
    Example(
        MATH,
        "rope",
        "2-D RoPE, theta = 0.1 rad/position: q1 = [1, 0.5] at m = 1, k3 = [1, 0.5] at n = 3",
        _math_rope,
        (
            *_Q1_AT_1,
            S("cos3", "cos(0.3)", "0.955"),
            S("sin3", "sin(0.3)", "0.296"),
            S("k3_s1", "k3': 0.5 sin(0.3) (subtracted)", "0.148"),
            S(
                "k3_c1",
                "k3': 0.5 cos(0.3)",
                "0.4775",
                chain=0.5 * 0.955,
                why="0.5 x 0.955 with cos(0.3) rounded to 3 digits",
            ),
            S("k30", "k3'[0]", "0.807", chain=0.955 - 0.148),
            S("k31", "k3'[1]", "0.774", chain=0.296 + 0.4775),
            S("score_t0", "score term 0.945 x 0.807", "0.763"),
            S("score_t1", "score term 0.597 x 0.774", "0.462"),
            S("score", "score q1' . k3'", "1.225"),
        ),
    ),
    Example(
        WORKED,
        "rms",
        "RMSNorm of x = [0.5, -1.2, 0.8, 0.3] (gamma = 1, eps = 0)",
        _worked_rms,
        (
            S("sumsq", "sum of squares", "2.42"),
            S("ms", "mean square", "0.605"),
            S("rms", "RMS(x)", "0.778"),
            S("y0", "RMSNorm(x)[0]", "0.643"),
            S("y1", "RMSNorm(x)[1]", "-1.543"),
            S("y2", "RMSNorm(x)[2]", "1.029"),
            S("y3", "RMSNorm(x)[3]", "0.386"),
        ),
    ),
    Example(
        WORKED,
        "residual",
        "residual y = x + [0.6, -1.5, 1.0, 0.4], then RMSNorm (eps = 0)",
        _worked_residual,
        (
            S("h0", "y[0]", "1.1"),
            S("h1", "y[1]", "-2.7"),
            S("h2", "y[2]", "1.8"),
            S("h3", "y[3]", "0.7"),
            S("sumsq", "sum of squares", "12.23"),
            S("ms", "mean square", "3.0575"),
            S("rms", "RMS(y)", "1.749"),
            S("y0", "RMSNorm(y)[0]", "0.629"),
            S("y1", "RMSNorm(y)[1]", "-1.544"),
            S(
                "y2",
                "RMSNorm(y)[2]",
                "1.030",
                chain=1.8 / 1.749,
                why="1.8/1.749 = 1.0292 would round to 1.029; exactly 1.02941",
            ),
            S("y3", "RMSNorm(y)[3]", "0.400"),
        ),
    ),
    # By hand (FFN input y_n = RMSNorm(y) = [0.62909, -1.54412, 1.02941, 0.40033], exact):
    #   column 0 of W1 is [0.5, 0.2, -0.1, 0.3], so
    #   z1[0] = 0.31454 - 0.30882 - 0.10294 + 0.12010 = 0.02288, + 0.1 -> 0.12288
    #   (the notes' 0.463 = (-1.544)(-0.3): they used W1[0,1] = -0.3 for W1[1,0] = 0.2; with
    #   that one slip their own sum 0.315 + 0.463 - 0.103 + 0.120 = 0.795 is consistent);
    #   e^-0.12288 = 0.88437, sigma = 1/1.88437 = 0.53068, Swish = 0.12288 x 0.53068 = 0.06521,
    #   z2[0] = 0.25163 + 0.15441 + 0.30882 - 0.08007 = 0.63480,
    #   out[0] = 0.06521 x 0.63480 = 0.04139 -> 0.041 (the notes' 0.404).
    #   Even for the example's z = 0.895: e^-0.895 = 0.4086 (printed 0.407), sigma = 0.7099 (0.711).
    Example(
        WORKED,
        "ffn",
        "SwiGLU FFN of RMSNorm(y): z1 = y_n W1 + b1, z2 = y_n W2 + b2, Swish(z1) * z2",
        _worked_ffn,
        (
            S("t1_00", "z1[0] term y_n[0] x 0.5", "0.315"),
            S(
                "t1_10",
                "z1[0] term y_n[1] x W1[1,0]",
                "0.463",
                chain=-1.544 * -0.3,
                why=f"{_W1_SLIP}: (-1.544)(0.2) = -0.309",
            ),
            S("t1_20", "z1[0] term y_n[2] x (-0.1)", "-0.103"),
            S("t1_30", "z1[0] term y_n[3] x 0.3", "0.120"),
            S(
                "z1nb0",
                "z1[0] before bias",
                "0.795",
                chain=0.315 + 0.463 - 0.103 + 0.120,
                why="inherits the W1[1,0] slip: 0.315 - 0.309 - 0.103 + 0.120 = 0.023",
            ),
            S("z1_0", "z1[0]", "0.895", why="inherits the W1[1,0] slip: 0.023 + 0.1 = 0.123"),
            S("t1_01", "z1[1] term y_n[0] x (-0.3)", "-0.189"),
            S("t1_11", "z1[1] term y_n[1] x 0.4", "-0.618"),
            S("t1_21", "z1[1] term y_n[2] x 0.6", "0.618"),
            S("t1_31", "z1[1] term y_n[3] x (-0.2)", "-0.080"),
            S("z1nb1", "z1[1] before bias", "-0.269"),
            S("z1_1", "z1[1]", "-0.369"),
            S(
                "exp0",
                "e^-z1[0]",
                "0.407",
                chain=math.exp(-0.895),
                why="z1[0] is 0.123 and e^-0.123 = 0.884 (even e^-0.895 is 0.409, not 0.407)",
            ),
            S(
                "sigma0",
                "sigma(z1[0])",
                "0.711",
                chain=1.0 / (1.0 + 0.407),
                why="inherits the W1[1,0] slip: sigma(0.123) = 1/1.884 = 0.531",
            ),
            S(
                "swish0",
                "Swish(z1[0])",
                "0.636",
                chain=0.895 * 0.711,
                why="inherits the W1[1,0] slip: 0.123 x 0.531 = 0.065",
            ),
            S(
                "exp1",
                "e^-z1[1] = e^0.369",
                "1.447",
                chain=math.exp(0.369),
                why="e^0.369 = 1.4463 -> 1.446",
            ),
            S(
                "sigma1",
                "sigma(z1[1])",
                "0.408",
                chain=1.0 / (1.0 + 1.447),
                why="1/(1 + 1.447) = 0.4087 -> 0.409",
            ),
            S("swish1", "Swish(z1[1])", "-0.151"),
            S("t2_00", "z2[0] term y_n[0] x 0.4", "0.252"),
            S("t2_10", "z2[0] term y_n[1] x (-0.1)", "0.154"),
            S("t2_20", "z2[0] term y_n[2] x 0.3", "0.309"),
            S("t2_30", "z2[0] term y_n[3] x (-0.2)", "-0.080"),
            S("z2nb0", "z2[0] before bias", "0.635"),
            S("z2_0", "z2[0]", "0.635"),
            S("t2_01", "z2[1] term y_n[0] x 0.2", "0.126"),
            S("t2_11", "z2[1] term y_n[1] x 0.5", "-0.772"),
            S("t2_21", "z2[1] term y_n[2] x (-0.2)", "-0.206"),
            S("t2_31", "z2[1] term y_n[3] x 0.4", "0.160"),
            S("z2nb1", "z2[1] before bias", "-0.692"),
            S("z2_1", "z2[1]", "-0.642"),
            S(
                "out0",
                "FFN output[0] = Swish(z1[0]) z2[0]",
                "0.404",
                chain=0.636 * 0.635,
                why="inherits the W1[1,0] slip: 0.0652 x 0.6348 = 0.041",
            ),
            S("out1", "FFN output[1] = Swish(z1[1]) z2[1]", "0.097"),
        ),
    ),
    Example(
        WORKED,
        "rope",
        "2-D RoPE, theta = 0.1 rad/position, tokens at positions 1 and 2: "
        "q1 = [1, .5], k1 = [.8, .6], q2 = [.9, .7], k2 = [.7, .5]",
        _worked_rope,
        (
            S("abs_t0", "no RoPE: 1.05 x 0.9", "0.945"),
            S("abs_t1", "no RoPE: 0.78 x 0.65", "0.507"),
            S("abs_score", "no RoPE: score (q2 + p2) . (k1 + p1)", "1.452"),
            *_Q1_AT_1,
            S("k1_c0", "k1': 0.8 cos(0.1)", "0.796"),
            S("k1_s1", "k1': 0.6 sin(0.1) (subtracted)", "0.0599"),
            S("k1_s0", "k1': 0.8 sin(0.1)", "0.0798", chain=0.8 * 0.0998),
            S("k1_c1", "k1': 0.6 cos(0.1)", "0.597"),
            S("k10", "k1'[0]", "0.736"),
            S("k11", "k1'[1]", "0.677"),
            S("cos2", "cos(0.2)", "0.980"),
            S("sin2", "sin(0.2)", "0.199"),
            S("q2_c0", "q2': 0.9 cos(0.2)", "0.882"),
            S(
                "q2_s1",
                "q2': 0.7 sin(0.2) (subtracted)",
                "0.1393",
                chain=0.7 * 0.199,
                why="0.7 x 0.199 with sin(0.2) rounded to 3 digits; exactly 0.13907",
            ),
            S(
                "q2_s0",
                "q2': 0.9 sin(0.2)",
                "0.1791",
                chain=0.9 * 0.199,
                why="0.9 x 0.199 with sin(0.2) rounded to 3 digits; exactly 0.17880",
            ),
            S("q2_c1", "q2': 0.7 cos(0.2)", "0.686"),
            S("q20", "q2'[0]", "0.743"),
            S("q21", "q2'[1]", "0.865"),
            S("k2_c0", "k2': 0.7 cos(0.2)", "0.686"),
            S("k2_s1", "k2': 0.5 sin(0.2) (subtracted)", "0.0995", chain=0.5 * 0.199),
            S("k2_s0", "k2': 0.7 sin(0.2)", "0.1393", chain=0.7 * 0.199),
            S("k2_c1", "k2': 0.5 cos(0.2)", "0.490"),
            S("k20", "k2'[0]", "0.586", chain=0.686 - 0.0995),
            S("k21", "k2'[1]", "0.629"),
            S("score_t0", "score term 0.743 x 0.736", "0.547"),
            S("score_t1", "score term 0.865 x 0.677", "0.586", chain=0.865 * 0.677),
            S("score", "score q2' . k1' (with RoPE)", "1.133", chain=0.547 + 0.586),
        ),
    ),
    Example(
        TUTORIAL,
        "small",
        "microgpt rmsnorm of x = [3, 4] (eps = 1e-5)",
        _tutorial_small,
        (
            S("ms", "mean square", "12.5"),
            S("scale", "scale = (ms + 1e-5)^-0.5", "0.283"),
            S("y0", "output[0]", "0.85"),
            S("y1", "output[1]", "1.13"),
        ),
    ),
    # By hand: (1000^2 + 2000^2 + 3000^2)/3 = 14e6/3 = 4666666.67; 2160^2 = 4665600 and
    # 2161^2 = 4669921, so RMS = 2160.2 (2160.25^2 = 4666680 is just above). 2015^2 = 4060225.
    # Outputs: 1000/2160.2 = 0.4629, 2000/2160.2 = 0.9258, 3000/2160.2 = 1.3887. The tutorial's
    # [0.37, 0.74, 1.11] don't follow from its own 2015 either (1000/2015 = 0.496), and their
    # RMS is sqrt((0.37^2 + 0.74^2 + 1.11^2)/3) = 0.80, not the 1.0 it then states.
    Example(
        TUTORIAL,
        "large",
        "microgpt rmsnorm of x = [1000, 2000, 3000] (eps = 1e-5)",
        _tutorial_large,
        (
            S(
                "rms",
                "RMS(x) before RMSNorm",
                "2015",
                why="sqrt((1000^2 + 2000^2 + 3000^2)/3) = sqrt(14e6/3) = 2160.2",
            ),
            S(
                "y0",
                "output[0]",
                "0.37",
                chain=1000 / 2015,
                why="1000/2160.2 = 0.463 (and 1000/2015 = 0.496: not even the tutorial's own RMS)",
            ),
            S("y1", "output[1]", "0.74", chain=2000 / 2015, why="2000/2160.2 = 0.926"),
            S("y2", "output[2]", "1.11", chain=3000 / 2015, why="3000/2160.2 = 1.389"),
            S("out_rms", "RMS of the output", "1.0"),
        ),
    ),
)


# --------------------------------------------------------------------------------------
# evaluation
# --------------------------------------------------------------------------------------


def _reference() -> Ops:
    from llmkernels import reference

    return reference


def exact_values(reference: Ops | None = None) -> dict[str, float]:
    """Every stated quantity's exact value (float64 reference), by global key."""
    ref = _reference() if reference is None else reference
    out: dict[str, float] = {}
    for ex in EXAMPLES:
        vals = ex.compute(ref, np.float64)
        out.update({f"{ex.id}.{it.key}": vals[it.key] for it in ex.items})
    return out


def evaluate(
    ops: Ops | None = None, dtype: DTypeLike = np.float32, reference: Ops | None = None
) -> list[Row]:
    """Recompute every stated number with ``ops`` (inputs of ``dtype``) and classify it.

    Args:
        ops: the namespace under test; default :mod:`llmkernels` (the C++ kernels).
        dtype: dtype of the inputs handed to ``ops`` (float32 or float64).
        reference: the float64 specification; default :mod:`llmkernels.reference`.

    Returns:
        One :class:`Row` per stated number, in the notes' order. The verdict depends only on
        the exact (reference, float64) value, never on ``ops``.
    """
    if ops is None:
        import llmkernels as ops
    ref = _reference() if reference is None else reference
    rows: list[Row] = []
    for ex in EXAMPLES:
        got, exact = ex.compute(ops, dtype), ex.compute(ref, np.float64)
        for it in ex.items:
            verdict = classify(it.stated, exact[it.key], it.chain)
            rows.append(Row(ex, it, got[it.key], exact[it.key], verdict))
    return rows
