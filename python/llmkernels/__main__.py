"""Command line: ``python -m llmkernels demo`` and ``python -m llmkernels info``.

``demo`` recomputes every number the seeds' worked examples state (RMSNorm, LayerNorm, SwiGLU,
RoPE) with the C++ kernels and with the float64 reference, says which of the seed's numbers
are right, rounded or wrong, then times each op side by side: pure Python, NumPy (float32),
llmkernels and torch (when installed). ``info`` prints :func:`llmkernels.build_info`.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

F32 = np.float32


def _table(headers: Sequence[str], rows: Sequence[Sequence[str]], right: Sequence[int]) -> str:
    """Plain-text table; columns whose index is in ``right`` are right-aligned."""
    widths = [max(len(r[i]) for r in (headers, *rows)) for i in range(len(headers))]

    def line(cells: Sequence[str]) -> str:
        return " | ".join(
            c.rjust(w) if i in right else c.ljust(w)
            for i, (c, w) in enumerate(zip(cells, widths, strict=True))
        )

    rule = "-+-".join("-" * w for w in widths)
    return "\n".join(["  " + line(headers), "  " + rule, *("  " + line(r) for r in rows)])


# --------------------------------------------------------------------------------------
# seeds
# --------------------------------------------------------------------------------------


def show_seeds(lk: Any, dtype: type[np.floating]) -> int:
    """Print one table per worked example; return the number of seed errors found."""
    from ._seeds import WRONG, evaluate

    rows = evaluate(lk, dtype)
    print(
        f"Seed worked examples, recomputed (C++ kernels on {np.dtype(dtype).name} inputs; "
        "float64 reference)."
    )
    print("  ok = the seed's number is the exact value rounded; rounded = off by a couple of")
    print("  units in its last digit because the seed rounded intermediate values; wrong = an")
    print("  arithmetic error in the seed.")
    headers = ("quantity", "seed states", "llmkernels (C++)", "float64 reference", "verdict")
    errors = 0
    for ex in dict.fromkeys(r.example for r in rows):
        ex_rows = [r for r in rows if r.example is ex]
        print(f"\nseed {ex.seed}: {ex.title}")
        cells = [
            (r.item.label, r.item.stated, f"{r.value:.7g}", f"{r.exact:.10g}", r.verdict)
            for r in ex_rows
        ]
        print(_table(headers, cells, right=(1, 2, 3)))
        for r in ex_rows:
            if r.verdict == WRONG:
                errors += 1
                print(
                    f"  SEED ERROR: {r.item.label}: the seed states {r.item.stated}; "
                    f"correct value is {r.correct} ({r.item.why})"
                )
            elif r.item.why:
                print(f"  note: {r.item.label}: {r.verdict}: {r.item.why}")
    return errors


# --------------------------------------------------------------------------------------
# timing
# --------------------------------------------------------------------------------------


def _median_time(
    fn: Callable[[], object], blocks: int = 3, min_runs: int = 5, budget: float = 0.15
) -> float:
    """Time ``fn()`` after one warm-up call: the median of each block of runs (at least
    ``min_runs``, more while ``budget`` seconds last, at most 30), best block of ``blocks``.

    Several blocks because on a small shared machine the thread pools of NumPy's OpenBLAS,
    torch and llmkernels sometimes disturb each other for a fraction of a second.
    """
    fn()
    medians = []
    for _ in range(blocks):
        times: list[float] = []
        stop = time.perf_counter() + budget
        while len(times) < min_runs or (len(times) < 30 and time.perf_counter() < stop):
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
        medians.append(statistics.median(times))
    return min(medians)


@dataclass
class Bench:
    """One op timed four ways, each a zero-argument callable.

    ``pure`` runs on a smaller input (``pure_shape``); its time is scaled by
    ``work / pure_work`` (elements, or multiply-adds for the FFN). ``pure`` and ``torch`` are
    only called when that module imported.
    """

    op: str
    shape: str
    work: float
    pure_shape: str
    pure_work: float
    pure: Callable[[], object]
    numpy: Callable[[], object]
    llmkernels: Callable[[], object]
    torch: Callable[[], object]


def _np_rope_tables(t: int, d: int, theta: float = 10000.0) -> tuple[np.ndarray, np.ndarray]:
    """HF-style precomputed ``cos, sin`` of shape (T, D) (half-split layout), float32."""
    inv = 1.0 / theta ** (np.arange(0, d, 2) / d)
    ang = np.arange(t)[:, None] * inv
    emb = np.concatenate([ang, ang], axis=-1)
    return np.cos(emb).astype(F32), np.sin(emb).astype(F32)


def _rotate_half_rope(x: Any, cos: Any, sin: Any, cat: Callable[..., Any]) -> Any:
    """HF ``apply_rotary_pos_emb``: ``x * cos + rotate_half(x) * sin`` (NumPy or torch)."""
    h = x.shape[-1] // 2
    return x * cos + cat((-x[..., h:], x[..., :h]), -1) * sin


def _np_silu(x: np.ndarray) -> np.ndarray:
    return x / (1.0 + np.exp(-x))


def _np_rms_norm(x: np.ndarray, w: np.ndarray, eps: float = 1e-6) -> np.ndarray:
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w


def _np_layer_norm(x: np.ndarray, w: np.ndarray, b: np.ndarray, eps: float = 1e-5) -> np.ndarray:
    xc = x - x.mean(axis=-1, keepdims=True)
    return xc / np.sqrt(np.mean(xc * xc, axis=-1, keepdims=True) + eps) * w + b


def _benches(lk: Any, pure: Any, torch: Any) -> list[Bench]:
    """The workloads (float32, fixed seed). ``pure``/``torch`` may be None (not called then)."""
    rng = np.random.default_rng(0)

    def randn(*shape: int, scale: float = 1.0) -> np.ndarray:
        return rng.standard_normal(shape, dtype=F32) * F32(scale)

    def tt(a: np.ndarray) -> Any:
        return torch.from_numpy(a)

    def F() -> Any:  # noqa: N802 (torch.nn.functional, looked up only when torch is there)
        return torch.nn.functional

    # rms_norm / layer_norm / silu on (2048, 4096); pure Python on 8 of the rows
    x, w, b = randn(2048, 4096), 1 + randn(4096, scale=0.1), randn(4096, scale=0.1)
    xs, ws, bs = x[:8].tolist(), w.tolist(), b.tolist()
    # swiglu on (512, 11008); pure Python on 4 rows
    g, u = randn(512, 11008), randn(512, 11008)
    gs, us = g[:4].tolist(), u[:4].tolist()
    # swiglu_ffn (64, 1024) -> 2816 -> 1024; pure Python on (1, 256) -> 704 -> 256
    xf = randn(64, 1024)
    wg, wu = randn(1024, 2816, scale=1024**-0.5), randn(1024, 2816, scale=1024**-0.5)
    wd = randn(2816, 1024, scale=2816**-0.5)
    small = (xf[:1, :256], wg[:256, :704], wu[:256, :704], wd[:704, :256])
    pxf, pwg, pwu, pwd = (a.tolist() for a in small)
    # rope on (1, 32, 512, 128), theta 1e4, positions 0..T-1; pure Python on 2 heads x 64
    q = randn(1, 32, 512, 128)
    cos, sin = _np_rope_tables(512, 128)
    qs = q[:, :2, :64].tolist()

    return [
        Bench(
            op="rms_norm", shape="(2048, 4096)", work=x.size,
            pure_shape="(8, 4096)", pure_work=8 * 4096,
            pure=lambda: pure.rms_norm(xs, ws, 1e-6),
            numpy=lambda: _np_rms_norm(x, w),
            llmkernels=lambda: lk.rms_norm(x, w, 1e-6),
            torch=lambda: F().rms_norm(tt(x), (4096,), tt(w), 1e-6),
        ),
        Bench(
            op="layer_norm", shape="(2048, 4096)", work=x.size,
            pure_shape="(8, 4096)", pure_work=8 * 4096,
            pure=lambda: pure.layer_norm(xs, ws, bs, 1e-5),
            numpy=lambda: _np_layer_norm(x, w, b),
            llmkernels=lambda: lk.layer_norm(x, w, b, 1e-5),
            torch=lambda: F().layer_norm(tt(x), (4096,), tt(w), tt(b), 1e-5),
        ),
        Bench(
            op="silu", shape="(2048, 4096)", work=x.size,
            pure_shape="(8, 4096)", pure_work=8 * 4096,
            pure=lambda: pure.silu(xs),
            numpy=lambda: _np_silu(x),
            llmkernels=lambda: lk.silu(x),
            torch=lambda: F().silu(tt(x)),
        ),
        Bench(
            op="swiglu", shape="(512, 11008)", work=g.size,
            pure_shape="(4, 11008)", pure_work=4 * 11008,
            pure=lambda: pure.swiglu(gs, us),
            numpy=lambda: _np_silu(g) * u,
            llmkernels=lambda: lk.swiglu(g, u),
            torch=lambda: F().silu(tt(g)) * tt(u),
        ),
        Bench(
            op="swiglu_ffn", shape="(64, 1024)->2816", work=64 * 3 * 1024 * 2816,
            pure_shape="(1, 256)->704", pure_work=3 * 256 * 704,
            pure=lambda: pure.swiglu_ffn(pxf, pwg, pwu, pwd),
            numpy=lambda: (_np_silu(xf @ wg) * (xf @ wu)) @ wd,
            llmkernels=lambda: lk.swiglu_ffn(xf, wg, wu, wd),
            torch=lambda: (F().silu(tt(xf) @ tt(wg)) * (tt(xf) @ tt(wu))) @ tt(wd),
        ),
        Bench(
            op="rope", shape="(1, 32, 512, 128)", work=q.size,
            pure_shape="(1, 2, 64, 128)", pure_work=2 * 64 * 128,
            pure=lambda: pure.rope(qs),
            numpy=lambda: _rotate_half_rope(q, cos, sin, np.concatenate),
            llmkernels=lambda: lk.rope(q),
            torch=lambda: _rotate_half_rope(tt(q), tt(cos), tt(sin), torch.cat),
        ),
    ]  # fmt: skip


def _fmt_time(t: float | None) -> str:
    if t is None:
        return "n/a"
    return f"{t:.3g} s" if t >= 1.0 else f"{t * 1e3:.3g} ms"


def _speedup(t: float | None, t_lk: float | None) -> str:
    """How many times faster llmkernels (``t_lk``) is than a peer taking ``t``."""
    if t is None or t_lk is None:
        return "n/a"
    r = t / t_lk
    return f"{r:,.0f}x" if r >= 100 else f"{r:.3g}x"


def show_timings(lk: Any) -> None:
    """Time every op four ways and print the table with llmkernels' speed-ups."""
    try:
        from . import pure
    except ImportError:
        pure = None
    try:
        import torch
    except ImportError:
        torch = None

    print(
        f"\nTiming: median of repeated runs after warm-up (best of 3 such medians), float32, "
        f"llmkernels on {lk.get_num_threads()} thread(s), SIMD {lk.simd_arch()}."
    )
    print("  pure Python runs on the smaller 'pure size' input; its time is scaled to the full")
    print("  size (per element; per multiply-add for swiglu_ffn). NumPy = the float32 formula;")
    print("  torch = F.rms_norm / F.layer_norm / F.silu / F.silu(g)*u / HF rotate_half with")
    print("  precomputed cos/sin. 'x' columns: how many times faster llmkernels is.")
    failures: list[str] = []

    def timed(name: str, fn: Callable[[], object], **kw: Any) -> float | None:
        try:
            return _median_time(fn, **kw)
        except Exception as e:  # a missing or differently-shaped peer must not stop the demo
            failures.append(f"{name}: {type(e).__name__}: {e}")
            return None

    rows = []
    for bm in _benches(lk, pure, torch):
        t_lk = timed(f"llmkernels {bm.op}", bm.llmkernels)
        t_np = timed(f"NumPy {bm.op}", bm.numpy)
        t_th = t_pp = None
        if torch is not None:
            with torch.inference_mode():
                t_th = timed(f"torch {bm.op}", bm.torch)
        if pure is not None:
            t_pp = timed(f"pure {bm.op}", bm.pure, blocks=1, min_runs=3, budget=0.3)
        if t_pp is not None:
            t_pp *= bm.work / bm.pure_work

        rows.append(
            (
                bm.op,
                bm.shape,
                bm.pure_shape,
                _fmt_time(t_pp),
                _fmt_time(t_np),
                _fmt_time(t_lk),
                _fmt_time(t_th),
                _speedup(t_pp, t_lk),
                _speedup(t_np, t_lk),
                _speedup(t_th, t_lk),
            )
        )
    headers = (
        "op",
        "shape",
        "pure size",
        "pure Python",
        "NumPy",
        "llmkernels",
        "torch",
        "vs pure",
        "vs NumPy",
        "vs torch",
    )
    print(_table(headers, rows, right=tuple(range(3, 10))))
    for f in failures:
        print(f"  n/a: {f}")


# --------------------------------------------------------------------------------------
# entry point
# --------------------------------------------------------------------------------------


def _info(lk: Any) -> None:
    info = lk.build_info()
    if isinstance(info, dict):
        width = max(len(str(k)) for k in info)
        for k, v in info.items():
            print(f"{k!s:<{width}}  {v}")
    else:
        print(info)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the process exit status."""
    parser = argparse.ArgumentParser(
        prog="python -m llmkernels", description="llmkernels: seed demo, timings, build info."
    )
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser("demo", help="seed worked examples, then side-by-side timings")
    demo.add_argument(
        "--dtype",
        choices=("float32", "float64"),
        default="float32",
        help="dtype of the inputs given to the C++ kernels for the seed examples",
    )
    demo.add_argument("--no-bench", action="store_true", help="skip the timing table")
    sub.add_parser("info", help="print llmkernels.build_info()")
    args = parser.parse_args(argv)

    import llmkernels as lk

    if args.command == "info":
        _info(lk)
        return 0
    print(f"llmkernels {lk.__version__}\n")
    errors = show_seeds(lk, np.dtype(args.dtype).type)
    print(f"\n{errors} seed error(s) found (lines starting with 'SEED ERROR').")
    if not args.no_bench:
        show_timings(lk)
    return 0


if __name__ == "__main__":
    sys.exit(main())
