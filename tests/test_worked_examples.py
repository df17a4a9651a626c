"""The worked examples of the LLaMA notes (the math notes, the worked example and the RMSNorm
tutorial; ``examples/worked_examples.py``) as test vectors.

(a) every stated quantity recomputed with the C++ kernels matches the float64 reference within
    the tolerances of conftest.py, for float32 and float64 inputs;
(b) every verdict (ok / rounded / wrong) is the one established by hand, and every exact
    value equals a constant derived by hand below with ``math`` only;
(c) ``python examples/demo.py demo --details`` (``make demo``) runs and reports the errors in
    the notes.
"""

from __future__ import annotations

import math
import subprocess
import sys

import llmkernels
import numpy as np
import pytest
from conftest import ROOT, run_interpreter
from llmkernels import reference

sys.path.insert(0, str(ROOT / "examples"))
from worked_examples import (  # noqa: E402  (the audit lives in examples/, not the package)
    EXAMPLES,
    OK,
    ROUNDED,
    WRONG,
    Example,
    classify,
    decimals,
    evaluate,
    exact_values,
)

RTOL, ATOL = 2e-5, 1e-6  # conftest.TOL: norms / RoPE / SwiGLU


# --------------------------------------------------------------------------------------
# hand derivations (math only, independent of worked_examples)
# --------------------------------------------------------------------------------------


def _sigma(z: float) -> float:
    return 1.0 / (1.0 + math.exp(-z))


def _rot(v: tuple[float, float], angle: float) -> tuple[float, float]:
    c, s = math.cos(angle), math.sin(angle)
    return v[0] * c - v[1] * s, v[0] * s + v[1] * c


# "The Math: RMSNorm, SwiGLU, and RoPE"
R0 = math.sqrt(14 / 4)
STD0 = math.sqrt(2.5)
Z1_0 = 1.5 * 2.0 + 0.5
SW0 = Z1_0 * _sigma(Z1_0)
Q1 = _rot((1.0, 0.5), 0.1)
K3 = _rot((1.0, 0.5), 0.3)
# "Worked Example: Computing RMSNorm, SwiGLU, and RoPE"
R1 = math.sqrt(2.42 / 4)
R1B = math.sqrt(12.23 / 4)  # residual y = [1.1, -2.7, 1.8, 0.7]
YN = [v / R1B for v in (1.1, -2.7, 1.8, 0.7)]  # exact RMSNorm(y), the FFN input
W1 = [[0.5, -0.3], [0.2, 0.4], [-0.1, 0.6], [0.3, -0.2]]
W2 = [[0.4, 0.2], [-0.1, 0.5], [0.3, -0.2], [-0.2, 0.4]]
T1 = [[YN[i] * W1[i][j] for j in range(2)] for i in range(4)]
T2 = [[YN[i] * W2[i][j] for j in range(2)] for i in range(4)]
Z1NB = [sum(T1[i][j] for i in range(4)) for j in range(2)]
Z2NB = [sum(T2[i][j] for i in range(4)) for j in range(2)]
Z1 = [Z1NB[0] + 0.1, Z1NB[1] - 0.1]
Z2 = [Z2NB[0] + 0.0, Z2NB[1] + 0.05]
SW1 = [z * _sigma(z) for z in Z1]
Q1R, K1R = _rot((1.0, 0.5), 0.1), _rot((0.8, 0.6), 0.1)
Q2R, K2R = _rot((0.9, 0.7), 0.2), _rot((0.7, 0.5), 0.2)
C1, S1, C2, S2 = math.cos(0.1), math.sin(0.1), math.cos(0.2), math.sin(0.2)
# the RMSNorm tutorial
SC2 = (12.5 + 1e-5) ** -0.5
MS3 = (1000**2 + 2000**2 + 3000**2) / 3  # 14e6 / 3
RMS3 = math.sqrt(14e6 / 3)  # 2160.2469 (the tutorial says 2015)
SC3 = (MS3 + 1e-5) ** -0.5

#: global key -> (verdict, exact value derived by hand)
HAND: dict[str, tuple[str, float]] = {
    # math notes: RMSNorm of [2, -1, 3, 0]
    "math.rms.sumsq": (OK, 14.0),
    "math.rms.rms": (OK, R0),
    "math.rms.y0": (OK, 2 / R0),
    "math.rms.y1": (OK, -1 / R0),
    "math.rms.y2": (OK, 3 / R0),
    "math.rms.y3": (OK, 0.0),
    "math.rms.out_sumsq": (WRONG, 4.0),  # notes: 3.50
    "math.rms.out_ms": (WRONG, 1.0),  # notes: 0.875
    "math.rms.out_rms": (OK, 1.0),
    # math notes: LayerNorm
    "math.ln.mean": (OK, 1.0),
    "math.ln.var": (OK, 2.5),
    "math.ln.std": (OK, STD0),
    "math.ln.y0": (OK, 1 / STD0),
    "math.ln.y1": (OK, -2 / STD0),
    "math.ln.y2": (OK, 2 / STD0),
    "math.ln.y3": (OK, -1 / STD0),
    # math notes: scalar SwiGLU
    "math.swiglu.z1": (OK, 3.5),
    "math.swiglu.exp": (OK, math.exp(-3.5)),
    "math.swiglu.sigma": (WRONG, _sigma(3.5)),  # notes: 0.9704, exact 0.97069
    "math.swiglu.swish": (ROUNDED, SW0),
    "math.swiglu.z2": (OK, 4.5),
    "math.swiglu.ffn": (ROUNDED, SW0 * 4.5),
    "math.swiglu.relu_ffn": (OK, 10.5),
    # math notes: RoPE, theta = 0.1
    "math.rope.cos1": (OK, math.cos(0.1)),
    "math.rope.sin1": (OK, math.sin(0.1)),
    "math.rope.q1_s1": (OK, 0.5 * math.sin(0.1)),
    "math.rope.q1_c1": (OK, 0.5 * math.cos(0.1)),
    "math.rope.q10": (OK, Q1[0]),
    "math.rope.q11": (OK, Q1[1]),
    "math.rope.cos3": (OK, math.cos(0.3)),
    "math.rope.sin3": (OK, math.sin(0.3)),
    "math.rope.k3_s1": (OK, 0.5 * math.sin(0.3)),
    "math.rope.k3_c1": (ROUNDED, 0.5 * math.cos(0.3)),
    "math.rope.k30": (ROUNDED, K3[0]),
    "math.rope.k31": (ROUNDED, K3[1]),
    "math.rope.score_t0": (OK, Q1[0] * K3[0]),
    "math.rope.score_t1": (OK, Q1[1] * K3[1]),
    "math.rope.score": (OK, 1.25 * math.cos(0.2)),  # |v|^2 cos(relative angle)
    # worked example: RMSNorm of [0.5, -1.2, 0.8, 0.3]
    "worked.rms.sumsq": (OK, 2.42),
    "worked.rms.ms": (OK, 0.605),
    "worked.rms.rms": (OK, R1),
    "worked.rms.y0": (OK, 0.5 / R1),
    "worked.rms.y1": (OK, -1.2 / R1),
    "worked.rms.y2": (OK, 0.8 / R1),
    "worked.rms.y3": (OK, 0.3 / R1),
    # worked example: residual and second RMSNorm
    "worked.residual.h0": (OK, 1.1),
    "worked.residual.h1": (OK, -2.7),
    "worked.residual.h2": (OK, 1.8),
    "worked.residual.h3": (OK, 0.7),
    "worked.residual.sumsq": (OK, 12.23),
    "worked.residual.ms": (OK, 3.0575),
    "worked.residual.rms": (OK, R1B),
    "worked.residual.y0": (OK, YN[0]),
    "worked.residual.y1": (OK, YN[1]),
    "worked.residual.y2": (ROUNDED, YN[2]),  # notes 1.030, exact 1.02941
    "worked.residual.y3": (OK, YN[3]),
    # worked example: SwiGLU FFN (the notes use -0.3 for W1[1,0] = 0.2)
    "worked.ffn.t1_00": (OK, T1[0][0]),
    "worked.ffn.t1_10": (WRONG, T1[1][0]),  # notes 0.463, exact -0.309
    "worked.ffn.t1_20": (OK, T1[2][0]),
    "worked.ffn.t1_30": (OK, T1[3][0]),
    "worked.ffn.z1nb0": (WRONG, Z1NB[0]),  # notes 0.795, exact 0.0229
    "worked.ffn.z1_0": (WRONG, Z1[0]),  # notes 0.895, exact 0.1229
    "worked.ffn.t1_01": (OK, T1[0][1]),
    "worked.ffn.t1_11": (OK, T1[1][1]),
    "worked.ffn.t1_21": (OK, T1[2][1]),
    "worked.ffn.t1_31": (OK, T1[3][1]),
    "worked.ffn.z1nb1": (OK, Z1NB[1]),
    "worked.ffn.z1_1": (OK, Z1[1]),
    "worked.ffn.exp0": (WRONG, math.exp(-Z1[0])),  # notes 0.407, exact 0.884
    "worked.ffn.sigma0": (WRONG, _sigma(Z1[0])),  # notes 0.711, exact 0.531
    "worked.ffn.swish0": (WRONG, SW1[0]),  # notes 0.636, exact 0.065
    "worked.ffn.exp1": (ROUNDED, math.exp(-Z1[1])),
    "worked.ffn.sigma1": (ROUNDED, _sigma(Z1[1])),
    "worked.ffn.swish1": (OK, SW1[1]),
    "worked.ffn.t2_00": (OK, T2[0][0]),
    "worked.ffn.t2_10": (OK, T2[1][0]),
    "worked.ffn.t2_20": (OK, T2[2][0]),
    "worked.ffn.t2_30": (OK, T2[3][0]),
    "worked.ffn.z2nb0": (OK, Z2NB[0]),
    "worked.ffn.z2_0": (OK, Z2[0]),
    "worked.ffn.t2_01": (OK, T2[0][1]),
    "worked.ffn.t2_11": (OK, T2[1][1]),
    "worked.ffn.t2_21": (OK, T2[2][1]),
    "worked.ffn.t2_31": (OK, T2[3][1]),
    "worked.ffn.z2nb1": (OK, Z2NB[1]),
    "worked.ffn.z2_1": (OK, Z2[1]),
    "worked.ffn.out0": (WRONG, SW1[0] * Z2[0]),  # notes 0.404, exact 0.0414
    "worked.ffn.out1": (OK, SW1[1] * Z2[1]),
    # worked example: RoPE on two tokens, theta = 0.1, positions 1 and 2
    "worked.rope.abs_t0": (OK, 1.05 * 0.9),
    "worked.rope.abs_t1": (OK, 0.78 * 0.65),
    "worked.rope.abs_score": (OK, 1.05 * 0.9 + 0.78 * 0.65),
    "worked.rope.cos1": (OK, C1),
    "worked.rope.sin1": (OK, S1),
    "worked.rope.q1_s1": (OK, 0.5 * S1),
    "worked.rope.q1_c1": (OK, 0.5 * C1),
    "worked.rope.q10": (OK, Q1R[0]),
    "worked.rope.q11": (OK, Q1R[1]),
    "worked.rope.k1_c0": (OK, 0.8 * C1),
    "worked.rope.k1_s1": (OK, 0.6 * S1),
    "worked.rope.k1_s0": (ROUNDED, 0.8 * S1),
    "worked.rope.k1_c1": (OK, 0.6 * C1),
    "worked.rope.k10": (OK, K1R[0]),
    "worked.rope.k11": (OK, K1R[1]),
    "worked.rope.cos2": (OK, C2),
    "worked.rope.sin2": (OK, S2),
    "worked.rope.q2_c0": (OK, 0.9 * C2),
    "worked.rope.q2_s1": (ROUNDED, 0.7 * S2),  # 0.7 x 0.199 = 0.1393; exact 0.1391
    "worked.rope.q2_s0": (ROUNDED, 0.9 * S2),  # 0.9 x 0.199 = 0.1791; exact 0.1788
    "worked.rope.q2_c1": (OK, 0.7 * C2),
    "worked.rope.q20": (OK, Q2R[0]),
    "worked.rope.q21": (OK, Q2R[1]),
    "worked.rope.k2_c0": (OK, 0.7 * C2),
    "worked.rope.k2_s1": (ROUNDED, 0.5 * S2),
    "worked.rope.k2_s0": (ROUNDED, 0.7 * S2),
    "worked.rope.k2_c1": (OK, 0.5 * C2),
    "worked.rope.k20": (ROUNDED, K2R[0]),
    "worked.rope.k21": (OK, K2R[1]),
    "worked.rope.score_t0": (OK, Q2R[0] * K1R[0]),
    "worked.rope.score_t1": (ROUNDED, Q2R[1] * K1R[1]),
    "worked.rope.score": (ROUNDED, Q2R[0] * K1R[0] + Q2R[1] * K1R[1]),  # 1.1323, notes 1.133
    # RMSNorm tutorial: microgpt rmsnorm, eps = 1e-5
    "tutorial.small.ms": (OK, 12.5),
    "tutorial.small.scale": (OK, SC2),
    "tutorial.small.y0": (OK, 3 * SC2),
    "tutorial.small.y1": (OK, 4 * SC2),
    "tutorial.large.rms": (WRONG, RMS3),  # notes 2015
    "tutorial.large.y0": (WRONG, 1000 * SC3),  # notes 0.37
    "tutorial.large.y1": (WRONG, 2000 * SC3),  # notes 0.74
    "tutorial.large.y2": (WRONG, 3000 * SC3),  # notes 1.11
    "tutorial.large.out_rms": (OK, math.sqrt(MS3 * SC3**2)),
}

#: the wrong values with the value they should have been, at the notes' precision
CORRECTIONS = {
    "math.rms.out_sumsq": ("3.50", "4.00"),
    "math.rms.out_ms": ("0.875", "1.000"),
    "math.swiglu.sigma": ("0.9704", "0.9707"),
    "worked.ffn.t1_10": ("0.463", "-0.309"),
    "worked.ffn.z1nb0": ("0.795", "0.023"),
    "worked.ffn.z1_0": ("0.895", "0.123"),
    "worked.ffn.exp0": ("0.407", "0.884"),
    "worked.ffn.sigma0": ("0.711", "0.531"),
    "worked.ffn.swish0": ("0.636", "0.065"),
    "worked.ffn.out0": ("0.404", "0.041"),
    "tutorial.large.rms": ("2015", "2160"),
    "tutorial.large.y0": ("0.37", "0.46"),
    "tutorial.large.y1": ("0.74", "0.93"),
    "tutorial.large.y2": ("1.11", "1.39"),
}


@pytest.fixture(scope="module")
def exact() -> dict[str, float]:
    return exact_values()


# --------------------------------------------------------------------------------------
# (a) C++ kernels vs the float64 reference
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=["float32", "float64"])
@pytest.mark.parametrize("example", EXAMPLES, ids=[e.id for e in EXAMPLES])
def test_kernels_match_reference(example: Example, dtype: type[np.floating]) -> None:
    got = example.compute(llmkernels, dtype)
    ref = example.compute(reference, np.float64)
    for item in example.items:
        np.testing.assert_allclose(
            got[item.key],
            ref[item.key],
            rtol=RTOL,
            atol=ATOL,
            err_msg=f"{example.id}.{item.key} ({item.label})",
        )


def test_evaluate_rows_agree_with_reference() -> None:
    rows = evaluate(llmkernels, np.float32)
    assert len(rows) == sum(len(e.items) for e in EXAMPLES)
    for r in rows:
        assert r.value == pytest.approx(r.exact, rel=RTOL, abs=ATOL), r.key


# --------------------------------------------------------------------------------------
# (b) verdicts and exact values
# --------------------------------------------------------------------------------------


def test_hand_table_covers_every_stated_number(exact: dict[str, float]) -> None:
    assert set(HAND) == set(exact)


@pytest.mark.parametrize("key", sorted(HAND))
def test_exact_value_matches_hand_derivation(key: str, exact: dict[str, float]) -> None:
    assert exact[key] == pytest.approx(HAND[key][1], rel=1e-12, abs=1e-14)


def test_verdicts() -> None:
    rows = evaluate(reference, np.float64)  # verdicts depend only on the exact values
    got = {r.key: r.verdict for r in rows}
    assert got == {k: v for k, (v, _) in HAND.items()}


def test_wrong_values_and_corrections() -> None:
    rows = {r.key: r for r in evaluate(reference, np.float64)}
    wrong = {k: (r.item.stated, r.correct) for k, r in rows.items() if r.verdict == WRONG}
    assert wrong == CORRECTIONS
    assert all(rows[k].item.why for k in wrong), "every wrong value explains why"


def test_tutorial_rms_by_hand() -> None:
    # (1000^2 + 2000^2 + 3000^2)/3 = 14e6/3; 2160^2 = 4665600 <= 4666666.7 < 2161^2 = 4669921
    assert 2160**2 <= 14e6 / 3 < 2161**2
    assert exact_values()["tutorial.large.rms"] == pytest.approx(math.sqrt(14e6 / 3), rel=1e-12)
    assert abs(2015 - math.sqrt(14e6 / 3)) > 100


def test_classify_rule() -> None:
    assert [decimals(s) for s in ("2015", "1.0", "0.0302", "-0.535", "0.000")] == [0, 1, 4, 3, 3]
    assert classify("1.871", math.sqrt(3.5)) == OK
    assert classify("0.000", 0.0) == OK
    assert classify("0.4975", 0.5 * math.cos(0.1)) == OK  # 0.49750208
    assert classify("0.807", _rot((1.0, 0.5), 0.3)[0]) == ROUNDED  # 0.8076: 0.6 units off
    assert classify("0.9704", _sigma(3.5)) == WRONG  # 0.97069: 2.9 units off
    # 0.7 sin(0.2) = 0.13907: 2.3 units from 0.1393, which the notes got from 0.7 x 0.199
    assert classify("0.1393", 0.7 * math.sin(0.2)) == WRONG
    assert classify("0.1393", 0.7 * math.sin(0.2), chain=0.7 * 0.199) == ROUNDED
    # a chain that reproduces the number does not excuse a large error
    assert classify("0.711", _sigma(Z1[0]), chain=1 / (1 + 0.407)) == WRONG
    # the sigma slip: 1/(1 + 0.0302) = 0.970685 does not give 0.9704
    assert classify("0.9704", _sigma(3.5), chain=1 / 1.0302) == WRONG


# --------------------------------------------------------------------------------------
# (c) the demo
# --------------------------------------------------------------------------------------


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    """``examples/demo.py`` for the demo, the package's CLI for the rest."""
    demo = str(ROOT / "examples" / "demo.py")
    return run_interpreter(
        *((demo,) if args[0] == "demo" else ("-m", "llmkernels")), *args,
        env={"PYTHONWARNINGS": "error"},
    )  # fmt: skip


def test_demo_runs() -> None:
    proc = _run("demo", "--details")
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert out.count("NOTES ERROR:") == len(CORRECTIONS)
    assert "NOTES ERROR: RMS(x) before RMSNorm: the notes state 2015; correct value is 2160" in out
    assert "correct value is 0.9707" in out
    for op in ("rms_norm", "layer_norm", "silu", "swiglu", "swiglu_ffn", "rope"):
        assert f"\n  {op} " in out
    assert "Warning" not in proc.stderr


def test_info_runs() -> None:
    proc = _run("info")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip()
