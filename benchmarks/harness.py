"""The benchmark harness: the one copy of what every script in ``benchmarks/`` shares.

* **Peers**: :func:`load_peers` imports torch and transformers when installed (extra
  ``bench``) into :data:`peers`; without them only the NumPy peers run.
* **Threads**: :func:`set_threads` sets llmkernels (and its OpenBLAS), torch and NumPy's
  bundled OpenBLAS (through ctypes, what threadpoolctl does) to the same count.
* **Timing**: :func:`measure` interleaves the peers -- ``rounds`` rounds, in
  each every peer runs its warm-up calls and then its timed calls in turn -- so that the slow
  drift of a shared machine falls on all peers alike; medians are reported.
  :func:`measure_quietly` first waits for other processes to go idle and measures once more
  when they kept more than half a CPU busy (:class:`OtherLoad`, from ``/proc/stat``).
  :func:`paired_ratio` compares two peers sample by sample (the median of the ratios of
  samples taken side by side), which a slow phase of the host shifts far less than a ratio of
  medians.
* **Roofline**: :func:`roofline_probe`, the extension's fp32 FMA and STREAM-triad probes at
  each thread count.
* **Cases**: an :class:`OpCase` is a name, a shape, bytes or FLOPs per call and
  ``{peer: callable}`` (llmkernels first); :func:`run_case` checks every peer's output
  against llmkernels' (:func:`check_outputs`), times them at each thread count and derives
  rates, roofline fractions, time ratios and thread speed-ups; :func:`op_table` renders them.
* **Reports**: :func:`machine_info` / :func:`machine_lines`, :func:`probe_section`, the
  ``fmt*`` helpers and :func:`md_table`, and :func:`write_report` (``<out>/<name>.md`` and
  ``<out>/<name>.json``).
* **Scripts**: :class:`Timing` (the shared protocol settings, ``FULL_TIMING`` /
  ``QUICK_TIMING``), :func:`arg_parser` (the options every script takes) and :func:`start`,
  which loads the peers, settles the configuration and returns a :class:`Run` (progress log,
  probe, cases, thread counts restored and the report written at the end);
  :func:`parse_and_start` is the two for a script's command line.
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
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path
from types import SimpleNamespace
from typing import Any, TypeVar

import llmkernels as lk
import numpy as np

LK = "llmkernels"
Impls = dict[str, Callable[[], Any]]

# torch, torch.nn.functional (F), HF's apply_rotary_pos_emb and a namespace of the
# transformers classes the block benchmarks use (hf); None where not installed.
peers = SimpleNamespace(torch=None, F=None, apply_rotary_pos_emb=None, hf=None)


def load_peers(torch_thp: bool = False) -> SimpleNamespace:
    """Import torch and transformers when installed; returns :data:`peers`.

    ``torch_thp`` sets ``THP_MEM_ALLOC_ENABLE=1`` first: torch then asks for transparent huge
    pages for its large allocations (NumPy does so by default). Off by default, to time torch
    as users get it.
    """
    global NUMPY_BLAS_THREADS
    if NUMPY_BLAS_THREADS is None:
        NUMPY_BLAS_THREADS = NumpyBlasThreads()
    if torch_thp:
        os.environ["THP_MEM_ALLOC_ENABLE"] = "1"
    try:
        import torch
        import torch.nn.functional as functional
    except ImportError:
        return peers
    peers.torch, peers.F = torch, functional
    try:
        from transformers import LlamaConfig, LlamaForCausalLM
        from transformers.cache_utils import DynamicCache
        from transformers.models.llama.modeling_llama import (
            LlamaDecoderLayer,
            LlamaRotaryEmbedding,
            apply_rotary_pos_emb,
        )
    except ImportError:
        return peers
    peers.apply_rotary_pos_emb = apply_rotary_pos_emb
    peers.hf = SimpleNamespace(
        LlamaConfig=LlamaConfig,
        LlamaForCausalLM=LlamaForCausalLM,
        DynamicCache=DynamicCache,
        LlamaDecoderLayer=LlamaDecoderLayer,
        LlamaRotaryEmbedding=LlamaRotaryEmbedding,
    )
    return peers


# --------------------------------------------------------------------------------------
# threads
# --------------------------------------------------------------------------------------


def hf_cache(module: Any, cache: Any) -> dict[str, Any]:
    """The keyword a transformers module takes its KV cache by: ``cache`` since transformers
    5.24 (which deprecates ``past_key_values``), ``past_key_values`` before."""
    import inspect

    params = inspect.signature(module.forward).parameters
    return {"cache" if "cache" in params else "past_key_values": cache}


def hf_output_cache(out: Any) -> Any:
    """The cache a transformers forward returned (``out.cache`` since 5.24)."""
    cache = getattr(out, "cache", None)
    return cache if cache is not None else out.past_key_values


class NumpyBlasThreads:
    """Set the thread count of NumPy's bundled OpenBLAS (what threadpoolctl does), via ctypes.

    NumPy's elementwise ops are single-threaded; only its matmuls use threads. If the library
    or its symbol cannot be found, NumPy keeps its default and ``controlled`` is False.
    """

    def __init__(self) -> None:
        self._set: Callable[[int], Any] | None = None
        self.path: str | None = None
        np.ones((2, 2), np.float32) @ np.ones((2, 2), np.float32)  # make sure it is loaded
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
                    self._set, self.path = getattr(lib, symbol), path
                    return

    @property
    def controlled(self) -> bool:
        """Whether NumPy's BLAS thread count can be set."""
        return self._set is not None

    def corename(self) -> str | None:
        """The kernel set NumPy's OpenBLAS chose (``Haswell``, ``SkylakeX``, ...)."""
        if self.path is None:
            return None
        lib = ctypes.CDLL(self.path)
        for symbol in (
            "scipy_openblas_get_corename64_",
            "openblas_get_corename64_",
            "openblas_get_corename",
        ):
            if hasattr(lib, symbol):
                fn = getattr(lib, symbol)
                fn.restype = ctypes.c_char_p
                return fn().decode()
        return None

    def __call__(self, n: int) -> None:
        if self._set is not None:
            self._set(ctypes.c_int(n))


NUMPY_BLAS_THREADS: NumpyBlasThreads | None = None  # made by load_peers()


def set_threads(n: int) -> None:
    """Use ``n`` threads in every library: llmkernels (+ its OpenBLAS), torch, NumPy's BLAS."""
    lk.set_num_threads(n)
    if peers.torch is not None:
        peers.torch.set_num_threads(n)
    if NUMPY_BLAS_THREADS is not None:
        NUMPY_BLAS_THREADS(n)


# --------------------------------------------------------------------------------------
# load and timing
# --------------------------------------------------------------------------------------


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


@contextmanager
def inference() -> Iterator[None]:
    """``torch.inference_mode`` when torch is there (HF's generate uses it too)."""
    if peers.torch is None:
        yield
    else:
        with peers.torch.inference_mode():
            yield


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


# minimum untimed time per peer block before its timed calls (see measure)
WARMUP_S = 0.1


def measure(
    impls: Impls,
    rounds: int,
    per_round: int,
    warmup: int = 1,
    setup: Mapping[str, Callable[[], Any]] | None = None,
    cap_s: float = math.inf,
    torch_inference: bool = False,
    warmup_s: float = WARMUP_S,
) -> dict[str, list[float]]:
    """Time every peer, interleaved: ``rounds`` rounds, each peer's block in turn.

    Each block starts with ``warmup`` untimed calls, repeated until ``warmup_s`` seconds have
    passed, which also lets the previous peer's spinning worker threads go to sleep (torch's
    OpenMP workers spin for milliseconds after a parallel region, ONNX Runtime's pool for tens
    of milliseconds: without this the next peer's ~1 ms samples at 2 threads ran with one core
    taken), then times ``per_round`` calls
    (fewer once they took ``cap_s`` seconds, but at least 2: a peer slowed down many times by
    other processes must not stall the run). ``setup[name]`` (untimed) runs before each of
    that peer's calls. ``torch_inference`` runs everything under ``torch.inference_mode``.
    Rounds spread slow drift of a shared machine over all peers alike. Returns seconds per call.
    """
    setup = setup or {}
    samples: dict[str, list[float]] = {name: [] for name in impls}
    with no_gc(), inference() if torch_inference else _nothing():
        for _ in range(rounds):
            for name, fn in impls.items():
                prep = setup.get(name)
                w0 = time.perf_counter()
                done = 0
                while done < warmup or (done and time.perf_counter() - w0 < warmup_s):
                    if prep is not None:
                        prep()
                    fn()
                    done += 1
                spent = 0.0
                for i in range(per_round):
                    if i >= 2 and spent > cap_s:
                        break
                    if prep is not None:
                        prep()
                    t0 = time.perf_counter()
                    fn()
                    dt = time.perf_counter() - t0
                    samples[name].append(dt)
                    spent += dt
    return samples


@contextmanager
def _nothing() -> Iterator[None]:
    yield


def measure_quietly(
    impls: Impls,
    rounds: int,
    per_round: int,
    *,
    quiet_wait: float,
    retry_max_s: float = math.inf,
    **kwargs: Any,
) -> tuple[dict[str, list[float]], float | None]:
    """:func:`measure` (``kwargs`` go to it) after :func:`wait_for_quiet` (at most
    ``quiet_wait`` s); measured once more if other processes kept more than half a CPU busy
    meanwhile (unless ``quiet_wait`` is 0 or the attempt took over ``retry_max_s``). Returns
    the samples of the quieter attempt and the CPUs other processes used during it."""
    best: tuple[dict[str, list[float]], float | None] | None = None
    for _ in range(2 if quiet_wait > 0 else 1):
        wait_for_quiet(quiet_wait)
        t0 = time.perf_counter()
        with OtherLoad() as load:
            samples = measure(impls, rounds, per_round, **kwargs)
        if best is None or (load.cpus or 0.0) < (best[1] or 0.0):
            best = (samples, load.cpus)
        if (load.cpus or 0.0) <= 0.5 or time.perf_counter() - t0 > retry_max_s:
            break
    assert best is not None
    return best


def paired_ratio(num: Sequence[float], den: Sequence[float]) -> float:
    """Median over i of ``num[i] / den[i]``: two peers' samples of one :func:`measure` call
    pair up by index (same round, same position in it), so each ratio compares calls made
    seconds apart. The shared hosts slow down in phases of seconds to tens of seconds (the same
    call 170 ms, then 270 ms for a dozen calls, then 170 again): a phase that falls on one
    peer's block moves a ratio of medians, while it moves only the pairs it covers here."""
    n = min(len(num), len(den))
    if n == 0:
        raise ValueError("paired_ratio: no samples")
    return statistics.median(num[i] / den[i] for i in range(n))


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


def peer_stats(
    samples: Mapping[str, list[float]], work: float | None, roof_value: float | None
) -> dict[str, dict[str, Any]]:
    """Per peer: median, min and samples (s), ``rate`` (``work`` per second / 1e9, GB/s or
    GFLOP/s), its ``fraction_of_roof`` and ``time_vs_llmkernels`` (median over llmkernels')."""
    lk_med = statistics.median(samples[LK]) if LK in samples else None
    out = {}
    for name, s in samples.items():
        med = statistics.median(s)
        entry: dict[str, Any] = {"median_s": med, "min_s": min(s), "samples_s": s}
        if work is not None:
            entry["rate"] = work / med / 1e9
            if roof_value:
                entry["fraction_of_roof"] = entry["rate"] / roof_value
        if lk_med:
            entry["time_vs_llmkernels"] = med / lk_med
        out[name] = entry
    return out


@dataclasses.dataclass
class OpCase:
    """One op at one shape, with its peers (the first peer is llmkernels)."""

    name: str
    shape: str
    metric: str  # "GB/s" (memory-bound) or "GFLOP/s" (compute-bound)
    work: float  # bytes moved or FLOPs per call
    impls: Impls
    repeats: int | None = None  # default: cfg.repeats
    rounds: int | None = None  # default: cfg.rounds


def run_case(case: OpCase, cfg: Any, probe: Mapping[str, Any]) -> dict[str, Any]:
    """Check that the peers agree, then time them at each of ``cfg.threads`` (``cfg.rounds``
    rounds, ``cfg.warmup`` warm-up calls, ``cfg.repeats`` timed calls over all rounds, after
    waiting up to ``cfg.quiet_wait`` s for a quiet machine); derive rates, fractions of the
    roofline, time ratios to llmkernels and each peer's thread speed-up."""
    set_threads(max(cfg.threads))
    results = {name: fn() for name, fn in case.impls.items()}
    reference = [r.copy() for r in as_arrays(results[LK])]  # out= buffers are overwritten later
    agreement = {name: max_rel_diff(res, reference) for name, res in results.items()}
    del results
    check_outputs(case.name, agreement)

    repeats = cfg.repeats if case.repeats is None else case.repeats
    rounds = cfg.rounds if case.rounds is None else case.rounds
    per_round = max(1, math.ceil(repeats / rounds))
    per_threads: dict[str, dict[str, Any]] = {name: {} for name in case.impls}
    other_load: dict[str, float | None] = {}
    for t in cfg.threads:
        set_threads(t)
        samples, other_load[str(t)] = measure_quietly(
            case.impls, rounds, per_round, warmup=cfg.warmup, quiet_wait=cfg.quiet_wait
        )
        for name, st in peer_stats(samples, case.work, roof(probe, case.metric, t)).items():
            per_threads[name][str(t)] = st
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


def op_table(ops: Sequence[Mapping[str, Any]], threads: Sequence[int]) -> list[str]:
    """The per-op table of :func:`run_case` results: each peer's time, rate and roofline
    fraction per thread count, its time over llmkernels', its own thread speedup next to the
    probe's, and the load of other processes."""
    lo, hi = str(min(threads)), str(max(threads))

    def cells(s: Mapping[str, Any]) -> list[str]:
        return [fmt_time(s["median_s"]), fmt(s["rate"], 1), f"{100 * s['fraction_of_roof']:.0f}%"]

    rows = []
    for op in ops:
        others = op["other_processes_cpus"]
        per_op = [fmt(op["roof_scaling"]), fmt_cpus([others[str(t)] for t in threads])]
        rows += grouped(
            f"**{op['op']}** {op['shape']} [{op['metric']}]",
            [
                [name]
                + [c for t in threads for c in cells(st[str(t)])]
                + [fmt(st[t]["time_vs_llmkernels"]) for t in (lo, hi)]
                + [fmt(st["thread_speedup"])]
                + (per_op if i == 0 else ["", ""])
                for i, (name, st) in enumerate(op["impls"].items())
            ],
        )
    tail = [f"x lk {lo}T", f"x lk {hi}T", f"{lo}T/{hi}T", "probe", "others"]
    return md_table(thread_header(["op", "impl"], ["time", "rate", "roof"], threads, tail), rows)


# --------------------------------------------------------------------------------------
# roofline probe
# --------------------------------------------------------------------------------------


def roofline_probe(
    threads: Sequence[int],
    *,
    fma_iters: int,
    triad_n: int,
    triad_inner: int,
    repeats: int,
    quiet_wait: float,
    best: bool = False,
) -> dict[str, Any]:
    """fp32 FMA peak (GFLOP/s) and triad bandwidth (GB/s) per thread count, measured by the
    extension (``_probe_fma_gflops``, ``_probe_triad_gbs``; the triad is itself best of
    ``triad_inner``), ``repeats`` times.

    ``best=False``: the medians (``{"fma_gflops": {"1": {"median", "samples"}}, ...}`` with
    the 2T/1T ``*_scaling``). ``best=True``: the best of the repeats
    (``{"fma_gflops": {"1": best}, "fma_samples": ...}``): a peak is a maximum, and on a
    shared machine other processes only ever lower it -- a busy second core makes the
    2-thread FMA number fall to the 1-thread one, which would inflate every 2T fraction.
    """
    core = lk._core
    core._probe_fma_gflops(1, fma_iters)  # let the clock ramp up
    fma: dict[int, list[float]] = {t: [] for t in threads}
    triad: dict[int, list[float]] = {t: [] for t in threads}
    wait_for_quiet(quiet_wait)
    with OtherLoad() as load:
        for _ in range(repeats):
            for t in threads:
                fma[t].append(core._probe_fma_gflops(t, fma_iters))
                triad[t].append(core._probe_triad_gbs(t, triad_n, triad_inner))
    if best:
        return {
            "fma_gflops": {str(t): max(v) for t, v in fma.items()},
            "triad_gbs": {str(t): max(v) for t, v in triad.items()},
            "fma_samples": {str(t): v for t, v in fma.items()},
            "triad_samples": {str(t): v for t, v in triad.items()},
            "other_processes_cpus": load.cpus,
        }
    lo, hi = min(threads), max(threads)
    fma_med = {t: statistics.median(v) for t, v in fma.items()}
    triad_med = {t: statistics.median(v) for t, v in triad.items()}
    return {
        "fma_gflops": {str(t): {"median": fma_med[t], "samples": fma[t]} for t in threads},
        "triad_gbs": {str(t): {"median": triad_med[t], "samples": triad[t]} for t in threads},
        "fma_scaling": fma_med[hi] / fma_med[lo],
        "triad_scaling": triad_med[hi] / triad_med[lo],
        "triad_n": triad_n,
        "fma_iterations": fma_iters,
        "other_processes_cpus": load.cpus,
    }


def roof(probe: Mapping[str, Any], metric: str, threads: int | str) -> float:
    """The roofline number an op of ``metric`` ("GB/s" or "GFLOP/s") is compared with at
    ``threads``, from either form of :func:`roofline_probe`."""
    entry = probe["triad_gbs" if metric == "GB/s" else "fma_gflops"][str(threads)]
    return float(entry["median"] if isinstance(entry, Mapping) else entry)


# --------------------------------------------------------------------------------------
# data, outputs, NumPy formulas shared by several scripts
# --------------------------------------------------------------------------------------


def rng_f32(rng: np.random.Generator, *shape: int, scale: float = 1.0) -> np.ndarray:
    """Standard-normal float32 data of ``shape`` (times ``scale``)."""
    return (rng.standard_normal(shape, dtype=np.float32) * np.float32(scale)).astype(np.float32)


def as_arrays(result: Any) -> list[np.ndarray]:
    """A peer's result (array, tensor, or tuple of them) as a list of NumPy arrays."""
    items = result if isinstance(result, (tuple, list)) else (result,)
    torch = peers.torch
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


def check_outputs(name: str, diffs: Mapping[str, float], limit: float = 1e-3) -> None:
    """Warn (stderr) about every peer whose output differs from llmkernels' beyond ``limit``."""
    for peer, d in diffs.items():
        if not d <= limit:
            print(
                f"WARNING: {name}: {peer} differs from llmkernels by {d:.2e} (rel)", file=sys.stderr
            )


def rope_cos_sin(head_dim: int, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``cos, sin`` of shape ``(T, head_dim/2)``, theta 10000 (angles in float64, like
    llmkernels)."""
    inv_freq = lk.rope_inv_freq(head_dim, 10000.0)
    ang = np.outer(positions.astype(np.float64), inv_freq)
    return np.cos(ang).astype(np.float32), np.sin(ang).astype(np.float32)


def numpy_rope(x: np.ndarray, cos: np.ndarray, sin: np.ndarray) -> np.ndarray:
    """Half-split RoPE with precomputed ``cos``/``sin`` of shape ``(T, D/2)``."""
    h = x.shape[-1] // 2
    x1, x2 = x[..., :h], x[..., h:]
    return np.concatenate((x1 * cos - x2 * sin, x2 * cos + x1 * sin), axis=-1)


def numpy_rms_norm(x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
    """The float32 NumPy RMSNorm formula."""
    return x / np.sqrt(np.mean(x * x, -1, keepdims=True) + np.float32(eps)) * w


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


# --------------------------------------------------------------------------------------
# machine info
# --------------------------------------------------------------------------------------


def _lk_openblas_core() -> str | None:
    """The kernel set of the extension's OpenBLAS (the word before ``MAX_THREADS``)."""
    words = str(lk.build_info().get("blas", "")).split()
    for i, w in enumerate(words):
        if w.startswith("MAX_THREADS") and i > 0:
            return words[i - 1]
    return None


def machine_info() -> dict[str, Any]:
    """Build info of the extension plus the host, library versions, BLAS kernels and load at
    start."""
    cpu = platform.processor()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name"))
    except (OSError, StopIteration):
        pass
    numpy_blas = "?"
    try:
        b = np.show_config(mode="dicts")["Build Dependencies"]["blas"]  # type: ignore[call-arg]
        numpy_blas = f"{b.get('name')} {b.get('version')}"
    except Exception:  # noqa: BLE001 - informational only
        pass
    torch = peers.torch
    torch_blas = None
    if torch is not None:
        show = torch.__config__.show()
        torch_blas = "MKL" if "BLAS_INFO=mkl" in show else "see torch.__config__.show()"
    try:
        import transformers

        transformers_version: str | None = transformers.__version__
    except ImportError:
        transformers_version = None
    blas = NUMPY_BLAS_THREADS
    return {
        "build_info": lk.build_info(),
        "cpu": cpu,
        "cpu_count": os.cpu_count(),
        "llc_bytes": llc_bytes(),
        "platform": platform.platform(),
        "python": sys.version.split()[0],
        "numpy": np.__version__,
        "numpy_blas": numpy_blas,
        "numpy_openblas_core": blas.corename() if blas else None,
        "llmkernels_openblas_core": _lk_openblas_core(),
        "OPENBLAS_CORETYPE": os.environ.get("OPENBLAS_CORETYPE"),
        "numpy_blas_threads_controlled": bool(blas and blas.controlled),
        "torch": torch.__version__ if torch is not None else None,
        "torch_blas": torch_blas,
        "torch_THP_MEM_ALLOC_ENABLE": os.environ.get("THP_MEM_ALLOC_ENABLE"),
        "transformers": transformers_version,
        "load_average_at_start": os.getloadavg(),
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
    }


def machine_lines(m: Mapping[str, Any]) -> list[str]:
    """The report header's machine lines (markdown list items); what a results file from an
    older run does not have is left out."""
    bi = m["build_info"]
    build = [bi["simd_arch"], bi.get("compiler"), bi.get("xsimd") and f"xsimd {bi['xsimd']}"]
    lines = [
        f"- {m['cpu']}, {m['cpu_count']} CPUs; load average at start "
        f"{', '.join(f'{x:.2f}' for x in m['load_average_at_start'])}; {m['date']}",
        f"- llmkernels {bi['version']} ({', '.join(str(b) for b in build if b)}, {bi['blas']})",
        f"- Python {m['python']}, NumPy {m['numpy']}"
        + (f" ({m['numpy_blas']})" if m.get("numpy_blas") else "")
        + f", torch {m['torch']}"
        + (f" ({m['torch_blas']})" if m.get("torch_blas") else "")
        + f", transformers {m['transformers']}"
        + (" (torch with THP_MEM_ALLOC_ENABLE=1)" if m.get("torch_THP_MEM_ALLOC_ENABLE") else ""),
    ]
    if m.get("numpy_openblas_core") or m.get("llmkernels_openblas_core"):
        lines.append(
            f"- OpenBLAS kernels: llmkernels' {m.get('llmkernels_openblas_core')}, NumPy's "
            f"{m.get('numpy_openblas_core')} "
            f"(OPENBLAS_CORETYPE={m.get('OPENBLAS_CORETYPE') or 'unset'})"
        )
    return lines


def probe_section(probe: Mapping[str, Any], threads: Sequence[int]) -> list[str]:
    """The ``## Roofline probe`` section of a report (the median form of the probe)."""
    lo, hi = str(min(threads)), str(max(threads))
    out = ["## Roofline probe", ""]
    out += md_table(
        ["", *[f"{t} thread{'s' if t > 1 else ''}" for t in threads], f"{hi}T / {lo}T"],
        [
            [
                "fp32 FMA peak (GFLOP/s)",
                *[fmt(probe["fma_gflops"][str(t)]["median"], 1) for t in threads],
                fmt(probe["fma_scaling"]),
            ],
            [
                "triad bandwidth (GB/s)",
                *[fmt(probe["triad_gbs"][str(t)]["median"], 1) for t in threads],
                fmt(probe["triad_scaling"]),
            ],
        ],
    )
    if probe.get("other_processes_cpus") is not None:
        cpus = probe["other_processes_cpus"]
        out += ["", f"Other processes kept {cpus:.1f} CPUs busy meanwhile."]
    return out


# --------------------------------------------------------------------------------------
# formatting
# --------------------------------------------------------------------------------------


def fmt(v: float | None, digits: int = 2) -> str:
    """A number for the tables (``-`` when absent)."""
    if v is None:
        return "-"
    if v != 0 and abs(v) < 10**-digits:
        return f"{v:.1e}"
    return f"{v:.{digits}f}"


def fmt_time(seconds: float | None) -> str:
    """Seconds as s/ms/us/ns with three significant digits (``-`` when absent)."""
    if seconds is None:
        return "-"
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("us", 1e-6)):
        if abs(seconds) >= scale:
            return f"{seconds / scale:.3g} {unit}"
    return f"{seconds / 1e-9:.3g} ns"


def fmt_bytes(n: float | None) -> str:
    """Bytes as B/KiB/MiB/GiB with three significant digits (``-`` when absent)."""
    if n is None:
        return "-"
    for unit, scale in (("GiB", 1024**3), ("MiB", 1024**2), ("KiB", 1024)):
        if abs(n) >= scale:
            return f"{n / scale:.3g} {unit}"
    return f"{n:.0f} B"


def fmt_cpus(values: Sequence[float | None]) -> str:
    """CPUs other processes used, per thread count: ``0.1 / 0.3``."""
    return " / ".join("-" if c is None else f"{c:.1f}" for c in values)


def md_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    """Rows of a markdown table."""
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join(" --- " for _ in header) + "|"]
    return lines + ["| " + " | ".join(r) + " |" for r in rows]


def thread_header(
    lead: Sequence[str], columns: Sequence[str], threads: Sequence[int], tail: Sequence[str] = ()
) -> list[str]:
    """A table header: ``lead``, then ``columns`` once per thread count (``"2T time"``), then
    ``tail``."""
    return [*lead, *(f"{t}T {c}" for t in threads for c in columns), *tail]


def grouped(label: str, rows: Iterable[Sequence[str]]) -> list[list[str]]:
    """The rows of one case of a table: ``label`` leads the first, the others start empty."""
    return [[label if i == 0 else "", *r] for i, r in enumerate(rows)]


# --------------------------------------------------------------------------------------
# scripts: options, start, results
# --------------------------------------------------------------------------------------

C = TypeVar("C")


@dataclasses.dataclass(frozen=True)
class Timing:
    """The protocol settings of the op-level scripts; their ``Config`` adds the shapes."""

    quick: bool
    threads: tuple[int, ...]
    rounds: int  # measurement rounds; every peer runs once per round, in turn
    warmup: int  # untimed calls of a peer at the start of each of its rounds
    repeats: int  # timed calls of a peer, over all rounds
    probe_repeats: int
    triad_n: int
    triad_inner: int  # the probe's own best-of count
    fma_iters: int
    quiet_wait: float  # max seconds to wait for other processes to go idle before timing


FULL_TIMING: dict[str, Any] = {
    "quick": False,
    "threads": (1, 2),
    "rounds": 3,
    "warmup": 1,
    "repeats": 15,
    "probe_repeats": 5,
    "triad_n": 50_000_000,
    "triad_inner": 2,
    "fma_iters": 50_000_000,
    "quiet_wait": 60.0,
}
QUICK_TIMING: dict[str, Any] = {
    **FULL_TIMING,
    "quick": True,
    "rounds": 1,
    "repeats": 3,
    "probe_repeats": 1,
    "triad_n": 10_000_000,
    "fma_iters": 10_000_000,
    "quiet_wait": 0.0,
}


def full_and_quick(
    config: Callable[..., C],
    sizes: Mapping[str, tuple[Any, Any]],
    timing: tuple[Mapping[str, Any], Mapping[str, Any]] = (FULL_TIMING, QUICK_TIMING),
) -> tuple[C, C]:
    """A script's ``(FULL, QUICK)`` configurations from one table ``field: (full, quick)``,
    so that each size of the full run stands beside its ``--quick`` counterpart, plus the
    timing settings of each run (``timing``: keyword arguments of the full and the quick
    ``config``)."""
    full = config(**timing[0], **{k: v[0] for k, v in sizes.items()})
    quick = config(**timing[1], **{k: v[1] for k, v in sizes.items()})
    return full, quick


def arg_parser(doc: str | None, quiet_default: str) -> argparse.ArgumentParser:
    """The options every benchmark script takes: ``--quick``, ``--out``, ``--quiet-wait``,
    ``--torch-thp``."""
    parser = argparse.ArgumentParser(description=(doc or "").split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="small shapes, few repeats")
    parser.add_argument(
        "--out",
        type=Path,
        default=Path("benchmarks/results"),
        help="output directory (default: benchmarks/results)",
    )
    parser.add_argument(
        "--quiet-wait",
        type=float,
        default=None,
        help="max seconds to wait for other processes to go idle before each measurement "
        f"(default: {quiet_default}, 0 with --quick)",
    )
    parser.add_argument(
        "--torch-thp",
        action="store_true",
        help="set THP_MEM_ALLOC_ENABLE=1 for torch (huge pages for its allocations)",
    )
    return parser


class Run:
    """One benchmark run: the progress log on stderr (``[  t s] what``, the stage lines), and
    the thread counts restored at :meth:`finish`."""

    def __init__(self, log: bool = True) -> None:
        self.start = time.perf_counter()
        self._log = log
        self._lk_threads = lk.get_num_threads()
        torch = peers.torch
        self._torch_threads = torch.get_num_threads() if torch is not None else None

    def log(self, msg: str) -> None:
        if self._log:
            print(f"[{self.elapsed():6.1f} s] {msg}", file=sys.stderr, flush=True)

    def elapsed(self) -> float:
        return time.perf_counter() - self.start

    def finish(self) -> float:
        """Restore the thread counts; returns the seconds since the start."""
        lk.set_num_threads(self._lk_threads)
        if peers.torch is not None and self._torch_threads is not None:
            peers.torch.set_num_threads(self._torch_threads)
        if NUMPY_BLAS_THREADS is not None:
            NUMPY_BLAS_THREADS(os.cpu_count() or 1)
        return self.elapsed()

    def probe(self, cfg: Timing) -> dict[str, Any]:
        """The roofline probe (median form) with ``cfg``'s settings."""
        self.log("roofline probe")
        return roofline_probe(
            cfg.threads,
            fma_iters=cfg.fma_iters,
            triad_n=cfg.triad_n,
            triad_inner=cfg.triad_inner,
            repeats=cfg.probe_repeats,
            quiet_wait=cfg.quiet_wait,
        )

    def cases(
        self,
        makers: Sequence[Callable[[Any, np.random.Generator], OpCase]],
        cfg: Timing,
        rng: np.random.Generator,
        probe: Mapping[str, Any],
    ) -> list[dict[str, Any]]:
        """Each maker's :class:`OpCase` through :func:`run_case`, one at a time (its arrays
        freed before the next is made)."""
        out = []
        for make in makers:
            case = make(cfg, rng)
            self.log(f"{case.name} {case.shape}")
            out.append(run_case(case, cfg, probe))
            del case
            gc.collect()
        return out

    def report(
        self,
        report: dict[str, Any],
        render: Callable[[dict[str, Any]], str],
        out: Path,
        name: str,
    ) -> int:
        """Finish the run, print the rendered report and write ``<out>/<name>.md/.json``."""
        report["elapsed_s"] = self.finish()
        self.log("done")
        text = render(report)
        print(text)
        write_report(out, name, report, text)
        return 0


def start(
    cfg: C, quiet_wait: float | None, *, torch_thp: bool = False, log: bool = True
) -> tuple[C, Run]:
    """Load the peers, freeze the objects they leave behind and settle ``cfg`` (a frozen
    dataclass with ``threads`` and ``quiet_wait``): only thread counts this machine has, and
    ``quiet_wait`` when given. Returns ``(cfg, Run)``."""
    load_peers(torch_thp)
    # torch and transformers leave ~10^5 objects behind; freezing them keeps the gc.collect()
    # before every measurement (no_gc) from scanning them each time (~0.2 s per call).
    gc.collect()
    gc.freeze()
    threads = tuple(t for t in cfg.threads if t <= (os.cpu_count() or 1)) or (1,)  # type: ignore[attr-defined]
    wait = cfg.quiet_wait if quiet_wait is None else quiet_wait  # type: ignore[attr-defined]
    cfg = dataclasses.replace(cfg, threads=threads, quiet_wait=wait)  # type: ignore[type-var]
    return cfg, Run(log)


def parse_and_start(
    parser: argparse.ArgumentParser,
    argv: list[str] | None,
    full: C,
    quick: C,
    *,
    use_torch_thp: bool = False,
) -> tuple[argparse.Namespace, C, Run]:
    """A script's command line parsed (``parser``: :func:`arg_parser` and the script's own
    options), then :func:`start` of ``quick`` (``--quick``) or ``full`` with ``--quiet-wait``
    and, where ``use_torch_thp``, ``--torch-thp``. Returns ``(args, cfg, Run)``."""
    args = parser.parse_args(argv)
    thp = args.torch_thp if use_torch_thp else False
    cfg, run = start(quick if args.quick else full, args.quiet_wait, torch_thp=thp)
    return args, cfg, run


def new_report(cfg: Any) -> dict[str, Any]:
    """A report's first entries: the machine and the configuration."""
    return {"machine": machine_info(), "config": dataclasses.asdict(cfg)}


DOT_FLAGS = {"avx2", "fma", "avx512f", "avx512bw", "avx512vl", "avx512_vnni", "avx512_bf16"}


def cpu_flags(wanted: set[str] = DOT_FLAGS) -> list[str]:
    """The CPU's flags among ``wanted`` (/proc/cpuinfo), sorted: what the kernels depend on."""
    text = Path("/proc/cpuinfo").read_text()
    return sorted(set(text.split("flags")[1].split("\n")[0].split()) & wanted)


def heading(report: Mapping[str, Any], title: str) -> tuple[dict[str, Any], list[str], list[str]]:
    """A rendered report's start: its config, its thread counts as strings, and the lines of
    its title and machine."""
    cfg = report["config"]
    return cfg, [str(t) for t in cfg["threads"]], [title, "", *machine_lines(report["machine"]), ""]


def print_report(
    out: str | Path | None, name: str, report: Mapping[str, Any], lines: list[str]
) -> int:
    """Print the rendered ``lines`` and, given ``out``, write ``<out>/<name>.md/.json``."""
    text = "\n".join(lines)
    print(text)
    if out:
        write_report(Path(out), name, report, text + "\n")
    return 0


def write_report(out: Path, name: str, report: Mapping[str, Any], markdown: str) -> None:
    """``<out>/<name>.md`` (the printed report) and ``<out>/<name>.json`` (everything)."""
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{name}.md").write_text(markdown)
    data = {k: v for k, v in report.items() if k != "markdown"}
    (out / f"{name}.json").write_text(json.dumps(data, indent=1, default=str) + "\n")
    print(f"wrote {out / f'{name}.md'} and {out / f'{name}.json'}", file=sys.stderr)


def load_json(path: Path) -> dict[str, Any]:
    """A results file."""
    return json.loads(Path(path).read_text())
