#!/usr/bin/env python
"""Side-by-side benchmarks: llmkernels vs torch (CPU) vs NumPy vs pure Python.

Usage::

    python benchmarks/run.py [--quick] [--out benchmarks/results]

What it does (DESIGN.md §5):

1. A roofline probe: fp32 FMA peak (GFLOP/s) and STREAM-triad bandwidth (GB/s) at 1 and 2
   threads, medians of a few repeats, measured by the extension itself.
2. Each op, float32, every peer in this process and run, at 1 and 2 threads: medians of
   repeated ``time.perf_counter`` timings after warm-up. Memory-bound ops are reported in GB/s
   and as a fraction of the triad bandwidth at the same thread count; the SwiGLU FFN in
   GFLOP/s and as a fraction of the FMA peak. ``x lk`` is a peer's time divided by
   llmkernels' time (above 1: llmkernels is faster). The thread-scaling column (1T time over
   2T time) sits next to the probe's own 2T/1T ratio, the most a memory-bound op can gain.
3. Pure Python at toy sizes, per element (per FLOP for the FFN), to show the gap.
4. RMSNorm GB/s against the row length at a fixed total size.

Results go to ``<out>/results.md`` (the printed tables) and ``<out>/results.json``.
``--quick`` (smaller shapes, fewer repeats) is a smoke test that finishes in well under 30 s.
"""

from __future__ import annotations

import argparse
import ctypes
import dataclasses
import gc
import json
import math
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import llmkernels as lk
import numpy as np
from llmkernels import pure

# Optional peers (extra "bench"), imported by import_peers() once the options are known.
torch: Any = None
F: Any = None
apply_rotary_pos_emb: Any = None

LK = "llmkernels"
LK_ALLOC = "llmkernels (no out=)"
TORCH = "torch"
HF = "HF apply_rotary_pos_emb"
NUMPY = "NumPy"

Impls = dict[str, Callable[[], Any]]


# --------------------------------------------------------------------------------------
# configuration
# --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Config:
    """Shapes and repeat counts of one benchmark run."""

    quick: bool
    threads: tuple[int, ...]
    rounds: int  # measurement rounds; every peer runs once per round, in turn
    warmup: int  # untimed calls of a peer at the start of each of its rounds
    repeats: int  # timed calls of a peer, over all rounds
    ffn_repeats: int
    probe_repeats: int
    triad_n: int
    triad_inner: int  # the probe's own best-of count
    fma_iters: int
    norm_shape: tuple[int, int]
    swiglu_shape: tuple[int, int]
    rope_shape: tuple[int, int, int, int]
    ffn_shape: tuple[int, int, int]  # (tokens, d_model, d_ff)
    row_lengths: tuple[int, ...]
    row_elements: int  # total elements of each row-length case
    pure_len: int  # toy row length for the pure-Python elementwise ops
    pure_rope_shape: tuple[int, int, int, int]
    pure_ffn_shape: tuple[int, int, int]
    attn_prefill_shape: tuple[int, int, int, int]  # (B, H, T, D), Tq = Tk = T
    attn_prefill_repeats: int
    attn_decode_shape: tuple[int, int, int, int, int]  # (B, Hq, Hkv, Tk, D), Tq = 1
    attn_decode_repeats: int
    attn_scaling_shape: tuple[int, int]  # (H, D) of the T sweep, B = 1, non-causal
    attn_scaling_lengths: tuple[int, ...]
    attn_scaling_numpy_max_t: int  # NumPy's peak memory is measured up to this T
    quiet_wait: float  # max seconds to wait for other processes to go idle before timing
    scaling_rounds: int = 12  # rounds of the paired thread-scaling measurement


FULL = Config(
    quick=False,
    threads=(1, 2),
    rounds=3,
    warmup=1,
    repeats=15,
    ffn_repeats=6,
    probe_repeats=5,
    triad_n=50_000_000,
    triad_inner=2,
    fma_iters=50_000_000,
    norm_shape=(4096, 4096),
    swiglu_shape=(4096, 11008),
    rope_shape=(1, 32, 2048, 128),
    ffn_shape=(512, 2048, 5632),
    row_lengths=(1024, 2048, 4096, 8192, 16384),
    row_elements=4096 * 4096,
    pure_len=4096,
    pure_rope_shape=(1, 1, 16, 128),
    pure_ffn_shape=(1, 256, 688),
    attn_prefill_shape=(1, 32, 2048, 128),
    attn_prefill_repeats=6,
    attn_decode_shape=(1, 32, 8, 4096, 128),
    attn_decode_repeats=200,
    attn_scaling_shape=(8, 128),
    attn_scaling_lengths=(256, 512, 1024, 2048, 4096, 8192),
    attn_scaling_numpy_max_t=4096,
    quiet_wait=60.0,
)

QUICK = Config(
    quick=True,
    threads=(1, 2),
    rounds=1,
    warmup=1,
    repeats=3,
    ffn_repeats=2,
    probe_repeats=1,
    triad_n=10_000_000,
    triad_inner=2,
    fma_iters=10_000_000,
    norm_shape=(1024, 4096),
    swiglu_shape=(1024, 2752),
    rope_shape=(1, 8, 1024, 128),
    ffn_shape=(128, 512, 1408),
    row_lengths=(1024, 4096, 16384),
    row_elements=1024 * 4096,
    pure_len=1024,
    pure_rope_shape=(1, 1, 8, 64),
    pure_ffn_shape=(1, 64, 172),
    attn_prefill_shape=(1, 8, 512, 128),
    attn_prefill_repeats=3,
    attn_decode_shape=(1, 32, 8, 1024, 128),
    attn_decode_repeats=20,
    attn_scaling_shape=(8, 64),
    attn_scaling_lengths=(128, 256, 512, 1024),
    attn_scaling_numpy_max_t=512,
    quiet_wait=0.0,
    scaling_rounds=2,
)


def import_peers(torch_thp: bool) -> None:
    """Import torch and transformers when installed.

    ``torch_thp`` sets ``THP_MEM_ALLOC_ENABLE=1`` first: torch then asks for transparent huge
    pages for its large allocations (NumPy does so by default). Off by default, to time torch
    as users get it.
    """
    global torch, F, apply_rotary_pos_emb
    if torch_thp:
        os.environ["THP_MEM_ALLOC_ENABLE"] = "1"
    try:
        import torch as _torch
        import torch.nn.functional as _functional

        torch, F = _torch, _functional
    except ImportError:
        return
    try:
        from transformers.models.llama.modeling_llama import apply_rotary_pos_emb as _apply

        apply_rotary_pos_emb = _apply
    except ImportError:
        pass


# --------------------------------------------------------------------------------------
# threads and timing
# --------------------------------------------------------------------------------------


class NumpyBlasThreads:
    """Set the thread count of NumPy's bundled OpenBLAS (what threadpoolctl does), via ctypes.

    NumPy's elementwise ops are single-threaded; only its matmuls use threads. If the library
    or its symbol cannot be found, NumPy keeps its default and ``controlled`` is False.
    """

    def __init__(self) -> None:
        self._set: Callable[[int], Any] | None = None
        try:
            with open("/proc/self/maps") as maps:
                paths = {line.split()[-1] for line in maps if "openblas" in line.lower()}
        except OSError:
            paths = set()
        for path in sorted(paths):
            if "numpy" not in path:
                continue  # llmkernels' own OpenBLAS is set by lk.set_num_threads
            lib = ctypes.CDLL(path)
            for symbol in (
                "scipy_openblas_set_num_threads64_",
                "openblas_set_num_threads64_",
                "openblas_set_num_threads",
            ):
                if hasattr(lib, symbol):
                    self._set = getattr(lib, symbol)
                    return

    @property
    def controlled(self) -> bool:
        """Whether NumPy's BLAS thread count can be set."""
        return self._set is not None

    def __call__(self, n: int) -> None:
        if self._set is not None:
            self._set(ctypes.c_int(n))


NUMPY_BLAS_THREADS = NumpyBlasThreads()


def set_threads(n: int) -> None:
    """Use ``n`` threads in every library: llmkernels (+ its OpenBLAS), torch, NumPy's BLAS."""
    lk.set_num_threads(n)
    if torch is not None:
        torch.set_num_threads(n)
    NUMPY_BLAS_THREADS(n)


class OtherLoad:
    """CPUs kept busy by *other* processes while a block runs (the machine is shared).

    From ``/proc/stat`` (all CPUs' busy time) minus this process's own CPU time
    (``os.times``), over the wall time. ``cpus`` is ``None`` where ``/proc/stat`` is missing.
    """

    def __init__(self) -> None:
        self.cpus: float | None = None

    @staticmethod
    def _system_busy_s() -> float | None:
        try:
            with open("/proc/stat") as f:
                fields = [int(v) for v in f.readline().split()[1:]]
        except (OSError, ValueError):
            return None
        idle = fields[3] + (fields[4] if len(fields) > 4 else 0)
        return (sum(fields[:8]) - idle) / os.sysconf("SC_CLK_TCK")

    @staticmethod
    def _own_s() -> float:
        t = os.times()
        return t.user + t.system

    def __enter__(self) -> OtherLoad:
        self._busy0, self._own0, self._t0 = self._system_busy_s(), self._own_s(), time.time()
        return self

    def __exit__(self, *exc: object) -> None:
        busy1, wall = self._system_busy_s(), time.time() - self._t0
        if busy1 is not None and self._busy0 is not None and wall > 0:
            other = (busy1 - self._busy0) - (self._own_s() - self._own0)
            self.cpus = max(0.0, other / wall)


@contextmanager
def no_gc() -> Iterator[None]:
    """Keep the cyclic garbage collector out of the timed region."""
    enabled = gc.isenabled()
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def wait_for_quiet(max_wait: float, threshold: float = 0.25, window: float = 0.5) -> float:
    """Wait (at most ``max_wait`` s) until other processes use under ``threshold`` CPUs.

    Returns the seconds waited. The machines are shared; a busy second core spoils
    2-thread timings (and OpenMP-based peers suffer far more than the others).
    """
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < max_wait:
        with OtherLoad() as load:
            time.sleep(window)
        if load.cpus is None or load.cpus < threshold:
            break
    return time.perf_counter() - t0


def measure_quietly(
    impls: Impls, cfg: Config, repeats: int | None = None, rounds: int | None = None
) -> tuple[dict[str, list[float]], float | None]:
    """:func:`measure` after :func:`wait_for_quiet`; measured again (once) if other processes
    kept more than half a CPU busy meanwhile. Returns the samples of the quieter attempt and
    the CPUs other processes used during it."""
    best: tuple[dict[str, list[float]], float | None] | None = None
    for _ in range(2 if cfg.quiet_wait > 0 else 1):
        wait_for_quiet(cfg.quiet_wait)
        with OtherLoad() as load:
            samples = measure(impls, cfg, repeats, rounds)
        if best is None or (load.cpus or 0.0) < (best[1] or 0.0):
            best = (samples, load.cpus)
        if (load.cpus or 0.0) <= 0.5:
            break
    assert best is not None
    return best


def measure(
    impls: Impls, cfg: Config, repeats: int | None = None, rounds: int | None = None
) -> dict[str, list[float]]:
    """Time every peer: ``rounds`` (default ``cfg.rounds``) rounds, each peer's block in turn.

    Each block starts with ``cfg.warmup`` untimed calls (which also lets the previous peer's
    spinning worker threads go to sleep), then times its share of ``repeats`` calls. Rounds
    spread slow drift of a shared machine over all peers alike. Returns seconds per call.
    """
    repeats = cfg.repeats if repeats is None else repeats
    rounds = cfg.rounds if rounds is None else rounds
    per_round = max(1, math.ceil(repeats / rounds))
    samples: dict[str, list[float]] = {name: [] for name in impls}
    with no_gc():
        for _ in range(rounds):
            for name, fn in impls.items():
                for _ in range(cfg.warmup):
                    fn()
                for _ in range(per_round):
                    t0 = time.perf_counter()
                    fn()
                    samples[name].append(time.perf_counter() - t0)
    return samples


def time_per_call(fn: Callable[[], Any], samples: int, min_time: float = 0.02) -> float:
    """Median seconds per call of a fast ``fn``: each sample loops until ``min_time`` passes."""
    fn()
    t0 = time.perf_counter()
    fn()
    once = max(time.perf_counter() - t0, 1e-9)
    number = max(1, int(min_time / once))
    times = []
    with no_gc():
        for _ in range(samples):
            t0 = time.perf_counter()
            for _ in range(number):
                fn()
            times.append((time.perf_counter() - t0) / number)
    return statistics.median(times)


# --------------------------------------------------------------------------------------
# roofline probe
# --------------------------------------------------------------------------------------


def roofline_probe(cfg: Config) -> dict[str, Any]:
    """fp32 FMA peak and triad bandwidth per thread count: medians over ``probe_repeats``."""
    core = lk._core
    core._probe_fma_gflops(1, cfg.fma_iters)  # let the clock ramp up
    fma: dict[int, list[float]] = {t: [] for t in cfg.threads}
    triad: dict[int, list[float]] = {t: [] for t in cfg.threads}
    wait_for_quiet(cfg.quiet_wait)
    with OtherLoad() as load:
        for _ in range(cfg.probe_repeats):
            for t in cfg.threads:
                fma[t].append(core._probe_fma_gflops(t, cfg.fma_iters))
                triad[t].append(core._probe_triad_gbs(t, cfg.triad_n, cfg.triad_inner))
    lo, hi = min(cfg.threads), max(cfg.threads)
    fma_med = {t: statistics.median(v) for t, v in fma.items()}
    triad_med = {t: statistics.median(v) for t, v in triad.items()}
    return {
        "fma_gflops": {str(t): {"median": fma_med[t], "samples": fma[t]} for t in cfg.threads},
        "triad_gbs": {str(t): {"median": triad_med[t], "samples": triad[t]} for t in cfg.threads},
        "fma_scaling": fma_med[hi] / fma_med[lo],
        "triad_scaling": triad_med[hi] / triad_med[lo],
        "triad_n": cfg.triad_n,
        "fma_iterations": cfg.fma_iters,
        "other_processes_cpus": load.cpus,
    }


def roof(probe: dict[str, Any], metric: str, threads: int) -> float:
    """The roofline number an op of ``metric`` is compared with at ``threads``."""
    key = "triad_gbs" if metric == "GB/s" else "fma_gflops"
    return float(probe[key][str(threads)]["median"])


# --------------------------------------------------------------------------------------
# peers
# --------------------------------------------------------------------------------------


def rng_f32(rng: np.random.Generator, *shape: int, scale: float = 1.0) -> np.ndarray:
    """Standard-normal float32 data of ``shape`` (times ``scale``)."""
    return (rng.standard_normal(shape, dtype=np.float32) * np.float32(scale)).astype(np.float32)


def as_arrays(result: Any) -> list[np.ndarray]:
    """A peer's result (array, tensor, or tuple of them) as a list of NumPy arrays."""
    items = result if isinstance(result, (tuple, list)) else (result,)
    return [
        it.numpy() if torch is not None and isinstance(it, torch.Tensor) else np.asarray(it)
        for it in items
    ]


def max_rel_diff(result: Any, expected: Any) -> float:
    """Largest ``|a - b|`` over all outputs, relative to the largest ``|b|``."""
    worst = 0.0
    for a, b in zip(as_arrays(result), as_arrays(expected), strict=True):
        scale = max(float(np.max(np.abs(b))), 1e-30)
        worst = max(worst, float(np.max(np.abs(a.astype(np.float64) - b))) / scale)
    return worst


def numpy_rms_norm(x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
    """The float32 NumPy RMSNorm formula."""
    return x / np.sqrt(np.mean(x * x, -1, keepdims=True) + np.float32(eps)) * w


def numpy_layer_norm(x: np.ndarray, w: np.ndarray, b: np.ndarray, eps: float) -> np.ndarray:
    """The float32 NumPy LayerNorm formula (biased variance)."""
    mean = np.mean(x, -1, keepdims=True)
    xc = x - mean
    var = np.mean(xc * xc, -1, keepdims=True)
    return xc / np.sqrt(var + np.float32(eps)) * w + b


def numpy_silu(x: np.ndarray) -> np.ndarray:
    """The float32 NumPy SiLU formula."""
    return x / (1 + np.exp(-x))


def numpy_swiglu(g: np.ndarray, u: np.ndarray) -> np.ndarray:
    """The float32 NumPy SwiGLU formula."""
    return g / (1 + np.exp(-g)) * u


def numpy_rope(x: np.ndarray, cos: np.ndarray, sin: np.ndarray) -> np.ndarray:
    """Half-split RoPE with precomputed ``cos``/``sin`` of shape ``(T, D/2)``."""
    h = x.shape[-1] // 2
    x1, x2 = x[..., :h], x[..., h:]
    return np.concatenate((x1 * cos - x2 * sin, x2 * cos + x1 * sin), axis=-1)


def numpy_ffn(x: np.ndarray, wg: np.ndarray, wu: np.ndarray, wd: np.ndarray) -> np.ndarray:
    """The float32 NumPy SwiGLU feed-forward (matmuls on NumPy's OpenBLAS)."""
    g = x @ wg
    return (g / (1 + np.exp(-g)) * (x @ wu)) @ wd


# --------------------------------------------------------------------------------------
# running one op
# --------------------------------------------------------------------------------------


@dataclass
class OpCase:
    """One op at one shape, with its peers (the first peer is llmkernels)."""

    name: str
    shape: str
    metric: str  # "GB/s" (memory-bound) or "GFLOP/s" (compute-bound)
    work: float  # bytes moved or FLOPs per call
    impls: Impls
    repeats: int | None = None
    rounds: int | None = None


def run_case(case: OpCase, cfg: Config, probe: dict[str, Any]) -> dict[str, Any]:
    """Check that the peers agree, then time them at each thread count; derive rates/ratios."""
    set_threads(max(cfg.threads))
    results = {name: fn() for name, fn in case.impls.items()}
    reference = as_arrays(results[LK])
    reference = [r.copy() for r in reference]  # out= buffers are overwritten later
    agreement = {name: max_rel_diff(res, reference) for name, res in results.items()}
    del results
    for name, diff in agreement.items():
        if diff > 1e-3:
            print(f"WARNING: {case.name}: {name} differs from llmkernels by {diff:.2e} (rel)")

    per_threads: dict[str, dict[str, Any]] = {name: {} for name in case.impls}
    other_load: dict[str, float | None] = {}
    for t in cfg.threads:
        set_threads(t)
        samples, other_load[str(t)] = measure_quietly(case.impls, cfg, case.repeats, case.rounds)
        lk_median = statistics.median(samples[LK])
        for name, s in samples.items():
            median = statistics.median(s)
            rate = case.work / median / 1e9
            per_threads[name][str(t)] = {
                "median_s": median,
                "min_s": min(s),
                "samples_s": s,
                "rate": rate,
                "fraction_of_roof": rate / roof(probe, case.metric, t),
                "time_vs_llmkernels": median / lk_median,
            }
    lo, hi = str(min(cfg.threads)), str(max(cfg.threads))
    for stats in per_threads.values():
        stats["thread_speedup"] = stats[lo]["median_s"] / stats[hi]["median_s"]
    roof_key = "triad_scaling" if case.metric == "GB/s" else "fma_scaling"
    return {
        "op": case.name,
        "shape": case.shape,
        "metric": case.metric,
        "work_per_call": case.work,
        "roof_scaling": probe[roof_key],
        "other_processes_cpus": other_load,
        "max_rel_diff_vs_llmkernels": agreement,
        "impls": per_threads,
    }


def case_rms_norm(cfg: Config, rng: np.random.Generator) -> OpCase:
    """RMSNorm over rows: llmkernels (out=) vs torch F.rms_norm vs NumPy; 8 B/element."""
    rows, d = cfg.norm_shape
    x, w, eps = rng_f32(rng, rows, d), rng_f32(rng, d), 1e-6
    out = np.empty_like(x)
    impls: Impls = {
        LK: lambda: lk.rms_norm(x, w, eps, out=out),
        LK_ALLOC: lambda: lk.rms_norm(x, w, eps),
    }
    if torch is not None:
        xt, wt = torch.from_numpy(x), torch.from_numpy(w)
        impls[TORCH] = lambda: F.rms_norm(xt, (d,), wt, eps)
    impls[NUMPY] = lambda: numpy_rms_norm(x, w, eps)
    return OpCase("rms_norm", f"({rows}, {d})", "GB/s", 8.0 * x.size, impls)


def case_layer_norm(cfg: Config, rng: np.random.Generator) -> OpCase:
    """LayerNorm: llmkernels (out=) vs torch F.layer_norm vs NumPy; 8 B/element."""
    rows, d = cfg.norm_shape
    x, w, b, eps = rng_f32(rng, rows, d), rng_f32(rng, d), rng_f32(rng, d), 1e-5
    out = np.empty_like(x)
    impls: Impls = {
        LK: lambda: lk.layer_norm(x, w, b, eps, out=out),
        LK_ALLOC: lambda: lk.layer_norm(x, w, b, eps),
    }
    if torch is not None:
        xt, wt, bt = torch.from_numpy(x), torch.from_numpy(w), torch.from_numpy(b)
        impls[TORCH] = lambda: F.layer_norm(xt, (d,), wt, bt, eps)
    impls[NUMPY] = lambda: numpy_layer_norm(x, w, b, eps)
    return OpCase("layer_norm", f"({rows}, {d})", "GB/s", 8.0 * x.size, impls)


def case_silu(cfg: Config, rng: np.random.Generator) -> OpCase:
    """SiLU: llmkernels (out=) vs torch F.silu vs NumPy; 8 B/element."""
    rows, d = cfg.swiglu_shape
    x = rng_f32(rng, rows, d)
    out = np.empty_like(x)
    impls: Impls = {LK: lambda: lk.silu(x, out=out), LK_ALLOC: lambda: lk.silu(x)}
    if torch is not None:
        xt = torch.from_numpy(x)
        impls[TORCH] = lambda: F.silu(xt)
    impls[NUMPY] = lambda: numpy_silu(x)
    return OpCase("silu", f"({rows}, {d})", "GB/s", 8.0 * x.size, impls)


def case_swiglu(cfg: Config, rng: np.random.Generator) -> OpCase:
    """SwiGLU gating: llmkernels (out=) vs torch ``F.silu(g) * u`` vs NumPy; 12 B/element."""
    rows, d = cfg.swiglu_shape
    g, u = rng_f32(rng, rows, d), rng_f32(rng, rows, d)
    out = np.empty_like(g)
    impls: Impls = {LK: lambda: lk.swiglu(g, u, out=out), LK_ALLOC: lambda: lk.swiglu(g, u)}
    if torch is not None:
        gt, ut = torch.from_numpy(g), torch.from_numpy(u)
        impls[TORCH] = lambda: F.silu(gt) * ut
    impls[NUMPY] = lambda: numpy_swiglu(g, u)
    return OpCase("swiglu", f"({rows}, {d})", "GB/s", 12.0 * g.size, impls)


def case_rope(cfg: Config, rng: np.random.Generator) -> OpCase:
    """RoPE on q and k (two tensors): llmkernels twice vs HF apply_rotary_pos_emb vs NumPy.

    8 B/element over both tensors. cos/sin are precomputed for the peers, shaped as HF's
    LlamaRotaryEmbedding makes them (``(1, T, D)``, the frequencies repeated twice) for HF and
    ``(T, D/2)`` for NumPy; llmkernels computes its angles itself (from positions ``0..T-1``).
    """
    b, h, t, d = cfg.rope_shape
    q, k = rng_f32(rng, b, h, t, d), rng_f32(rng, b, h, t, d)
    q_out, k_out = np.empty_like(q), np.empty_like(k)
    inv_freq = lk.rope_inv_freq(d, 10000.0)
    angles = np.outer(np.arange(t, dtype=np.float64), inv_freq)  # float64, like llmkernels
    cos_half, sin_half = np.cos(angles).astype(np.float32), np.sin(angles).astype(np.float32)

    def lk_rope() -> tuple[np.ndarray, np.ndarray]:
        return lk.rope(q, out=q_out), lk.rope(k, out=k_out)

    impls: Impls = {LK: lk_rope, LK_ALLOC: lambda: (lk.rope(q), lk.rope(k))}
    if torch is not None and apply_rotary_pos_emb is not None:
        qt, kt = torch.from_numpy(q), torch.from_numpy(k)
        cos = torch.from_numpy(np.concatenate((cos_half, cos_half), -1)[None])  # (1, T, D)
        sin = torch.from_numpy(np.concatenate((sin_half, sin_half), -1)[None])
        impls[HF] = lambda: apply_rotary_pos_emb(qt, kt, cos, sin)
    impls[NUMPY] = lambda: (numpy_rope(q, cos_half, sin_half), numpy_rope(k, cos_half, sin_half))
    shape = f"q, k: ({b}, {h}, {t}, {d})"
    return OpCase("rope", shape, "GB/s", 8.0 * (q.size + k.size), impls)


def case_swiglu_ffn(cfg: Config, rng: np.random.Generator) -> OpCase:
    """SwiGLU FFN: llmkernels vs torch ``(F.silu(x@wg) * (x@wu)) @ wd`` vs NumPy; GFLOP/s."""
    tokens, d, hidden = cfg.ffn_shape
    x = rng_f32(rng, tokens, d)
    wg, wu = rng_f32(rng, d, hidden, scale=d**-0.5), rng_f32(rng, d, hidden, scale=d**-0.5)
    wd = rng_f32(rng, hidden, d, scale=hidden**-0.5)
    impls: Impls = {LK: lambda: lk.swiglu_ffn(x, wg, wu, wd)}
    if torch is not None:
        xt, wgt, wut, wdt = (torch.from_numpy(a) for a in (x, wg, wu, wd))
        impls[TORCH] = lambda: (F.silu(xt @ wgt) * (xt @ wut)) @ wdt
    impls[NUMPY] = lambda: numpy_ffn(x, wg, wu, wd)
    flops = 6.0 * tokens * d * hidden  # three matmuls of 2*T*d*H
    shape = f"x ({tokens}, {d}), d_ff {hidden}"
    return OpCase("swiglu_ffn", shape, "GFLOP/s", flops, impls, repeats=cfg.ffn_repeats)


CASES: tuple[Callable[[Config, np.random.Generator], OpCase], ...] = (
    case_rms_norm,
    case_layer_norm,
    case_silu,
    case_swiglu,
    case_rope,
    case_swiglu_ffn,
)


# --------------------------------------------------------------------------------------
# pure Python at toy sizes
# --------------------------------------------------------------------------------------


def pure_cases(cfg: Config, rng: np.random.Generator) -> list[tuple[str, str, str, float, Impls]]:
    """(op, toy shape, unit, units per call, {pure, NumPy, llmkernels}) at toy sizes."""
    n = cfg.pure_len
    x, w, b = rng_f32(rng, n), rng_f32(rng, n), rng_f32(rng, n)
    g, u = rng_f32(rng, n), rng_f32(rng, n)
    xl, wl, bl, gl, ul = (a.tolist() for a in (x, w, b, g, u))

    rb, rh, rt, rd = cfg.pure_rope_shape
    q = rng_f32(rng, rb, rh, rt, rd)
    ql = q.tolist()
    inv_freq = lk.rope_inv_freq(rd, 10000.0)
    angles = np.outer(np.arange(rt, dtype=np.float64), inv_freq)
    cos_half, sin_half = np.cos(angles).astype(np.float32), np.sin(angles).astype(np.float32)

    ft, fd, fh = cfg.pure_ffn_shape
    fx = rng_f32(rng, ft, fd)
    fwg, fwu = rng_f32(rng, fd, fh, scale=fd**-0.5), rng_f32(rng, fd, fh, scale=fd**-0.5)
    fwd = rng_f32(rng, fh, fd, scale=fh**-0.5)
    fxl, fwgl, fwul, fwdl = (a.tolist() for a in (fx, fwg, fwu, fwd))

    return [
        (
            "rms_norm",
            f"({n},)",
            "element",
            n,
            {
                "pure": lambda: pure.rms_norm(xl, wl, 1e-6),
                NUMPY: lambda: numpy_rms_norm(x, w, 1e-6),
                LK: lambda: lk.rms_norm(x, w, 1e-6),
            },
        ),
        (
            "layer_norm",
            f"({n},)",
            "element",
            n,
            {
                "pure": lambda: pure.layer_norm(xl, wl, bl, 1e-5),
                NUMPY: lambda: numpy_layer_norm(x, w, b, 1e-5),
                LK: lambda: lk.layer_norm(x, w, b, 1e-5),
            },
        ),
        (
            "silu",
            f"({n},)",
            "element",
            n,
            {
                "pure": lambda: pure.silu(xl),
                NUMPY: lambda: numpy_silu(x),
                LK: lambda: lk.silu(x),
            },
        ),
        (
            "swiglu",
            f"({n},)",
            "element",
            n,
            {
                "pure": lambda: pure.swiglu(gl, ul),
                NUMPY: lambda: numpy_swiglu(g, u),
                LK: lambda: lk.swiglu(g, u),
            },
        ),
        (
            "rope",
            f"({rb}, {rh}, {rt}, {rd})",
            "element",
            q.size,
            {
                "pure": lambda: pure.rope(ql),
                NUMPY: lambda: numpy_rope(q, cos_half, sin_half),
                LK: lambda: lk.rope(q),
            },
        ),
        (
            "swiglu_ffn",
            f"x ({ft}, {fd}), d_ff {fh}",
            "FLOP",
            6.0 * ft * fd * fh,
            {
                "pure": lambda: pure.swiglu_ffn(fxl, fwgl, fwul, fwdl),
                NUMPY: lambda: numpy_ffn(fx, fwg, fwu, fwd),
                LK: lambda: lk.swiglu_ffn(fx, fwg, fwu, fwd),
            },
        ),
    ]


def run_pure(cfg: Config, rng: np.random.Generator, ops: list[dict[str, Any]]) -> list[dict]:
    """Pure Python vs NumPy vs llmkernels at toy sizes, one thread, per element (or FLOP)."""
    set_threads(1)
    full_lk = {
        op["op"]: op["impls"][LK]["1"]["median_s"] / (op["work_per_call"] / op_unit_bytes(op))
        for op in ops
    }
    samples = 3 if cfg.quick else 5
    rows = []
    for name, shape, unit, units, impls in pure_cases(cfg, rng):
        diff = max_rel_diff(np.asarray(impls["pure"](), dtype=np.float64), impls[LK]())
        if diff > 1e-3:
            print(f"WARNING: pure {name} differs from llmkernels by {diff:.2e} (rel)")
        per_call = {k: time_per_call(fn, samples) for k, fn in impls.items()}
        per_unit = {k: v / units for k, v in per_call.items()}
        rows.append(
            {
                "op": name,
                "toy_shape": shape,
                "unit": unit,
                "units_per_call": units,
                "seconds_per_call": per_call,
                "seconds_per_unit": per_unit,
                "llmkernels_full_size_1T_seconds_per_unit": full_lk.get(name),
                "pure_vs_llmkernels_toy": per_call["pure"] / per_call[LK],
                "max_rel_diff_pure_vs_llmkernels": diff,
            }
        )
    return rows


def op_unit_bytes(op: dict[str, Any]) -> float:
    """Work units per element (bytes/element for memory-bound ops, 1 for FLOP counts)."""
    return {"rms_norm": 8.0, "layer_norm": 8.0, "silu": 8.0, "swiglu": 12.0, "rope": 8.0}.get(
        op["op"], 1.0
    )


# --------------------------------------------------------------------------------------
# RMSNorm vs row length
# --------------------------------------------------------------------------------------


def run_row_scaling(cfg: Config, rng: np.random.Generator, probe: dict) -> list[dict]:
    """RMSNorm GB/s for several row lengths at the same total size, llmkernels vs torch."""
    rows_out = []
    repeats = max(3, cfg.repeats // 3)
    for d in cfg.row_lengths:
        rows = cfg.row_elements // d
        x, w = rng_f32(rng, rows, d), rng_f32(rng, d)
        out = np.empty_like(x)
        impls: Impls = {LK: lambda x=x, w=w, out=out: lk.rms_norm(x, w, 1e-6, out=out)}
        if torch is not None:
            xt, wt = torch.from_numpy(x), torch.from_numpy(w)
            impls[TORCH] = lambda xt=xt, wt=wt, d=d: F.rms_norm(xt, (d,), wt, 1e-6)
        entry: dict[str, Any] = {"d": d, "rows": rows}
        for t in cfg.threads:
            set_threads(t)
            samples, others = measure_quietly(impls, cfg, repeats)
            entry.setdefault("other_processes_cpus", {})[str(t)] = others
            for name, s in samples.items():
                gbs = 8.0 * x.size / statistics.median(s) / 1e9
                entry.setdefault(name, {})[str(t)] = {
                    "median_s": statistics.median(s),
                    "gbs": gbs,
                    "fraction_of_triad": gbs / roof(probe, "GB/s", t),
                }
        rows_out.append(entry)
    return rows_out


SCALING_OPS = ("rms_norm", "swiglu", "rope")


def run_thread_scaling(cfg: Config, rng: np.random.Generator) -> dict[str, Any]:
    """2-thread speed-up of the memory-bound ops, each measurement paired with the triad probe.

    On this shared host the bandwidth a second thread can add changes from minute to minute
    (other tenants share the memory channels), so a speed-up is only meaningful next to the
    probe's speed-up measured at the same moment. Each round times, for 1 then 2 threads, the
    triad probe and then each op (out=, median of 5); the report keeps every round."""
    x, w = rng_f32(rng, *cfg.norm_shape), rng_f32(rng, cfg.norm_shape[1])
    xo = np.empty_like(x)
    g, u = rng_f32(rng, *cfg.swiglu_shape), rng_f32(rng, *cfg.swiglu_shape)
    go = np.empty_like(g)
    q = rng_f32(rng, *cfg.rope_shape)
    qo = np.empty_like(q)
    calls = {
        "rms_norm": (lambda: lk.rms_norm(x, w, 1e-6, out=xo), 8.0 * x.size),
        "swiglu": (lambda: lk.swiglu(g, u, out=go), 12.0 * g.size),
        "rope": (lambda: lk.rope(q, out=qo), 8.0 * q.size),
    }
    rounds = []
    for _ in range(cfg.scaling_rounds):
        entry: dict[str, Any] = {}
        for t in cfg.threads:
            set_threads(t)
            entry.setdefault("triad_gbs", {})[str(t)] = lk._core._probe_triad_gbs(
                t, cfg.triad_n, cfg.triad_inner
            )
            for name, (fn, nbytes) in calls.items():
                fn()
                seconds = time_per_call(fn, 5)
                entry.setdefault(name, {})[str(t)] = nbytes / seconds / 1e9
        rounds.append(entry)
    lo, hi = str(min(cfg.threads)), str(max(cfg.threads))

    def speedup(e: dict[str, Any], key: str) -> float:
        return e[key][hi] / e[key][lo]

    good = [e for e in rounds if speedup(e, "triad_gbs") >= 1.6]
    summary = {}
    for name in ("triad_gbs", *calls):
        summary[name] = {
            "median_speedup": statistics.median(speedup(e, name) for e in rounds),
            "median_speedup_when_triad_scales": (
                statistics.median(speedup(e, name) for e in good) if good else None
            ),
            "median_2t_fraction_of_triad": statistics.median(
                e[name][hi] / e["triad_gbs"][hi] for e in rounds
            ),
        }
    return {"rounds": rounds, "rounds_where_triad_scaled_1_6": len(good), "summary": summary}


def render_thread_scaling(sc: dict[str, Any], cfg: Config) -> list[str]:
    lo, hi = str(min(cfg.threads)), str(max(cfg.threads))
    n = len(sc["rounds"])
    out = [
        "",
        f"## Thread scaling of the memory-bound ops, paired with the triad probe ({n} rounds)",
        "",
        f"Each round measures the triad probe and then each op (out=, median of 5) at {lo} and "
        f"then {hi} threads, so every op speed-up sits next to the machine's own speed-up at "
        "that moment: on this shared host the bandwidth a second core adds varies from round "
        f"to round. Shapes as above (rope on q alone). {sc['rounds_where_triad_scaled_1_6']} "
        f"of {n} rounds had a triad speed-up of at least 1.6.",
        "",
    ]
    rows = []
    for name, label in [("triad_gbs", "triad probe"), *[(o, o) for o in SCALING_OPS]]:
        s = sc["summary"][name]
        rows.append(
            [
                label,
                fmt(s["median_speedup"]),
                fmt(s["median_speedup_when_triad_scales"]),
                f"{100 * s['median_2t_fraction_of_triad']:.0f}%",
            ]
        )
    out += md_table(
        [
            "",
            f"{hi}T / {lo}T, median of all rounds",
            f"{hi}T / {lo}T, median of rounds where the triad scaled >= 1.6",
            f"{hi}T GB/s / same-round {hi}T triad",
        ],
        rows,
    )
    out += ["", "Per round (GB/s, " + f"{lo}T -> {hi}T):", ""]
    rows = []
    for i, e in enumerate(sc["rounds"], 1):
        rows.append(
            [str(i)]
            + [
                f"{e[k][lo]:.1f} -> {e[k][hi]:.1f} ({e[k][hi] / e[k][lo]:.2f}x)"
                for k in ("triad_gbs", *SCALING_OPS)
            ]
        )
    out += md_table(["round", "triad", *SCALING_OPS], rows)
    return out


# --------------------------------------------------------------------------------------
# attention
# --------------------------------------------------------------------------------------

TORCH_SDPA = "torch SDPA"


def attention_flops(h: int, tq: int, tk: int, d: int, dv: int, causal: bool) -> float:
    """DESIGN.md §5: ``2·H·Tq·Tk·(D + Dv)`` (Q·K^T and P·V), halved when causal."""
    flops = 2.0 * h * tq * tk * (d + dv)
    return flops / 2 if causal else flops


def attention_workspace_bytes(threads: int, d: int, dv: int, itemsize: int = 4) -> int:
    """The fused kernel's scratch memory (``attn_workspace_size`` in ``cpp/kernels/ops.hpp``).

    Per thread: the scaled Q^T tile (64·D), a 64×64 score tile, the output accumulator and a
    padded V tile (64·Dv each, Dv rounded up to 64 bytes) and 3×64 row values (causal limit,
    running max, running sum). Independent of T; the prefill work list (one 48-byte item per
    64-row tile) and, for decode-like shapes, the key-split partials come on top.
    """
    per_elem = 64 // itemsize
    dv_pad = -(-dv // per_elem) * per_elem
    return threads * (64 * d + 64 * 64 + 128 * dv_pad + 192) * itemsize


def numpy_attention(
    q: np.ndarray, k: np.ndarray, v: np.ndarray, scale: float, mask: np.ndarray | None = None
) -> np.ndarray:
    """The float32 NumPy formula: two BLAS matmuls around a materialised softmax.

    ``mask`` is additive (``np.triu`` of -inf for causal). Grouped-query heads are handled by
    viewing q as ``(B, Hkv, Hq/Hkv·Tq, D)`` (no copy of K/V; valid for Tq = 1 or no mask).
    """
    b, hq, tq, d = q.shape
    hkv = k.shape[1]
    if hkv != hq:
        q = q.reshape(b, hkv, hq // hkv * tq, d)
    s = q @ k.transpose(0, 1, 3, 2) * np.float32(scale)
    if mask is not None:
        s += mask
    s -= s.max(-1, keepdims=True)
    p = np.exp(s)
    p /= p.sum(-1, keepdims=True)
    o = p @ v
    return o.reshape(b, hq, tq, v.shape[-1])


def case_attention_prefill(cfg: Config, rng: np.random.Generator, causal: bool) -> OpCase:
    """Prefill self-attention (Tq = Tk = T): llmkernels (out=) vs torch SDPA vs NumPy; GFLOP/s."""
    b, h, t, d = cfg.attn_prefill_shape
    q, k, v = (rng_f32(rng, b, h, t, d) for _ in range(3))
    out = np.empty_like(q)
    scale = d**-0.5
    impls: Impls = {LK: lambda: lk.attention(q, k, v, causal=causal, out=out)}
    if torch is not None:
        qt, kt, vt = (torch.from_numpy(a) for a in (q, k, v))
        impls[TORCH_SDPA] = lambda: F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal)
    mask = np.triu(np.full((t, t), -np.inf, dtype=np.float32), 1) if causal else None
    impls[NUMPY] = lambda: numpy_attention(q, k, v, scale, mask)
    return OpCase(
        f"attention prefill{', causal' if causal else ''}",
        f"q, k, v ({b}, {h}, {t}, {d})",
        "GFLOP/s",
        b * attention_flops(h, t, t, d, d, causal),
        impls,
        repeats=cfg.attn_prefill_repeats,
    )


def llc_bytes() -> int:
    """Size of the largest CPU cache (sysfs), 32 MiB if unknown."""
    best = 0
    for path in Path("/sys/devices/system/cpu/cpu0/cache").glob("index*/size"):
        try:
            text = path.read_text().strip().upper()
            mult = {"K": 1024, "M": 1024**2, "G": 1024**3}.get(text[-1], 1)
            best = max(best, int(text.rstrip("KMG")) * mult)
        except (OSError, ValueError, IndexError):
            continue
    return best or 32 * 1024**2


def case_attention_decode(cfg: Config, rng: np.random.Generator, cold: bool) -> OpCase:
    """One decode step (Tq = 1) against a GQA KV cache: llmkernels vs torch SDPA
    (``enable_gqa=True``) vs NumPy; GB/s of K and V read (``2·Hkv·Tk·D·4`` bytes).

    ``cold``: every call reads the next of several KV caches (together over 4× the last-level
    cache), as a model's layers do; otherwise the same K/V every call (partly cache-resident
    when K+V are about the cache's size).
    """
    b, hq, hkv, tk, d = cfg.attn_decode_shape
    kv_bytes = 2 * b * hkv * tk * d * 4
    copies = max(2, math.ceil(4 * llc_bytes() / kv_bytes)) if cold else 1
    q = rng_f32(rng, b, hq, 1, d)
    ks = [rng_f32(rng, b, hkv, tk, d) for _ in range(copies)]
    vs = [rng_f32(rng, b, hkv, tk, d) for _ in range(copies)]
    out = np.empty((b, hq, 1, d), dtype=np.float32)
    scale = d**-0.5

    def cycling(call: Callable[[int], Any]) -> Callable[[], Any]:
        state = [0]

        def fn() -> Any:
            i = state[0]
            state[0] = (i + 1) % copies
            return call(i)

        return fn

    impls: Impls = {LK: cycling(lambda i: lk.attention(q, ks[i], vs[i], out=out))}
    if torch is not None:
        qt = torch.from_numpy(q)
        kts, vts = [torch.from_numpy(a) for a in ks], [torch.from_numpy(a) for a in vs]
        impls[TORCH_SDPA] = cycling(
            lambda i: F.scaled_dot_product_attention(qt, kts[i], vts[i], enable_gqa=True)
        )
    impls[NUMPY] = cycling(lambda i: numpy_attention(q, ks[i], vs[i], scale))
    where = f"cold: {copies} KV caches in turn" if cold else "same K/V each call"
    return OpCase(
        f"attention decode ({where})",
        f"q ({b}, {hq}, 1, {d}), k, v ({b}, {hkv}, {tk}, {d})",
        "GB/s",
        float(kv_bytes),
        impls,
        repeats=cfg.attn_decode_repeats,
    )


ATTENTION_CASES: tuple[Callable[[Config, np.random.Generator], OpCase], ...] = (
    lambda cfg, rng: case_attention_prefill(cfg, rng, causal=False),
    lambda cfg, rng: case_attention_prefill(cfg, rng, causal=True),
    lambda cfg, rng: case_attention_decode(cfg, rng, cold=False),
    lambda cfg, rng: case_attention_decode(cfg, rng, cold=True),
)

# Run in a fresh interpreter per size: the peak resident set (VmHWM, what ru_maxrss reports)
# over one llmkernels call, then over one NumPy-formula call, above the RSS before the call.
# ru_maxrss itself is useless in a child: Linux carries the parent's high-water mark over
# fork + exec. The peak is reset through /proc/self/clear_refs ("5") before each call.
_MEMORY_PROBE = r"""
import json, re, sys
import numpy as np
import llmkernels as lk

def status(key):
    with open("/proc/self/status") as f:
        return int(re.search(key + r":\s+(\d+)", f.read()).group(1)) * 1024

def extra(fn):
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        before = status("VmRSS")
    except OSError:
        before = status("VmHWM")
    fn()
    return status("VmHWM") - before

h, t, d, threads, with_numpy = (int(a) for a in sys.argv[1:])
lk.set_num_threads(threads)
rng = np.random.default_rng(0)
q, k, v = (rng.standard_normal((1, h, t, d), dtype=np.float32) for _ in range(3))
out = np.zeros_like(q)
res = {"llmkernels": extra(lambda: lk.attention(q, k, v, out=out))}
if with_numpy:
    sc = np.float32(d ** -0.5)

    def formula():
        s = q @ k.transpose(0, 1, 3, 2) * sc
        s -= s.max(-1, keepdims=True)
        p = np.exp(s)
        p /= p.sum(-1, keepdims=True)
        return p @ v

    res["numpy"] = extra(formula)
print(json.dumps(res))
"""


def attention_peak_memory(h: int, t: int, d: int, threads: int, with_numpy: bool) -> dict:
    """Peak extra resident bytes of one call (peak RSS over RSS before, fresh subprocess)."""
    import subprocess

    args = [str(a) for a in (h, t, d, threads, int(with_numpy))]
    proc = subprocess.run(
        [sys.executable, "-c", _MEMORY_PROBE, *args], capture_output=True, text=True, timeout=600
    )
    if proc.returncode != 0:
        print(f"WARNING: attention memory probe T={t} failed: {proc.stderr.strip()[-300:]}")
        return {}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def run_attention_scaling(cfg: Config, rng: np.random.Generator, probe: dict) -> dict:
    """llmkernels attention time against T (B = 1, non-causal): O(T²) time, O(1)-in-T memory.

    Each T is timed at every thread count (median of up to ``cfg.repeats`` calls, about a
    second's worth, after a warm-up call), then its peak extra memory is measured in a
    subprocess, next to the NumPy formula's (up to ``attn_scaling_numpy_max_t``).
    """
    h, d = cfg.attn_scaling_shape
    hi = max(cfg.threads)
    rows: list[dict[str, Any]] = []
    for t in cfg.attn_scaling_lengths:
        q, k, v = (rng_f32(rng, 1, h, t, d) for _ in range(3))
        out = np.empty_like(q)
        impls: Impls = {LK: lambda q=q, k=k, v=v, out=out: lk.attention(q, k, v, out=out)}
        flops = attention_flops(h, t, t, d, d, causal=False)
        entry: dict[str, Any] = {"T": t, "H": h, "D": d, "flops": flops}
        for n in cfg.threads:
            set_threads(n)
            t0 = time.perf_counter()
            impls[LK]()
            once = time.perf_counter() - t0
            repeats = max(3, min(cfg.repeats, math.ceil(1.0 / max(once, 1e-6))))
            samples, others = measure_quietly(impls, cfg, repeats, rounds=1)
            median = statistics.median(samples[LK])
            gflops = flops / median / 1e9
            entry[str(n)] = {
                "median_s": median,
                "min_s": min(samples[LK]),
                "samples_s": samples[LK],
                "gflops": gflops,
                "fraction_of_fma_peak": gflops / roof(probe, "GFLOP/s", n),
                "other_processes_cpus": others,
            }
        if rows:
            entry["time_vs_previous_T"] = {
                str(n): entry[str(n)]["median_s"] / rows[-1][str(n)]["median_s"]
                for n in cfg.threads
            }
        del q, k, v, out, impls
        measured = attention_peak_memory(h, t, d, hi, t <= cfg.attn_scaling_numpy_max_t)
        entry["memory"] = {
            "threads": hi,
            "llmkernels_peak_extra_bytes": measured.get("llmkernels"),
            "llmkernels_workspace_bytes": attention_workspace_bytes(hi, d, d),
            "numpy_peak_extra_bytes": measured.get("numpy"),
            "score_matrix_bytes": h * t * t * 4,
        }
        rows.append(entry)
    return {"H": h, "D": d, "B": 1, "causal": False, "rows": rows}


# --------------------------------------------------------------------------------------
# reporting
# --------------------------------------------------------------------------------------


def machine_info() -> dict[str, Any]:
    """Build info of the extension plus the host, library versions and load at start."""
    cpu = platform.processor()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name"))
    except (OSError, StopIteration):
        pass
    info: dict[str, Any] = {
        "build_info": lk.build_info(),
        "cpu": cpu,
        "cpu_count": os.cpu_count(),
        "platform": platform.platform(),
        "python": sys.version.split()[0],
        "numpy": np.__version__,
        "numpy_blas_threads_controlled": NUMPY_BLAS_THREADS.controlled,
        "torch": torch.__version__ if torch is not None else None,
        "torch_THP_MEM_ALLOC_ENABLE": os.environ.get("THP_MEM_ALLOC_ENABLE"),
        "load_average_at_start": os.getloadavg(),
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
    }
    try:
        import transformers

        info["transformers"] = transformers.__version__
    except ImportError:
        info["transformers"] = None
    return info


def fmt(v: float | None, digits: int = 2) -> str:
    """A number for the tables (``-`` when absent)."""
    if v is None:
        return "-"
    if v != 0 and abs(v) < 10**-digits:
        return f"{v:.1e}"
    return f"{v:.{digits}f}"


def fmt_time(seconds: float) -> str:
    """Seconds as ns/us/ms with three significant digits."""
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("us", 1e-6), ("ns", 1e-9)):
        if seconds >= scale:
            return f"{seconds / scale:.3g} {unit}"
    return f"{seconds / 1e-9:.3g} ns"


def md_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    """Rows of a markdown table."""
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join(" --- " for _ in header) + "|"]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return lines


def op_table(ops: list[dict[str, Any]], cfg: Config) -> list[str]:
    """The per-op table: each peer's time, rate and roofline fraction per thread count,
    its time over llmkernels', its own thread speedup next to the probe's, other load."""
    lo, hi = str(min(cfg.threads)), str(max(cfg.threads))
    rows = []
    for op in ops:
        first = True
        for name, st in op["impls"].items():
            label = f"**{op['op']}** {op['shape']} [{op['metric']}]" if first else ""
            row = [label, name]
            for t in cfg.threads:
                s = st[str(t)]
                row += [
                    fmt_time(s["median_s"]),
                    fmt(s["rate"], 1),
                    f"{100 * s['fraction_of_roof']:.0f}%",
                ]
            row += [fmt(st[t]["time_vs_llmkernels"]) for t in (lo, hi)]
            row += [fmt(st["thread_speedup"]), fmt(op["roof_scaling"]) if first else ""]
            others = op["other_processes_cpus"]
            cpus = [others[str(t)] for t in cfg.threads]
            row += [" / ".join("-" if c is None else f"{c:.1f}" for c in cpus) if first else ""]
            rows.append(row)
            first = False
    header = ["op", "impl"]
    for t in cfg.threads:
        header += [f"{t}T time", f"{t}T rate", f"{t}T roof"]
    header += [f"x lk {lo}T", f"x lk {hi}T", f"{lo}T/{hi}T", "probe", "others"]
    return md_table(header, rows)


def fmt_bytes(n: float | None) -> str:
    """Bytes as B/KiB/MiB/GiB with three significant digits (``-`` when absent)."""
    if n is None:
        return "-"
    for unit, scale in (("GiB", 1024**3), ("MiB", 1024**2), ("KiB", 1024)):
        if abs(n) >= scale:
            return f"{n / scale:.3g} {unit}"
    return f"{n:.0f} B"


def render_attention(report: dict[str, Any], cfg: Config) -> list[str]:
    """The attention sections: prefill/decode peers, then llmkernels against T."""
    att = report["attention"]
    out = [
        "",
        "## Attention (float32; median after warm-up; "
        f"prefill {cfg.attn_prefill_repeats} runs, decode {cfg.attn_decode_repeats})",
        "",
        "Prefill: `rate` is GFLOP/s with FLOPs = 2·H·Tq·Tk·(D+Dv), halved when causal (the "
        "same count for every peer, although NumPy computes the full masked square); `roof` is "
        "the fraction of the FMA peak at that thread count. torch is "
        "`F.scaled_dot_product_attention` (is_causal), NumPy the two-matmul formula with a "
        "materialised softmax (and an `np.triu` -inf mask). Decode (Tq = 1, GQA): `rate` is "
        "GB/s of K and V read (2·Hkv·Tk·D·4 bytes), `roof` the fraction of the triad bandwidth; "
        "torch uses `enable_gqa=True`, NumPy views q as (B, Hkv, Hq/Hkv, D). *Same K/V* "
        f"reuses one cache ({fmt_bytes(att.get('decode_kv_bytes'))}, last-level cache "
        f"{fmt_bytes(att.get('llc_bytes'))}), so part of it may come from the cache; *cold* "
        "cycles through several caches as a model's layers would. `x lk` is the peer's time "
        "over llmkernels'.",
        "",
    ]
    out += op_table(att["cases"], cfg)
    sc = att.get("scaling")
    if sc:
        h, d = sc["H"], sc["D"]
        mem_threads = sc["rows"][0]["memory"]["threads"] if sc["rows"] else max(cfg.threads)
        out += [
            "",
            f"### llmkernels attention vs sequence length (B = 1, H = {h}, D = {d}, "
            "non-causal, out=)",
            "",
            "Time grows as T² (×4 per doubling) at a constant GFLOP/s; memory does not grow "
            "with T beyond the inputs. `peak extra` is the process's peak RSS during one call "
            "(VmHWM, reset before it) over its RSS before, in a fresh subprocess per size at "
            f"{mem_threads} threads (thread start-up included); `workspace` the kernel's "
            f"scratch, {mem_threads} × (64·D + 64·64 + 128·Dv + 192) × 4 bytes; `scores` the "
            "H·T²·4-byte matrix the NumPy formula materialises (its measured peak holds about "
            "two: the scaled scores and their exponentials). `others`: CPUs other processes "
            "kept busy during the 1T / 2T timings (rows with others near 1 are unreliable).",
            "",
        ]
        header = ["T", "GFLOP"]
        for t in cfg.threads:
            header += [f"{t}T time", f"{t}T GFLOP/s (peak)", f"{t}T × prev"]
        header += ["lk peak extra", "lk workspace", "NumPy peak extra", "scores H·T²·4"]
        header += ["others"]
        rows = []
        for e in sc["rows"]:
            row = [str(e["T"]), fmt(e["flops"] / 1e9, 1)]
            for t in cfg.threads:
                c = e[str(t)]
                prev = e.get("time_vs_previous_T", {}).get(str(t))
                row += [
                    fmt_time(c["median_s"]),
                    f"{c['gflops']:.1f} ({100 * c['fraction_of_fma_peak']:.0f}%)",
                    fmt(prev),
                ]
            m = e["memory"]
            row += [
                fmt_bytes(m["llmkernels_peak_extra_bytes"]),
                fmt_bytes(m["llmkernels_workspace_bytes"]),
                fmt_bytes(m["numpy_peak_extra_bytes"]),
                fmt_bytes(m["score_matrix_bytes"]),
            ]
            cpus = [e[str(t)]["other_processes_cpus"] for t in cfg.threads]
            row += [" / ".join("-" if c is None else f"{c:.1f}" for c in cpus)]
            rows.append(row)
        out += md_table(header, rows)
    return out


def render(report: dict[str, Any], cfg: Config) -> str:
    """The markdown report: machine, probe, per-op table, pure Python gap, row-length table."""
    m, p = report["machine"], report["probe"]
    bi = m["build_info"]
    lo, hi = str(min(cfg.threads)), str(max(cfg.threads))
    out = [
        f"# llmkernels benchmarks{' (--quick)' if cfg.quick else ''}",
        "",
        f"- {m['cpu']}, {m['cpu_count']} CPUs; load average at start "
        f"{', '.join(f'{x:.2f}' for x in m['load_average_at_start'])}; {m['date']}",
        f"- llmkernels {bi['version']} ({bi['simd_arch']}, {bi['compiler']}, xsimd {bi['xsimd']}, "
        f"{bi['blas']})",
        f"- Python {m['python']}, NumPy {m['numpy']}, torch {m['torch']}, "
        f"transformers {m['transformers']}"
        + (" (torch with THP_MEM_ALLOC_ENABLE=1)" if m["torch_THP_MEM_ALLOC_ENABLE"] else ""),
        "",
        "## Roofline probe",
        "",
    ]
    out += md_table(
        ["", *[f"{t} thread{'s' if t > 1 else ''}" for t in cfg.threads], f"{hi}T / {lo}T"],
        [
            [
                "fp32 FMA peak (GFLOP/s)",
                *[fmt(p["fma_gflops"][str(t)]["median"], 1) for t in cfg.threads],
                fmt(p["fma_scaling"]),
            ],
            [
                "triad bandwidth (GB/s)",
                *[fmt(p["triad_gbs"][str(t)]["median"], 1) for t in cfg.threads],
                fmt(p["triad_scaling"]),
            ],
        ],
    )
    if p.get("other_processes_cpus") is not None:
        out += ["", f"Other processes kept {p['other_processes_cpus']:.1f} CPUs busy meanwhile."]
    if report.get("ops"):
        out += [
            "",
            f"## Ops (float32; median of {cfg.repeats} runs, FFN {cfg.ffn_repeats}, after warm-up)",
            "",
            "`rate` is GB/s (memory-bound ops) or GFLOP/s (FFN); `roof` is the fraction of "
            "the triad bandwidth (or FMA peak) at the same thread count; `x lk` is the peer's "
            f"time over llmkernels' time; `{lo}T/{hi}T` is the peer's own thread speedup, next "
            "to the probe's (the most a memory-bound op can gain from the second thread); "
            "`others` is how many CPUs other processes kept busy meanwhile (1T / 2T): this "
            "machine is shared, and a busy second core spoils 2-thread timings.",
            "",
        ]
        out += op_table(report["ops"], cfg)

    if report.get("pure"):
        out += ["", "## Pure Python at toy sizes (1 thread, per element; FFN per FLOP)", ""]
        rows = []
        for r in report["pure"]:
            spu = r["seconds_per_unit"]
            full = r["llmkernels_full_size_1T_seconds_per_unit"]
            rows.append(
                [
                    r["op"],
                    r["toy_shape"],
                    fmt_time(r["seconds_per_call"]["pure"]),
                    f"{spu['pure'] * 1e9:.3g}",
                    f"{spu[NUMPY] * 1e9:.3g}",
                    f"{spu[LK] * 1e9:.3g}",
                    f"{full * 1e9:.3g}" if full is not None else "-",
                    f"{r['pure_vs_llmkernels_toy']:.0f}x",
                ]
            )
        out += md_table(
            [
                "op",
                "toy shape",
                "pure / call",
                "pure ns/unit",
                "NumPy ns/unit",
                "lk ns/unit",
                "lk ns/unit (full size, 1T)",
                "pure / lk (toy)",
            ],
            rows,
        )

    if report.get("rms_norm_row_scaling"):
        out += [
            "",
            f"## rms_norm vs row length ({cfg.row_elements} elements, out= for "
            "llmkernels; GB/s and fraction of triad)",
            "",
        ]
        skip = ("d", "rows", "other_processes_cpus")
        names = [k for k in report["rms_norm_row_scaling"][0] if k not in skip]
        header = ["D", "rows"]
        for t in cfg.threads:
            header += [f"{n} {t}T" for n in names]
        rows = []
        for e in report["rms_norm_row_scaling"]:
            row = [str(e["d"]), str(e["rows"])]
            for t in cfg.threads:
                cells = (e[n][str(t)] for n in names)
                row += [f"{c['gbs']:.1f} ({100 * c['fraction_of_triad']:.0f}%)" for c in cells]
            rows.append(row)
        out += md_table(header, rows)

    if report.get("thread_scaling"):
        out += render_thread_scaling(report["thread_scaling"], cfg)

    if report.get("attention"):
        out += render_attention(report, cfg)

    out += [
        "",
        "Notes: NumPy's elementwise ops are single-threaded (only its matmuls use threads: "
        f"NumPy BLAS threads {'set' if m['numpy_blas_threads_controlled'] else 'NOT set'} per "
        "column). `llmkernels (no out=)` allocates its result each call, as torch and NumPy do; "
        "the difference to `llmkernels` is the cost of a fresh (page-faulted) output buffer. "
        "torch allocates its result and every temporary with 4 KiB pages unless "
        "`THP_MEM_ALLOC_ENABLE=1` (`--torch-thp`); NumPy asks for huge pages by default. "
        "Absolute times drift on shared machines; compare ratios within one run.",
        "",
    ]
    return "\n".join(out)


# --------------------------------------------------------------------------------------
# main
# --------------------------------------------------------------------------------------


def main(argv: Sequence[str] | None = None) -> int:
    """Run the benchmarks; print the markdown report and write results.md / results.json."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="small shapes, few repeats")
    parser.add_argument(
        "--out",
        type=Path,
        default=Path("benchmarks/results"),
        help="output directory (default: benchmarks/results)",
    )
    parser.add_argument(
        "--torch-thp",
        action="store_true",
        help="set THP_MEM_ALLOC_ENABLE=1 for torch (huge pages for its allocations)",
    )
    parser.add_argument(
        "--quiet-wait",
        type=float,
        default=None,
        help="max seconds to wait for other processes to go idle before each measurement "
        "(default: 60, 0 with --quick)",
    )
    parser.add_argument(
        "--no-row-scaling", action="store_true", help="skip the rms_norm vs row length table"
    )
    parser.add_argument("--no-attention", action="store_true", help="skip the attention benchmarks")
    parser.add_argument(
        "--attention-only",
        action="store_true",
        help="only the roofline probe and the attention benchmarks",
    )
    parser.add_argument(
        "--scaling-only",
        action="store_true",
        help="only the roofline probe and the paired thread-scaling rounds",
    )
    args = parser.parse_args(argv)
    import_peers(args.torch_thp)
    # torch and transformers leave ~10^5 objects behind; freezing them keeps the gc.collect()
    # before every measurement (no_gc) from scanning them each time (~0.2 s per call).
    gc.collect()
    gc.freeze()
    cfg = QUICK if args.quick else FULL
    threads = tuple(t for t in cfg.threads if t <= (os.cpu_count() or 1)) or (1,)
    quiet_wait = cfg.quiet_wait if args.quiet_wait is None else args.quiet_wait
    cfg = dataclasses.replace(cfg, threads=threads, quiet_wait=quiet_wait)
    start = time.perf_counter()
    rng = np.random.default_rng(0)

    def log(msg: str) -> None:
        print(f"[{time.perf_counter() - start:6.1f} s] {msg}", file=sys.stderr, flush=True)

    threads_before = lk.get_num_threads()
    report: dict[str, Any] = {"machine": machine_info(), "config": dataclasses.asdict(cfg)}
    log("roofline probe")
    probe = roofline_probe(cfg)
    report["probe"] = probe
    if args.scaling_only:
        log("thread scaling, paired with the triad probe")
        report["thread_scaling"] = run_thread_scaling(cfg, rng)
    elif not args.attention_only:
        report["ops"] = []
        for make in CASES:
            case = make(cfg, rng)
            log(f"{case.name} {case.shape}")
            report["ops"].append(run_case(case, cfg, probe))
            del case
            gc.collect()
        log("pure Python")
        report["pure"] = run_pure(cfg, rng, report["ops"])
        if not args.no_row_scaling:
            log("rms_norm vs row length")
            report["rms_norm_row_scaling"] = run_row_scaling(cfg, rng, probe)
        log("thread scaling, paired with the triad probe")
        report["thread_scaling"] = run_thread_scaling(cfg, rng)
    if not (args.no_attention or args.scaling_only):
        b, hq, hkv, tk, d = cfg.attn_decode_shape
        attention: dict[str, Any] = {
            "llc_bytes": llc_bytes(),
            "decode_kv_bytes": 2 * b * hkv * tk * d * 4,
            "cases": [],
        }
        for make in ATTENTION_CASES:
            case = make(cfg, rng)
            log(f"{case.name} {case.shape}")
            attention["cases"].append(run_case(case, cfg, probe))
            del case
            gc.collect()
        log("attention vs sequence length")
        attention["scaling"] = run_attention_scaling(cfg, rng, probe)
        report["attention"] = attention
    set_threads(threads_before)
    report["elapsed_s"] = time.perf_counter() - start
    log("done")

    text = render(report, cfg)
    print(text)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "results.md").write_text(text)
    (args.out / "results.json").write_text(json.dumps(report, indent=1, default=str) + "\n")
    print(f"wrote {args.out / 'results.md'} and {args.out / 'results.json'}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
