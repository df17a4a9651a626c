#!/usr/bin/env python
"""Quantized-weight GEMV (decode, m = 1) at TinyLlama's projection shapes: int8 and int4 weights
(group 32) against float32, as GB/s of weight bytes read and a fraction of the triad bandwidth.

Usage::

    python benchmarks/bench_quant.py [--quick] [--out benchmarks/results] [--m 1]

For each shape (in -> out: 2048 -> 2048, 2048 -> 5632, 5632 -> 2048, 2048 -> 32000) and each
thread count (1, 2), interleaved rounds (``harness.measure_quietly``), medians:

* ``f32 NumPy``: ``x @ w.T`` with w float32 (rows, k) -- NumPy's BLAS sgemv, the float32 peer;
* ``int8 float-acts`` / ``int8 int8-acts``: ``lk.quantized_linear`` with int8 weights and the
  two activation strategies (float32 activations dequantized in registers; activations
  quantized per token to int8 blocks and integer dot products);
* ``int4 float-acts`` / ``int4 int8-acts``: the same with int4 (Q4_0-layout) weights;
* ``llama.cpp``: not timed here (the model-level comparison is bench_precision.py); this script
  says whether ``llama_cpp`` is importable.

Bytes per call = the weight bytes (codes + float16 scales; 4 bytes per weight for float32);
``roof`` = that rate over the triad bandwidth the extension's probe measures in the same run.
Writes ``<out>/quant.md`` and ``<out>/quant.json``.
"""

from __future__ import annotations

import statistics
import sys
from dataclasses import dataclass
from typing import Any

import harness as h
import llmkernels as lk
import numpy as np
from harness import fmt, fmt_time, md_table

SHAPES = ((2048, 2048), (2048, 5632), (5632, 2048), (2048, 32000))  # (k = in, rows = out)
GROUP = 32


@dataclass(frozen=True)
class Config(h.Timing):
    shapes: tuple[tuple[int, int], ...]
    m: int


FULL, QUICK = h.full_and_quick(
    Config,
    {"shapes": (SHAPES, SHAPES[:2]), "m": (1, 1)},
    (
        {**h.FULL_TIMING, "rounds": 5, "repeats": 40, "quiet_wait": 10.0},
        {**h.QUICK_TIMING, "repeats": 5},
    ),
)


def peers_for(k: int, rows: int, m: int, rng: np.random.Generator) -> tuple[dict, dict, dict]:
    """{peer: callable}, {peer: weight bytes}, {peer: output} for one shape."""
    w = (rng.standard_normal((rows, k)) * 0.02).astype(np.float32)
    x = rng.standard_normal((m, k)).astype(np.float32)
    impls: dict[str, Any] = {}
    nbytes: dict[str, int] = {}
    for bits in (8, 4):
        q, s = lk.quantize(w, bits, GROUP)
        for acts, label in (("float32", "float-acts"), ("int8", "int8-acts")):
            name = f"int{bits} {label}"
            impls[name] = lambda q=q, s=s, bits=bits, acts=acts: lk.quantized_linear(
                x, q, s, bits, GROUP, activations=acts
            )
            nbytes[name] = q.nbytes + s.nbytes
    impls["f32 NumPy"] = lambda: x @ w.T
    nbytes["f32 NumPy"] = w.nbytes
    ref = x.astype(np.float64) @ w.T.astype(np.float64)
    outs = {name: fn() for name, fn in impls.items()}
    for name, y in outs.items():  # a sanity check: quantization error only
        rel = np.abs(y - ref).max() / np.abs(ref).max()
        limit = 0.02 if name.startswith(("int8", "f32")) else 0.2
        if not rel < limit:
            raise SystemExit(f"{name}: max rel error {rel:.3g} vs float64 (limit {limit})")
    return impls, nbytes, outs


def main(argv: list[str] | None = None) -> int:
    parser = h.arg_parser(__doc__, "10")
    parser.add_argument("--m", type=int, default=None, help="tokens per call (default 1)")
    args, cfg, run = h.parse_and_start(parser, argv, FULL, QUICK)
    if args.m:
        import dataclasses

        cfg = dataclasses.replace(cfg, m=args.m)
    report = h.new_report(cfg)
    try:
        import llama_cpp  # noqa: F401

        report["llama_cpp"] = "installed (model-level comparison: bench_precision.py)"
    except ImportError:
        report["llama_cpp"] = "not installed: skipped"
    probe = run.probe(cfg)
    report["probe"] = probe
    rng = np.random.default_rng(0)
    cases = []
    for k, rows in cfg.shapes:
        run.log(f"{k} -> {rows}, m = {cfg.m}")
        impls, nbytes, _ = peers_for(k, rows, cfg.m, rng)
        per_round = max(1, cfg.repeats // cfg.rounds)
        entry: dict[str, Any] = {"k": k, "rows": rows, "bytes": nbytes, "threads": {}}
        for t in cfg.threads:
            h.set_threads(t)
            samples, others = h.measure_quietly(
                impls, cfg.rounds, per_round, warmup=cfg.warmup, quiet_wait=cfg.quiet_wait
            )
            triad = h.roof(probe, "GB/s", t)
            stats = {}
            for name, smp in samples.items():
                med = statistics.median(smp)
                rate = nbytes[name] / med / 1e9
                stats[name] = {"median_s": med, "gbs": rate, "roof": rate / triad, "samples": smp}
            entry["threads"][str(t)] = {"peers": stats, "triad_gbs": triad, "others": others}
        cases.append(entry)
    report["cases"] = cases
    return run.report(report, render, args.out, "quant")


def render(report: dict[str, Any]) -> str:
    cfg, threads, lines = h.heading(report, "# Quantized GEMV (decode)")
    lines += [f"m = {cfg['m']} token(s), group size {GROUP}; llama.cpp: {report['llama_cpp']}", ""]
    lines += [
        "triad bandwidth: "
        + ", ".join(f"{t}T {h.roof(report['probe'], 'GB/s', t):.1f} GB/s" for t in threads),
        "",
    ]

    def cells(st: dict[str, Any]) -> list[str]:
        return [fmt_time(st["median_s"]), fmt(st["gbs"], 1), f"{100 * st['roof']:.0f}%"]

    rows = []
    for c in report["cases"]:
        rows += h.grouped(
            f"{c['k']} -> {c['rows']}",
            [
                [name, h.fmt_bytes(size)]
                + [x for t in threads for x in cells(c["threads"][t]["peers"][name])]
                for name, size in c["bytes"].items()
            ],
        )
    lead = ["shape (in -> out)", "weights", "bytes"]
    header = h.thread_header(lead, ["time", "GB/s", "of triad"], threads)
    lines += md_table(header, rows)
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
