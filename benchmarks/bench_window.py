#!/usr/bin/env python
"""Sliding-window attention: cost O(T·w), against full causal attention and torch SDPA.

Usage::

    python benchmarks/bench_window.py [--quick] [--out benchmarks/results]

What it does (the protocol is ``harness.py``'s: interleaved rounds, medians,
1 and 2 threads):

* ``lk.attention(q, k, v, causal=True, window=w)`` at (B, H, T, D) = (1, 8, 16384, 64),
  w = 4096, against ``lk.attention(q, k, v, causal=True)`` (full causal, same shape) and torch
  SDPA given the equivalent explicit boolean mask (key j visible to query i iff
  0 <= i - j < w; SDPA has no window option, so it computes every score).
* Outputs are compared first (windowed llmkernels vs torch with the mask).
* Reported: each time, windowed / full causal, next to the ratio of the scores each computes
  (``work ratio``: query i sees min(i + 1, w) keys with the window, i + 1 without; 0.44 at
  T = 16384, w = 4096 -- the least time ratio exact attention can reach), and
  torch / llmkernels.

Writes ``<out>/window.md`` and ``<out>/window.json``. ``--quick``: T = 1024, w = 256.
"""

from __future__ import annotations

import dataclasses
import statistics
import sys
import time
from typing import Any

import harness as h
import llmkernels as lk
import numpy as np
from harness import LK, fmt, md_table, peers

FULL_CAUSAL = "llmkernels full causal"
TORCH = "torch SDPA + mask"


@dataclasses.dataclass(frozen=True)
class Config(h.Timing):
    shape: tuple[int, int, int, int]  # (B, H, T, D)
    window: int


FULL, QUICK = h.full_and_quick(
    Config,
    {"shape": ((1, 8, 16384, 64), (1, 2, 1024, 32)), "window": (4096, 256)},
    ({**h.FULL_TIMING, "rounds": 3, "repeats": 3}, {**h.QUICK_TIMING, "repeats": 1}),
)


def main(argv: list[str] | None = None) -> int:
    args, cfg, run = h.parse_and_start(h.arg_parser(__doc__, "30"), argv, FULL, QUICK)
    b, nh, t, d = cfg.shape
    w = cfg.window
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((b, nh, t, d)).astype(np.float32) for _ in range(3))
    impls: dict[str, Any] = {
        LK: lambda: lk.attention(q, k, v, causal=True, window=w),
        FULL_CAUSAL: lambda: lk.attention(q, k, v, causal=True),
    }
    diff = None
    torch = peers.torch
    if torch is not None:
        i = torch.arange(t)[:, None]
        j = torch.arange(t)[None, :]
        mask = (i - j >= 0) & (i - j < w)  # (T, T) bool, True = visible
        tq, tk, tv = (torch.from_numpy(a) for a in (q, k, v))
        sdpa = torch.nn.functional.scaled_dot_product_attention

        def torch_masked() -> Any:
            with torch.inference_mode():
                return sdpa(tq, tk, tv, attn_mask=mask)

        impls[TORCH] = torch_masked
        want = torch_masked().numpy()
        got = impls[LK]()
        diff = float(np.max(np.abs(got - want)) / np.max(np.abs(want)))
        h.check_outputs("windowed attention", {LK: 0.0, TORCH: diff}, limit=1e-4)
    else:
        print("torch not installed: its column is left out", file=sys.stderr)

    report = h.new_report(cfg)
    report["max_rel_diff_vs_torch"] = diff
    rows_i = np.arange(1, t + 1, dtype=np.float64)
    work_ratio = float(np.minimum(rows_i, w).sum() / rows_i.sum())  # scores, window / causal
    report["work_ratio"] = work_ratio
    per_round = max(1, cfg.repeats // cfg.rounds)
    for threads in cfg.threads:
        h.set_threads(threads)
        run.log(f"{threads} thread(s)")
        samples, load = h.measure_quietly(
            impls, cfg.rounds, per_round, warmup=cfg.warmup, quiet_wait=cfg.quiet_wait
        )
        med = {name: statistics.median(s) for name, s in samples.items()}
        # CPU seconds of one call (every thread of this process): on a shared machine the wall
        # time includes waiting for a core, the CPU time only this call's work
        cpu = {}
        for name, fn in impls.items():
            c0 = time.process_time()
            fn()
            cpu[name] = time.process_time() - c0
        entry: dict[str, Any] = {
            "median_s": med,
            "samples_s": samples,
            "window_vs_full_causal": med[LK] / med[FULL_CAUSAL],
            "cpu_s": cpu,
            "cpu_window_vs_full_causal": cpu[LK] / cpu[FULL_CAUSAL],
            "other_processes_cpus": load,
        }
        if TORCH in med:
            entry["torch_vs_llmkernels"] = med[TORCH] / med[LK]
        report[str(threads)] = entry

    def render(rep: dict[str, Any]) -> str:
        lines = ["# Sliding-window attention", ""] + h.machine_lines(rep["machine"])
        lines += [
            "",
            f"(B, H, T, D) = {cfg.shape}, window {w}, causal. Ratios of medians in one run. "
            f"Scores computed with the window / without: {work_ratio:.3f} (the least time "
            "ratio exact attention can reach).",
            "",
        ]
        rows = []
        for th in cfg.threads:
            e = rep[str(th)]
            m = e["median_s"]
            rows.append(
                [
                    str(th),
                    h.fmt_time(m[LK]),
                    h.fmt_time(m[FULL_CAUSAL]),
                    h.fmt_time(m.get(TORCH)),
                    f"{fmt(e['window_vs_full_causal'])} (CPU time "
                    f"{fmt(e['cpu_window_vs_full_causal'])}, work {work_ratio:.2f})",
                    fmt(e.get("torch_vs_llmkernels")),
                ]
            )
        lines += md_table(
            [
                "threads",
                "llmkernels window",
                "llmkernels full causal",
                "torch SDPA + mask",
                "window / full causal",
                "torch / llmkernels",
            ],
            rows,
        )
        return "\n".join(lines) + "\n"

    return run.report(report, render, args.out, "window")


if __name__ == "__main__":
    sys.exit(main())
