"""The demo and the side-by-side timing table, run from the source tree (``make demo``).

``python examples/demo.py demo`` streams text from the example model that ships with the
package (with its tokens/s), times each op side by side (pure Python, NumPy (float32),
llmkernels and torch when installed; small shapes), then recomputes every number the worked
examples of the LLaMA notes state (RMSNorm, LayerNorm, SwiGLU, RoPE) with the C++ kernels and
the float64 reference and says in one line how many of the notes' numbers are wrong
(``--details``: every example's table, right / rounded / wrong per number).

``python examples/demo.py bench [--quick] [--out DIR]`` prints the timing table alone (and writes
``builtin_timings.json`` into ``DIR``). The full benchmarks (roofline probe, 1 and 2 threads,
blocks and models, plots, the documentation's tables) are the scripts in ``benchmarks/`` (``make
bench``). The table shows a progress bar (tqdm, when installed) on a terminal only.

This is not part of the installed package: the data of the worked examples lives beside it, in
``examples/worked_examples.py``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # worked_examples beside this file

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


class _NoBar:
    """Stands in for a tqdm bar when tqdm is not installed."""

    def update(self, n: int = 1) -> None:
        pass

    def set_description_str(self, desc: str) -> None:
        pass

    def write(self, line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    def close(self) -> None:
        pass


def _progress(total: int | None, desc: str) -> Any:
    """A tqdm progress bar on stderr, disabled when stderr is not a terminal (or without
    tqdm): logs and CI output stay free of carriage-return noise."""
    try:
        from tqdm import tqdm
    except ImportError:
        return _NoBar()
    return tqdm(
        total=total,
        desc=desc,
        file=sys.stderr,
        disable=not sys.stderr.isatty(),
        leave=False,
        dynamic_ncols=True,
    )


# --------------------------------------------------------------------------------------
# text generation; the worked examples of the LLaMA notes
# --------------------------------------------------------------------------------------


def show_generation(lk: Any, prompt: str = "A dictionary", max_tokens: int = 80) -> None:
    """Stream text from the example model that ships with the package (trained on the Python
    documentation) and report its speed."""
    model, tokenizer = lk.load(lk.example_model())
    n = sum(v.size for k, v in model.state_dict().items()
            if not (k == "lm_head.weight" and model.config.tie_embeddings))  # fmt: skip
    print(f"Text from the example model ({n / 1e6:.1f} M parameters, {model.dtype}, trained on "
          "the Python documentation), sampled at temperature 0.8:\n")  # fmt: skip
    print(prompt, end="", flush=True)
    piece = None
    for piece in lk.stream_generate(model, tokenizer, prompt, max_tokens=max_tokens,
                                    temperature=0.8, top_p=0.95, seed=0):  # fmt: skip
        print(piece.text, end="", flush=True)
    if piece is not None:
        print(f"\n\n[{piece.prompt_tokens} prompt tokens at {piece.prompt_tps:.0f} tokens/s, "
              f"{piece.generation_tokens} generated at {piece.generation_tps:.0f} tokens/s]")


def show_worked_example_summary(lk: Any, dtype: type[np.floating]) -> int:
    """One line: the worked examples recomputed, and how many of their numbers are wrong."""
    from worked_examples import WRONG, evaluate

    rows = evaluate(lk, dtype)
    wrong = [r for r in rows if r.verdict == WRONG]
    print(f"\nWorked examples from the LLaMA notes: {len(rows)} numbers recomputed by the "
          f"kernels, {len(wrong)} found wrong in the notes "
          f"(`python examples/demo.py demo --details` shows each).")  # fmt: skip
    return len(wrong)


def show_worked_examples(lk: Any, dtype: type[np.floating]) -> int:
    """Print one table per worked example; return the number of errors found in the notes."""
    from worked_examples import WRONG, evaluate

    rows = evaluate(lk, dtype)
    print(
        "\nWorked examples from the LLaMA notes, recomputed (C++ kernels on "
        f"{np.dtype(dtype).name} inputs; float64 reference)."
    )
    print("  ok = the notes' number is the exact value rounded; rounded = off by a couple of")
    print("  units in its last digit because the notes rounded intermediate values; wrong = an")
    print("  arithmetic error in the notes.")
    headers = ("quantity", "notes state", "llmkernels (C++)", "float64 reference", "verdict")
    errors = 0
    for ex in dict.fromkeys(r.example for r in rows):
        ex_rows = [r for r in rows if r.example is ex]
        print(f"\n{ex.source}: {ex.title}")
        cells = [
            (r.item.label, r.item.stated, f"{r.value:.7g}", f"{r.exact:.10g}", r.verdict)
            for r in ex_rows
        ]
        print(_table(headers, cells, right=(1, 2, 3)))
        for r in ex_rows:
            if r.verdict == WRONG:
                errors += 1
                print(
                    f"  NOTES ERROR: {r.item.label}: the notes state {r.item.stated}; "
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


def _np_attention(q: np.ndarray, k: np.ndarray, v: np.ndarray) -> np.ndarray:
    """``softmax(q @ k^T / sqrt(D)) @ v``, max-subtracted, float32."""
    s = (q @ np.swapaxes(k, -1, -2)) * F32(1.0 / np.sqrt(q.shape[-1]))
    e = np.exp(s - s.max(axis=-1, keepdims=True))
    return (e / e.sum(axis=-1, keepdims=True)) @ v


def _benches(lk: Any, pure: Any, torch: Any, quick: bool = False) -> list[Bench]:
    """The workloads (float32, fixed seed). ``pure``/``torch`` may be None (not called then).
    ``quick``: an eighth of the rows (a quarter of the sequence for RoPE and attention)."""
    rng = np.random.default_rng(0)
    if quick:
        n_rows, sw_rows, ffn_rows, rope_t, attn_t = 256, 64, 16, 128, 128
    else:
        n_rows, sw_rows, ffn_rows, rope_t, attn_t = 2048, 512, 64, 512, 512

    def randn(*shape: int, scale: float = 1.0) -> np.ndarray:
        return rng.standard_normal(shape, dtype=F32) * F32(scale)

    def tt(a: np.ndarray) -> Any:
        return torch.from_numpy(a)

    def F() -> Any:  # noqa: N802 (torch.nn.functional, looked up only when torch is there)
        return torch.nn.functional

    # rms_norm / layer_norm / silu on (2048, 4096); pure Python on 8 of the rows
    x, w, b = randn(n_rows, 4096), 1 + randn(4096, scale=0.1), randn(4096, scale=0.1)
    xs, ws, bs = x[:8].tolist(), w.tolist(), b.tolist()
    # swiglu on (512, 11008); pure Python on 4 rows
    g, u = randn(sw_rows, 11008), randn(sw_rows, 11008)
    gs, us = g[:4].tolist(), u[:4].tolist()
    # swiglu_ffn (64, 1024) -> 2816 -> 1024; pure Python on (1, 256) -> 704 -> 256
    xf = randn(ffn_rows, 1024)
    wg, wu = randn(1024, 2816, scale=1024**-0.5), randn(1024, 2816, scale=1024**-0.5)
    wd = randn(2816, 1024, scale=2816**-0.5)
    small = (xf[:1, :256], wg[:256, :704], wu[:256, :704], wd[:704, :256])
    pxf, pwg, pwu, pwd = (a.tolist() for a in small)
    # rope on (1, 32, 512, 128), theta 1e4, positions 0..T-1; pure Python on 2 heads x 64
    q = randn(1, 32, rope_t, 128)
    cos, sin = _np_rope_tables(rope_t, 128)
    qs = q[:, :2, :64].tolist()
    # attention (1, 8, 512, 64) non-causal; pure Python on 2 heads x 16 queries x 16 keys
    qa, ka, va = (randn(1, 8, attn_t, 64) for _ in range(3))
    pqa, pka, pva = (a[0, :2, :16].tolist() for a in (qa, ka, va))
    attn_macs = 8 * attn_t * attn_t * (64 + 64)

    return [
        Bench(
            op="rms_norm", shape=f"({n_rows}, 4096)", work=x.size,
            pure_shape="(8, 4096)", pure_work=8 * 4096,
            pure=lambda: pure.rms_norm(xs, ws, 1e-6),
            numpy=lambda: _np_rms_norm(x, w),
            llmkernels=lambda: lk.rms_norm(x, w, 1e-6),
            torch=lambda: F().rms_norm(tt(x), (4096,), tt(w), 1e-6),
        ),
        Bench(
            op="layer_norm", shape=f"({n_rows}, 4096)", work=x.size,
            pure_shape="(8, 4096)", pure_work=8 * 4096,
            pure=lambda: pure.layer_norm(xs, ws, bs, 1e-5),
            numpy=lambda: _np_layer_norm(x, w, b),
            llmkernels=lambda: lk.layer_norm(x, w, b, 1e-5),
            torch=lambda: F().layer_norm(tt(x), (4096,), tt(w), tt(b), 1e-5),
        ),
        Bench(
            op="silu", shape=f"({n_rows}, 4096)", work=x.size,
            pure_shape="(8, 4096)", pure_work=8 * 4096,
            pure=lambda: pure.silu(xs),
            numpy=lambda: _np_silu(x),
            llmkernels=lambda: lk.silu(x),
            torch=lambda: F().silu(tt(x)),
        ),
        Bench(
            op="swiglu", shape=f"({sw_rows}, 11008)", work=g.size,
            pure_shape="(4, 11008)", pure_work=4 * 11008,
            pure=lambda: pure.swiglu(gs, us),
            numpy=lambda: _np_silu(g) * u,
            llmkernels=lambda: lk.swiglu(g, u),
            torch=lambda: F().silu(tt(g)) * tt(u),
        ),
        Bench(
            op="swiglu_ffn", shape=f"({ffn_rows}, 1024)->2816", work=ffn_rows * 3 * 1024 * 2816,
            pure_shape="(1, 256)->704", pure_work=3 * 256 * 704,
            pure=lambda: pure.swiglu_ffn(pxf, pwg, pwu, pwd),
            numpy=lambda: (_np_silu(xf @ wg) * (xf @ wu)) @ wd,
            llmkernels=lambda: lk.swiglu_ffn(xf, wg, wu, wd),
            torch=lambda: (F().silu(tt(xf) @ tt(wg)) * (tt(xf) @ tt(wu))) @ tt(wd),
        ),
        Bench(
            op="rope", shape=f"(1, 32, {rope_t}, 128)", work=q.size,
            pure_shape="(1, 2, 64, 128)", pure_work=2 * 64 * 128,
            pure=lambda: pure.rope(qs),
            numpy=lambda: _rotate_half_rope(q, cos, sin, np.concatenate),
            llmkernels=lambda: lk.rope(q),
            torch=lambda: _rotate_half_rope(tt(q), tt(cos), tt(sin), torch.cat),
        ),
        Bench(
            op="attention", shape=f"(1, 8, {attn_t}, 64)", work=attn_macs,
            pure_shape="(2, 16, 64)", pure_work=2 * 16 * 16 * (64 + 64),
            pure=lambda: pure.attention(pqa, pka, pva),
            numpy=lambda: _np_attention(qa, ka, va),
            llmkernels=lambda: lk.attention(qa, ka, va),
            torch=lambda: F().scaled_dot_product_attention(tt(qa), tt(ka), tt(va)),
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


def show_timings(
    lk: Any, quick: bool = False, json_path: str | os.PathLike[str] | None = None
) -> None:
    """Time every op four ways and print the table with llmkernels' speed-ups.

    ``quick``: smaller inputs and shorter timing budgets. ``json_path``: also write the
    timings (seconds; None where a peer is missing) as JSON.
    """
    try:
        from llmkernels import pure
    except ImportError:
        pure = None
    try:
        import torch
    except ImportError:
        torch = None

    budget = 0.05 if quick else 0.15
    blocks = 2 if quick else 3
    print(
        f"\nTiming: median of repeated runs after warm-up (best of {blocks} such medians), "
        f"float32, llmkernels on {lk.get_num_threads()} thread(s), SIMD {lk.simd_arch()}."
    )
    print("  pure Python runs on the smaller 'pure size' input; its time is scaled to the full")
    print("  size (per element; per multiply-add for swiglu_ffn and attention). NumPy = the")
    print("  float32 formula; torch = F.rms_norm / F.layer_norm / F.silu / F.silu(g)*u / HF")
    print("  rotate_half with precomputed cos/sin / F.scaled_dot_product_attention.")
    print("  'x' columns: how many times faster llmkernels is.")
    failures: list[str] = []

    def timed(name: str, fn: Callable[[], object], **kw: Any) -> float | None:
        try:
            return _median_time(fn, **kw)
        except Exception as e:  # a missing or differently-shaped peer must not stop the demo
            failures.append(f"{name}: {type(e).__name__}: {e}")
            return None

    benches = _benches(lk, pure, torch, quick=quick)
    peers = 2 + (torch is not None) + (pure is not None)
    bar = _progress(len(benches) * peers, "timing")
    rows = []
    records = []
    for bm in benches:
        bar.set_description_str(f"timing {bm.op}")
        t_lk = timed(f"llmkernels {bm.op}", bm.llmkernels, blocks=blocks, budget=budget)
        bar.update(1)
        t_np = timed(f"NumPy {bm.op}", bm.numpy, blocks=blocks, budget=budget)
        bar.update(1)
        t_th = t_pp = None
        if torch is not None:
            with torch.inference_mode():
                t_th = timed(f"torch {bm.op}", bm.torch, blocks=blocks, budget=budget)
            bar.update(1)
        if pure is not None:
            t_pp = timed(f"pure {bm.op}", bm.pure, blocks=1, min_runs=3, budget=2 * budget)
            bar.update(1)
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
        records.append(
            {
                "op": bm.op,
                "shape": bm.shape,
                "pure_shape": bm.pure_shape,
                "seconds": {
                    "pure (scaled)": t_pp, "NumPy": t_np, "llmkernels": t_lk, "torch": t_th,
                },
            }
        )  # fmt: skip
    bar.close()
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
    if json_path is not None:
        report = {"build_info": lk.build_info(), "quick": quick, "ops": records}
        Path(json_path).write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")
        print(f"wrote {json_path}", file=sys.stderr)


# --------------------------------------------------------------------------------------
# bench: the built-in side-by-side table (the full benchmarks are benchmarks/, `make bench`)
# --------------------------------------------------------------------------------------


def bench(lk: Any, quick: bool, out: Path | None) -> int:
    """The ``bench`` command: every op timed side by side (the demo's table); with ``out``,
    its JSON in ``out/builtin_timings.json``."""
    print(f"llmkernels {lk.__version__}: built-in side-by-side timings"
          + (" (quick)" if quick else ""))  # fmt: skip
    print("(the full benchmarks, with the roofline probe and plots: `make bench` in a source "
          "checkout, see benchmarks/README.md)")  # fmt: skip
    json_path = None
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        json_path = out / "builtin_timings.json"
    show_timings(lk, quick=quick, json_path=json_path)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Run the demo; returns the process exit status."""
    parser = argparse.ArgumentParser(
        prog="python examples/demo.py",
        description="llmkernels: text from the example model, side-by-side timings, the LLaMA "
        "notes' worked examples.",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser(
        "demo", help="text from the example model, side-by-side timings, the worked examples"
    )
    demo.add_argument(
        "--dtype",
        choices=("float32", "float64"),
        default="float32",
        help="dtype of the inputs given to the C++ kernels for the worked examples",
    )
    demo.add_argument("--no-bench", action="store_true", help="skip the timing table")
    demo.add_argument(
        "--details", action="store_true", help="every worked example's numbers, not a summary"
    )
    bench_p = sub.add_parser("bench", help="side-by-side timings of every op")
    bench_p.add_argument(
        "--quick", action="store_true", help="small shapes, short timings (a smoke run)"
    )
    bench_p.add_argument(
        "--out", type=Path, default=None, help="also write builtin_timings.json there"
    )
    args = parser.parse_args(argv)

    import llmkernels as lk

    if args.command == "bench":
        return bench(lk, args.quick, args.out)
    print(f"llmkernels {lk.__version__}: SIMD {lk.simd_arch()}, {lk.get_num_threads()} thread(s)\n")
    show_generation(lk)
    if not args.no_bench:
        show_timings(lk, quick=True)
    if args.details:
        errors = show_worked_examples(lk, np.dtype(args.dtype).type)
        print(f"\n{errors} error(s) found in the notes (lines starting with 'NOTES ERROR').")
    else:
        show_worked_example_summary(lk, np.dtype(args.dtype).type)
    return 0


if __name__ == "__main__":
    sys.exit(main())
