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

try:
    import torch
    import torch.nn.functional as F  # noqa: N812 (the usual torch alias)
except ImportError:  # torch is an optional peer (extra "bench")
    torch = None  # type: ignore[assignment]
    F = None  # type: ignore[assignment]

try:
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb
except ImportError:  # transformers is an optional peer as well
    apply_rotary_pos_emb = None

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
)


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


def measure(impls: Impls, cfg: Config, repeats: int | None = None) -> dict[str, list[float]]:
    """Time every peer: ``cfg.rounds`` rounds, each peer's block of calls in turn.

    Each block starts with ``cfg.warmup`` untimed calls (which also lets the previous peer's
    spinning worker threads go to sleep), then times its share of ``repeats`` calls. Rounds
    spread slow drift of a shared machine over all peers alike. Returns seconds per call.
    """
    repeats = cfg.repeats if repeats is None else repeats
    per_round = max(1, math.ceil(repeats / cfg.rounds))
    samples: dict[str, list[float]] = {name: [] for name in impls}
    with no_gc():
        for _ in range(cfg.rounds):
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
        with OtherLoad() as load:
            samples = measure(case.impls, cfg, case.repeats)
        other_load[str(t)] = load.cpus
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
            samples = measure(impls, cfg, repeats)
            for name, s in samples.items():
                gbs = 8.0 * x.size / statistics.median(s) / 1e9
                entry.setdefault(name, {})[str(t)] = {
                    "median_s": statistics.median(s),
                    "gbs": gbs,
                    "fraction_of_triad": gbs / roof(probe, "GB/s", t),
                }
        rows_out.append(entry)
    return rows_out


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
        f"transformers {m['transformers']}",
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
    out += [
        "",
        f"## Ops (float32; median of {cfg.repeats} runs, FFN {cfg.ffn_repeats}, after warm-up)",
        "",
        "`rate` is GB/s (memory-bound ops) or GFLOP/s (FFN); `roof` is the fraction of the "
        "triad bandwidth (or FMA peak) at the same thread count; `x lk` is the peer's time over "
        f"llmkernels' time; `{lo}T/{hi}T` is the peer's own thread speedup, next to the "
        "probe's (the most a memory-bound op can gain from the second thread); `others` is "
        "how many CPUs other processes kept busy meanwhile (1T / 2T): this machine is shared, "
        "and a busy second core spoils 2-thread timings.",
        "",
    ]
    rows = []
    for op in report["ops"]:
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
            row += [" / ".join(fmt(others[str(t)], 1) for t in cfg.threads) if first else ""]
            rows.append(row)
            first = False
    header = ["op", "impl"]
    for t in cfg.threads:
        header += [f"{t}T time", f"{t}T rate", f"{t}T roof"]
    header += [f"x lk {lo}T", f"x lk {hi}T", f"{lo}T/{hi}T", "probe", "others"]
    out += md_table(header, rows)

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
        names = [k for k in report["rms_norm_row_scaling"][0] if k not in ("d", "rows")]
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

    out += [
        "",
        "Notes: NumPy's elementwise ops are single-threaded (only its matmuls use threads: "
        f"NumPy BLAS threads {'set' if m['numpy_blas_threads_controlled'] else 'NOT set'} per "
        "column). `llmkernels (no out=)` allocates its result each call, as torch and NumPy do; "
        "the difference to `llmkernels` is the cost of a fresh (page-faulted) output buffer. "
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
        "--no-row-scaling", action="store_true", help="skip the rms_norm vs row length table"
    )
    args = parser.parse_args(argv)
    cfg = QUICK if args.quick else FULL
    cfg = Config(
        **{
            **cfg.__dict__,
            "threads": tuple(t for t in cfg.threads if t <= (os.cpu_count() or 1)) or (1,),
        }
    )
    start = time.perf_counter()
    rng = np.random.default_rng(0)

    def log(msg: str) -> None:
        print(f"[{time.perf_counter() - start:6.1f} s] {msg}", file=sys.stderr, flush=True)

    threads_before = lk.get_num_threads()
    report: dict[str, Any] = {"machine": machine_info(), "config": dict(cfg.__dict__)}
    log("roofline probe")
    probe = roofline_probe(cfg)
    report["probe"] = probe
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
