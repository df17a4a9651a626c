"""Runtime behaviour: SIMD path selection (LLMKERNELS_ARCH, set_simd_arch), fork safety of the
thread pool, concurrent calls from Python threads (GIL released), build_info().

Anything that could crash or hang runs in a subprocess of its own session, with a timeout: a
hang fails the test and the whole process group is killed.
"""

from __future__ import annotations

import json
import threading

import llmkernels as lk
import numpy as np
import pytest
from conftest import ISA_ORDER, SUPPORTED_ISAS, TOL, fork_while_threads_work
from conftest import run_python as _run_python
from llmkernels import reference as ref

TIMEOUT = 120  # seconds per subprocess; the scripts take ~1-3 s


def run_python(code: str, env: dict[str, str] | None = None, timeout: float = TIMEOUT):
    """conftest's runner, without an inherited forced SIMD path."""
    return _run_python(code, env, timeout, drop=("LLMKERNELS_ARCH",))


def run_ok(code: str, env: dict[str, str] | None = None, timeout: float = TIMEOUT) -> str:
    res = run_python(code, env, timeout)
    assert res.returncode == 0, (
        f"exit code {res.returncode}\nstdout:\n{res.stdout}\nstderr:\n{res.stderr}"
    )
    return res.stdout


# --- (a) SIMD path selection ------------------------------------------------------------------

# the subprocess reports the path in use and checks the kernels against the reference
ARCH_SCRIPT = """
import json
import numpy as np
import llmkernels as lk
from llmkernels import reference as ref

TOL = {np.float32: dict(rtol=2e-5, atol=1e-6), np.float64: dict(rtol=1e-12, atol=1e-14)}
rng = np.random.default_rng(0)
failures = []
for dt, tol in TOL.items():
    x = rng.standard_normal((3, 5, 1025)).astype(dt)
    w = rng.standard_normal(1025).astype(dt)
    b = rng.standard_normal(1025).astype(dt)
    u = rng.standard_normal((3, 5, 1025)).astype(dt)
    r = x[..., :1024]
    cases = {
        "rms_norm": (lk.rms_norm(x, w), ref.rms_norm(x, w)),
        "layer_norm": (lk.layer_norm(x, w, b), ref.layer_norm(x, w, b)),
        "silu": (lk.silu(4 * x), ref.silu(4 * x)),
        "swiglu": (lk.swiglu(4 * x, u), ref.swiglu(4 * x, u)),
        "rope": (lk.rope(r, np.arange(5) + 10**5), ref.rope(r, np.arange(5) + 10**5)),
        "rope_interleaved": (lk.rope(r, interleaved=True), ref.rope(r, interleaved=True)),
    }
    for name, (got, want) in cases.items():
        if got.dtype != dt or not np.allclose(got, want, **tol):
            failures.append(f"{name}/{np.dtype(dt).name}")
first = lk.simd_arch()
info_arch = lk.build_info()["simd_arch"]
lk.set_simd_arch("sse2")
lowered = lk.simd_arch()
lk.set_simd_arch(lk._core.best_simd_arch())  # raising the path again is allowed
print(json.dumps({"arch": first, "best": lk._core.best_simd_arch(), "build_info_arch": info_arch,
                  "failures": failures, "lowered": lowered, "raised": lk.simd_arch()}))
"""

ALIASES = {
    "sse2": "sse2",
    "sse": "sse2",
    "avx2": "avx2",
    "fma3": "avx2",
    "avx512": "avx512",
    "avx512bw": "avx512",
}
BEST = lk._core.best_simd_arch()


def expected_arch(value: str | None) -> str:
    """What cpp/common/isa.cpp does with LLMKERNELS_ARCH: a known name selects that path,
    clamped down to the CPU's best (never up: that would SIGILL); anything else (unknown,
    empty, other case) is ignored and the best path is used."""
    wanted = ALIASES.get(value) if value is not None else None
    if wanted is None:
        return BEST
    return ISA_ORDER[min(ISA_ORDER.index(wanted), ISA_ORDER.index(BEST))]


@pytest.mark.parametrize(
    "value", [None, "sse2", "avx2", "avx512", "sse", "fma3", "avx512bw", "bogus", "", "AVX2"]
)
def test_env_arch(value):
    env = {} if value is None else {"LLMKERNELS_ARCH": value}
    report = json.loads(run_ok(ARCH_SCRIPT, env).strip().splitlines()[-1])
    assert report["best"] == BEST
    assert report["arch"] == expected_arch(value), report
    assert report["build_info_arch"] == report["arch"]
    assert report["failures"] == [], f"results differ from the reference on {report['arch']}"
    assert report["lowered"] == "sse2" and report["raised"] == BEST


def test_env_arch_above_cpu_is_clamped():
    """Every name at or above the CPU's best selects the best path (on this machine's CPU the
    list may hold only the best itself)."""
    for name in ISA_ORDER[ISA_ORDER.index(BEST) :]:
        out = run_ok(ARCH_SCRIPT, {"LLMKERNELS_ARCH": name})
        report = json.loads(out.strip().splitlines()[-1])
        assert report["arch"] == BEST
        assert report["failures"] == []


def test_set_simd_arch_errors():
    before = lk.simd_arch()
    with pytest.raises(ValueError, match=r"^\[set_simd_arch\] .*'bogus'"):
        lk.set_simd_arch("bogus")
    with pytest.raises(ValueError, match=r"^\[set_simd_arch\]"):
        lk.set_simd_arch("")
    with pytest.raises(TypeError, match=r"^\[set_simd_arch\]"):
        lk.set_simd_arch(2)  # type: ignore[arg-type]
    for name in ISA_ORDER[ISA_ORDER.index(BEST) + 1 :]:  # above this CPU: refused, not clamped
        with pytest.raises(ValueError, match=r"^\[set_simd_arch\] .*not supported"):
            lk.set_simd_arch(name)
    assert lk.simd_arch() == before  # a failed call changes nothing


def test_set_simd_arch_roundtrip():
    before = lk.simd_arch()
    try:
        for name in SUPPORTED_ISAS:
            lk.set_simd_arch(name)
            assert lk.simd_arch() == name
            assert lk.build_info()["simd_arch"] == name
        for alias, name in ALIASES.items():
            if name in SUPPORTED_ISAS:
                lk.set_simd_arch(alias)
                assert lk.simd_arch() == name
    finally:
        lk.set_simd_arch(before)


# --- (b) fork safety --------------------------------------------------------------------------

FORK_SETUP = """
import hashlib, os, sys, threading
import numpy as np
import llmkernels as lk

lk.set_num_threads(2)
rng = np.random.default_rng(0)
x = rng.standard_normal((2048, 4096)).astype(np.float32)
w = rng.standard_normal(4096).astype(np.float32)
xf = rng.standard_normal((64, 512)).astype(np.float32)
wg = rng.standard_normal((512, 1024)).astype(np.float32)
wu = rng.standard_normal((512, 1024)).astype(np.float32)
wd = rng.standard_normal((1024, 512)).astype(np.float32)

def compute():
    return (lk.rms_norm(x, w), lk.swiglu(x, x), lk.swiglu_ffn(xf, wg, wu, wd))

def digest(arrays):
    return hashlib.sha256(b"".join(a.tobytes() for a in arrays)).hexdigest()

expected = digest(compute())  # the parent's pool is up and has run parallel jobs

def in_child(fn):
    \"\"\"fork; the child runs fn() -> bool, exits 0 if True; returns the child's exit code.\"\"\"
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            code = 0 if fn() else 2
        except BaseException:
            import traceback
            traceback.print_exc()
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status)
"""


def test_fork_after_parallel_kernel():
    code = (
        FORK_SETUP
        + """
def child():
    ok = lk.get_num_threads() == 2
    for _ in range(3):
        ok = ok and digest(compute()) == expected
    # the child's own pool survives a second fork (grandchild)
    ok = ok and in_child(lambda: digest(compute()) == expected) == 0
    return ok

codes = [in_child(child) for _ in range(3)]
assert codes == [0, 0, 0], codes
assert digest(compute()) == expected  # the parent's pool still works
print("ok")
"""
    )
    assert run_ok(code).strip() == "ok"


@fork_while_threads_work
def test_fork_while_another_thread_runs_kernels():
    """fork() while a second Python thread is inside a parallel kernel: the child must not
    inherit a locked pool."""
    code = (
        FORK_SETUP
        + """
stop = threading.Event()
errors = []
first = lk.rms_norm(x, w)

def spin():
    while not stop.is_set():
        if not np.array_equal(lk.rms_norm(x, w), first):
            errors.append("mismatch")

th = threading.Thread(target=spin)
th.start()
try:
    codes = [in_child(lambda: digest(compute()) == expected) for _ in range(8)]
finally:
    stop.set()
    th.join()
assert codes == [0] * 8, codes
assert not errors
print("ok")
"""
    )
    assert run_ok(code).strip() == "ok"


def test_multiprocessing_fork_pool():
    code = (
        FORK_SETUP
        + """
import multiprocessing as mp

def work(i):
    return lk.get_num_threads(), digest(compute())

ctx = mp.get_context("fork")
with ctx.Pool(2) as pool:
    results = pool.map(work, range(4))
assert all(r == (2, expected) for r in results), results
with ctx.Pool(2) as pool:  # and again, after the parent ran more parallel work
    assert digest(compute()) == expected
    results = pool.map(work, range(4))
assert all(r == (2, expected) for r in results), results
print("ok")
"""
    )
    assert run_ok(code).strip() == "ok"


# --- (c) concurrent calls from Python threads (the GIL is released) ---------------------------


def _run_threads(targets, timeout: float = TIMEOUT) -> None:
    threads = [threading.Thread(target=fn, daemon=True) for fn in targets]
    for th in threads:
        th.start()
    for th in threads:
        th.join(timeout)
    assert not any(th.is_alive() for th in threads), "a thread is stuck in a kernel"


@pytest.mark.parametrize("n_threads", [1, 2])
def test_concurrent_swiglu_from_python_threads(n_threads, threads, rng):
    lk.set_num_threads(n_threads)
    size = 1 << 22
    inputs = [
        (
            rng.standard_normal(size).astype(np.float32) * 4,
            rng.standard_normal(size).astype(np.float32),
        )
        for _ in range(2)
    ]
    expected = [lk.swiglu(g, u) for g, u in inputs]  # one at a time
    for (g, u), e in zip(inputs, expected, strict=True):
        np.testing.assert_allclose(e, ref.swiglu(g, u), **TOL[np.dtype(np.float32)])
    results: list[list[bool]] = [[], []]
    errors: list[BaseException] = []

    def worker(k: int):
        def run():
            try:
                g, u = inputs[k]
                for _ in range(6):
                    results[k].append(bool(np.array_equal(lk.swiglu(g, u), expected[k])))
            except BaseException as exc:  # pragma: no cover - reported below
                errors.append(exc)

        return run

    _run_threads([worker(0), worker(1)])
    assert not errors, errors
    assert results == [[True] * 6, [True] * 6]  # bitwise equal to the serial results


def test_concurrent_mixed_kernels_from_python_threads(threads, rng):
    """Different kernels (elementwise, row-wise, BLAS FFN) from three threads at once."""
    lk.set_num_threads(2)
    x = rng.standard_normal((512, 4096)).astype(np.float32)
    w = rng.standard_normal(4096).astype(np.float32)
    xf = rng.standard_normal((64, 256)).astype(np.float32)
    wg, wu = rng.standard_normal((256, 512)), rng.standard_normal((256, 512))
    calls = [
        lambda: lk.rms_norm(x, w),
        lambda: lk.swiglu(x, x),
        lambda: lk.swiglu_ffn(xf, wg, wu),
    ]
    expected = [c() for c in calls]
    ok: list[bool] = []

    def worker(k: int):
        return lambda: ok.extend(np.array_equal(calls[k](), expected[k]) for _ in range(5))

    _run_threads([worker(0), worker(1), worker(2)])
    assert ok == [True] * 15


def test_set_num_threads_while_kernels_run():
    """Changing the thread count while another Python thread is inside a parallel kernel: the
    pool in use must not be torn down under it (subprocess: a crash or hang fails the test).

    Takes ~2 s when it works (~30 s in the sanitizer build, whose kernels run ~100x slower);
    a hang is caught by the 120 s timeout."""
    code = (
        FORK_SETUP
        + """
stop = threading.Event()
bad = []

def spin():
    while not stop.is_set():
        if not np.array_equal(lk.rms_norm(x, w), first):
            bad.append(1)

first = lk.rms_norm(x, w)
th = threading.Thread(target=spin)
th.start()
try:
    for i in range(200):
        lk.set_num_threads(2 + i % 3)  # 2, 3, 4 workers: each change rebuilds the pool
        lk.silu(x[:16])  # 64K elements: a parallel job on the new pool
finally:
    stop.set()
    th.join()
assert not bad
print("ok")
"""
    )
    assert run_ok(code, timeout=120).strip() == "ok"


# --- (d) build_info ---------------------------------------------------------------------------


def test_build_info():
    info = lk.build_info()
    assert set(info) == {
        "version",
        "compiler",
        "xsimd",
        "simd_arch",
        "best_simd_arch",
        "compiled_simd_archs",
        "num_threads",
        "blas",
        "kernel_paths",
    }
    assert info["kernel_paths"] == {
        "float": lk.simd_arch(),
        "automatic": lk._core.simd_arch_automatic(),
        **{f"family_{k}": v for k, v in lk._core.family_simd_archs().items()},
        "int8_prefill_dot": lk._core.int8_dot(),
        "int8_decode_dot": lk._int8_decode_dot(),
        "bf16_prefill_dot": lk._core.bf16_dot(),
    }
    assert info["version"] == lk.__version__ and isinstance(info["version"], str)
    assert isinstance(info["compiler"], str) and info["compiler"]
    assert isinstance(info["xsimd"], str) and info["xsimd"][0].isdigit()
    assert info["simd_arch"] == lk.simd_arch()
    assert info["best_simd_arch"] == BEST
    assert info["compiled_simd_archs"] == ISA_ORDER
    assert info["best_simd_arch"] in info["compiled_simd_archs"]
    assert info["num_threads"] == lk.get_num_threads() >= 1
    assert isinstance(info["blas"], str) and "openblas" in info["blas"].lower()
    json.dumps(info)  # plain data


def test_build_info_follows_runtime_changes(threads):
    lk.set_num_threads(1)
    assert lk.build_info()["num_threads"] == 1
    lk.set_num_threads(3)
    assert lk.build_info()["num_threads"] == 3


@pytest.mark.parametrize(
    ("env", "warned"),
    [
        ({"LLMKERNELS_ARCH": "bogus"}, "LLMKERNELS_ARCH='bogus' is not a SIMD path"),
        ({"LLMKERNELS_ARCH": "sse2"}, None),
        ({"LLMKERNELS_ARCH": "fma3"}, None),  # xsimd's name of the AVX2 path
        ({"LLMKERNELS_NUM_THREADS": "abc"}, "LLMKERNELS_NUM_THREADS='abc' is not a thread"),
        ({"LLMKERNELS_NUM_THREADS": "0"}, "LLMKERNELS_NUM_THREADS='0' is not a thread"),
        ({"LLMKERNELS_NUM_THREADS": "1"}, None),
        ({"LLMKERNELS_INT8_DOT": "vpdpbusd"}, "LLMKERNELS_INT8_DOT='vpdpbusd' is not a path"),
        ({"LLMKERNELS_BF16_DOT": "amx2"}, "LLMKERNELS_BF16_DOT='amx2' is not a path"),
        ({"LLMKERNELS_INT8_DOT": "none"}, None),
        ({"LLMKERNELS_BF16_DOT": "bf16_simde"}, None),
    ],
)
def test_an_ignored_environment_variable_warns(env, warned):
    """A typo in LLMKERNELS_ARCH / LLMKERNELS_NUM_THREADS is ignored by the core (the best
    path, all cores) -- with a warning at import, not silently."""
    r = run_python(
        "import warnings; warnings.simplefilter('always')\n"
        "import llmkernels as lk; print(lk.simd_arch(), lk.get_num_threads())",
        env={"LLMKERNELS_NUM_THREADS": "2", **env},
    )
    assert r.returncode == 0, r.stderr
    if warned is None:
        assert "RuntimeWarning" not in r.stderr, r.stderr
    else:
        assert "RuntimeWarning" in r.stderr and warned in r.stderr, r.stderr


def test_roofline_probes() -> None:
    """The probes the benchmarks divide by: positive figures, and clear errors for an unknown
    instruction or one the CPU lacks."""
    core = lk._core
    assert core._probe_fma_gflops(1, 100_000) > 0
    assert core._probe_read_gbs(2, 1 << 16, 2) > 0
    assert core._probe_read_gbs(1, 7, 1) > 0  # shorter than a vector: the tail alone
    has_instruction = {
        "vpdpbusd": core.cpu_has_avx512_vnni,
        "vdpbf16ps": core.cpu_has_avx512_bf16,
        "tdpbssd": core.cpu_has_amx,
        "tdpbf16ps": core.cpu_has_amx,
        "vpmaddubsw": core.best_simd_arch() in ("avx2", "avx512"),
    }
    for name, has in has_instruction.items():
        if has:
            assert core._probe_dot_gops(name, 2, 10_000) > 0
        else:
            with pytest.raises(ValueError, match=r"\[_probe_dot_gops\] this CPU has no " + name):
                core._probe_dot_gops(name, 1, 10)
    with pytest.raises(ValueError, match=r"\[_probe_dot_gops\] instruction must be"):
        core._probe_dot_gops("vfmadd", 1, 10)


# --- per-family paths (common/isa.hpp: dispatch by measured speed) ---------------------------

FAMILIES = ["other", "norm", "rope", "attention", "quant", "qgemv", "packed"]
# on AMD Zen 4 (512-bit instructions split in two) these run their avx2 code in the automatic mode
ZEN4_AVX2 = {"norm", "rope", "attention", "quant", "packed"}
# and these on every CPU (no 512-bit code of their own)
ALWAYS_AVX2 = {"qgemv"}

FAMILY_SCRIPT = """
import json, llmkernels as lk
print(json.dumps({"auto": lk._core.simd_arch_automatic(), "arch": lk.simd_arch(),
                  "families": lk._core.family_simd_archs()}))
"""


@pytest.mark.parametrize("value", [None, "avx2", "bogus"])
def test_family_paths_at_start(value):
    """Without LLMKERNELS_ARCH (or with a name it does not know) the mode is automatic: each
    family on its measured-fastest path for this CPU; a named path forces every family."""
    env = {} if value is None else {"LLMKERNELS_ARCH": value}
    report = json.loads(run_ok(FAMILY_SCRIPT, env).strip().splitlines()[-1])
    assert list(report["families"]) == FAMILIES
    if value == "avx2":
        assert not report["auto"]
        assert set(report["families"].values()) == {expected_arch("avx2")}
        return
    assert report["auto"] and report["arch"] == BEST
    for family, arch in report["families"].items():
        lower = family in ALWAYS_AVX2 or (lk._core.cpu_splits_512 and family in ZEN4_AVX2)
        want = expected_arch("avx2") if lower else BEST
        assert arch == want, (family, report)


def test_set_simd_arch_auto_and_forced():
    lk.set_simd_arch("auto")
    assert lk._core.simd_arch_automatic() and lk.simd_arch() == BEST
    auto = lk._core.family_simd_archs()
    assert lk.build_info()["kernel_paths"]["family_rope"] == auto["rope"]
    lk.set_simd_arch(BEST)  # forcing the best path forces it for every family
    assert not lk._core.simd_arch_automatic()
    assert set(lk._core.family_simd_archs().values()) == {BEST}
    lk.set_simd_arch("auto")
    assert lk._core.family_simd_archs() == auto
    with pytest.raises(ValueError, match=r"arch must be 'auto', 'sse2'"):
        lk.set_simd_arch("fastest")


def test_automatic_results_are_the_family_path_results(rng):
    """In the automatic mode each family's result is bit for bit the one of the path it runs
    (forced), for the kernels of every family."""
    x = rng.standard_normal((64, 256)).astype(np.float32)
    w = rng.standard_normal(256).astype(np.float32)
    q = rng.standard_normal((1, 4, 48, 32)).astype(np.float32)
    k = rng.standard_normal((1, 2, 48, 32)).astype(np.float32)
    wq = (rng.standard_normal((96, 256)) * 0.05).astype(np.float32)
    codes, scales = lk.quantize(wq, bits=4, group_size=32)
    calls = {
        "norm": lambda: lk.rms_norm(x, w),
        "rope": lambda: lk.rope(q, positions=np.arange(7, 55)),
        "attention": lambda: lk.attention(q, k, k, causal=True),
        "quant": lambda: lk.quantized_linear(x[:3], codes, scales, 4, 32, activations="float32"),
        "packed": lambda: lk.quantized_linear(x, codes, scales, 4, 32, activations="float32"),
        "other": lambda: lk.swiglu(x, x),
    }
    lk.set_simd_arch("auto")
    paths = lk._core.family_simd_archs()
    auto = {name: call() for name, call in calls.items()}
    for name, call in calls.items():
        lk.set_simd_arch(paths[name])
        np.testing.assert_array_equal(auto[name], call(), err_msg=name)
    lk.set_simd_arch("auto")
