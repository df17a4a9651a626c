#!/usr/bin/env python
"""float32 GEMM of the projections, y = x . W^T with W (out, in) as HF stores it, at TinyLlama's
shapes: the package's own products against OpenBLAS sgemm and torch (MKL), in one run.

Usage::

    python benchmarks/bench_gemm.py [--quick] [--out benchmarks/results] [--m 16,512]

For each shape (in -> out: 2048 -> 2048, 2048 -> 5632, 5632 -> 2048, 2048 -> 256), each token
count m (16, 64, 256, 512, 2048) and each thread count (1, 2), interleaved rounds
(``harness.measure_quietly``), medians of:

* ``lk auto``: ``_core._linear`` (the modules' projection path) as routed by ops/linear.cpp;
* ``lk packed``: the same call forced to gemm_packed_kernel (both operands packed);
* ``lk tokens``: forced to gemm_xt_kernel (x packed, weights read in place; m <= 512 only);
* ``lk OpenBLAS``: forced to the package's BLAS route: the OpenBLAS (pthreads build) it links,
  single-threaded inside the package's thread pool, blocks of 256 rows (columns below 512 rows);
* ``NumPy``: ``x @ w.T`` -- NumPy's bundled OpenBLAS (scipy-openblas) with its own threads;
* ``torch``: ``torch.matmul(x, w.T)`` -- MKL on the x86 CPU wheel (``torch.__config__``), when
  torch is installed.

Every output is first compared with a float64 product. Rates in GFLOP/s (2 m k n per call) and
as a fraction of the fp32 FMA peak the extension's probe measures in the same run; ratios are
peer time / ``lk auto`` time. Writes ``<out>/gemm.md`` and ``<out>/gemm.json``.
"""

from __future__ import annotations

import statistics
import sys
from dataclasses import dataclass, replace
from typing import Any

import harness as h
import llmkernels as lk
import numpy as np
from harness import fmt, fmt_time, md_table

core = lk._core
SHAPES = ((2048, 2048), (2048, 5632), (5632, 2048), (2048, 256))  # (k = in, n = out)
TOKENS = (16, 64, 256, 512, 2048)
TOKENS_MAX_M = 512  # the in-place kernel is timed up to here (it is not routed above)


@dataclass(frozen=True)
class Config(h.Timing):
    shapes: tuple[tuple[int, int], ...]
    tokens: tuple[int, ...]


FULL, QUICK = h.full_and_quick(
    Config,
    {"shapes": (SHAPES, ((256, 320), (320, 96))), "tokens": (TOKENS, (16, 77))},
    (
        {**h.FULL_TIMING, "rounds": 3, "repeats": 9, "quiet_wait": 10.0},
        {**h.QUICK_TIMING, "repeats": 2},
    ),
)


def routed(route: str, x: np.ndarray, w: np.ndarray) -> Any:
    """A callable of ``_core._linear`` forced to ``route`` (restored after the call)."""

    def call() -> np.ndarray:
        previous = core._set_gemm_route(route)
        try:
            return core._linear(x, w, "float32")
        finally:
            core._set_gemm_route(previous)

    return call


def peers_for(k: int, n: int, m: int, rng: np.random.Generator) -> dict[str, Any]:
    """{peer: callable} for one shape and token count, outputs checked against float64."""
    w = (rng.standard_normal((n, k)) * 0.02).astype(np.float32)
    x = rng.standard_normal((m, k)).astype(np.float32)
    impls: dict[str, Any] = {
        "lk auto": routed("auto", x, w),
        "lk packed": routed("packed", x, w),
    }
    if m <= TOKENS_MAX_M:
        impls["lk tokens"] = routed("tokens", x, w)
    impls["lk OpenBLAS"] = routed("blas", x, w)
    impls["NumPy"] = lambda: x @ w.T
    torch = h.peers.torch
    if torch is not None:
        xt, wt = torch.from_numpy(x), torch.from_numpy(w)
        impls["torch"] = lambda: torch.matmul(xt, wt.T)
    ref = x.astype(np.float64) @ w.T.astype(np.float64)
    scale = np.abs(ref).max()
    for name, fn in impls.items():
        got = np.asarray(h.as_arrays(fn())[0], dtype=np.float64)
        rel = np.abs(got - ref).max() / scale
        if not rel < 1e-4:
            raise SystemExit(f"{name} ({k} -> {n}, m = {m}): max rel error {rel:.3g} vs float64")
    return impls


def blas_info() -> dict[str, Any]:
    """Which BLAS each peer runs on."""
    info: dict[str, Any] = {"llmkernels_openblas": core.openblas_config()}
    numpy_blas = h.NUMPY_BLAS_THREADS
    if numpy_blas is not None:
        info["numpy_openblas"] = {"path": numpy_blas.path, "core": numpy_blas.corename()}
    torch = h.peers.torch
    if torch is not None:
        info["torch"] = {
            "version": torch.__version__,
            "mkl": bool(torch.backends.mkl.is_available()),
            "blas": next(
                (ln.strip() for ln in torch.__config__.show().splitlines() if "BLAS_INFO" in ln),
                None,
            ),
        }
    return info


def main(argv: list[str] | None = None) -> int:
    parser = h.arg_parser(__doc__, "10")
    parser.add_argument("--m", type=str, default=None, help="token counts, comma-separated")
    args, cfg, run = h.parse_and_start(parser, argv, FULL, QUICK)
    if args.m:
        cfg = replace(cfg, tokens=tuple(int(v) for v in args.m.split(",")))
    report = h.new_report(cfg)
    report["blas"] = blas_info()
    probe = run.probe(cfg)
    report["probe"] = probe
    rng = np.random.default_rng(0)
    cases = []
    for k, n in cfg.shapes:
        for m in cfg.tokens:
            run.log(f"{k} -> {n}, m = {m}")
            impls = peers_for(k, n, m, rng)
            flops = 2.0 * m * k * n
            per_round = max(1, cfg.repeats // cfg.rounds)
            entry: dict[str, Any] = {"k": k, "n": n, "m": m, "flops": flops, "threads": {}}
            for t in cfg.threads:
                h.set_threads(t)
                samples, others = h.measure_quietly(
                    impls,
                    cfg.rounds,
                    per_round,
                    warmup=cfg.warmup,
                    quiet_wait=cfg.quiet_wait,
                    cap_s=2.0,
                )
                peak = h.roof(probe, "GFLOP/s", t)
                base = statistics.median(samples["lk auto"])
                stats = {}
                for name, smp in samples.items():
                    med = statistics.median(smp)
                    rate = flops / med / 1e9
                    stats[name] = {
                        "median_s": med,
                        "gflops": rate,
                        "peak": rate / peak,
                        "ratio": med / base,
                        "samples": smp,
                    }
                entry["threads"][str(t)] = {"peers": stats, "fma_gflops": peak, "others": others}
            cases.append(entry)
            del impls
    report["cases"] = cases
    return run.report(report, render, args.out, "gemm")


def render(report: dict[str, Any]) -> str:
    cfg, threads, lines = h.heading(report, "# float32 GEMM (projections, W (out, in))")
    blas = report["blas"]
    lines += [f"llmkernels' OpenBLAS: {blas['llmkernels_openblas']}"]
    if "numpy_openblas" in blas:
        lines += [f"NumPy's OpenBLAS: {blas['numpy_openblas']['core']}"]
    if "torch" in blas:
        lines += [f"torch {blas['torch']['version']}: MKL {blas['torch']['mkl']}"]
    lines += [
        "",
        "fp32 FMA peak (probe, same run): "
        + ", ".join(f"{t}T {h.roof(report['probe'], 'GFLOP/s', t):.1f} GFLOP/s" for t in threads),
        "",
        "GFLOP/s (fraction of the FMA peak) and time ratio peer / lk auto (> 1: lk auto faster).",
        "",
    ]

    def cells(st: dict[str, Any]) -> list[str]:
        gflops = f"{st['gflops']:.1f} ({100 * st['peak']:.0f}%)"
        return [fmt_time(st["median_s"]), gflops, fmt(st["ratio"])]

    rows = []
    for c in report["cases"]:
        per_t = c["threads"]
        rows += h.grouped(
            f"{c['k']} -> {c['n']}, m={c['m']}",
            [
                [name, *(x for t in threads for x in cells(per_t[t]["peers"][name]))]
                for name in per_t[threads[0]]["peers"]
            ],
        )
    lead = ["shape (in -> out), tokens", "peer"]
    header = h.thread_header(lead, ["time", "GFLOP/s", "ratio"], threads)
    lines += md_table(header, rows)
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
