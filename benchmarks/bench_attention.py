#!/usr/bin/env python
"""Attention: llmkernels vs torch SDPA (CPU) vs the NumPy formula; time and memory against T.

Usage::

    python benchmarks/bench_attention.py [--quick] [--out benchmarks/results]

What it does (the protocol is in ``harness.py``):

1. The roofline probe, as ``bench_ops.py`` runs it.
2. Prefill (non-causal and causal; GFLOP/s against the FMA peak) and one decode step against a
   GQA KV cache (GB/s of K and V read against the triad bandwidth; the same K/V every call,
   and *cold*: several caches in turn), every peer in this process and run, 1 and 2 threads,
   outputs cross-checked first.
3. llmkernels alone against the sequence length T: time (O(T²)) at each thread count, and the
   peak extra memory of one call in a fresh subprocess, next to the NumPy formula's.

Results go to ``<out>/attention.md`` and ``<out>/attention.json``. ``--quick`` (smaller
shapes, fewer repeats) is a smoke test that finishes in well under 30 s.
"""

from __future__ import annotations

import json
import math
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import harness as h
import llmkernels as lk
import numpy as np
from harness import LK, Impls, OpCase, fmt, fmt_bytes, fmt_time, peers, rng_f32

TORCH_SDPA = "torch SDPA"
NUMPY = "NumPy"


@dataclass(frozen=True)
class Config(h.Timing):
    """Shapes and repeat counts of one run (the timing settings are harness.Timing's;
    ``repeats`` is also the most calls per size of the T sweep)."""

    attn_prefill_shape: tuple[int, int, int, int]  # (B, H, T, D), Tq = Tk = T
    attn_prefill_repeats: int
    attn_decode_shape: tuple[int, int, int, int, int]  # (B, Hq, Hkv, Tk, D), Tq = 1
    attn_decode_repeats: int
    attn_scaling_shape: tuple[int, int]  # (H, D) of the T sweep, B = 1, non-causal
    attn_scaling_lengths: tuple[int, ...]
    attn_scaling_numpy_max_t: int  # NumPy's peak memory is measured up to this T


# field: (full run, --quick run)
FULL, QUICK = h.full_and_quick(
    Config,
    {
        "attn_prefill_shape": ((1, 32, 2048, 128), (1, 8, 512, 128)),
        "attn_prefill_repeats": (6, 3),
        "attn_decode_shape": ((1, 32, 8, 4096, 128), (1, 32, 8, 1024, 128)),
        "attn_decode_repeats": (200, 20),
        "attn_scaling_shape": ((8, 128), (8, 64)),
        "attn_scaling_lengths": ((256, 512, 1024, 2048, 4096, 8192), (128, 256, 512, 1024)),
        "attn_scaling_numpy_max_t": (4096, 512),
    },
)


def attention_flops(nh: int, tq: int, tk: int, d: int, dv: int, causal: bool) -> float:
    """FLOPs: ``2·H·Tq·Tk·(D + Dv)`` (Q·K^T and P·V), halved when causal."""
    flops = 2.0 * nh * tq * tk * (d + dv)
    return flops / 2 if causal else flops


def attention_workspace_bytes(threads: int, d: int, dv: int, itemsize: int = 4) -> int:
    """The fused kernel's scratch memory (``attn_workspace_size`` in ``cpp/kernels/ops.hpp``).

    Per thread: the scaled Q^T tile (D rows) and a score tile (64 rows), rows of 64 values
    plus 64 bytes (against L1 set conflicts), the output accumulator and a V tile copy (64 rows
    each of Dv rounded up to 64 bytes, plus 64 bytes) and 4×64 row values (causal limit,
    window start, running max, running sum). Independent of T; the prefill work list (one
    48-byte item per 64-row tile) and, for decode-like shapes, the key-split partials come on
    top.
    """
    per_elem = 64 // itemsize
    dv_pad = -(-dv // per_elem) * per_elem
    return threads * ((d + 64) * (64 + per_elem) + 128 * (dv_pad + per_elem) + 256) * itemsize


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


def case_prefill(cfg: Config, rng: np.random.Generator, causal: bool) -> OpCase:
    """Prefill self-attention (Tq = Tk = T): llmkernels (out=) vs torch SDPA vs NumPy; GFLOP/s."""
    b, nh, t, d = cfg.attn_prefill_shape
    q, k, v = (rng_f32(rng, b, nh, t, d) for _ in range(3))
    out = np.empty_like(q)
    scale = d**-0.5
    impls: Impls = {LK: lambda: lk.attention(q, k, v, causal=causal, out=out)}
    if peers.torch is not None:
        qt, kt, vt = (peers.torch.from_numpy(a) for a in (q, k, v))
        sdpa = peers.F.scaled_dot_product_attention
        impls[TORCH_SDPA] = lambda: sdpa(qt, kt, vt, is_causal=causal)
    mask = np.triu(np.full((t, t), -np.inf, dtype=np.float32), 1) if causal else None
    impls[NUMPY] = lambda: numpy_attention(q, k, v, scale, mask)
    return OpCase(
        f"attention prefill{', causal' if causal else ''}",
        f"q, k, v ({b}, {nh}, {t}, {d})",
        "GFLOP/s",
        b * attention_flops(nh, t, t, d, d, causal),
        impls,
        repeats=cfg.attn_prefill_repeats,
    )


def case_decode(cfg: Config, rng: np.random.Generator, cold: bool) -> OpCase:
    """One decode step (Tq = 1) against a GQA KV cache: llmkernels vs torch SDPA
    (``enable_gqa=True``) vs NumPy; GB/s of K and V read (``2·Hkv·Tk·D·4`` bytes).

    ``cold``: every call reads the next of several KV caches (together over 4× the last-level
    cache), as a model's layers do; otherwise the same K/V every call (partly cache-resident
    when K+V are about the cache's size).
    """
    b, hq, hkv, tk, d = cfg.attn_decode_shape
    kv_bytes = 2 * b * hkv * tk * d * 4
    copies = max(2, math.ceil(4 * h.llc_bytes() / kv_bytes)) if cold else 1
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
    if peers.torch is not None:
        torch, sdpa = peers.torch, peers.F.scaled_dot_product_attention
        qt = torch.from_numpy(q)
        kts, vts = [torch.from_numpy(a) for a in ks], [torch.from_numpy(a) for a in vs]
        impls[TORCH_SDPA] = cycling(lambda i: sdpa(qt, kts[i], vts[i], enable_gqa=True))
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


CASES: tuple[Callable[[Config, np.random.Generator], OpCase], ...] = (
    lambda cfg, rng: case_prefill(cfg, rng, causal=False),
    lambda cfg, rng: case_prefill(cfg, rng, causal=True),
    lambda cfg, rng: case_decode(cfg, rng, cold=False),
    lambda cfg, rng: case_decode(cfg, rng, cold=True),
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


def peak_memory(nh: int, t: int, d: int, threads: int, with_numpy: bool) -> dict:
    """Peak extra resident bytes of one call (peak RSS over RSS before, fresh subprocess)."""
    args = [str(a) for a in (nh, t, d, threads, int(with_numpy))]
    proc = subprocess.run(
        [sys.executable, "-c", _MEMORY_PROBE, *args], capture_output=True, text=True, timeout=600
    )
    if proc.returncode != 0:
        print(
            f"WARNING: attention memory probe T={t} failed: {proc.stderr.strip()[-300:]}",
            file=sys.stderr,
        )
        return {}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def run_scaling(cfg: Config, rng: np.random.Generator, probe: dict) -> dict:
    """llmkernels attention time against T (B = 1, non-causal): O(T²) time, O(1)-in-T memory.

    Each T is timed at every thread count (median of up to ``cfg.repeats`` calls, about a
    second's worth, after a warm-up call), then its peak extra memory is measured in a
    subprocess, next to the NumPy formula's (up to ``attn_scaling_numpy_max_t``).
    """
    nh, d = cfg.attn_scaling_shape
    hi = max(cfg.threads)
    rows: list[dict[str, Any]] = []
    for t in cfg.attn_scaling_lengths:
        q, k, v = (rng_f32(rng, 1, nh, t, d) for _ in range(3))
        out = np.empty_like(q)
        impls: Impls = {LK: lambda q=q, k=k, v=v, out=out: lk.attention(q, k, v, out=out)}
        flops = attention_flops(nh, t, t, d, d, causal=False)
        entry: dict[str, Any] = {"T": t, "H": nh, "D": d, "flops": flops}
        for n in cfg.threads:
            h.set_threads(n)
            t0 = time.perf_counter()
            impls[LK]()
            once = time.perf_counter() - t0
            repeats = max(3, min(cfg.repeats, math.ceil(1.0 / max(once, 1e-6))))
            samples, others = h.measure_quietly(
                impls, 1, repeats, warmup=cfg.warmup, quiet_wait=cfg.quiet_wait
            )
            median = statistics.median(samples[LK])
            gflops = flops / median / 1e9
            entry[str(n)] = {
                "median_s": median,
                "min_s": min(samples[LK]),
                "samples_s": samples[LK],
                "gflops": gflops,
                "fraction_of_fma_peak": gflops / h.roof(probe, "GFLOP/s", n),
                "other_processes_cpus": others,
            }
        if rows:
            entry["time_vs_previous_T"] = {
                str(n): entry[str(n)]["median_s"] / rows[-1][str(n)]["median_s"]
                for n in cfg.threads
            }
        del q, k, v, out, impls
        measured = peak_memory(nh, t, d, hi, t <= cfg.attn_scaling_numpy_max_t)
        entry["memory"] = {
            "threads": hi,
            "llmkernels_peak_extra_bytes": measured.get("llmkernels"),
            "llmkernels_workspace_bytes": attention_workspace_bytes(hi, d, d),
            "numpy_peak_extra_bytes": measured.get("numpy"),
            "score_matrix_bytes": nh * t * t * 4,
        }
        rows.append(entry)
    return {"H": nh, "D": d, "B": 1, "causal": False, "rows": rows}


def render(report: dict[str, Any]) -> str:
    """The markdown report: machine, probe, prefill/decode peers, llmkernels against T."""
    cfg, att = report["config"], report["attention"]
    threads = cfg["threads"]
    out = [f"# llmkernels attention{' (--quick)' if cfg['quick'] else ''}", ""]
    out += [*h.machine_lines(report["machine"]), ""]
    out += h.probe_section(report["probe"], threads)
    out += [
        "",
        "## Attention (float32; median after warm-up; "
        f"prefill {cfg['attn_prefill_repeats']} runs, decode {cfg['attn_decode_repeats']})",
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
    out += h.op_table(att["cases"], threads)
    sc = att.get("scaling")
    if sc:
        mem_threads = sc["rows"][0]["memory"]["threads"] if sc["rows"] else max(threads)
        out += [
            "",
            f"### llmkernels attention vs sequence length (B = 1, H = {sc['H']}, D = {sc['D']}, "
            "non-causal, out=)",
            "",
            "Time grows as T² (×4 per doubling) at a constant GFLOP/s; memory does not grow "
            "with T beyond the inputs. `peak extra` is the process's peak RSS during one call "
            "(VmHWM, reset before it) over its RSS before, in a fresh subprocess per size at "
            f"{mem_threads} threads (thread start-up included); `workspace` the kernel's "
            f"scratch, {mem_threads} × (80·(D + 64) + 128·(Dv + 16) + 256) × 4 bytes; `scores` the "
            "H·T²·4-byte matrix the NumPy formula materialises (its measured peak holds about "
            "two: the scaled scores and their exponentials). `others`: CPUs other processes "
            "kept busy during the 1T / 2T timings (rows with others near 1 are unreliable).",
            "",
        ]
        header = ["T", "GFLOP"]
        for t in threads:
            header += [f"{t}T time", f"{t}T GFLOP/s (peak)", f"{t}T × prev"]
        header += ["lk peak extra", "lk workspace", "NumPy peak extra", "scores H·T²·4"]
        header += ["others"]
        rows = []
        for e in sc["rows"]:
            row = [str(e["T"]), fmt(e["flops"] / 1e9, 1)]
            for t in threads:
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
            row += [h.fmt_cpus([e[str(t)]["other_processes_cpus"] for t in threads])]
            rows.append(row)
        out += h.md_table(header, rows)
    out.append("")
    return "\n".join(out)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the benchmarks; print the markdown report and write attention.md / .json."""
    parser = h.arg_parser(__doc__, quiet_default="60")
    parser.add_argument(
        "--no-scaling", action="store_true", help="skip the sweep over the sequence length"
    )
    args, cfg, run = h.parse_and_start(parser, argv, FULL, QUICK, use_torch_thp=True)
    rng = np.random.default_rng(0)
    report = h.new_report(cfg)
    report["probe"] = probe = run.probe(cfg)
    b, _, hkv, tk, d = cfg.attn_decode_shape
    attention: dict[str, Any] = {
        "llc_bytes": h.llc_bytes(),
        "decode_kv_bytes": 2 * b * hkv * tk * d * 4,
        "cases": run.cases(CASES, cfg, rng, probe),
    }
    if not args.no_scaling:
        run.log("attention vs sequence length")
        attention["scaling"] = run_scaling(cfg, rng, probe)
    report["attention"] = attention
    return run.report(report, render, args.out, "attention")


if __name__ == "__main__":
    sys.exit(main())
