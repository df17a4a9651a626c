"""Shared fixtures: every SIMD path the CPU supports, thread counts, per-dtype tolerances."""

from __future__ import annotations

import math
import os
import signal
import subprocess
import sys
import textwrap
from collections.abc import Iterator, Sequence
from pathlib import Path

import llmkernels as lk
import numpy as np
import pytest
from perturb_libm import ENV as PERTURB_ENV
from perturb_libm import install_from_env

# LLMK_TEST_PERTURB_ULP=k: the references' transcendentals k ulp off (tests/perturb_libm.py)
PERTURB_ULP = install_from_env()

ROOT = Path(__file__).resolve().parents[1]

# the SIMD paths as the core lists them (cpp/common/isa_list.hpp), lowest first
ISA_ORDER = list(lk._core.isa_names)
SUPPORTED_ISAS = ISA_ORDER[: ISA_ORDER.index(lk._core.best_simd_arch()) + 1]

# The tolerances: float32 results against the float64 reference. float64 results are held to
# a tolerance that only accumulation-order differences can explain.
TOL = {
    np.dtype(np.float32): {"rtol": 2e-5, "atol": 1e-6},
    np.dtype(np.float64): {"rtol": 1e-12, "atol": 1e-14},
}


def cxx_inv_freq(dim: int, theta: float = 10000.0) -> np.ndarray:
    """The core's own RoPE frequencies when it is given ``theta``: ``1 / theta ** (arange(0, dim,
    2) / dim)`` with the C library's ``pow`` per element, as the C++ computes them (std::pow). The
    reference's frequencies come from llmkernels._libm, which LLMK_TEST_PERTURB_ULP perturbs; at
    positions where one ulp of a frequency moves the angle past the tolerance (p * ulp(f) >~ 1e-13)
    a test gives the reference these instead."""
    exps = np.arange(0, dim, 2, dtype=np.float64) / dim
    return np.array([1.0 / math.pow(theta, float(e)) for e in exps], dtype=np.float64)


#: the suite runs under AddressSanitizer (``make test-sanitize`` preloads libasan)
UNDER_ASAN = "libasan" in os.environ.get("LD_PRELOAD", "")
#: GCC 12's ASan runtime registers no fork handlers (newer LLVM runtimes lock their allocator
#: around fork()): a child forked while another thread of the parent is inside malloc waits
#: forever on the allocator's lock, whatever the code under test does. The tests that fork while
#: a thread works are run by ``make test`` and the ISA matrix instead.
fork_while_threads_work = pytest.mark.skipif(
    UNDER_ASAN,
    reason="GCC 12's ASan allocator is not fork-safe while another thread allocates",
)


def run_python(
    code: str,
    env: dict[str, str] | None = None,
    timeout: float = 120,
    drop: Sequence[str] = (),
) -> subprocess.CompletedProcess[str]:
    """Runs ``code`` in a fresh interpreter (its own session, environment minus ``drop``, plus
    ``env``); returns the CompletedProcess. A hang kills the process group (forked children
    included) after ``timeout`` s and fails the test instead of hanging the suite."""
    full_env = {k: v for k, v in os.environ.items() if k not in drop}
    full_env.update(env or {})
    proc = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(code)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=full_env,
        start_new_session=True,
    )
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        pytest.fail(f"subprocess hung (killed after {timeout} s)\nstdout:\n{out}\nstderr:\n{err}")
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def run_interpreter(
    *args: str,
    timeout: float = 600,
    env: dict[str, str] | None = None,
    stdin: str | None = None,
) -> subprocess.CompletedProcess[str]:
    """Runs ``python *args`` (a script, or ``-m llmkernels ...``) from the repository root in a
    fresh interpreter, the environment plus ``env``, ``stdin`` as its input; output captured."""
    return subprocess.run(
        [sys.executable, *args], input=stdin, capture_output=True, text=True, timeout=timeout,
        env={**os.environ, **(env or {})}, cwd=ROOT, check=False,
    )  # fmt: skip


def run_bench(
    script: str, *args: str, timeout: float = 600, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """``benchmarks/<script> *args`` with warnings as errors (plus ``env``): the smoke runs of
    tests/bench/test_bench_*.py."""
    path = str(ROOT / "benchmarks" / script)
    return run_interpreter(
        path, *args, timeout=timeout, env={"PYTHONWARNINGS": "error", **(env or {})}
    )


@pytest.fixture(autouse=True)
def _restore_simd_mode() -> Iterator[None]:
    """Tests force SIMD paths and restore the previous name; the automatic mode (each kernel
    family on its fastest path) is put back after a test that started in it."""
    automatic = lk._core.simd_arch_automatic()
    yield
    if automatic and not lk._core.simd_arch_automatic():
        lk.set_simd_arch("auto")


@pytest.fixture(params=SUPPORTED_ISAS)
def isa(request: pytest.FixtureRequest) -> Iterator[str]:
    """Runs the test once per SIMD path (forced in-process with set_simd_arch)."""
    previous = lk.simd_arch()
    lk.set_simd_arch(request.param)
    assert lk.simd_arch() == request.param
    yield request.param
    lk.set_simd_arch(previous)


@pytest.fixture
def exact_bf16() -> Iterator[None]:
    """bfloat16 weights on the exact path: the float32 GEMM of the widened weights (bit for bit
    the float32 model of the rounded weights), not vdpbf16ps (activations rounded to bfloat16;
    tests/ops/test_gemm_bf16.py) where the CPU has AVX512_BF16."""
    lk._core._set_bf16_dot("none")
    yield
    lk._core._set_bf16_dot("auto")


@pytest.fixture
def threads() -> Iterator[None]:
    """Restores the thread count after a test that changes it."""
    previous = lk.get_num_threads()
    yield
    lk.set_num_threads(previous)


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng(1234)


# --- hypothesis profiles (tests/robustness/test_properties.py) ------------------------------------
# "ci" (default): 200 examples per property; "long": 10x. Select with HYPOTHESIS_PROFILE=long or
# `pytest --hypothesis-profile=long` (hypothesis' pytest plugin loads it after this file).
import os as _os  # noqa: E402

from hypothesis import settings as _hyp_settings  # noqa: E402

# "ci" (default): 200 examples per property, derandomized so that a CI run is reproducible (the
# same examples every time; a failure found by "long" is fixed and pinned as an explicit test).
# "long": 2000 random examples per property (--hypothesis-profile=long or HYPOTHESIS_PROFILE=long).
_hyp_settings.register_profile(
    "ci", max_examples=200, deadline=None, derandomize=True, print_blob=True, database=None
)
_hyp_settings.register_profile(
    "long", max_examples=2000, deadline=None, derandomize=False, print_blob=True
)
_hyp_settings.load_profile(_os.environ.get("HYPOTHESIS_PROFILE", "ci"))


def pytest_report_header() -> str | None:
    if PERTURB_ULP:
        return f"{PERTURB_ENV}={PERTURB_ULP}: the references' transcendentals perturbed (ulp)"
    return None
