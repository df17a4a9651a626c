#!/usr/bin/env python
"""Decode at a long context with a float32, bfloat16 and float16 KV cache.

Usage::

    python benchmarks/bench_kv_dtype.py [--quick] [--threads 1,2] [--out FILE.md]

Two rows per thread count, each dtype timed in the same run, interleaved (medians):

* ``attention`` -- the kernel alone, one decode query per head over ``Tk`` cached keys,
  TinyLlama's heads (32 query / 4 KV heads, head_dim 64), batch 16: ``lk.attention`` on float32
  K/V against the same kernel reading 16-bit K/V (``_core._attention_kv16``, the path a 16-bit
  cache takes). K/V read per call at Tk = 4096: 128 MiB float32, 64 MiB 16-bit -- both well
  past a 32 MiB L3, so this is the DRAM-bound case.
* ``MultiHeadAttention step`` -- one decode token through ``MultiHeadAttention(512, 8)``
  (projections of 4 MB) with batch 4 after a prefill of ``Tk`` positions (K/V of 64 MiB float32,
  32 MiB 16-bit at Tk = 4096: the 16-bit cache may partly stay in L3 between steps): what a
  cache's dtype changes in a decode step dominated by the cache.

Ratios are float32 time / 16-bit time (> 1: the 16-bit cache is faster). Outputs are compared
first: the 16-bit kernel against float32 attention over the rounded K/V. Expect at most 2x, and
less where the kernel is not bandwidth-bound: with TinyLlama's GQA groups of 8, each K/V element
feeds 16 flops (the attention row), without GQA 2 (the module row).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import llmkernels as lk
import ml_dtypes
import numpy as np
from llmkernels import _core

DTYPES = {"float32": np.float32, "bfloat16": ml_dtypes.bfloat16, "float16": np.float16}


def _median_time(fn, calls: int) -> float:
    times = []
    for _ in range(calls):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def kernel_row(b: int, tk: int, rounds: int, calls: int) -> dict[str, float]:
    rng = np.random.default_rng(0)
    q = rng.standard_normal((b, 32, 1, 64)).astype(np.float32)
    k = rng.standard_normal((b, 4, tk, 64)).astype(np.float32)
    v = rng.standard_normal((b, 4, tk, 64)).astype(np.float32)
    fns = {"float32": lambda: lk.attention(q, k, v)}
    for name in ("bfloat16", "float16"):
        k16, v16 = k.astype(DTYPES[name]), v.astype(DTYPES[name])
        kw, vw = k16.view(np.uint16), v16.view(np.uint16)
        got = _core._attention_kv16(q, kw, vw, name)
        want = lk.attention(q, k16.astype(np.float32), v16.astype(np.float32))
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
        fns[name] = lambda kw=kw, vw=vw, name=name: _core._attention_kv16(q, kw, vw, name)
    samples: dict[str, list[float]] = {n: [] for n in fns}
    for _ in range(rounds):  # interleaved: the machine's drift hits every dtype alike
        for n, fn in fns.items():
            fn()
            samples[n].append(_median_time(fn, calls))
    return {n: statistics.median(s) for n, s in samples.items()}


def module_row(b: int, tk: int, rounds: int, calls: int) -> dict[str, float]:
    attn = lk.MultiHeadAttention(512, 8, seed=0)
    rng = np.random.default_rng(1)
    prompt = rng.standard_normal((b, tk, 512)).astype(np.float32)
    step = rng.standard_normal((b, 1, 512)).astype(np.float32)
    caches = {}
    for name in DTYPES:
        caches[name] = attn.new_cache(b, tk + rounds * (calls + 1) + 1, dtype=name)
        attn(prompt, cache=caches[name])
    samples: dict[str, list[float]] = {n: [] for n in DTYPES}
    for _ in range(rounds):
        for n, c in caches.items():
            samples[n].append(_median_time(lambda c=c: attn(step, cache=c), calls + 1))
    return {n: statistics.median(s) for n, s in samples.items()}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="Tk = 512, few calls (a smoke run)")
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--out", default=None, help="also write the table to this file")
    args = ap.parse_args(argv)
    tk, rounds, calls = (512, 2, 3) if args.quick else (4096, 5, 15)
    lines = [
        f"KV cache dtype, decode at Tk = {tk} cached positions (median of {rounds} rounds x "
        f"{calls} calls; ratio = float32 time / 16-bit time)",
        "",
        "| case | threads | float32 | bfloat16 | float16 | f32/bf16 | f32/f16 |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for n in (int(x) for x in args.threads.split(",")):
        lk.set_num_threads(n)
        kb, mb = (2, 1) if args.quick else (16, 4)
        for case, row in (
            (f"attention (B={kb}, 32/4 heads, hd 64)", kernel_row(kb, tk, rounds, calls)),
            (f"MultiHeadAttention step (B={mb}, dim 512)", module_row(mb, tk, rounds, calls)),
        ):
            t32, tb, th = row["float32"], row["bfloat16"], row["float16"]
            lines.append(
                f"| {case} | {n} | {t32 * 1e3:.3f} ms | {tb * 1e3:.3f} ms | {th * 1e3:.3f} ms "
                f"| {t32 / tb:.2f}x | {t32 / th:.2f}x |"
            )
    text = "\n".join(lines)
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
