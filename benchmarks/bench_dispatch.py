"""Dispatch by measured speed: every kernel family at representative shapes on every SIMD path
this CPU supports (forced), against the path the automatic mode picks for that family.

In the automatic mode (``lk.set_simd_arch("auto")``, the mode at start) each kernel family runs
on the path measured fastest for it on this CPU (common/isa.hpp; ``build_info()["kernel_paths"]``
lists them). This script checks that claim: per case, the median of interleaved calls on each
path (rounds over the paths), and the automatic mode's time as a ratio of the fastest path's;
a family is "ok" when every case of it is within 5%. The automatic mode is timed as one more
path ("auto"): it is not always the code of the forced path it names -- where the CPU has VNNI
the int8 / int4 decode GEMV runs on vpdpbusd under the family's AVX2 path, which forcing
"avx2" (no AVX-512 instructions at all) turns off.

    python benchmarks/bench_dispatch.py [--threads 1,2] [--seconds 0.8] [--out benchmarks/results]
"""

from __future__ import annotations

import argparse
import platform
import random
import statistics
import sys
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

TOLERANCE = 1.05


def cases(rng: np.random.Generator) -> list[tuple[str, str, Callable[[], object]]]:
    """(family, case, call): TinyLlama-1.1B's shapes (dim 2048, 32 / 4 heads of 64, hidden 5632)"""
    import llmkernels as lk
    import ml_dtypes

    linear = lk._core._linear  # the modules' projection path
    out: list[tuple[str, str, Callable[[], object]]] = []

    def add(family: str, name: str, fn: Callable[..., object], *args: object, **kw: object):
        out.append((family, name, partial(fn, *args, **kw)))

    def f32(*shape: int) -> np.ndarray:
        return rng.standard_normal(shape).astype(np.float32)

    for rows in (1, 16, 512):
        add("norm", f"rms_norm ({rows}, 2048)", lk.rms_norm, f32(rows, 2048), f32(2048))
    add("norm", "layer_norm (64, 4096)", lk.layer_norm, f32(64, 4096), f32(4096), f32(4096))
    for t in (1, 16, 512):
        pos = np.arange(100, 100 + t)
        add("rope", f"rope (1, 32, {t}, 64)", lk.rope, f32(1, 32, t, 64), positions=pos)
    for tk in (128, 1024, 4096):
        k = f32(1, 4, tk, 64)
        add("attention", f"decode, {tk} keys", lk.attention, f32(1, 32, 1, 64), k, k, causal=True)
    for t in (16, 64, 256, 512):
        k = f32(1, 4, t, 64)
        add("attention", f"causal prefill {t}", lk.attention, f32(1, 32, t, 64), k, k, causal=True)
    w = f32(5632, 2048) * 0.02
    xs = {m: f32(m, 2048) for m in (1, 4, 64, 512)}
    for bits in (8, 4):
        q, s = lk.quantize(w, bits=bits, group_size=32)
        for m in (1, 4):
            for acts in ("int8", "float32"):
                name = f"int{bits} 5632x2048, {m} token(s), {acts} acts"
                # the quantized GEMVs, but int8 x int8: there the quantized family's path decides
                # the VNNI GEMV (vpdpbusd where it runs avx512)
                fam = "quant" if bits == 8 and acts == "int8" else "qgemv"
                add(fam, name, lk.quantized_linear, xs[m], q, s, bits, 32, activations=acts)
        for m in (64, 512):
            name = f"int{bits} 5632x2048, {m} tokens, float32 acts"
            add("packed", name, lk.quantized_linear, xs[m], q, s, bits, 32, activations="float32")
    g = f32(512, 5632)
    add("other", "swiglu (512, 5632)", lk.swiglu, g, g)
    add("other", "silu (512, 5632)", lk.silu, g)
    wb = w.astype(ml_dtypes.bfloat16).view(np.uint16)
    for m in (1, 64):
        add("other", f"float32 5632x2048, {m} token(s)", linear, xs[m], w, "float32")
        add("other", f"bfloat16 5632x2048, {m} token(s)", linear, xs[m], wb, "bfloat16")
    return out


def time_paths(call: Callable[[], object], paths: list[str], seconds: float) -> dict[str, float]:
    """Median seconds per path (interleaved rounds; at least 5, then up to `seconds`)."""
    import llmkernels as lk

    samples: dict[str, list[float]] = {p: [] for p in paths}
    once = []
    for p in paths:  # warm-up
        lk.set_simd_arch(p)
        t0 = time.perf_counter()
        call()
        once.append(time.perf_counter() - t0)
    # calls per sample: at least ~200 us each, so that a microsecond call is not timer noise
    inner = max(1, min(1000, int(2e-4 / max(min(once), 1e-9))))
    start, rounds = time.perf_counter(), 0
    order = list(paths)
    shuffle = random.Random(0).shuffle
    while rounds < 5 or (time.perf_counter() - start < seconds and rounds < 500):
        # the paths in a new order every round: alternating calls that each allocate their
        # output otherwise give each path the same addresses every round (and their aliasing)
        shuffle(order)
        for p in order:
            lk.set_simd_arch(p)
            t0 = time.perf_counter()
            for _ in range(inner):
                call()
            samples[p].append((time.perf_counter() - t0) / inner)
        rounds += 1
    lk.set_simd_arch("auto")
    return {p: statistics.median(v) for p, v in samples.items()}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--threads", default="1,2")
    p.add_argument("--seconds", type=float, default=0.8, help="per case and thread count")
    p.add_argument("--out", default=None)
    args = p.parse_args()

    import harness
    import llmkernels as lk

    lk.set_simd_arch("auto")
    families = lk._core.family_simd_archs()
    names = list(lk._core.isa_names)
    paths = names[names.index("avx2") : names.index(lk._core.best_simd_arch()) + 1]
    paths = [p for p in paths if p in names] or [lk._core.best_simd_arch()]
    flags = harness.cpu_flags()
    report: dict = {
        "cpu": platform.processor() or "x86_64",
        "flags": flags,
        "splits_512": lk._core.cpu_splits_512,
        "families": families,
        "paths": paths,
        "date": time.strftime("%Y-%m-%d"),
        "rows": [],
    }
    rng = np.random.default_rng(0)
    todo = cases(rng)
    for t in [int(v) for v in args.threads.split(",")]:
        lk.set_num_threads(t)
        for family, name, call in todo:
            med = time_paths(call, [*paths, "auto"], args.seconds)
            fastest = min(med, key=med.__getitem__)
            chosen = families[family] if family in families else lk.simd_arch()
            row = {
                "threads": t,
                "family": family,
                "case": name,
                "us": {k: v * 1e6 for k, v in med.items()},
                "fastest": fastest,
                "auto_path": chosen,
                "auto_over_fastest": med["auto"] / med[fastest],
            }
            report["rows"].append(row)
            print(
                f"{t} thr  {family:9s} {name:42s} "
                + "  ".join(f"{k} {v * 1e6:9.1f} us" for k, v in med.items())
                + f"  auto={chosen} x{row['auto_over_fastest']:.2f}",
                flush=True,
            )
    verdict = {}
    for family in families:
        rows = [r for r in report["rows"] if r["family"] == family]
        if rows:
            worst = max(r["auto_over_fastest"] for r in rows)
            verdict[family] = {"path": families[family], "worst": worst, "ok": worst <= TOLERANCE}
    report["verdict"] = verdict
    lines = [
        f"CPU: {report['cpu']}, flags {' '.join(flags)}; 512-bit split in two (Zen 4): "
        f"{report['splits_512']}; paths timed: {', '.join(paths)}; {report['date']}",
        "",
        "| family | automatic path | worst case: auto time / fastest path's | within 5% |",
        "| --- | --- | --- | --- |",
    ]
    for family, v in verdict.items():
        ok = "yes" if v["ok"] else "NO"
        lines.append(f"| {family} | {v['path']} | {v['worst']:.2f} | {ok} |")
    head = " | ".join(paths)
    lines += [
        "",
        f"| threads | family | case | {head} | auto | auto path | auto / fastest |",
        "| --- | --- | --- | " + " | ".join("---" for _ in paths) + " | --- | --- | --- |",
    ]
    for r in report["rows"]:
        lines.append(
            f"| {r['threads']} | {r['family']} | {r['case']} | "
            + " | ".join(f"{r['us'][p]:.1f} us" for p in paths)
            + f" | {r['us']['auto']:.1f} us | {r['auto_path']} | {r['auto_over_fastest']:.2f} |"
        )
    return harness.print_report(args.out, "dispatch", report, lines)


if __name__ == "__main__":
    raise SystemExit(main())
