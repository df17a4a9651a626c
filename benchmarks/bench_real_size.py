"""Whole-model prefill and decode at TinyLlama-1.1B's full shape (22 layers, dim 2048, 32 / 4
heads, hidden 5632, vocab 32000: 1.1 B parameters, 4.4 GB in float32), llmkernels against
llama.cpp at the same precision, each case in its own process.

The 4-layer model of bench_precision.py fits partly in the last-level cache; this one does not.
One random float32 model is saved once as safetensors; ours load it with
``Transformer.from_pretrained(path, dtype=...)`` (int8 / int4: quantized after loading, group
size 32), llama.cpp's GGUFs come from its own converter (F32, BF16, Q8_0; Q4_0 by its quantizer;
llamacpp_peer.py says how to install it). The logits of our float32 model and llama.cpp's F32
are compared first. Then, per thread count, round by round, each (ours, peer) pair runs
back to back in fresh processes (or, with ``--pairs N``, both models stay loaded in their own
processes and N rounds of adjacent calls are timed, the read probe beside every decode: on a
host whose bandwidth moves from minute to minute the two sides of each ratio are then seconds
apart, not minutes; our float32 model then stays resident too, and each other case's "vs our
f32" ratio is the median of its prefills' ratios to float32 calls made beside them):

* prefill: 512 tokens, the last position's logits (what a generation needs); one untimed
  warm-up call, then the median of ``--repeats`` timed calls;
* decode: 64 greedy steps through the KV cache after a 128-token prompt.

Ratios are llama.cpp time / ours (above 1 we are faster), the median over rounds of the
per-round ratios. The machine's limits are probed in every round: the float32 FMA peak, the
peaks of the instructions the bf16 (vdpbf16ps, or AMX's tdpbf16ps) and int8 / int4
(vpdpbusd, or AMX's tdpbssd) kernels run where the CPU has them, and read-only bandwidth;
prefill is given as a fraction of its precision's peak, decode (the weight bytes of a token
times tokens/s) as a fraction of the read probe.

    python benchmarks/bench_real_size.py --workdir /tmp/real [--threads 1,2]
        [--rounds 2 | --pairs 5] [--cases float32,bfloat16,int8,int4] [--layers 22]
        [--out benchmarks/results]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

PEER = {"float32": "F32", "bfloat16": "BF16", "float16": "F16", "int8": "Q8_0", "int4": "Q4_0"}
PROMPT, DECODE, PREFILL = 128, 64, 512


def config(layers: int) -> dict:
    return {
        "dim": 2048,
        "n_layers": layers,
        "n_heads": 32,
        "n_kv_heads": 4,
        "hidden_dim": 5632,
        "vocab_size": 32000,
        "max_seq_len": 1024,
    }


def prepare(workdir: Path, layers: int, cases: list[str], with_peer: bool) -> Path:
    """The float32 checkpoint (and GGUFs): made once, reused by later runs."""
    model_dir = workdir / f"tinyllama-{layers}"
    if not (model_dir / "config.json").exists():
        import llmkernels as lk

        model = lk.Transformer(config(layers), seed=0)
        model.save_pretrained(model_dir)
        del model
    if with_peer:
        import llamacpp_peer

        if not (model_dir / "tokenizer.model").exists():
            llamacpp_peer.write_tokenizer(model_dir)
        for case in cases:
            llamacpp_peer.make_gguf(model_dir, workdir / f"gguf-{layers}", PEER[case])
    return model_dir


def child(args: argparse.Namespace) -> None:
    """One case in this process: prints a JSON line of seconds."""
    rng = np.random.default_rng(0)
    prefill_ids = rng.integers(3, 32000, PREFILL).tolist()
    prompt_ids = rng.integers(3, 32000, PROMPT).tolist()
    out: dict = {}
    if args.impl == "ours":
        import llmkernels as lk

        lk.set_num_threads(args.threads)
        t0 = time.perf_counter()
        dtype = args.case if args.case in ("float32", "bfloat16", "float16") else "float32"
        model = lk.Transformer.from_pretrained(args.model, dtype=dtype)
        if args.case in ("int8", "int4"):
            model.quantize(bits=int(args.case[3:]), group_size=32)
        out["load"] = time.perf_counter() - t0
        ids = np.array([prefill_ids])

        def prefill() -> float:
            t = time.perf_counter()
            model(ids, last_only=True)
            return time.perf_counter() - t

        def decode() -> float:
            cache = model.new_cache(1, PROMPT + DECODE + 1)
            tok = model(np.array([prompt_ids]), cache=cache, last_only=True)[:, -1].argmax(-1)
            t = time.perf_counter()
            for _ in range(DECODE):
                tok = model(tok[:, None], cache=cache, last_only=True)[:, -1].argmax(-1)
            return time.perf_counter() - t

        if args.logits:
            out["logits"] = model(np.array([prompt_ids[:64]]))[0, -1].tolist()
    else:
        import llamacpp_peer

        t0 = time.perf_counter()
        peer = llamacpp_peer.LlamaCpp(Path(args.gguf), n_ctx=1024, threads=args.threads,
                                      f32_kv=args.logits)  # fmt: skip
        out["load"] = time.perf_counter() - t0

        def prefill() -> float:
            return peer.prefill(prefill_ids)

        def decode() -> float:
            return peer.decode(prompt_ids, DECODE)

        if args.logits:
            out["logits"] = peer.logits(prompt_ids[:64]).tolist()
    if args.serve:  # one command a line from the parent: "prefill" / "decode" -> seconds
        prefill()  # warm-up
        print("RESULT " + json.dumps(out), flush=True)
        for line in sys.stdin:
            if line.strip() == "quit":
                break
            call = prefill if line.strip() == "prefill" else decode
            print("RESULT " + json.dumps({line.strip(): call()}), flush=True)
        return
    if not args.logits:
        prefill()  # warm-up
        out["prefill"] = statistics.median(prefill() for _ in range(args.repeats))
        out["decode"] = decode()
    print("RESULT " + json.dumps(out), flush=True)


class Server:
    """A child in --serve mode: its model loaded once, timed calls on request."""

    def __init__(self, impl: str, case: str, threads: int, model_dir: Path,
                 gguf: Path | None) -> None:  # fmt: skip
        cmd = [sys.executable, __file__, "--child", "--serve", "--impl", impl, "--case", case,
               "--threads", str(threads), "--model", str(model_dir)]  # fmt: skip
        if gguf:
            cmd += ["--gguf", str(gguf)]
        env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
        self.name = f"{impl} {case}"
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     text=True, env=env)  # fmt: skip
        self.read()  # loaded and warmed up

    def read(self) -> dict:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            if line.startswith("RESULT "):
                return json.loads(line[7:])
        raise RuntimeError(f"{self.name} failed (exit {self.proc.wait()})")

    def call(self, what: str) -> float:
        assert self.proc.stdin is not None
        self.proc.stdin.write(what + "\n")
        self.proc.stdin.flush()
        return float(self.read()[what])

    def close(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write("quit\n")
        self.proc.stdin.close()
        self.proc.wait()


def run_pairs(case: str, threads: int, model_dir: Path, gguf: Path | None, pairs: int,
              read_probe, base: Server | None = None) -> tuple[list, list, list, list]:  # fmt: skip
    """--pairs: both models loaded at once (each in its own process, the idle one blocked on a
    read), then `pairs` rounds of adjacent timed calls -- prefill of ours and the peer's, then
    decode of each, who goes first alternating by round -- with the read probe just before and
    after each round's decodes. The two sides of a ratio are measured seconds apart, under the
    same state of a host whose bandwidth moves from minute to minute. `base` (our float32
    model, resident in its own process): its prefill joins each round's, for the "vs our f32"
    ratio of the same adjacent calls."""
    ours = Server("ours", case, threads, model_dir, None)
    peer = Server("peer", case, threads, model_dir, gguf) if gguf else None
    o, q, b, probes = [], [], [], []
    try:
        for r in range(pairs):
            sides = [(ours, o), (peer, q)] if peer else [(ours, o)]
            if base:
                sides.append((base, b))
            if r % 2:
                sides.reverse()
            for srv, acc in sides:
                acc.append({"prefill": srv.call("prefill")})
            sides = [(srv, acc) for srv, acc in sides if srv is not base]
            probes.append(read_probe())
            for srv, acc in sides:
                acc[-1]["decode"] = srv.call("decode")
            probes.append(read_probe())
            print(f"threads {threads} pair {r} {case}: ours {o[-1]} peer {q[-1] if q else '-'} "
                  f"read probe {probes[-2]:.1f} / {probes[-1]:.1f}", flush=True)  # fmt: skip
    finally:
        ours.close()
        if peer:
            peer.close()
    return o, q, b, probes


def run_child(impl: str, case: str, threads: int, model_dir: Path, gguf: Path | None,
              repeats: int, logits: bool = False) -> dict:  # fmt: skip
    cmd = [sys.executable, __file__, "--child", "--impl", impl, "--case", case, "--threads",
           str(threads), "--model", str(model_dir), "--repeats", str(repeats)]  # fmt: skip
    if gguf:
        cmd += ["--gguf", str(gguf)]
    if logits:
        cmd.append("--logits")
    env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False)
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[7:])
    raise RuntimeError(f"{impl} {case} failed:\n{proc.stderr[-3000:]}")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--workdir", default="/tmp/llmk-real-size")
    p.add_argument("--threads", default="1,2")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--cases", default="float32,bfloat16,int8,int4")
    p.add_argument("--layers", type=int, default=22)
    p.add_argument("--no-llamacpp", action="store_true")
    p.add_argument("--out", default=None)
    p.add_argument("--pairs", type=int, default=0,
                   help="both models resident, this many rounds of adjacent calls per case "
                   "(instead of --rounds of fresh processes)")  # fmt: skip
    # child mode
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--impl", help=argparse.SUPPRESS)
    p.add_argument("--case", help=argparse.SUPPRESS)
    p.add_argument("--model", help=argparse.SUPPRESS)
    p.add_argument("--gguf", help=argparse.SUPPRESS)
    p.add_argument("--logits", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        args.threads = int(args.threads)
        child(args)
        return 0

    import harness
    import llmkernels as lk

    cases = args.cases.split(",")
    threads = [int(t) for t in args.threads.split(",")]
    with_peer = not args.no_llamacpp
    if with_peer:
        import llamacpp_peer

        why = llamacpp_peer.unavailable()
        if why:
            print(f"llama.cpp skipped: {why}")
            with_peer = False
    workdir = Path(args.workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    model_dir = prepare(workdir, args.layers, cases, with_peer)
    gdir = workdir / f"gguf-{args.layers}"

    def gguf(case: str) -> Path | None:
        return gdir / f"model-{PEER[case]}.gguf" if with_peer else None

    flags = harness.cpu_flags()
    report: dict = {
        "cpu": platform.processor() or "x86_64",
        "flags": flags,
        "layers": args.layers,
        "simd_arch": lk.simd_arch(),
        "int8_dot": lk._core.int8_dot(),
        "bf16_dot": lk._core.bf16_dot(),
        "rows": [],
    }
    # the machine's limits, probed in every round beside the cases (medians below): the float32
    # FMA, the dot-product instructions the bf16 / int8 kernels use where the CPU has them, and
    # read-only bandwidth (decode reads every weight once per token)
    core = lk._core
    probes = {
        "fma_gflops": lambda t: core._probe_fma_gflops(t, 100_000_000),
        "read_gbs": lambda t: core._probe_read_gbs(t, 1 << 26, 5),
    }
    if core.cpu_has_avx512_vnni:
        probes["vpdpbusd_gops"] = lambda t: core._probe_dot_gops("vpdpbusd", t, 50_000_000)
    if core.int8_dot() == "avx2":  # no VNNI: the int8 kernels' maddubs mix
        probes["vpmaddubsw_gops"] = lambda t: core._probe_dot_gops("vpmaddubsw", t, 50_000_000)
    if core.cpu_has_avx512_bf16:
        probes["vdpbf16ps_gflops"] = lambda t: core._probe_dot_gops("vdpbf16ps", t, 50_000_000)
    if core.cpu_has_amx:  # AMX tiles (the kernels' own instructions there)
        probes["tdpbssd_gops"] = lambda t: core._probe_dot_gops("tdpbssd", t, 2_000_000)
        probes["tdpbf16ps_gflops"] = lambda t: core._probe_dot_gops("tdpbf16ps", t, 2_000_000)
    probe_samples: dict = {name: {t: [] for t in threads} for name in probes}
    if with_peer and "float32" in cases:
        ours = np.array(run_child("ours", "float32", 2, model_dir, None, 1, logits=True)["logits"])
        peer = np.array(
            run_child("peer", "float32", 2, model_dir, gguf("float32"), 1, logits=True)["logits"]
        )
        report["logits_check"] = {
            "max_abs_diff": float(np.abs(ours - peer).max()),
            "logit_scale": float(np.abs(ours).max()),
            "same_argmax": bool(ours.argmax() == peer.argmax()),
        }
        print("logits check:", report["logits_check"], flush=True)
    # the projections of the 512 tokens: q, o, k, v and the MLP in every layer but the last,
    # which (last_only) projects k and v for all tokens and the rest for the last one only
    flops = (
        2
        * PREFILL
        * (
            (args.layers - 1) * (2 * 2048 * 2048 + 2 * 2048 * 256 + 3 * 2048 * 5632)
            + 2 * 2048 * 256
        )
    )
    # weight bytes a decode step reads (every projection and the head; the embedding row and
    # the norms are negligible): int8 / int4 with a float16 scale per 32 (Q8_0 / Q4_0 alike)
    params = args.layers * (2 * 2048 * 2048 + 2 * 2048 * 256 + 3 * 2048 * 5632) + 32000 * 2048
    per_param = {"float32": 4, "bfloat16": 2, "float16": 2, "int8": 34 / 32, "int4": 18 / 32}
    # each precision's peak: that of the instruction its prefill kernel runs here (bf16 without
    # a bf16 dot product: the float32 GEMM of the widened weights, FMA; int8 on AVX2: the sign +
    # maddubs + madd mix of int8 weights, which int4's unsigned nibbles halve -- int4 may pass it)
    int8_peak = {"amx": "tdpbssd_gops", "avx2": "vpmaddubsw_gops"}.get(
        report["int8_dot"], "vpdpbusd_gops"
    )
    bf16_peak = {"amx": "tdpbf16ps_gflops", "none": "fma_gflops"}.get(
        report["bf16_dot"], "vdpbf16ps_gflops"
    )
    peak_of = {"float32": "fma_gflops", "bfloat16": bf16_peak, "float16": "fma_gflops",
               "int8": int8_peak, "int4": int8_peak}  # fmt: skip
    for t in threads:
        samples: dict = {c: {"ours": [], "peer": []} for c in cases}
        if args.pairs:
            for name, probe in probes.items():
                probe_samples[name][t].append(probe(t))
            # our float32 model stays resident beside every other case: their prefill ratio to
            # it from adjacent calls, not from medians taken minutes apart
            base = (
                Server("ours", "float32", t, model_dir, None)
                if "float32" in cases and len(cases) > 1
                else None
            )
            try:
                for case in cases:

                    def read_probe(t: int = t) -> float:
                        return core._probe_read_gbs(t, 1 << 26, 2)

                    beside = base if case != "float32" else None
                    o, q, b, reads = run_pairs(case, t, model_dir, gguf(case), args.pairs,
                                               read_probe, beside)  # fmt: skip
                    samples[case] = {"ours": o, "peer": q, "base": b}
                    probe_samples["read_gbs"][t] += reads
            finally:
                if base:
                    base.close()
        for r in range(0 if args.pairs else args.rounds):
            for name, probe in probes.items():
                probe_samples[name][t].append(probe(t))
            for case in cases:
                samples[case]["ours"].append(run_child("ours", case, t, model_dir, None,
                                                       args.repeats))  # fmt: skip
                if with_peer:
                    samples[case]["peer"].append(run_child("peer", case, t, model_dir,
                                                           gguf(case), args.repeats))  # fmt: skip
                print(
                    f"threads {t} round {r} {case}: ours {samples[case]['ours'][-1]} "
                    f"peer {samples[case]['peer'][-1] if with_peer else '-'}",
                    flush=True,
                )
        for case in cases:
            o, q = samples[case]["ours"], samples[case]["peer"]
            row = {
                "threads": t,
                "ours": case,
                "peer": PEER[case] if with_peer else None,
                "our_prefill_s": statistics.median(s["prefill"] for s in o),
                "our_decode_tok_s": statistics.median(DECODE / s["decode"] for s in o),
                "our_prefill_gflops": flops / statistics.median(s["prefill"] for s in o) / 1e9,
            }
            if with_peer:
                row.update(
                    peer_prefill_s=statistics.median(s["prefill"] for s in q),
                    peer_decode_tok_s=statistics.median(DECODE / s["decode"] for s in q),
                    prefill_ratio=statistics.median(
                        b["prefill"] / a["prefill"] for a, b in zip(o, q, strict=True)
                    ),
                    decode_ratio=statistics.median(
                        b["decode"] / a["decode"] for a, b in zip(o, q, strict=True)
                    ),
                )
            decode_gbs = params * per_param[case] * row["our_decode_tok_s"] / 1e9
            row["our_decode_gbs"] = decode_gbs
            row["decode_of_read_probe"] = decode_gbs / statistics.median(
                probe_samples["read_gbs"][t]
            )
            peak = probe_samples.get(peak_of[case], {}).get(t)
            if peak:
                row["prefill_of_peak"] = row["our_prefill_gflops"] / statistics.median(peak)
                row["peak"] = peak_of[case]
            if samples[case].get("base"):
                row["prefill_vs_our_float32"] = statistics.median(
                    f["prefill"] / s["prefill"]
                    for s, f in zip(o, samples[case]["base"], strict=True)
                )
            report["rows"].append(row)
    report["probes"] = {
        name: {t: statistics.median(v) for t, v in per_t.items()}
        for name, per_t in probe_samples.items()
    }
    f32 = {r["threads"]: r["our_prefill_s"] for r in report["rows"] if r["ours"] == "float32"}
    for row in report["rows"]:  # (else: the ratio of the medians)
        if row["threads"] in f32 and "prefill_vs_our_float32" not in row:
            row["prefill_vs_our_float32"] = f32[row["threads"]] / row["our_prefill_s"]
    probe_text = "; ".join(
        f"{name} " + ", ".join(f"{v:.0f}" for v in per_t.values())
        for name, per_t in report["probes"].items()
    )
    protocol = (
        f"{args.pairs} adjacent pairs of calls per case, both models resident"
        if args.pairs
        else f"{args.rounds} rounds of fresh processes"
    )
    report["protocol"] = protocol
    lines = [
        f"CPU: {report['cpu']}, flags {' '.join(flags)}; {args.layers} layers; paths: "
        f"{report['simd_arch']}, int8 dot {report['int8_dot']}, bf16 dot {report['bf16_dot']}; "
        f"{protocol}; probes (medians) at {', '.join(map(str, threads))} threads: "
        f"{probe_text}",
        "",
        "| threads | ours | peer | our prefill | peer prefill | x | vs our f32 | our G op/s "
        "| of peak | our decode tok/s | GB/s | of read probe | peer | x |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]

    def num(r: dict, key: str, unit: str = "") -> str:  # "-" without the peer (--no-llamacpp)
        return f"{r[key]:.2f}{unit}" if key in r else "-"

    for r in report["rows"]:
        lines.append(
            f"| {r['threads']} | {r['ours']} | {r['peer'] or '-'} | {r['our_prefill_s']:.2f} s | "
            f"{num(r, 'peer_prefill_s', ' s')} | {num(r, 'prefill_ratio')} | "
            f"{num(r, 'prefill_vs_our_float32')} | {r['our_prefill_gflops']:.0f} | "
            + (f"{100 * r['prefill_of_peak']:.0f}% {r['peak']} | " if "peak" in r else "n/a | ")
            + f"{r['our_decode_tok_s']:.2f} | {r['our_decode_gbs']:.1f} | "
            f"{100 * r['decode_of_read_probe']:.0f}% | "
            f"{num(r, 'peer_decode_tok_s')} | {num(r, 'decode_ratio')} |"
        )
    return harness.print_report(args.out, "real_size", report, lines)


if __name__ == "__main__":
    raise SystemExit(main())
