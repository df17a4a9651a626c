#!/usr/bin/env python
"""Elementwise ops and the SwiGLU FFN: llmkernels vs torch (CPU) vs NumPy vs pure Python.

Usage::

    python benchmarks/bench_ops.py [--quick] [--out benchmarks/results]

What it does (the protocol is in ``harness.py``):

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
5. The 2-thread speed-up of the memory-bound ops, each round paired with the triad probe.

Results go to ``<out>/ops.md`` (the printed tables) and ``<out>/ops.json``. ``--quick``
(smaller shapes, fewer repeats) is a smoke test that finishes in well under 30 s.
"""

from __future__ import annotations

import statistics
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import harness as h
import llmkernels as lk
import numpy as np
from harness import LK, Impls, OpCase, fmt, fmt_time, md_table, peers, rng_f32
from llmkernels import pure

LK_ALLOC = "llmkernels (no out=)"
TORCH = "torch"
HF = "HF apply_rotary_pos_emb"
NUMPY = "NumPy"


@dataclass(frozen=True)
class Config(h.Timing):
    """Shapes and repeat counts of one run (the timing settings are harness.Timing's)."""

    ffn_repeats: int
    norm_shape: tuple[int, int]
    swiglu_shape: tuple[int, int]
    rope_shape: tuple[int, int, int, int]
    ffn_shape: tuple[int, int, int]  # (tokens, d_model, d_ff)
    row_lengths: tuple[int, ...]
    row_elements: int  # total elements of each row-length case
    pure_len: int  # toy row length for the pure-Python elementwise ops
    pure_rope_shape: tuple[int, int, int, int]
    pure_ffn_shape: tuple[int, int, int]
    scaling_rounds: int = 12  # rounds of the paired thread-scaling measurement


# field: (full run, --quick run)
FULL, QUICK = h.full_and_quick(
    Config,
    {
        "ffn_repeats": (6, 2),
        "norm_shape": ((4096, 4096), (1024, 4096)),
        "swiglu_shape": ((4096, 11008), (1024, 2752)),
        "rope_shape": ((1, 32, 2048, 128), (1, 8, 1024, 128)),
        "ffn_shape": ((512, 2048, 5632), (128, 512, 1408)),
        "row_lengths": ((1024, 2048, 4096, 8192, 16384), (1024, 4096, 16384)),
        "row_elements": (4096 * 4096, 1024 * 4096),
        "pure_len": (4096, 1024),
        "pure_rope_shape": ((1, 1, 16, 128), (1, 1, 8, 64)),
        "pure_ffn_shape": ((1, 256, 688), (1, 64, 172)),
        "scaling_rounds": (Config.scaling_rounds, 2),
    },
)


# --------------------------------------------------------------------------------------
# NumPy formulas (RMSNorm and RoPE are in harness.py)
# --------------------------------------------------------------------------------------


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


def numpy_ffn(x: np.ndarray, wg: np.ndarray, wu: np.ndarray, wd: np.ndarray) -> np.ndarray:
    """The float32 NumPy SwiGLU feed-forward (matmuls on NumPy's OpenBLAS)."""
    g = x @ wg
    return (g / (1 + np.exp(-g)) * (x @ wu)) @ wd


# --------------------------------------------------------------------------------------
# the op cases
# --------------------------------------------------------------------------------------


def case_rms_norm(cfg: Config, rng: np.random.Generator) -> OpCase:
    """RMSNorm over rows: llmkernels (out=) vs torch F.rms_norm vs NumPy; 8 B/element."""
    rows, d = cfg.norm_shape
    x, w, eps = rng_f32(rng, rows, d), rng_f32(rng, d), 1e-6
    out = np.empty_like(x)
    impls: Impls = {
        LK: lambda: lk.rms_norm(x, w, eps, out=out),
        LK_ALLOC: lambda: lk.rms_norm(x, w, eps),
    }
    if peers.torch is not None:
        xt, wt = peers.torch.from_numpy(x), peers.torch.from_numpy(w)
        impls[TORCH] = lambda: peers.F.rms_norm(xt, (d,), wt, eps)
    impls[NUMPY] = lambda: h.numpy_rms_norm(x, w, eps)
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
    if peers.torch is not None:
        xt, wt, bt = (peers.torch.from_numpy(a) for a in (x, w, b))
        impls[TORCH] = lambda: peers.F.layer_norm(xt, (d,), wt, bt, eps)
    impls[NUMPY] = lambda: numpy_layer_norm(x, w, b, eps)
    return OpCase("layer_norm", f"({rows}, {d})", "GB/s", 8.0 * x.size, impls)


def case_silu(cfg: Config, rng: np.random.Generator) -> OpCase:
    """SiLU: llmkernels (out=) vs torch F.silu vs NumPy; 8 B/element."""
    rows, d = cfg.swiglu_shape
    x = rng_f32(rng, rows, d)
    out = np.empty_like(x)
    impls: Impls = {LK: lambda: lk.silu(x, out=out), LK_ALLOC: lambda: lk.silu(x)}
    if peers.torch is not None:
        xt = peers.torch.from_numpy(x)
        impls[TORCH] = lambda: peers.F.silu(xt)
    impls[NUMPY] = lambda: numpy_silu(x)
    return OpCase("silu", f"({rows}, {d})", "GB/s", 8.0 * x.size, impls)


def case_swiglu(cfg: Config, rng: np.random.Generator) -> OpCase:
    """SwiGLU gating: llmkernels (out=) vs torch ``F.silu(g) * u`` vs NumPy; 12 B/element."""
    rows, d = cfg.swiglu_shape
    g, u = rng_f32(rng, rows, d), rng_f32(rng, rows, d)
    out = np.empty_like(g)
    impls: Impls = {LK: lambda: lk.swiglu(g, u, out=out), LK_ALLOC: lambda: lk.swiglu(g, u)}
    if peers.torch is not None:
        gt, ut = peers.torch.from_numpy(g), peers.torch.from_numpy(u)
        impls[TORCH] = lambda: peers.F.silu(gt) * ut
    impls[NUMPY] = lambda: numpy_swiglu(g, u)
    return OpCase("swiglu", f"({rows}, {d})", "GB/s", 12.0 * g.size, impls)


def case_rope(cfg: Config, rng: np.random.Generator) -> OpCase:
    """RoPE on q and k (two tensors): llmkernels twice vs HF apply_rotary_pos_emb vs NumPy.

    8 B/element over both tensors. cos/sin are precomputed for the peers, shaped as HF's
    LlamaRotaryEmbedding makes them (``(1, T, D)``, the frequencies repeated twice) for HF and
    ``(T, D/2)`` for NumPy; llmkernels computes its angles itself (from positions ``0..T-1``).
    """
    b, nh, t, d = cfg.rope_shape
    q, k = rng_f32(rng, b, nh, t, d), rng_f32(rng, b, nh, t, d)
    q_out, k_out = np.empty_like(q), np.empty_like(k)
    cos_half, sin_half = h.rope_cos_sin(d, np.arange(t))

    def lk_rope() -> tuple[np.ndarray, np.ndarray]:
        return lk.rope(q, out=q_out), lk.rope(k, out=k_out)

    impls: Impls = {LK: lk_rope, LK_ALLOC: lambda: (lk.rope(q), lk.rope(k))}
    if peers.torch is not None and peers.apply_rotary_pos_emb is not None:
        torch, apply = peers.torch, peers.apply_rotary_pos_emb
        qt, kt = torch.from_numpy(q), torch.from_numpy(k)
        cos = torch.from_numpy(np.concatenate((cos_half, cos_half), -1)[None])  # (1, T, D)
        sin = torch.from_numpy(np.concatenate((sin_half, sin_half), -1)[None])
        impls[HF] = lambda: apply(qt, kt, cos, sin)
    impls[NUMPY] = lambda: (
        h.numpy_rope(q, cos_half, sin_half),
        h.numpy_rope(k, cos_half, sin_half),
    )
    shape = f"q, k: ({b}, {nh}, {t}, {d})"
    return OpCase("rope", shape, "GB/s", 8.0 * (q.size + k.size), impls)


def case_swiglu_ffn(cfg: Config, rng: np.random.Generator) -> OpCase:
    """SwiGLU FFN: llmkernels vs torch ``(F.silu(x@wg) * (x@wu)) @ wd`` vs NumPy; GFLOP/s."""
    tokens, d, hidden = cfg.ffn_shape
    x = rng_f32(rng, tokens, d)
    wg, wu = rng_f32(rng, d, hidden, scale=d**-0.5), rng_f32(rng, d, hidden, scale=d**-0.5)
    wd = rng_f32(rng, hidden, d, scale=hidden**-0.5)
    impls: Impls = {LK: lambda: lk.swiglu_ffn(x, wg, wu, wd)}
    if peers.torch is not None:
        xt, wgt, wut, wdt = (peers.torch.from_numpy(a) for a in (x, wg, wu, wd))
        impls[TORCH] = lambda: (peers.F.silu(xt @ wgt) * (xt @ wut)) @ wdt
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
    cos_half, sin_half = h.rope_cos_sin(rd, np.arange(rt))

    ft, fd, fh = cfg.pure_ffn_shape
    fx = rng_f32(rng, ft, fd)
    fwg, fwu = rng_f32(rng, fd, fh, scale=fd**-0.5), rng_f32(rng, fd, fh, scale=fd**-0.5)
    fwd = rng_f32(rng, fh, fd, scale=fh**-0.5)
    fxl, fwgl, fwul, fwdl = (a.tolist() for a in (fx, fwg, fwu, fwd))

    row = f"({n},)"
    return [
        ("rms_norm", row, "element", n, {
            "pure": lambda: pure.rms_norm(xl, wl, 1e-6),
            NUMPY: lambda: h.numpy_rms_norm(x, w, 1e-6),
            LK: lambda: lk.rms_norm(x, w, 1e-6),
        }),
        ("layer_norm", row, "element", n, {
            "pure": lambda: pure.layer_norm(xl, wl, bl, 1e-5),
            NUMPY: lambda: numpy_layer_norm(x, w, b, 1e-5),
            LK: lambda: lk.layer_norm(x, w, b, 1e-5),
        }),
        ("silu", row, "element", n, {
            "pure": lambda: pure.silu(xl),
            NUMPY: lambda: numpy_silu(x),
            LK: lambda: lk.silu(x),
        }),
        ("swiglu", row, "element", n, {
            "pure": lambda: pure.swiglu(gl, ul),
            NUMPY: lambda: numpy_swiglu(g, u),
            LK: lambda: lk.swiglu(g, u),
        }),
        ("rope", f"({rb}, {rh}, {rt}, {rd})", "element", q.size, {
            "pure": lambda: pure.rope(ql),
            NUMPY: lambda: h.numpy_rope(q, cos_half, sin_half),
            LK: lambda: lk.rope(q),
        }),
        ("swiglu_ffn", f"x ({ft}, {fd}), d_ff {fh}", "FLOP", 6.0 * ft * fd * fh, {
            "pure": lambda: pure.swiglu_ffn(fxl, fwgl, fwul, fwdl),
            NUMPY: lambda: numpy_ffn(fx, fwg, fwu, fwd),
            LK: lambda: lk.swiglu_ffn(fx, fwg, fwu, fwd),
        }),
    ]  # fmt: skip


# bytes per element of the memory-bound ops (the FFN counts FLOPs: 1 per unit)
UNIT_BYTES = {"rms_norm": 8.0, "layer_norm": 8.0, "silu": 8.0, "swiglu": 12.0, "rope": 8.0}


def run_pure(cfg: Config, rng: np.random.Generator, ops: list[dict[str, Any]]) -> list[dict]:
    """Pure Python vs NumPy vs llmkernels at toy sizes, one thread, per element (or FLOP)."""
    h.set_threads(1)
    full_lk = {
        op["op"]: op["impls"][LK]["1"]["median_s"]
        / (op["work_per_call"] / UNIT_BYTES.get(op["op"], 1.0))
        for op in ops
    }
    samples = 3 if cfg.quick else 5
    rows = []
    for name, shape, unit, units, impls in pure_cases(cfg, rng):
        diff = h.max_rel_diff(np.asarray(impls["pure"](), dtype=np.float64), impls[LK]())
        h.check_outputs(f"pure {name}", {"pure": diff})
        per_call = {k: h.time_per_call(fn, samples) for k, fn in impls.items()}
        rows.append(
            {
                "op": name,
                "toy_shape": shape,
                "unit": unit,
                "units_per_call": units,
                "seconds_per_call": per_call,
                "seconds_per_unit": {k: v / units for k, v in per_call.items()},
                "llmkernels_full_size_1T_seconds_per_unit": full_lk.get(name),
                "pure_vs_llmkernels_toy": per_call["pure"] / per_call[LK],
                "max_rel_diff_pure_vs_llmkernels": diff,
            }
        )
    return rows


# --------------------------------------------------------------------------------------
# RMSNorm vs row length; thread scaling
# --------------------------------------------------------------------------------------


def run_row_scaling(cfg: Config, rng: np.random.Generator, probe: dict) -> list[dict]:
    """RMSNorm GB/s for several row lengths at the same total size, llmkernels vs torch."""
    rows_out = []
    repeats = max(3, cfg.repeats // 3)
    per_round = max(1, -(-repeats // cfg.rounds))
    for d in cfg.row_lengths:
        rows = cfg.row_elements // d
        x, w = rng_f32(rng, rows, d), rng_f32(rng, d)
        out = np.empty_like(x)
        impls: Impls = {LK: lambda x=x, w=w, out=out: lk.rms_norm(x, w, 1e-6, out=out)}
        if peers.torch is not None:
            xt, wt = peers.torch.from_numpy(x), peers.torch.from_numpy(w)
            impls[TORCH] = lambda xt=xt, wt=wt, d=d: peers.F.rms_norm(xt, (d,), wt, 1e-6)
        entry: dict[str, Any] = {"d": d, "rows": rows}
        for t in cfg.threads:
            h.set_threads(t)
            samples, others = h.measure_quietly(
                impls, cfg.rounds, per_round, warmup=cfg.warmup, quiet_wait=cfg.quiet_wait
            )
            entry.setdefault("other_processes_cpus", {})[str(t)] = others
            for name, s in samples.items():
                gbs = 8.0 * x.size / statistics.median(s) / 1e9
                entry.setdefault(name, {})[str(t)] = {
                    "median_s": statistics.median(s),
                    "gbs": gbs,
                    "fraction_of_triad": gbs / h.roof(probe, "GB/s", t),
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
            h.set_threads(t)
            entry.setdefault("triad_gbs", {})[str(t)] = lk._core._probe_triad_gbs(
                t, cfg.triad_n, cfg.triad_inner
            )
            for name, (fn, nbytes) in calls.items():
                fn()
                seconds = h.time_per_call(fn, 5)
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


# --------------------------------------------------------------------------------------
# report
# --------------------------------------------------------------------------------------


def render_thread_scaling(sc: dict[str, Any], threads: Sequence[int]) -> list[str]:
    """The paired thread-scaling section."""
    lo, hi = str(min(threads)), str(max(threads))
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


def render(report: dict[str, Any]) -> str:
    """The markdown report: machine, probe, per-op table, pure Python gap, row-length table,
    thread scaling (from the results alone)."""
    m, cfg = report["machine"], report["config"]
    threads = cfg["threads"]
    lo, hi = str(min(threads)), str(max(threads))
    out = [f"# llmkernels ops{' (--quick)' if cfg['quick'] else ''}", ""]
    out += [*h.machine_lines(m), ""]
    out += h.probe_section(report["probe"], threads)
    if report.get("ops"):
        out += [
            "",
            f"## Ops (float32; median of {cfg['repeats']} runs, FFN {cfg['ffn_repeats']}, "
            "after warm-up)",
            "",
            "`rate` is GB/s (memory-bound ops) or GFLOP/s (FFN); `roof` is the fraction of "
            "the triad bandwidth (or FMA peak) at the same thread count; `x lk` is the peer's "
            f"time over llmkernels' time; `{lo}T/{hi}T` is the peer's own thread speedup, next "
            "to the probe's (the most a memory-bound op can gain from the second thread); "
            "`others` is how many CPUs other processes kept busy meanwhile (1T / 2T): this "
            "machine is shared, and a busy second core spoils 2-thread timings.",
            "",
        ]
        out += h.op_table(report["ops"], threads)

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
        header = ["op", "toy shape", "pure / call", "pure ns/unit", "NumPy ns/unit"]
        header += ["lk ns/unit", "lk ns/unit (full size, 1T)", "pure / lk (toy)"]
        out += md_table(header, rows)

    if report.get("rms_norm_row_scaling"):
        out += [
            "",
            f"## rms_norm vs row length ({cfg['row_elements']} elements, out= for "
            "llmkernels; GB/s and fraction of triad)",
            "",
        ]
        skip = ("d", "rows", "other_processes_cpus")
        names = [k for k in report["rms_norm_row_scaling"][0] if k not in skip]
        header = ["D", "rows"]
        for t in threads:
            header += [f"{n} {t}T" for n in names]
        rows = []
        for e in report["rms_norm_row_scaling"]:
            row = [str(e["d"]), str(e["rows"])]
            for t in threads:
                cells = (e[n][str(t)] for n in names)
                row += [f"{c['gbs']:.1f} ({100 * c['fraction_of_triad']:.0f}%)" for c in cells]
            rows.append(row)
        out += md_table(header, rows)

    if report.get("thread_scaling"):
        out += render_thread_scaling(report["thread_scaling"], threads)

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


def main(argv: Sequence[str] | None = None) -> int:
    """Run the benchmarks; print the markdown report and write ops.md / ops.json."""
    parser = h.arg_parser(__doc__, quiet_default="60")
    parser.add_argument(
        "--no-row-scaling", action="store_true", help="skip the rms_norm vs row length table"
    )
    parser.add_argument("--no-pure", action="store_true", help="skip pure Python at toy sizes")
    parser.add_argument(
        "--scaling-only",
        action="store_true",
        help="only the roofline probe and the paired thread-scaling rounds",
    )
    args, cfg, run = h.parse_and_start(parser, argv, FULL, QUICK, use_torch_thp=True)
    rng = np.random.default_rng(0)
    report = h.new_report(cfg)
    report["probe"] = probe = run.probe(cfg)
    if not args.scaling_only:
        report["ops"] = run.cases(CASES, cfg, rng, probe)
        if not args.no_pure:
            run.log("pure Python")
            report["pure"] = run_pure(cfg, rng, report["ops"])
        if not args.no_row_scaling:
            run.log("rms_norm vs row length")
            report["rms_norm_row_scaling"] = run_row_scaling(cfg, rng, probe)
    run.log("thread scaling, paired with the triad probe")
    report["thread_scaling"] = run_thread_scaling(cfg, rng)
    return run.report(report, render, args.out, "ops")


if __name__ == "__main__":
    sys.exit(main())
