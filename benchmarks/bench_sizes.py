#!/usr/bin/env python
"""Size sweep and per-call overhead: llmkernels vs NumPy vs torch from 16 to 16M elements.

Usage::

    python benchmarks/bench_sizes.py [--quick] [--out benchmarks/results] [--no-plot]

What it does (the protocol is ``harness.py``'s: interleaved rounds, medians, 1 and 2 threads):

1. ``silu``, ``swiglu``, ``rms_norm``, ``layer_norm`` and ``rope``, float32, at sizes from 16
   to 16M elements (x8 steps; ``--quick``: four sizes), each peer allocating its result
   (``lk.silu(x)``, ``F.silu(xt)``, ``x / (1 + np.exp(-x))``): the time per call and each peer's
   time over llmkernels' (``x lk``: above 1, llmkernels is faster). A timed sample is a loop of
   calls lasting about 1 ms (a single call of 16 elements is below the clock's resolution
   for a fair comparison), so the medians are per call. Rows are ``(n / d, d)`` with
   ``d = min(n, 4096)`` for the norms; RoPE is ``(n / 1024, 16, 64)`` (from 1,024 elements) with
   the peers given precomputed cos/sin (llmkernels computes or reuses its own).
2. The per-call overhead table (1 thread): the four elementwise/row ops on 1,024
   float32, ``rope`` on (8, 16, 64), ``attention`` on (1, 8, 16, 64) causal, and each module's
   ``__call__`` next to its C++ forward (``module._impl.forward``) on prepared arguments: the
   difference is what the Python layer adds.

Writes ``<out>/sizes.md`` and ``<out>/sizes.json``, and (unless ``--no-plot``, needs matplotlib)
``<out>/sizes.png``: time per call against size per op, one panel per op and thread count.
``--quick`` finishes in under 30 s.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import harness as h
import llmkernels as lk
import numpy as np
from harness import LK, Impls, OpCase, fmt, fmt_time, md_table, peers, rng_f32

NUMPY = "NumPy"
TORCH = "torch"
OPS = ("silu", "swiglu", "rms_norm", "layer_norm", "rope")


@dataclass(frozen=True)
class Config(h.Timing):
    sizes: tuple[int, ...]
    sample_s: float  # each timed sample loops calls for about this long
    overhead_samples: int


FULL = Config(
    **{**h.FULL_TIMING, "rounds": 3, "repeats": 9, "quiet_wait": 5.0},
    sizes=tuple(16 * 8**i for i in range(7)) + (1 << 24,),  # 16 ... 4M (x8), and 16M
    sample_s=1e-3,
    overhead_samples=15,
)
QUICK = Config(
    **{**h.QUICK_TIMING, "rounds": 1, "repeats": 3},
    sizes=(16, 1024, 65536, 1 << 20),
    sample_s=5e-4,
    overhead_samples=5,
)


def _looped(fn: Callable[[], Any], k: int) -> Callable[[], Any]:
    def run() -> Any:
        r = None
        for _ in range(k):
            r = fn()
        return r

    return run


def _calls_per_sample(fn: Callable[[], Any], sample_s: float) -> int:
    fn()
    t0 = time.perf_counter()
    fn()
    return max(1, int(sample_s / max(time.perf_counter() - t0, 1e-7)))


def _rows(n: int) -> tuple[int, int]:
    d = min(n, 4096)
    return n // d, d


def _impls(op: str, n: int, rng: np.random.Generator) -> tuple[str, float, Impls]:
    """(shape, bytes per call, {peer: call}) of one op at n elements."""
    torch, F = peers.torch, peers.F
    if op in ("silu", "swiglu"):
        x, u = rng_f32(rng, n), rng_f32(rng, n)
        if op == "silu":
            impls: Impls = {LK: lambda: lk.silu(x), NUMPY: lambda: x / (1 + np.exp(-x))}
            if torch is not None:
                xt = torch.from_numpy(x)
                impls[TORCH] = lambda: F.silu(xt)
            return f"({n},)", 8.0 * n, impls
        impls = {LK: lambda: lk.swiglu(x, u), NUMPY: lambda: x / (1 + np.exp(-x)) * u}
        if torch is not None:
            xt, ut = torch.from_numpy(x), torch.from_numpy(u)
            impls[TORCH] = lambda: F.silu(xt) * ut
        return f"({n},)", 12.0 * n, impls
    if op in ("rms_norm", "layer_norm"):
        rows, d = _rows(n)
        x, w, b = rng_f32(rng, rows, d), rng_f32(rng, d), rng_f32(rng, d)
        if op == "rms_norm":
            impls = {
                LK: lambda: lk.rms_norm(x, w, 1e-6),
                NUMPY: lambda: h.numpy_rms_norm(x, w, 1e-6),
            }
            if torch is not None:
                xt, wt = torch.from_numpy(x), torch.from_numpy(w)
                impls[TORCH] = lambda: F.rms_norm(xt, (d,), wt, 1e-6)
            return f"({rows}, {d})", 8.0 * n, impls

        def np_ln() -> np.ndarray:
            xc = x - np.mean(x, -1, keepdims=True)
            return xc / np.sqrt(np.mean(xc * xc, -1, keepdims=True) + np.float32(1e-5)) * w + b

        impls = {LK: lambda: lk.layer_norm(x, w, b, 1e-5), NUMPY: np_ln}
        if torch is not None:
            xt, wt, bt = (torch.from_numpy(a) for a in (x, w, b))
            impls[TORCH] = lambda: F.layer_norm(xt, (d,), wt, bt, 1e-5)
        return f"({rows}, {d})", 8.0 * n, impls
    # rope: (H, 16, 64), half-split, default positions
    x = rng_f32(rng, n // 1024, 16, 64)
    cos, sin = h.rope_cos_sin(64, np.arange(16))
    impls = {LK: lambda: lk.rope(x), NUMPY: lambda: h.numpy_rope(x, cos, sin)}
    if torch is not None:
        xt = torch.from_numpy(x)
        ct, st = (
            torch.from_numpy(np.concatenate([cos, cos], -1)),
            torch.from_numpy(np.concatenate([sin, sin], -1)),
        )

        def torch_rope() -> Any:
            x1, x2 = xt[..., :32], xt[..., 32:]
            return xt * ct + torch.cat((-x2, x1), dim=-1) * st

        impls[TORCH] = torch_rope
    return f"({n // 1024}, 16, 64)", 8.0 * n, impls


def sweep(cfg: Config, run: h.Run, rng: np.random.Generator, probe: dict[str, Any]) -> list[dict]:
    out = []
    for op in OPS:
        for n in cfg.sizes:
            if op == "rope" and n < 1024:
                continue
            shape, work, impls = _impls(op, n, rng)
            h.set_threads(1)
            k = _calls_per_sample(impls[LK], cfg.sample_s)
            looped = {name: _looped(fn, k) for name, fn in impls.items()}
            run.log(f"{op} {shape} ({k} calls per sample)")
            res = h.run_case(OpCase(op, shape, "GB/s", work * k, looped), cfg, probe)
            for impl in res["impls"].values():
                for st in impl.values():
                    if isinstance(st, dict):
                        st["per_call_s"] = st["median_s"] / k
            res.update(elements=n, calls_per_sample=k)
            out.append(res)
    return out


# --------------------------------------------------------------------------------------
# per-call overhead
# --------------------------------------------------------------------------------------


def overhead(cfg: Config, rng: np.random.Generator) -> list[dict[str, Any]]:
    """Median µs per call at 1 thread of this list, and each module's __call__ next to
    its C++ forward."""
    h.set_threads(1)
    x = rng_f32(rng, 1024)
    w = np.ones(1024, np.float32)
    r = rng_f32(rng, 8, 16, 64)
    q = rng_f32(rng, 1, 8, 16, 64)
    cases: list[tuple[str, Callable[[], Any], float | None]] = [
        ("silu (1024,)", lambda: lk.silu(x), 2.5),
        ("swiglu (1024,)", lambda: lk.swiglu(x, x), 2.5),
        ("rms_norm (1024,)", lambda: lk.rms_norm(x, w), 2.5),
        ("layer_norm (1024,)", lambda: lk.layer_norm(x, w, w), 2.5),
        ("rope (8, 16, 64)", lambda: lk.rope(r), 5.0),
        ("attention (1, 8, 16, 64) causal", lambda: lk.attention(q, q, q, causal=True), 20.0),
        ("NumPy x / (1 + exp(-x)) (1024,)", lambda: x / (1 + np.exp(-x)), None),
    ]
    if peers.torch is not None:
        xt = peers.torch.from_numpy(x)
        cases.append(("torch F.silu (1024,)", lambda: peers.F.silu(xt), None))
    rows = [
        {"call": name, "us": 1e6 * h.time_per_call(fn, cfg.overhead_samples), "target_us": tgt}
        for name, fn, tgt in cases
    ]
    # modules: __call__ vs the C++ forward on the prepared arguments
    xm = rng_f32(rng, 1, 4, 64)
    pos = np.arange(4, dtype=np.int64)[None]
    rms, ln = lk.RMSNorm(1024), lk.LayerNorm(1024)
    ffn = lk.FeedForward(64, 128, seed=0)
    mha = lk.MultiHeadAttention(64, 4, seed=0)
    blk = lk.TransformerBlock(
        attention=lk.MultiHeadAttention(64, 4, seed=0),
        feed_forward=lk.FeedForward(64, 128, seed=0),
        attention_norm=lk.RMSNorm(64),
        ffn_norm=lk.RMSNorm(64),
    )
    x2 = x[None]
    mods: list[tuple[str, Callable[[], Any], Callable[[], Any]]] = [
        ("RMSNorm(1024) (1, 1024)", lambda: rms(x2), lambda: rms._impl.forward(x2)),
        ("LayerNorm(1024) (1, 1024)", lambda: ln(x2), lambda: ln._impl.forward(x2)),
        (
            "FeedForward(64, 128) (1, 4, 64)",
            lambda: ffn(xm),
            lambda: ffn._impl.forward(xm.reshape(-1, 64)),
        ),  # fmt: skip
        (
            "MultiHeadAttention(64, 4) (1, 4, 64)",
            lambda: mha(xm),
            lambda: mha._impl.forward(xm, pos, None, None, None),
        ),  # fmt: skip
        (
            "TransformerBlock(64, 4, 128) (1, 4, 64)",
            lambda: blk(xm),
            lambda: blk._impl.forward(xm, pos, None, None, None),
        ),  # fmt: skip
    ]
    for name, call, core in mods:
        a = 1e6 * h.time_per_call(call, cfg.overhead_samples)
        b = 1e6 * h.time_per_call(core, cfg.overhead_samples)
        rows.append({"call": name, "us": a, "core_us": b, "added_us": a - b, "target_us": 5.0})
    return rows


# --------------------------------------------------------------------------------------
# report
# --------------------------------------------------------------------------------------


def render(report: dict[str, Any]) -> str:
    threads = [int(t) for t in report["config"]["threads"]]
    lines = ["# Size sweep: llmkernels vs NumPy vs torch (float32, results allocated)", ""]
    lines += h.machine_lines(report["machine"]) + [""]
    behind = []
    for op in OPS:
        cases = [c for c in report["sweep"] if c["op"] == op]
        if not cases:
            continue
        lines += [f"## {op}", ""]
        header = ["elements", "shape"]
        for t in threads:
            header += [f"lk {t}T", f"NumPy {t}T", f"torch {t}T", f"NumPy x lk {t}T",
                       f"torch x lk {t}T"]  # fmt: skip
        rows = []
        for c in cases:
            row = [f"{c['elements']:,}", c["shape"]]
            for t in threads:
                lk_t = c["impls"][LK][str(t)]["per_call_s"]
                for peer in (NUMPY, TORCH):
                    st = c["impls"].get(peer, {}).get(str(t))
                    row.append(fmt_time(st["per_call_s"]) if st else "-")
                row.insert(len(row) - 2, fmt_time(lk_t))
                for peer in (NUMPY, TORCH):
                    st = c["impls"].get(peer, {}).get(str(t))
                    ratio = st["per_call_s"] / lk_t if st else None
                    row.append(fmt(ratio))
                    if ratio is not None and ratio < 1.0:
                        behind.append(f"{op} {c['elements']:,} ({t}T): {peer} x{ratio:.2f}")
            rows.append(row)
        lines += md_table(header, rows) + [""]
    lines += ["## Where llmkernels is behind (peer time / llmkernels time < 1)", ""]
    lines += [f"- {b}" for b in behind] or ["- nowhere"]
    lines += ["", "## Per-call overhead (1 thread, median µs per call)", ""]
    rows = []
    for o in report["overhead"]:
        rows.append([
            o["call"], fmt(o["us"], 2), fmt(o.get("core_us"), 2) if "core_us" in o else "",
            fmt(o.get("added_us"), 2) if "added_us" in o else "",
            "" if o["target_us"] is None else f"<= {o['target_us']:g}",
        ])  # fmt: skip
    lines += md_table(["call", "µs", "C++ forward µs", "added by Python µs", "target µs"], rows)
    return "\n".join(lines) + "\n"


def plot(report: dict[str, Any], path: Path) -> None:
    import matplotlib.pyplot as plt
    from plot_results import _FAMILIES

    plt.switch_backend("Agg")
    threads = [int(t) for t in report["config"]["threads"]]
    fig, axes = plt.subplots(len(threads), len(OPS), figsize=(4 * len(OPS), 3.4 * len(threads)),
                             squeeze=False)  # fmt: skip
    for i, t in enumerate(threads):
        for j, op in enumerate(OPS):
            ax = axes[i][j]
            cases = [c for c in report["sweep"] if c["op"] == op]
            for peer in (LK, NUMPY, TORCH):
                pts = [(c["elements"], c["impls"][peer][str(t)]["per_call_s"]) for c in cases
                       if peer in c["impls"]]  # fmt: skip
                if not pts:
                    continue
                label, colour = _FAMILIES.get(peer, (peer, "#5b5b5b"))
                ax.plot(*zip(*pts, strict=True), marker="o", ms=3, color=colour, label=label)
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.set_title(f"{op}, {t} thread{'s' if t > 1 else ''}", fontsize=9)
            ax.set_xlabel("elements", fontsize=8)
            ax.grid(True, which="both", alpha=0.3)
            if j == 0:
                ax.set_ylabel("time per call (s)", fontsize=8)
    axes[0][0].legend(fontsize=7)
    fig.suptitle("float32, each peer allocating its result (lower is better)", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    print(f"wrote {path}", file=sys.stderr)


def main(argv: list[str] | None = None) -> int:
    parser = h.arg_parser(__doc__, "5")
    parser.add_argument("--no-plot", action="store_true", help="don't draw sizes.png")
    args, cfg, run = h.parse_and_start(parser, argv, FULL, QUICK, use_torch_thp=True)
    rng = np.random.default_rng(0)
    report = h.new_report(cfg)
    # no roofline probe: times and ratios only (a zero roof leaves the fractions out)
    zero = {str(t): 0.0 for t in cfg.threads}
    probe = {"triad_gbs": zero, "fma_gflops": zero, "triad_scaling": None, "fma_scaling": None}
    report["sweep"] = sweep(cfg, run, rng, probe)
    run.log("per-call overhead")
    report["overhead"] = overhead(cfg, rng)
    status = run.report(report, render, args.out, "sizes")
    if not args.no_plot:
        plot(report, args.out / "sizes.png")
    return status


if __name__ == "__main__":
    sys.exit(main())
