#!/usr/bin/env python
"""Attention against its peers: llmkernels vs torch SDPA vs ONNX Runtime, as time ratios.

Usage::

    python benchmarks/bench_attention_peers.py [--quick] [--out benchmarks/results]
                                               [--paths avx2,best] [--quiet-wait S]

The cases, float32, shapes ``(B, H, T, head_dim)`` as
``lk.attention`` takes them:

* non-causal prefill ``(1, 32, 2048, 128)``, causal prefill (same shape);
* a small causal call ``(1, 8, 64, 64)`` (per-call overhead and short tiles);
* decode: 1 query against 2048 keys, GQA 32 query / 8 KV heads, head_dim 128.

Peers, each skipped (and the report says so) when not installed:

* ``torch SDPA``: ``F.scaled_dot_product_attention`` (``is_causal``; ``enable_gqa=True``);
* ``ORT MHA``: ``com.microsoft.MultiHeadAttention`` (``unidirectional`` for causal; query in
  ONNX Runtime's own ``(B, T, H*D)`` layout, K/V as ``(B, H, T, D)``, converted outside the
  timed region);
* ``ORT GQA``: ``com.microsoft.GroupQueryAttention`` for decode, past and present K/V sharing
  one buffer (I/O binding), as ONNX Runtime GenAI runs it, so no cache copy is timed;
* ``ORT Attention``: the opset-23 ``Attention`` op (4-D inputs, ``is_causal``, GQA heads).

Graphs are built with ``onnx.helper``; sessions get ``intra_op_num_threads`` = the thread count
under test (one session per count). Every peer's output is checked against llmkernels' (and
llmkernels' against a float64 formula) *before* timing; a peer that disagrees is dropped from the
timing with a WARNING. Timing is :func:`harness.measure_quietly`: every peer in turn, several
rounds, medians. The ratio is peer time / llmkernels time (> 1: llmkernels is faster).

Paths: ``avx2`` forces llmkernels' AVX2 kernels (``lk.set_simd_arch``) and torch's
(``ATEN_CPU_CAPABILITY=avx2``, set before torch is imported); ``best`` is each library's own
choice. ONNX Runtime has no switch for its ISA (MLAS picks by CPUID): it runs its best path in
both. On a machine whose best path is AVX2 the two are the same run, made once. Each path runs in
its own interpreter (torch reads its capability once).

Results go to ``<out>/attention_peers.md`` and ``<out>/attention_peers.json``. ``--quick``
(tiny shapes, few repeats) is a smoke test.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import harness as h
import llmkernels as lk
import numpy as np
from harness import LK, fmt_time

TORCH = "torch SDPA"
ORT_MHA = "ORT MHA"
ORT_GQA = "ORT GQA"
ORT_ATTN = "ORT Attention"
PEER_ORDER = (TORCH, ORT_MHA, ORT_GQA, ORT_ATTN)
TOLERANCE = 1e-4  # max |peer - llmkernels| / max |llmkernels| before a peer is timed


@dataclass(frozen=True)
class Config(h.Timing):
    """Shapes and repeat counts of one run."""

    prefill_shape: tuple[int, int, int, int]  # (B, H, T, D), Tq = Tk = T
    prefill_repeats: int
    small_shape: tuple[int, int, int, int]  # (B, H, T, D), causal
    small_repeats: int
    decode_shape: tuple[int, int, int, int, int]  # (B, Hq, Hkv, Tk, D), Tq = 1
    decode_repeats: int


FULL, QUICK = h.full_and_quick(
    Config,
    {
        "prefill_shape": ((1, 32, 2048, 128), (1, 2, 96, 32)),
        "prefill_repeats": (6, 2),
        "small_shape": ((1, 8, 64, 64), (1, 2, 16, 16)),
        "small_repeats": (600, 4),
        "decode_shape": ((1, 32, 8, 2048, 128), (1, 4, 2, 80, 32)),
        "decode_repeats": (300, 4),
    },
)


# --------------------------------------------------------------------------------------
# ONNX Runtime graphs
# --------------------------------------------------------------------------------------


def load_ort() -> tuple[Any, Any, str | None]:
    """``(onnx, onnxruntime, None)`` or ``(None, None, why)`` when either is missing."""
    try:
        import onnx
        import onnxruntime
    except ImportError as e:
        return None, None, f"not installed ({e.name}); `pip install onnxruntime onnx`"
    return onnx, onnxruntime, None


def ort_model(onnx: Any, node: Any, inputs: list[Any], outputs: list[Any], opset: int) -> bytes:
    """A one-node model, serialised."""
    graph = onnx.helper.make_graph([node], "attention", inputs, outputs)
    imports = [onnx.helper.make_opsetid("", opset), onnx.helper.make_opsetid("com.microsoft", 1)]
    model = onnx.helper.make_model(graph, opset_imports=imports)
    model.ir_version = 10 if opset < 23 else 11
    return model.SerializeToString()


def ort_session(ort: Any, model: bytes, threads: int) -> Any:
    """A CPU session with ``intra_op_num_threads = threads``."""
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    so.log_severity_level = 3
    return ort.InferenceSession(model, so, providers=["CPUExecutionProvider"])


def f32_info(onnx: Any, name: str, shape: Sequence[int]) -> Any:
    return onnx.helper.make_tensor_value_info(name, onnx.TensorProto.FLOAT, list(shape))


def ort_attention23(onnx: Any, q: np.ndarray, k: np.ndarray, causal: bool) -> bytes:
    """Opset-23 ``Attention``: Q (B, Hq, Tq, D), K/V (B, Hkv, Tk, D) -> Y (B, Hq, Tq, D).
    ``is_causal`` is top-left aligned there: only used with Tq = Tk."""
    node = onnx.helper.make_node(
        "Attention", ["Q", "K", "V"], ["Y"], is_causal=int(causal),
        q_num_heads=q.shape[1], kv_num_heads=k.shape[1], scale=q.shape[-1] ** -0.5,
    )  # fmt: skip
    ins = [f32_info(onnx, "Q", q.shape), f32_info(onnx, "K", k.shape), f32_info(onnx, "V", k.shape)]
    return ort_model(onnx, node, ins, [f32_info(onnx, "Y", q.shape)], 23)


def ort_mha(onnx: Any, q: np.ndarray, causal: bool) -> bytes:
    """``com.microsoft.MultiHeadAttention``: query (B, T, H*D), key/value (B, H, T, D)."""
    b, nh, t, d = q.shape
    node = onnx.helper.make_node(
        "MultiHeadAttention", ["query", "key", "value"], ["output"], domain="com.microsoft",
        num_heads=nh, unidirectional=int(causal), scale=d**-0.5,
    )  # fmt: skip
    ins = [
        f32_info(onnx, "query", (b, t, nh * d)),
        f32_info(onnx, "key", q.shape),
        f32_info(onnx, "value", q.shape),
    ]
    return ort_model(onnx, node, ins, [f32_info(onnx, "output", (b, t, nh * d))], 21)


def ort_gqa_decode(onnx: Any, q: np.ndarray, k: np.ndarray) -> bytes:
    """``com.microsoft.GroupQueryAttention``, one new token: query (B, 1, Hq*D), key/value of
    the new token (B, 1, Hkv*D), past = present (B, Hkv, Tk, D) (shared buffer)."""
    b, hq, _, d = q.shape
    hkv, tk = k.shape[1], k.shape[2]
    node = onnx.helper.make_node(
        "GroupQueryAttention",
        ["query", "key", "value", "past_key", "past_value", "seqlens_k", "total_sequence_length"],
        ["output", "present_key", "present_value"], domain="com.microsoft",
        num_heads=hq, kv_num_heads=hkv, scale=d**-0.5,
    )  # fmt: skip
    i32 = onnx.TensorProto.INT32
    ins = [
        f32_info(onnx, "query", (b, 1, hq * d)),
        f32_info(onnx, "key", (b, 1, hkv * d)),
        f32_info(onnx, "value", (b, 1, hkv * d)),
        f32_info(onnx, "past_key", k.shape),
        f32_info(onnx, "past_value", k.shape),
        onnx.helper.make_tensor_value_info("seqlens_k", i32, [b]),
        onnx.helper.make_tensor_value_info("total_sequence_length", i32, [1]),
    ]
    outs = [
        f32_info(onnx, "output", (b, 1, hq * d)),
        f32_info(onnx, "present_key", (b, hkv, tk, d)),
        f32_info(onnx, "present_value", (b, hkv, tk, d)),
    ]
    return ort_model(onnx, node, ins, outs, 21)


# --------------------------------------------------------------------------------------
# cases
# --------------------------------------------------------------------------------------


@dataclass
class Case:
    """One shape: ``impls(threads)`` gives ``{peer: callable returning (B, Hq, Tq, Dv)}``."""

    name: str
    shape: str
    repeats: int
    make: Callable[[int], dict[str, Callable[[], np.ndarray]]]
    expected: np.ndarray  # the float64 formula's output


def formula(q: np.ndarray, k: np.ndarray, v: np.ndarray, causal: bool) -> np.ndarray:
    """softmax(q k^T / sqrt(D) [+ causal -inf]) v in float64, GQA by repeating K/V heads."""
    group = q.shape[1] // k.shape[1]
    k64, v64 = (np.repeat(a.astype(np.float64), group, axis=1) for a in (k, v))
    s = q.astype(np.float64) @ k64.transpose(0, 1, 3, 2) * q.shape[-1] ** -0.5
    if causal:
        tq, tk = s.shape[-2:]
        s = np.where(np.tril(np.ones((tq, tk), bool), tk - tq), s, -np.inf)
    s = np.exp(s - s.max(-1, keepdims=True))
    return (s / s.sum(-1, keepdims=True)) @ v64


def self_attention_case(
    name: str, shape: tuple[int, int, int, int], causal: bool, repeats: int, ort: Any
) -> Case:
    """Tq = Tk self-attention (prefill, or the small causal call)."""
    rng = np.random.default_rng(0)
    b, nh, t, d = shape
    q, k, v = (h.rng_f32(rng, b, nh, t, d) for _ in range(3))
    out = np.empty_like(q)
    q_bsh = np.ascontiguousarray(q.transpose(0, 2, 1, 3).reshape(b, t, nh * d))
    onnx, ort_mod, _ = ort

    def make(threads: int) -> dict[str, Callable[[], np.ndarray]]:
        impls: dict[str, Callable[[], np.ndarray]] = {
            LK: lambda: lk.attention(q, k, v, causal=causal, out=out)
        }
        if h.peers.torch is not None:
            qt, kt, vt = (h.peers.torch.from_numpy(a) for a in (q, k, v))
            sdpa = h.peers.F.scaled_dot_product_attention
            impls[TORCH] = lambda: sdpa(qt, kt, vt, is_causal=causal).numpy()
        if ort_mod is not None:
            mha = ort_session(ort_mod, ort_mha(onnx, q, causal), threads)
            feeds = {"query": q_bsh, "key": k, "value": v}
            impls[ORT_MHA] = lambda: (
                mha.run(None, feeds)[0].reshape(b, t, nh, d).transpose(0, 2, 1, 3)
            )
            a23 = ort_session(ort_mod, ort_attention23(onnx, q, k, causal), threads)
            feeds23 = {"Q": q, "K": k, "V": v}
            impls[ORT_ATTN] = lambda: a23.run(None, feeds23)[0]
        return impls

    return Case(name, f"({b}, {nh}, {t}, {d})", repeats, make, formula(q, k, v, causal))


def decode_case(cfg: Config, ort: Any) -> Case:
    """One query per head against a GQA KV cache of Tk keys (the newest key is the query's
    own: ORT's GQA appends it in place, into the shared past/present buffer)."""
    rng = np.random.default_rng(1)
    b, hq, hkv, tk, d = cfg.decode_shape
    q = h.rng_f32(rng, b, hq, 1, d)
    k, v = (h.rng_f32(rng, b, hkv, tk, d) for _ in range(2))
    out = np.empty_like(q)
    onnx, ort_mod, _ = ort

    def make(threads: int) -> dict[str, Callable[[], np.ndarray]]:
        impls: dict[str, Callable[[], np.ndarray]] = {LK: lambda: lk.attention(q, k, v, out=out)}
        if h.peers.torch is not None:
            qt, kt, vt = (h.peers.torch.from_numpy(a) for a in (q, k, v))
            sdpa = h.peers.F.scaled_dot_product_attention
            impls[TORCH] = lambda: sdpa(qt, kt, vt, enable_gqa=True).numpy()
        if ort_mod is not None:
            impls[ORT_GQA] = gqa_decode_call(onnx, ort_mod, q, k, v, threads)
            a23 = ort_session(ort_mod, ort_attention23(onnx, q, k, False), threads)
            feeds23 = {"Q": q, "K": k, "V": v}
            impls[ORT_ATTN] = lambda: a23.run(None, feeds23)[0]
        return impls

    shape = f"q ({b}, {hq}, 1, {d}), k, v ({b}, {hkv}, {tk}, {d})"
    return Case("decode, GQA", shape, cfg.decode_repeats, make, formula(q, k, v, False))


def gqa_decode_call(
    onnx: Any, ort: Any, q: np.ndarray, k: np.ndarray, v: np.ndarray, threads: int
) -> Callable[[], np.ndarray]:
    """ORT GQA with past_key/present_key (and values) bound to one buffer each, holding the
    first Tk - 1 keys; each call writes the newest key (the same one) at Tk - 1."""
    b, hq, _, d = q.shape
    hkv, tk = k.shape[1], k.shape[2]
    sess = ort_session(ort, ort_gqa_decode(onnx, q, k), threads)
    kbuf, vbuf = k.copy(), v.copy()  # the cache; slot Tk - 1 is rewritten with the same key
    kv = ort.OrtValue.ortvalue_from_numpy(kbuf), ort.OrtValue.ortvalue_from_numpy(vbuf)
    io = sess.io_binding()
    io.bind_cpu_input("query", np.ascontiguousarray(q.reshape(b, 1, hq * d)))
    io.bind_cpu_input("key", np.ascontiguousarray(k[:, :, -1].reshape(b, 1, hkv * d)))
    io.bind_cpu_input("value", np.ascontiguousarray(v[:, :, -1].reshape(b, 1, hkv * d)))
    io.bind_ortvalue_input("past_key", kv[0])
    io.bind_ortvalue_input("past_value", kv[1])
    io.bind_cpu_input("seqlens_k", np.full(b, tk - 1, np.int32))
    io.bind_cpu_input("total_sequence_length", np.array([tk], np.int32))
    out = np.empty((b, 1, hq * d), np.float32)
    io.bind_output("output", "cpu", 0, np.float32, list(out.shape), out.ctypes.data)
    io.bind_ortvalue_output("present_key", kv[0])
    io.bind_ortvalue_output("present_value", kv[1])

    def call() -> np.ndarray:
        sess.run_with_iobinding(io)
        return out.reshape(b, hq, 1, d)

    return call


def make_cases(cfg: Config, ort: Any) -> list[Case]:
    return [
        self_attention_case("prefill", cfg.prefill_shape, False, cfg.prefill_repeats, ort),
        self_attention_case("prefill, causal", cfg.prefill_shape, True, cfg.prefill_repeats, ort),
        self_attention_case("small, causal", cfg.small_shape, True, cfg.small_repeats, ort),
        decode_case(cfg, ort),
    ]


# --------------------------------------------------------------------------------------
# one path, in this process
# --------------------------------------------------------------------------------------


def check(case: Case, impls: dict[str, Callable[[], np.ndarray]]) -> dict[str, Any]:
    """Each peer's max relative difference from llmkernels (and llmkernels' from float64);
    the peers beyond TOLERANCE are removed from ``impls``."""
    ours = np.array(impls[LK](), copy=True)
    scale = float(np.max(np.abs(case.expected))) or 1.0
    diffs = {"llmkernels_vs_float64": float(np.max(np.abs(ours - case.expected))) / scale}
    for name in [n for n in impls if n != LK]:
        try:
            got = np.asarray(impls[name]())
            diffs[name] = float(np.max(np.abs(got.astype(np.float64) - ours))) / scale
        except Exception as e:  # noqa: BLE001 - a peer that cannot run this shape is reported
            diffs[name] = f"failed: {type(e).__name__}: {str(e)[:200]}"
        if not (isinstance(diffs[name], float) and diffs[name] <= TOLERANCE):
            print(f"WARNING: {case.name}: {name} dropped: {diffs[name]}", file=sys.stderr)
            del impls[name]
    if not diffs["llmkernels_vs_float64"] <= TOLERANCE:
        print(f"WARNING: {case.name}: llmkernels vs float64 {diffs}", file=sys.stderr)
    return diffs


def run_path(cfg: Config, path: str, run: h.Run) -> dict[str, Any]:
    """Every case at every thread count on this process's path."""
    if path == "avx2":
        lk.set_simd_arch("avx2")
    ort = load_ort()
    torch = h.peers.torch
    info: dict[str, Any] = {
        "path": path,
        "llmkernels_simd_arch": lk.simd_arch(),
        "torch_cpu_capability": torch.backends.cpu.get_cpu_capability() if torch else None,
        "ATEN_CPU_CAPABILITY": os.environ.get("ATEN_CPU_CAPABILITY"),
        "onnxruntime": ort[1].__version__ if ort[1] is not None else None,
        "onnx": ort[0].__version__ if ort[0] is not None else None,
        "skipped": {},
    }
    if torch is None:
        info["skipped"][TORCH] = "not installed (extra `bench`)"
    if ort[2] is not None:
        for name in (ORT_MHA, ORT_GQA, ORT_ATTN):
            info["skipped"][name] = ort[2]
    cases = []
    for case in make_cases(cfg, ort):
        run.log(f"[{path}] {case.name} {case.shape}")
        entry: dict[str, Any] = {"case": case.name, "shape": case.shape, "threads": {}}
        for t in cfg.threads:
            h.set_threads(t)
            impls = case.make(t)
            entry["max_rel_diff"] = check(case, impls)
            per_round = max(1, -(-case.repeats // cfg.rounds))
            samples, others = h.measure_quietly(
                impls, cfg.rounds, per_round, warmup=cfg.warmup, quiet_wait=cfg.quiet_wait,
                torch_inference=True,
            )  # fmt: skip
            lk_med = statistics.median(samples[LK])
            entry["threads"][str(t)] = {
                "other_processes_cpus": others,
                "impls": {
                    name: {
                        "median_s": statistics.median(s),
                        "min_s": min(s),
                        "n": len(s),
                        "ratio": statistics.median(s) / lk_med,
                    }
                    for name, s in samples.items()
                },
            }
            del impls
        cases.append(entry)
    info["cases"] = cases
    return info


# --------------------------------------------------------------------------------------
# report
# --------------------------------------------------------------------------------------


def render(report: dict[str, Any]) -> str:
    """The markdown report: one table per path, a row per case, time and ratio per peer."""
    cfg = report["config"]
    out = [f"# llmkernels attention vs torch SDPA and ONNX Runtime{' (--quick)' * cfg['quick']}"]
    out += ["", *h.machine_lines(report["machine"]), ""]
    out += [
        "Float32, shapes (B, H, T, head_dim). `ratio` = peer time / llmkernels time: above 1 "
        "llmkernels is faster. Medians of interleaved repetitions (every peer in turn, "
        f"{cfg['rounds']} rounds) in one process per path; outputs checked against llmkernels "
        f"(and llmkernels against float64) within {TOLERANCE:g} before timing. `others`: CPUs "
        "that other processes kept busy meanwhile (near 1, the 2-thread figures are unreliable).",
        "",
    ]
    for note in report.get("notes", []):
        out += [f"- {note}"]
    for p in report["paths"]:
        threads = cfg["threads"]
        peers = [n for n in PEER_ORDER if any(n in c["threads"][str(threads[0])]["impls"]
                                                for c in p["cases"])]  # fmt: skip
        out += [
            "",
            f"## Path `{p['path']}`: llmkernels {p['llmkernels_simd_arch']}, torch "
            f"{p['torch_cpu_capability']}, onnxruntime {p['onnxruntime']} (its own choice)",
            "",
        ]
        for name, why in p["skipped"].items():
            out += [f"- {name} skipped: {why}"]
        header = ["case", "shape"]
        for t in threads:
            header += [f"lk {t}T"] + [f"{n} {t}T (ratio)" for n in peers] + [f"others {t}T"]
        rows = []
        for c in p["cases"]:
            row = [c["case"], c["shape"]]
            for t in threads:
                e = c["threads"][str(t)]
                row.append(fmt_time(e["impls"][LK]["median_s"]))
                for n in peers:
                    s = e["impls"].get(n)
                    row.append(f"{fmt_time(s['median_s'])} ({s['ratio']:.2f})" if s else "-")
                oc = e["other_processes_cpus"]
                row.append("-" if oc is None else f"{oc:.1f}")
            rows.append(row)
        out += ["", *h.md_table(header, rows)]
        diffs = [
            f"{c['case']}: "
            + ", ".join(
                f"{k} {v:.1e}" if isinstance(v, float) else f"{k} {v}"
                for k, v in c["max_rel_diff"].items()
            )
            for c in p["cases"]
        ]
        out += ["", "Max relative differences (vs llmkernels; llmkernels vs float64): "]
        out += [f"- {d}" for d in diffs]
    out.append("")
    return "\n".join(out)


def child_args(args: Any, path: str, json_out: Path) -> list[str]:
    extra = ["--quick"] if args.quick else []
    if args.quiet_wait is not None:
        extra += ["--quiet-wait", str(args.quiet_wait)]
    return [sys.executable, __file__, "--one-path", path, "--json-to", str(json_out), *extra]


def path_env(path: str) -> dict[str, str]:
    env = dict(os.environ)
    if path == "avx2":
        env["ATEN_CPU_CAPABILITY"] = "avx2"
    else:
        env.pop("ATEN_CPU_CAPABILITY", None)
    return env


def main(argv: Sequence[str] | None = None) -> int:
    """Run each path (in this process when there is one, else one child per path); print the
    markdown report and write attention_peers.md / .json."""
    parser = h.arg_parser(__doc__, quiet_default="30")
    parser.add_argument(
        "--paths", default="avx2,best", help="comma-separated: avx2, best (default both)"
    )
    parser.add_argument("--one-path", help=argparse.SUPPRESS)  # a child run: one path
    parser.add_argument("--json-to", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    base = QUICK if args.quick else FULL

    if args.one_path:  # a child: one path, the JSON of run_path to --json-to
        if args.one_path == "avx2":
            os.environ["ATEN_CPU_CAPABILITY"] = "avx2"  # before torch is imported
        cfg, run = h.start(base, args.quiet_wait, torch_thp=args.torch_thp)
        result = {"config": cfg, "path": run_path(cfg, args.one_path, run)}
        run.finish()
        args.json_to.write_text(json.dumps(result["path"], default=str))
        return 0

    wanted = [p.strip() for p in args.paths.split(",") if p.strip()]
    notes = []
    best = lk._core.best_simd_arch()
    if "best" in wanted and "avx2" in wanted and best == "avx2":
        wanted.remove("best")
        notes.append(
            "This machine's best llmkernels path is AVX2 (and torch's too, without AVX-512): "
            "the `best` path is the `avx2` run."
        )
    if "avx2" in wanted and "avx2" not in lk._core.isa_names:
        wanted.remove("avx2")
        notes.append("No AVX2 on this CPU: the `avx2` path is not run.")
    cfg, run = h.start(base, args.quiet_wait, torch_thp=args.torch_thp, log=True)
    report: dict[str, Any] = {"config": cfg, "notes": notes, "paths": []}
    with tempfile.TemporaryDirectory() as tmp:
        for path in wanted:
            js = Path(tmp) / f"{path}.json"
            proc = subprocess.run(child_args(args, path, js), env=path_env(path), check=False)
            if proc.returncode != 0:
                print(f"WARNING: path {path} failed ({proc.returncode})", file=sys.stderr)
                continue
            report["paths"].append(json.loads(js.read_text()))
    report = {"machine": h.machine_info(), **report}
    report["config"] = {k: getattr(cfg, k) for k in cfg.__dataclass_fields__}
    return run.report(report, render, args.out, "attention_peers")


if __name__ == "__main__":
    sys.exit(main())
