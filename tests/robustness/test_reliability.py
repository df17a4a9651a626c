"""Reliability: leaks, thread safety, the GIL, fork, and numerical extremes.

* Leaks: 100,000 calls of every op on small (4, 16) float32 inputs (allocating and ``out=``
  variants, plus the error path) and 1,000 ``TransformerBlock`` / ``Transformer`` forwards grow
  the resident set (``/proc/self/statm``) by less than 2 MiB after a warm-up, and leave the
  reference counts of the inputs and ``out`` unchanged.
* Threads: 8 Python threads calling every op and a shared ``TransformerBlock`` (own KV cache
  each, prefill + decode) get results bitwise equal to serial calls; while a thread is inside
  any op's C++ call another Python thread runs and sees it there (the GIL is released; shown
  by progress, not by timing), also when both threads are in kernels.
* Fork: after the ops ran with the internal thread pool on, ``multiprocessing`` children made
  with the fork start method run every op to the parent's results, without hanging -- also
  while the parent is busy in a kernel on another thread.
* Numerical extremes: rows near the float max/min, subnormals, constant rows, +-Inf/NaN, RoPE
  positions up to 2**62, attention logits of +-1e4, fully masked rows; subnormal operands
  give the reference results (their speed is measured in benchmarks/, not here).
"""

from __future__ import annotations

import gc
import multiprocessing
import os
import sys
import threading
import time
import warnings
from collections.abc import Callable
from typing import Any

import llmkernels as lk
import numpy as np
import pytest
from conftest import TOL, cxx_inv_freq, fork_while_threads_work
from llmkernels import _ops
from llmkernels import reference as ref

F32, F64 = np.dtype(np.float32), np.dtype(np.float64)
ATTN_TOL = {F32: {"rtol": 1e-4, "atol": 1e-5}, F64: {"rtol": 1e-10, "atol": 1e-12}}
PAGE = os.sysconf("SC_PAGE_SIZE")
MiB = 1 << 20


def rss() -> int:
    """Current resident set size in bytes (ru_maxrss would be the peak)."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * PAGE


@pytest.fixture(autouse=True)
def _restore_threads():
    previous = lk.get_num_threads()
    yield
    lk.set_num_threads(previous)


# ----------------------------------------------------------------------------------------------
# leaks
# ----------------------------------------------------------------------------------------------

LEAK_CALLS = 100_000
RNG = np.random.default_rng(2024)
X = RNG.standard_normal((4, 16)).astype(np.float32)
W = RNG.standard_normal(16).astype(np.float32)
B = RNG.standard_normal(16).astype(np.float32)
UP = RNG.standard_normal((4, 16)).astype(np.float32)
OUT = np.empty((4, 16), np.float32)
X3 = X.reshape(1, 4, 16)
OUT3 = np.empty((1, 4, 16), np.float32)
POS = np.array([3, 4, 5, 6])
WG = RNG.standard_normal((16, 8)).astype(np.float32)
WU = RNG.standard_normal((16, 8)).astype(np.float32)
WD = RNG.standard_normal((8, 16)).astype(np.float32)
BH = RNG.standard_normal(8).astype(np.float32)
Q = RNG.standard_normal((1, 2, 4, 16)).astype(np.float32)
KV = RNG.standard_normal((1, 1, 6, 16)).astype(np.float32)
MASK = RNG.random((1, 1, 4, 6)) < 0.8
OUTQ = np.empty((1, 2, 4, 16), np.float32)
YARN = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 1024}
BAD_W = np.ones(15, np.float32)


def _bad_call() -> None:
    try:
        lk.rms_norm(X, BAD_W, out=OUT)
    except ValueError:
        pass


LEAK_OPS: dict[str, tuple[Callable[[], Any], list[Any]]] = {
    # name: (call, objects whose refcounts must not change)
    "rms_norm": (lambda: lk.rms_norm(X, W), [X, W]),
    "rms_norm_out_alias": (lambda: lk.rms_norm(OUT, W, out=OUT), [OUT, W]),
    "layer_norm": (lambda: lk.layer_norm(X, W, B), [X, W, B]),
    "layer_norm_out": (lambda: lk.layer_norm(X, W, B, out=OUT), [X, W, B, OUT]),
    "silu": (lambda: lk.silu(X), [X]),
    "silu_out": (lambda: lk.silu(X, out=OUT), [X, OUT]),
    "swiglu": (lambda: lk.swiglu(X, UP), [X, UP]),
    "swiglu_out": (lambda: lk.swiglu(X, UP, out=OUT), [X, UP, OUT]),
    "swiglu_ffn": (
        lambda: lk.swiglu_ffn(X, WG, WU, WD, b_gate=BH, b_up=BH, b_down=W),
        [X, WG, WU, WD, BH, W],
    ),
    "rope": (lambda: lk.rope(X3, POS), [X3, POS]),
    "rope_out_interleaved": (lambda: lk.rope(X3, POS, interleaved=True, out=OUT3), [X3, POS, OUT3]),
    "attention": (
        lambda: lk.attention(Q, KV, KV, causal=True, mask=MASK, return_weights=True),
        [Q, KV, MASK],
    ),
    "attention_out": (lambda: lk.attention(Q, KV, KV, out=OUTQ), [Q, KV, OUTQ]),
    "rope_inv_freq": (lambda: lk.rope_inv_freq(16, 10000.0, YARN), [YARN]),
    "rope_attention_factor": (lambda: lk.rope_attention_factor(YARN), [YARN]),
    "error_path": (_bad_call, [X, BAD_W, OUT]),
}


def _loop(call: Callable[[], Any], n: int) -> None:
    for _ in range(n):
        call()


def _leak_check(call: Callable[[], Any], watched: list[Any], n: int, warmup: int) -> int:
    """RSS growth over ``n`` calls after ``warmup`` calls. A leak grows with every call; a
    one-off allocation (interpreter caches, allocator arenas) does not: when the first window
    exceeds the budget the window is measured once more, and the smaller growth is returned."""
    _loop(call, warmup)
    gc.collect()
    refs = [sys.getrefcount(o) for o in watched]
    growths = []
    for _ in range(2):
        before = rss()
        _loop(call, n)
        gc.collect()
        growths.append(rss() - before)
        assert [sys.getrefcount(o) for o in watched] == refs, "reference counts changed"
        if growths[0] < 2 * MiB:
            break
    return min(growths)


@pytest.mark.parametrize("name", list(LEAK_OPS))
def test_no_leak_ops(name, record_property):
    call, watched = LEAK_OPS[name]
    lk.set_num_threads(2)
    growth = _leak_check(call, watched, LEAK_CALLS, warmup=5_000)
    record_property("rss_growth_bytes", growth)
    print(f"{name}: {LEAK_CALLS} calls, RSS growth {growth / 1024:.0f} KiB")
    assert growth < 2 * MiB, f"{name}: RSS grew by {growth / MiB:.2f} MiB over {LEAK_CALLS} calls"


BLOCK_CFG = {"dim": 64, "n_heads": 4, "n_kv_heads": 2, "hidden_dim": 128}


def test_no_leak_transformer_block(record_property):
    block = lk.TransformerBlock.from_config(BLOCK_CFG, seed=0)
    x = np.random.default_rng(0).standard_normal((2, 8, 64)).astype(np.float32)
    mask = np.ones((2, 8), bool)
    mask[1, :3] = False

    def forward() -> None:
        block(x)
        block(x, mask=mask)
        cache = block.new_cache(2, 10)  # prefill + 2 decode steps on a fresh cache
        block(x[:, :6], cache=cache)
        block(x[:, 6:7], cache=cache)
        block(x[:, 7:8], cache=cache)

    watched = [x, mask, block]
    growth = _leak_check(forward, watched, 1_000, warmup=50)
    print(
        f"TransformerBlock: 1000 x (2 forwards + prefill + 2 decodes), RSS growth "
        f"{growth / 1024:.0f} KiB"
    )
    record_property("rss_growth_bytes", growth)
    assert growth < 2 * MiB


def test_no_leak_modules_and_model(record_property):
    cfg = dict(BLOCK_CFG, n_layers=2, vocab_size=50, max_seq_len=32)
    model = lk.Transformer(cfg, seed=0)
    norm = lk.RMSNorm(64)
    ln = lk.LayerNorm(64)
    ffn = lk.FeedForward(64, 128, seed=0)
    mha = lk.MultiHeadAttention(64, 4, 2, seed=0)
    ids = np.array([[1, 2, 3, 4, 5, 6]])
    x = np.random.default_rng(0).standard_normal((1, 6, 64)).astype(np.float32)

    def forward() -> None:
        model(ids)
        model(ids, last_only=True)
        norm(x)
        ln(x)
        ffn(x)
        mha(x)
        model.state_dict()

    growth = _leak_check(forward, [ids, x, model], 1_000, warmup=50)
    gen = _leak_check(lambda: model.generate(ids, 4, progress=False), [ids], 200, warmup=10)
    print(
        f"modules/Transformer: 1000 forwards growth {growth / 1024:.0f} KiB, 200 generate "
        f"growth {gen / 1024:.0f} KiB"
    )
    record_property("rss_growth_bytes", growth + gen)
    assert growth < 2 * MiB and gen < 2 * MiB


# ----------------------------------------------------------------------------------------------
# threads: bitwise equal to serial, the GIL is released
# ----------------------------------------------------------------------------------------------

N_PY_THREADS = 8
THREAD_ITERS = 15


def _thread_cases() -> dict[str, Callable[[], Any]]:
    rng = np.random.default_rng(11)
    x = rng.standard_normal((64, 257)).astype(np.float32)
    x64 = x.astype(np.float64)
    w = rng.standard_normal(257).astype(np.float32)
    up = rng.standard_normal((64, 257)).astype(np.float32)
    wg = (rng.standard_normal((257, 96)) * 0.1).astype(np.float32)
    wu = (rng.standard_normal((257, 96)) * 0.1).astype(np.float32)
    wd = (rng.standard_normal((96, 33)) * 0.1).astype(np.float32)
    xr = rng.standard_normal((2, 4, 48, 64)).astype(np.float32)
    q = rng.standard_normal((2, 4, 48, 64)).astype(np.float32)
    k = rng.standard_normal((2, 2, 80, 64)).astype(np.float32)
    v = rng.standard_normal((2, 2, 80, 40)).astype(np.float32)
    scaling = {
        "rope_type": "llama3",
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 64,
    }
    return {
        "rms_norm": lambda: lk.rms_norm(x, w),
        "rms_norm_f64": lambda: lk.rms_norm(x64[:, ::-1], w),
        "layer_norm": lambda: lk.layer_norm(x, w, w),
        "silu": lambda: lk.silu(x),
        "swiglu": lambda: lk.swiglu(x, up),
        "swiglu_ffn": lambda: lk.swiglu_ffn(x, wg, wu, wd),
        "rope": lambda: lk.rope(xr, np.arange(48) + 1000, interleaved=True),
        "rope_scaled": lambda: lk.rope(
            xr,
            inv_freq=lk.rope_inv_freq(64, 5e5, scaling),
            attention_factor=lk.rope_attention_factor(scaling),
        ),
        "attention": lambda: lk.attention(q, k, v, causal=True),
        "attention_weights": lambda: lk.attention(q, k, v, return_weights=True)[1],
    }


def _block_decode(block: Any, x: np.ndarray, prefill: int) -> np.ndarray:
    cache = block.new_cache(x.shape[0], x.shape[1])
    parts = [block(x[:, :prefill], cache=cache)]
    for i in range(prefill, x.shape[1]):
        parts.append(block(x[:, i : i + 1], cache=cache))
    return np.concatenate(parts, axis=1)


@pytest.mark.parametrize("kernel_threads", [1, 2])
def test_threads_bitwise_equal_to_serial(kernel_threads):
    lk.set_num_threads(kernel_threads)
    cases = _thread_cases()
    block = lk.TransformerBlock.from_config(BLOCK_CFG, seed=3)
    xb = np.random.default_rng(5).standard_normal((2, 12, 64)).astype(np.float32)
    serial = {name: call() for name, call in cases.items()}
    serial["block_full"] = block(xb)
    serial["block_decode"] = _block_decode(block, xb, 7)

    barrier = threading.Barrier(N_PY_THREADS)
    errors: list[str] = []
    counts = [0] * N_PY_THREADS

    def worker(tid: int) -> None:
        try:
            barrier.wait()
            names = list(cases)
            for it in range(THREAD_ITERS):
                # a different op order per thread, so different kernels overlap
                for j in range(len(names)):
                    name = names[(j + tid + it) % len(names)]
                    got = cases[name]()
                    if not np.array_equal(got, serial[name], equal_nan=True):
                        errors.append(f"thread {tid} iter {it}: {name} differs from serial")
                    counts[tid] += 1
                if not np.array_equal(block(xb), serial["block_full"]):
                    errors.append(f"thread {tid}: block forward differs")
                if not np.array_equal(_block_decode(block, xb, 7), serial["block_decode"]):
                    errors.append(f"thread {tid}: block prefill+decode differs")
                counts[tid] += 2
        except Exception as exc:  # pragma: no cover - reported below
            errors.append(f"thread {tid}: {exc!r}")

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(N_PY_THREADS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert not any(t.is_alive() for t in threads), "a thread hung"
    assert not errors, errors[:5]
    print(
        f"{N_PY_THREADS} threads x {THREAD_ITERS} iterations: {sum(counts)} calls, "
        f"kernel threads {kernel_threads}"
    )


def _gil_cases() -> dict[str, Callable[[], Any]]:
    """Every op and module on inputs where one single-threaded call takes a few milliseconds
    (contiguous inputs of the op's dtype: the Python wrappers copy nothing)."""
    rng = np.random.default_rng(1)
    big = rng.standard_normal((1024, 2048))  # float64, 16 MiB
    w = rng.standard_normal(2048)
    q = rng.standard_normal((1, 8, 512, 64)).astype(np.float32)
    x = rng.standard_normal((256, 1024)).astype(np.float32)
    wg = rng.standard_normal((1024, 512)).astype(np.float32) * 0.02
    wd = np.ascontiguousarray(wg.T)
    block = lk.TransformerBlock.from_config({"dim": 256, "n_heads": 4, "hidden_dim": 512}, seed=0)
    xb = rng.standard_normal((1, 256, 256)).astype(np.float32)
    model = lk.Transformer(
        {"dim": 128, "n_heads": 4, "hidden_dim": 256, "n_layers": 2, "vocab_size": 4000}, seed=0
    )
    ids = rng.integers(0, 4000, (1, 256))
    return {
        "rms_norm": lambda: lk.rms_norm(big, w),
        "layer_norm": lambda: lk.layer_norm(big, w, w),
        "silu": lambda: lk.silu(big),
        "swiglu": lambda: lk.swiglu(big, big),
        "swiglu_ffn": lambda: lk.swiglu_ffn(x, wg, wg, wd),
        "rope": lambda: lk.rope(big.reshape(16, 1024, 128)),
        "attention": lambda: lk.attention(q, q, q, causal=True),
        "TransformerBlock": lambda: block(xb),
        "Transformer": lambda: model(ids),
    }


_GIL_CASES: dict[str, Callable[[], Any]] = {}


def _inside_core_call(frame: Any) -> bool:
    """Whether a thread whose innermost Python frame is ``frame`` is inside a C++ call of the
    package: an llmkernels frame stopped on a line that calls ``_core.<fn>`` or
    ``<module>._impl.<method>``."""
    import linecache

    if frame is None or not str(frame.f_globals.get("__name__", "")).startswith("llmkernels"):
        return False
    line = linecache.getline(frame.f_code.co_filename, frame.f_lineno)
    return "_core." in line or "_impl." in line


def _calls_until_seen(call: Callable[[], Any], look: Callable[[int], bool]) -> tuple[int, int]:
    """Calls ``call`` on this (the main) thread while another thread repeats ``look(main
    thread id)``, until ``look`` has returned True once, or 200 calls (a few seconds: a busy
    machine may not schedule the other thread during one call; one observation is the proof).
    The switch interval is set far beyond the test's length, so the main thread gives the GIL
    away only by releasing it itself. Returns (times ``look`` saw it, calls made)."""
    main = threading.get_ident()
    seen = [0]
    stop = threading.Event()

    def loop() -> None:
        while not stop.is_set():
            if look(main):
                seen[0] += 1

    th = threading.Thread(target=loop)
    old = sys.getswitchinterval()
    th.start()
    sys.setswitchinterval(1e4)
    try:
        calls = 0
        while seen[0] == 0 and calls < 200:
            call()
            calls += 1
    finally:
        sys.setswitchinterval(old)
        stop.set()
        th.join()
    return seen[0], calls


# every functional op (the package's own list: a new op without a case above fails here) and
# the two models
@pytest.mark.parametrize("name", [*_ops.__all__, "TransformerBlock", "Transformer"])
def test_gil_released_per_op(name):
    """While the main thread is inside an op's C++ call, another Python thread runs: it
    observes (``sys._current_frames``) the main thread stopped on the line of the package that
    calls into ``_core``. Progress, not speed: the switch interval is set far beyond the test's
    length, so the main thread gives the GIL away only by releasing it itself -- were the op to
    hold the GIL, the observer could never run while the main thread is on that line (it would
    run only after the main thread left the package's code), and the count stays 0."""
    lk.set_num_threads(1)
    if not _GIL_CASES:
        _GIL_CASES.update(_gil_cases())
    call = _GIL_CASES[name]
    call()

    def observe(main: int) -> bool:
        inside = _inside_core_call(sys._current_frames().get(main))
        time.sleep(1e-4)  # gives the GIL back (the main thread may be waiting for it)
        return inside

    observed, calls = _calls_until_seen(call, observe)
    print(
        f"{name}: the observer saw the main thread inside the C++ call {observed} times "
        f"during {calls} calls"
    )
    assert observed > 0, (
        f"{name}: no other Python thread ran during {calls} calls: the op holds the GIL"
    )


def test_gil_released_two_python_threads():
    """Kernels on two Python threads at once (what a timing ratio used to measure): thread B
    runs attention calls and, after each, looks where the main thread is, while the main thread
    runs swiglu_ffn calls. B seeing the main thread inside its C++ call means B's kernel ran
    and returned while the main thread's kernel was running without the GIL; no speed is
    measured."""
    lk.set_num_threads(1)
    if not _GIL_CASES:
        _GIL_CASES.update(_gil_cases())
    main_call, other_call = _GIL_CASES["swiglu_ffn"], _GIL_CASES["attention"]

    def other(main: int) -> bool:
        other_call()  # releases the GIL itself; then checks where the main thread is
        return _inside_core_call(sys._current_frames().get(main))

    overlapped, _ = _calls_until_seen(main_call, other)
    assert overlapped > 0, "a kernel call on one thread never overlapped one on another"


# ----------------------------------------------------------------------------------------------
# fork
# ----------------------------------------------------------------------------------------------

_FORK_CASES: dict[str, Callable[[], Any]] = {}


def _fork_child(name: str) -> tuple[str, np.ndarray, int]:
    return name, np.asarray(_FORK_CASES[name]()), os.getpid()


def _fork_cases() -> dict[str, Callable[[], Any]]:
    cases = _thread_cases()
    rng = np.random.default_rng(9)
    big = rng.standard_normal((1024, 1024)).astype(np.float32)
    w = rng.standard_normal(1024).astype(np.float32)
    q = rng.standard_normal((1, 4, 256, 64)).astype(np.float32)
    block = lk.TransformerBlock.from_config(BLOCK_CFG, seed=1)
    xb = rng.standard_normal((2, 16, 64)).astype(np.float32)
    model = lk.Transformer(dict(BLOCK_CFG, n_layers=2, vocab_size=64), seed=2)
    ids = rng.integers(0, 64, (2, 5))
    cases.update(
        {
            # big enough that the kernels split work over the internal thread pool
            "rms_norm_big": lambda: lk.rms_norm(big, w),
            "layer_norm_big": lambda: lk.layer_norm(big, w, w),
            "silu_big": lambda: lk.silu(big),
            "swiglu_big": lambda: lk.swiglu(big, big),
            "rope_big": lambda: lk.rope(big.reshape(8, 128, 1024)),
            "attention_big": lambda: lk.attention(q, q, q, causal=True),
            "block": lambda: block(xb),
            "block_decode": lambda: _block_decode(block, xb, 9),
            "generate": lambda: model.generate(ids, 3, progress=False),
        }
    )
    return cases


def _run_in_fork_pool(names: list[str], timeout: float) -> dict[str, np.ndarray]:
    ctx = multiprocessing.get_context("fork")
    with warnings.catch_warnings():
        # Python >= 3.12 warns that fork() in a multi-threaded process may deadlock: that is
        # exactly what this test checks
        warnings.simplefilter("ignore", DeprecationWarning)
        pool = ctx.Pool(2)
    try:
        res = pool.map_async(_fork_child, names).get(timeout=timeout)
    except multiprocessing.TimeoutError:
        pool.terminate()
        pool.join()
        raise AssertionError(f"fork children hung (no result within {timeout} s)") from None
    pool.close()
    pool.join()
    assert all(pid != os.getpid() for _, _, pid in res)
    return {name: arr for name, arr, _ in res}


def test_fork_after_threads():
    lk.set_num_threads(2)
    _FORK_CASES.clear()
    _FORK_CASES.update(_fork_cases())
    parent = {name: np.asarray(call()) for name, call in _FORK_CASES.items()}  # pool is warm
    children = _run_in_fork_pool(list(_FORK_CASES), timeout=120)
    for name, want in parent.items():
        np.testing.assert_array_equal(children[name], want, err_msg=f"{name} in a fork child")
    # and the parent still works after forking
    for name, call in _FORK_CASES.items():
        np.testing.assert_array_equal(np.asarray(call()), parent[name])


@fork_while_threads_work
def test_fork_while_a_thread_is_inside_a_kernel():
    """Fork while another parent thread is busy in multi-threaded kernels (the pool's locks
    may be held at the moment of fork): children must not deadlock."""
    lk.set_num_threads(2)
    _FORK_CASES.clear()
    _FORK_CASES.update(_fork_cases())
    names = ["rms_norm_big", "silu_big", "attention_big", "swiglu_ffn", "block", "rope_big"]
    parent = {name: np.asarray(_FORK_CASES[name]()) for name in names}
    stop = threading.Event()
    rng = np.random.default_rng(3)
    busy_q = rng.standard_normal((1, 8, 512, 64)).astype(np.float32)
    busy_x = rng.standard_normal((1024, 1024)).astype(np.float32)

    def busy() -> None:
        while not stop.is_set():
            lk.attention(busy_q, busy_q, busy_q)
            lk.silu(busy_x)

    th = threading.Thread(target=busy)
    th.start()
    try:
        for _ in range(3):
            children = _run_in_fork_pool(names, timeout=60)
            for name in names:
                np.testing.assert_array_equal(children[name], parent[name], err_msg=name)
    finally:
        stop.set()
        th.join()


# ----------------------------------------------------------------------------------------------
# numerical extremes
# ----------------------------------------------------------------------------------------------


def scaled_rms_norm(x: np.ndarray, eps: float) -> np.ndarray:
    """rms_norm computed in float64 on x / max|x| (an exact power-of-two-free identity:
    x / sqrt(mean(x^2) + eps) == s / sqrt(mean(s^2) + eps / m^2) with s = x / m), so rows near
    the float64 maximum or in the subnormals are evaluated without overflow/underflow."""
    x = np.asarray(x, np.float64)
    m = np.max(np.abs(x), axis=-1, keepdims=True)
    m = np.where(m > 0, m, 1.0)
    s = x / m
    with np.errstate(over="ignore", divide="ignore", invalid="ignore"):
        return s / np.sqrt(np.mean(s * s, axis=-1, keepdims=True) + eps / m / m)


def scaled_layer_norm(x: np.ndarray, eps: float) -> np.ndarray:
    x = np.asarray(x, np.float64)
    m = np.max(np.abs(x), axis=-1, keepdims=True)
    m = np.where(m > 0, m, 1.0)
    s = x / m
    c = s - s.mean(axis=-1, keepdims=True)
    with np.errstate(over="ignore", divide="ignore", invalid="ignore"):
        return c / np.sqrt(np.mean(c * c, axis=-1, keepdims=True) + eps / m / m)


def _close(got, want, dtype, tol=None):
    dtype = np.dtype(dtype)
    assert got.dtype == dtype
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want), err_msg="NaN positions differ")
    fin = np.isfinite(want)
    np.testing.assert_allclose(got[fin], want[fin], **(tol or TOL)[dtype])


PATTERN = np.array([1.0, -0.5, 0.25, -1.0, 0.75, 0.1, -0.9] * 5)


@pytest.mark.parametrize("scale", [1e30, -1e30, 1e20, 1e-30, 1e-37])
@pytest.mark.parametrize("d", [1, 7, 35, 1000])
def test_norms_float32_overflow_safe_range(scale, d):
    """float32 rows with |x| up to 1e30 normalise correctly (and the tiny side,
    where squares underflow)."""
    x = (np.resize(PATTERN, (3, d)) * scale).astype(np.float32)
    x[1] *= 0.5
    for eps in (0.0, 1e-6):
        _close(lk.rms_norm(x, eps=eps), scaled_rms_norm(x, eps), F32)
        if d > 1:
            _close(lk.layer_norm(x, eps=eps), scaled_layer_norm(x, eps), F32)


@pytest.mark.parametrize("dtype", [F32, F64])
@pytest.mark.parametrize("where", ["max", "near_max_mixed", "min_normal"])
def test_norms_near_float_max_and_min(dtype, where):
    """Beyond §4's float32 1e30: rows at the very top of the dtype's range (float32 3.4e38,
    float64 1.8e308) and at its smallest normal numbers are finite input with a finite,
    O(1) normalised answer (computed here on x / max|x| in float64)."""
    fi = np.finfo(dtype)
    if where == "max":
        x = (PATTERN * fi.max).astype(dtype)[None]
    elif where == "near_max_mixed":
        x = np.concatenate([PATTERN[:17] * fi.max / 2, PATTERN[:16] * 1e-3]).astype(dtype)[None]
    else:
        x = (PATTERN * fi.tiny * 4).astype(dtype)[None]  # smallest normal numbers
    for eps in (0.0, 1e-6):
        _close(lk.rms_norm(x, eps=eps), scaled_rms_norm(x, eps), dtype)
        _close(lk.layer_norm(x, eps=eps), scaled_layer_norm(x, eps), dtype)
    with np.errstate(over="ignore"):
        _close(lk.silu(x), ref.silu(x), dtype)


@pytest.mark.parametrize("dtype", [F32, F64])
@pytest.mark.parametrize("eps", [1e-6, 0.0])
@pytest.mark.parametrize("d", [1, 8, 33])
def test_norms_of_subnormal_rows(dtype, eps, d):
    """Rows whose entries are all subnormal are finite input: the result is never NaN. With
    eps > 0 the exact values are ~x/sqrt(eps) (tiny; flushing them to 0 is within atol); with
    eps = 0 the row normalises to O(1) values (the overflow/underflow-safe path)."""
    fi = np.finfo(dtype)
    sub = fi.smallest_subnormal * np.array([3, -1000, 70000, -2, 5] * 7)[:d]  # x0.5 stays != 0
    x = np.stack([sub, sub * 0.5, np.full(d, fi.tiny / 4)]).astype(dtype)
    assert np.all(np.abs(x) < fi.tiny) and np.all(x != 0)
    for name, got, want in [
        ("rms_norm", lk.rms_norm(x, eps=eps), scaled_rms_norm(x, eps)),
        ("layer_norm", lk.layer_norm(x, eps=eps), scaled_layer_norm(x, eps)),
    ]:
        # NaN only where the exact answer is 0/0 (constant rows with eps = 0)
        np.testing.assert_array_equal(
            np.isnan(got),
            np.isnan(want),
            err_msg=f"{name} of subnormal rows: NaN positions, got {got}",
        )
        _close(got, want, dtype)


@pytest.mark.parametrize("dtype", [F32, F64])
def test_elementwise_subnormals_and_specials(dtype):
    fi = np.finfo(dtype)
    specials = np.array(
        [
            0.0,
            -0.0,
            fi.smallest_subnormal,
            -fi.smallest_subnormal,
            fi.tiny,
            -fi.tiny,
            fi.tiny / 3,
            fi.max,
            -fi.max,
            np.inf,
            -np.inf,
            np.nan,
            1e-3,
            -88.72,
            88.72,
            -103.97,
            -745.1,
            709.8,
            1.0,
            -1.0,
        ],
        dtype,
    )
    with np.errstate(over="ignore", invalid="ignore"):
        for got, want in [
            (lk.silu(specials), ref.silu(specials)),
            (lk.swiglu(specials, specials[::-1]), ref.swiglu(specials, specials[::-1])),
        ]:
            np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
            inf = np.isinf(want)
            np.testing.assert_array_equal(got[inf], want[inf])
            fin = np.isfinite(want)
            np.testing.assert_allclose(got[fin], want[fin], **TOL[dtype])


@pytest.mark.parametrize("dtype", [F32, F64])
@pytest.mark.parametrize("value", [3.3, 77.7, 100.1, 993.0098, 3333.3333, -1e4 / 3, 1e-3, 1e20])
def test_layer_norm_constant_rows_give_bias(dtype, value):
    """All-equal rows: x - mean = 0, LayerNorm returns the bias (torch does, exactly)."""
    for d in (6, 7, 33, 95, 1000):
        x = np.full((3, d), value, dtype)
        bias = np.linspace(-1, 1, d).astype(dtype)
        w = np.full(d, 2.0, dtype)
        got = lk.layer_norm(x, w, bias)
        np.testing.assert_allclose(
            got,
            np.broadcast_to(bias, x.shape),
            rtol=0,
            atol=TOL[dtype]["atol"],
            err_msg=f"layer_norm of rows of {d} x {value}",
        )
        # rms_norm of a constant row is sign(value) * weight
        np.testing.assert_allclose(
            lk.rms_norm(x, w, eps=0.0), np.sign(value) * w[None] + 0 * x, **TOL[dtype]
        )


@pytest.mark.parametrize("dtype", [F32, F64])
def test_nan_inf_propagate_every_op(dtype):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((4, 6, 16)).astype(dtype)
    x[0, 1, 3] = np.nan
    x[1, 2, 5] = np.inf
    x[2, 0, 0] = -np.inf
    w = rng.standard_normal(16).astype(dtype)
    pos = np.arange(6)
    with np.errstate(all="ignore"):
        pairs = [
            ("rms_norm", lk.rms_norm(x, w), ref.rms_norm(x, w)),
            ("layer_norm", lk.layer_norm(x, w, w), ref.layer_norm(x, w, w)),
            ("silu", lk.silu(x), ref.silu(x)),
            ("swiglu", lk.swiglu(x, x[::-1]), ref.swiglu(x, x[::-1])),
            ("rope", lk.rope(x, pos), ref.rope(x, pos)),
            (
                "rope_interleaved",
                lk.rope(x, pos, interleaved=True),
                ref.rope(x, pos, interleaved=True),
            ),
            (
                "swiglu_ffn",
                lk.swiglu_ffn(x, w[:, None] * np.ones((1, 5), dtype), np.ones((16, 5), dtype)),
                ref.swiglu_ffn(x, w[:, None] * np.ones((1, 5), dtype), np.ones((16, 5), dtype)),
            ),
        ]
        q, k, v = x[None, :, :, :], x[None, :2, :, :], x[None, 2:, :, :]
        for causal in (False, True):
            got = lk.attention(q, k, v, causal=causal)
            want = ref.attention(q, k, v, causal=causal)
            pairs += [("attention", got, want)]
    for name, got, want in pairs:
        np.testing.assert_array_equal(np.isnan(got), np.isnan(want), err_msg=f"{name}: NaN")
        inf = np.isinf(want)
        np.testing.assert_array_equal(got[inf], want[inf], err_msg=f"{name}: Inf")
        fin = np.isfinite(want)
        tol = ATTN_TOL if name.startswith("attention") or name == "swiglu_ffn" else TOL
        np.testing.assert_allclose(got[fin], want[fin], **tol[dtype], err_msg=name)


@pytest.mark.parametrize("dtype", [F32, F64])
def test_attention_weights_with_nan_logits(dtype):
    """A NaN logit makes the softmax denominator NaN, so under IEEE arithmetic (and in the
    reference) the whole weights row is NaN -- as the output row is. The returned weights
    must not claim finite probabilities for that row."""
    q = np.ones((1, 2, 4), dtype)
    k = np.ones((1, 3, 4), dtype)
    k[0, 1, 2] = np.nan
    v = np.arange(12, dtype=dtype).reshape(1, 3, 4)
    out, w = lk.attention(q, k, v, return_weights=True)
    want_out, want_w = ref.attention(q, k, v, return_weights=True)
    assert np.isnan(want_w).all() and np.isnan(want_out).all()
    assert np.isnan(out).all()
    np.testing.assert_array_equal(np.isnan(w), np.isnan(want_w), err_msg=f"weights {w}")


@pytest.mark.parametrize("dtype", [F32, F64])
@pytest.mark.parametrize("base", [2**24, 2**24 + 1, 2**31, 2**32 + 7, 2**40, 2**53 - 10, 2**62])
@pytest.mark.parametrize("interleaved", [False, True])
def test_rope_huge_positions(dtype, base, interleaved):
    """Angles are formed in float64 from int64 positions: float32 and float64 results match the
    reference at positions where float32 angles would be meaningless."""
    rng = np.random.default_rng(base % 1000)
    x = rng.standard_normal((2, 5, 64)).astype(dtype)
    pos = base + np.array([0, 1, 2, 17, 1000])
    # (the reference is given the core's frequencies: at these positions one ulp of a frequency
    # moves an angle by up to 512 rad, so only the angle arithmetic is compared)
    for kw, freqs in (
        ({}, cxx_inv_freq(64)),
        ({"theta": 500000.0}, cxx_inv_freq(64, 500000.0)),
        ({"inv_freq": np.array([0.1] + [1e-3] * 31)}, None),
        ({"rotary_dim": 32, "attention_factor": 1.3}, cxx_inv_freq(32)),
    ):
        got = lk.rope(x, pos, interleaved=interleaved, **kw)
        ref_kw = {k: v for k, v in kw.items() if k != "theta"}
        if freqs is not None:
            ref_kw["inv_freq"] = freqs
        _close(got, ref.rope(x, pos, interleaved=interleaved, **ref_kw), dtype)
    # consecutive positions stay distinct rotations (no float32 position rounding) up to 2**53,
    # where float64 -- the angle's precision by design -- stops representing every integer
    if base + 1 < 2**53:
        a = lk.rope(x[:1, :1], [base], inv_freq=np.ones(32))
        b = lk.rope(x[:1, :1], [base + 1], inv_freq=np.ones(32))
        assert not np.array_equal(a, b)
    # per-row (broadcast) huge positions
    pos2 = (base + rng.integers(0, 1000, (2, 5))).astype(np.int64)
    _close(lk.rope(x, pos2), ref.rope(x, pos2, inv_freq=cxx_inv_freq(64)), dtype)


def test_rope_position_range_checks():
    x = np.ones((2, 8), np.float32)
    with pytest.raises(ValueError, match=r"^\[rope\] positions must be < 2\*\*63"):
        lk.rope(x, np.array([2**63, 2**63 + 1], np.uint64))
    top = np.array([2**63 - 2, 2**63 - 1], np.int64)  # int64 max: finite, no overflow
    got = lk.rope(x, top)
    assert np.isfinite(got).all()
    _close(got, ref.rope(x, top, inv_freq=cxx_inv_freq(8)), F32)


def _exact_qk(rng, shape, lo, hi, dtype):
    return rng.integers(lo, hi + 1, shape).astype(dtype)


def _check_softmax_rounding(got, gw, want, ww, logit_abs, v, dtype):
    """A float softmax may round each logit (or logit * log2(e)) once; for |logit| ~ 1e4 that
    moves a float32 weight by up to ~2 u |logit| relative (3.6e-4 at 1e4): a limit of the
    format, above ATTN_TOL's rtol. Allowed: ATTN_TOL + w * 4 u max_row|logit| (over the keys
    with non-zero weight), and the matching bound on the output."""
    u = 2.0**-24 if dtype == F32 else 2.0**-53
    big = np.max(np.where(ww > 0, logit_abs, 0.0), axis=-1, keepdims=True)
    w_err = ww * 4 * u * big
    tol = ATTN_TOL[dtype]
    np.testing.assert_array_less(np.abs(gw - ww), w_err + tol["rtol"] * ww + tol["atol"])
    out_err = w_err @ np.abs(v.astype(np.float64)) + tol["rtol"] * np.abs(want) + tol["atol"]
    np.testing.assert_array_less(np.abs(got - want), out_err)


@pytest.mark.parametrize("dtype", [F32, F64])
def test_attention_extreme_logits(dtype):
    """Logits of +-1e4 (exact in float32: small integer q, k and scale=1): softmax stays
    max-subtracted, rows become one-hot or uniform, no NaN/Inf."""
    rng = np.random.default_rng(7)
    d, tq, tk = 4, 9, 70
    q = _exact_qk(rng, (2, tq, d), -50, 50, dtype)
    k = _exact_qk(rng, (2, tk, d), -50, 50, dtype)
    v = rng.standard_normal((2, tk, 24)).astype(dtype)
    got, gw = lk.attention(q, k, v, scale=1.0, return_weights=True)
    want, ww = ref.attention(q, k, v, scale=1.0, return_weights=True)
    logits = np.einsum("hqd,hkd->hqk", q.astype(np.float64), k)
    assert np.abs(logits).max() > 5e3
    assert np.isfinite(got).all() and np.isfinite(gw).all()
    _check_softmax_rounding(got, gw, want, ww, np.abs(logits), v, dtype)
    # all logits equal at +1e4 / -1e4: uniform weights
    for c in (1e4, -1e4):
        qc = np.full((1, 3, 1), c, dtype)
        kc = np.ones((1, tk, 1), dtype)
        out, wts = lk.attention(qc, kc, v[:1], scale=1.0, return_weights=True)
        np.testing.assert_allclose(wts, 1.0 / tk, rtol=1e-6 if dtype == F32 else 1e-14)
        _close(out, ref.attention(qc, kc, v[:1], scale=1.0), dtype, ATTN_TOL)
    # additive masks of +-1e4, -1e30, -finfo.max and -inf
    fmax = float(np.finfo(dtype).max)
    mask = rng.choice(np.array([0.0, 1e4, -1e4, -1e30, -fmax, -np.inf]), size=(tq, tk))
    mask = mask.astype(dtype)
    q1 = rng.standard_normal((2, tq, d)).astype(dtype)
    k1 = (k / 50).astype(dtype)
    got, gw = lk.attention(q1, k1, v, mask=mask, return_weights=True)
    want, ww = ref.attention(q1, k1, v, mask=mask, return_weights=True)
    assert not np.isnan(got).any()
    logits = np.abs(np.einsum("hqd,hkd->hqk", q1.astype(np.float64), k1) / 2.0)
    logits = logits + np.where(np.isfinite(mask), np.abs(mask.astype(np.float64)), 0.0)
    _check_softmax_rounding(got, gw, want, ww, logits, v, dtype)


@pytest.mark.parametrize("dtype", [F32, F64])
def test_attention_fully_masked_rows_are_zero(dtype):
    rng = np.random.default_rng(8)
    q = rng.standard_normal((2, 3, 10, 16)).astype(dtype)
    k = rng.standard_normal((2, 3, 12, 16)).astype(dtype)
    v = rng.standard_normal((2, 3, 12, 8)).astype(dtype)
    bmask = rng.random((2, 1, 10, 12)) < 0.5
    bmask[0, 0, 3] = False  # row 3 of batch 0: nothing to attend
    bmask[1, 0, :, :] = False  # all of batch 1
    amask = np.where(bmask, 0.0, -np.inf).astype(dtype)
    for m in (bmask, amask):
        out, w = lk.attention(q, k, v, mask=m, return_weights=True)
        assert not np.isnan(out).any() and not np.isnan(w).any()
        assert np.all(out[0, :, 3] == 0) and np.all(w[0, :, 3] == 0)
        assert np.all(out[1] == 0) and np.all(w[1] == 0)
        _close(out, ref.attention(q, k, v, mask=m), dtype, ATTN_TOL)
    # causal with Tq > Tk: the first Tq - Tk query rows see no key
    q2 = rng.standard_normal((2, 15, 16)).astype(dtype)
    k2, v2 = k[0, :2, :6], v[0, :2, :6]
    out = lk.attention(q2, k2, v2, causal=True)
    assert np.all(out[:, :9] == 0)
    _close(out, ref.attention(q2, k2, v2, causal=True), dtype, ATTN_TOL)
    # causal combined with a mask that removes the remaining keys
    out = lk.attention(q2, k2, v2, causal=True, mask=np.zeros(6, bool))
    assert np.all(out == 0)


@pytest.mark.parametrize(
    ("op", "value"),
    [
        ("silu", 1e-40),
        ("silu", -90.0),
        ("swiglu", 1e-40),
        ("swiglu", -90.0),
        ("rms_norm", 1e-40),
        ("layer_norm", 1e-40),
        ("rope", 1e-40),
    ],
    ids=[
        "silu-subnormal",
        "silu-(-90)",
        "swiglu-subnormal",
        "swiglu-(-90)",
        "rms_norm-subnormal",
        "layer_norm-subnormal",
        "rope-subnormal",
    ],
)
def test_denormal_operands_give_reference_results(op, value, isa):
    """No denormal slowdowns (flush or avoid) is a speed rule, measured in
    benchmarks/; what a test can hold without a clock is the result. Arrays of subnormals
    (1e-40 float32), of values whose exp(x) intermediate is subnormal (silu(-90):
    exp(-90) = 8e-40), and the same values interleaved with normal ones (every vector lane
    sees both): the results are finite and match the float64 reference within the contract's
    tolerance, and the results of the normal operands beside them are exact to the relative
    tolerance alone (absolute tolerance: the smallest normal float32) -- a subnormal operand
    in a vector must not disturb its neighbours' lanes."""
    tiny = float(np.finfo(np.float32).tiny)
    n = 1 << 14
    normal_value = 0.75 if value > 0 else -20.0
    sub = np.full(n, value, np.float32).reshape(-1, 1024)
    mixed = sub.copy()
    mixed.reshape(-1)[::3] = normal_value  # subnormal and normal operands side by side
    up = np.full_like(sub, 0.75)
    calls = {
        "silu": (lambda a: lk.silu(a), lambda a: ref.silu(a)),
        "swiglu": (lambda a: lk.swiglu(a, up), lambda a: ref.swiglu(a, up)),
        "rms_norm": (lambda a: lk.rms_norm(a), lambda a: ref.rms_norm(a)),
        "layer_norm": (lambda a: lk.layer_norm(a), lambda a: ref.layer_norm(a)),
        "rope": (
            lambda a: lk.rope(a.reshape(1, -1, 128)).reshape(a.shape),
            lambda a: ref.rope(a.reshape(1, -1, 128)).reshape(a.shape),
        ),
    }
    got_fn, want_fn = calls[op]
    normal_lanes = (mixed == normal_value) if op in ("silu", "swiglu") else slice(None)
    with np.errstate(all="ignore"):
        for a in (sub, mixed):
            got, want = got_fn(a), want_fn(a)
            assert got.dtype == np.float32 and np.isfinite(got).all()
            np.testing.assert_allclose(got, want, **TOL[np.dtype(np.float32)])
        # elementwise ops: the results of the normal operands; rows (norms) and pairs (rope)
        # mix the operands: the whole result
        np.testing.assert_allclose(got[normal_lanes], want[normal_lanes], rtol=2e-5, atol=tiny)


# --------------------------------------------------------------------------------------------
# reads stay inside the arrays: inputs that end right before an unreadable page
# --------------------------------------------------------------------------------------------

_GUARD_SCRIPT = r"""
import ctypes, mmap, sys
import numpy as np
import llmkernels as lk
from llmkernels import reference

PAGE = mmap.PAGESIZE
libc = ctypes.CDLL(None, use_errno=True)
libc.mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
keep = []

def guarded(a):
    # a copy of `a` whose last byte is followed by a PROT_NONE page: reading past it faults
    a = np.ascontiguousarray(a)
    pages = -(-a.nbytes // PAGE) + 1
    mm = mmap.mmap(-1, pages * PAGE)
    buf = np.frombuffer(mm, np.uint8)
    assert libc.mprotect(buf.ctypes.data + (pages - 1) * PAGE, PAGE, 0) == 0
    start = (pages - 1) * PAGE - a.nbytes
    out = buf[start:start + a.nbytes].view(a.dtype).reshape(a.shape)
    out[...] = a
    keep.append(mm)
    return out

rng = np.random.default_rng(0)
for arch in sys.argv[1:]:
    lk.set_simd_arch(arch)
    for dtype in (np.float32, np.float64):
        for d in (1, 4, 7, 8, 12, 33):
            x = guarded(rng.standard_normal((3, d)).astype(dtype))
            lk.rms_norm(x, guarded(np.ones(d, dtype)))
            lk.layer_norm(x, guarded(np.ones(d, dtype)), guarded(np.zeros(d, dtype)))
            lk.swiglu(x, guarded(x.copy()))
            if d % 2 == 0:
                lk.rope(guarded(rng.standard_normal((1, 2, 3, d)).astype(dtype)))
            for tq, tk in ((1, 5), (3, 3), (9, 4)):
                q = guarded(rng.standard_normal((2, tq, d)).astype(dtype))
                k = guarded(rng.standard_normal((1, tk, d)).astype(dtype))
                v = guarded(rng.standard_normal((1, tk, d)).astype(dtype))
                got = lk.attention(q, k, v, causal=True)
                want = reference.attention(q, k, v, causal=True)
                assert np.allclose(got, want, rtol=1e-4, atol=1e-5), (arch, dtype, d, tq, tk)
print("ok")
"""


def test_reads_stay_inside_arrays():
    """Every kernel on inputs that end right before an unreadable page, on every SIMD path and
    at head and row sizes that are and are not multiples of each vector width (a vector load
    past the last row would fault; this found one in the attention kernel's P.V product)."""
    import subprocess

    from conftest import SUPPORTED_ISAS

    proc = subprocess.run(
        [sys.executable, "-c", _GUARD_SCRIPT, *SUPPORTED_ISAS],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr[-3000:]
