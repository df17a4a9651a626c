"""Weight precision: decode and prefill tokens/s with float32, bfloat16 and float16 weights
(the bf16 / f16 rows beside llama.cpp's), and the weight-read bandwidth of decode as a fraction of
the STREAM-triad bandwidth measured in the same run.

One random model at TinyLlama's layer shape (dim 2048, 32 / 4 heads, hidden 5632, vocab 32000,
4 layers: 307 M parameters) is built in float32; the bf16 and f16 models are the same weights
rounded (``Transformer.to``-style conversion through ``load_state_dict``). Cases, at 1 and 2
threads, interleaved round by round (medians):

* decode: 64 greedy steps through the KV cache after a 128-token prompt (the prompt's prefill
  is untimed setup); tokens/s = 64 / time. Bytes per token = every matrix the step reads (the
  projections and the LM head; one embedding row is negligible); GB/s = bytes x tokens/s.
* prefill: 512 tokens, last position's logits (as a generation needs); tokens/s = 512 / time.

int8 and int4 (group size 32, :meth:`Transformer.quantize`) join when the package has them.
Targets: decode bf16 >= 1.8x, int8 >= 3x, int4 >= 4.5x our float32.

llama.cpp, when installed (:mod:`llamacpp_peer` says how; otherwise the
report says why it was skipped): the float32 model is saved in HF layout, converted to GGUF by
llama.cpp's own converter (F32, F16, Q8_0; Q4_0 quantized from F32), its F32 logits validated
against ours (an F32 KV cache, a 64-token prompt) before any timing, then the same decode and
prefill cases are timed in the same rounds (llama.cpp with its default F16 KV cache, n_batch
512). Ratios are llama.cpp time / llmkernels time: above 1 we are faster. Each of ours is timed
next to its llama.cpp peer in every round, and a ratio is the median of the ratios of those
side-by-side samples (``harness.paired_ratio``: the host slows down in phases of seconds, a
round takes minutes); tokens/s are medians.

    python benchmarks/bench_precision.py [--quick] [--no-llamacpp] [--real-size]
        [--out benchmarks/results]

``--real-size`` then runs the same comparison at TinyLlama-1.1B's full shape (22 layers, 1.1 B
parameters: more than the last-level cache holds; bench_real_size.py, one process per case, its
own report ``real_size.md``). The dot-product peaks (vpdpbusd, vdpbf16ps) and read-only
bandwidth are probed in the same run where the CPU has them.
"""

from __future__ import annotations

import dataclasses
import gc
import statistics
import tempfile
from collections.abc import Iterable
from typing import Any

import harness
import llamacpp_peer
import llmkernels as lk
import numpy as np
from harness import fmt, md_table, set_threads
from llmkernels.nn.module import no_random_init

DTYPES = ("float32", "bfloat16", "float16")


@dataclasses.dataclass(frozen=True)
class Config(harness.Timing):
    dim: int
    n_heads: int
    n_kv_heads: int
    hidden: int
    vocab: int
    layers: int
    prompt: int  # tokens before the timed decode steps
    decode: int  # timed decode steps
    prefill: int  # tokens of the timed prefill


# a decode case is 64 model calls and a prefill several seconds: 2 timed calls of each per round
# (3 rounds), as the whole-model benchmarks of bench_blocks.py do
TIMING = (
    {**harness.FULL_TIMING, "repeats": 6},
    {**harness.QUICK_TIMING, "repeats": 1},
)
FULL, QUICK = harness.full_and_quick(
    Config,
    {
        "dim": (2048, 256),
        "n_heads": (32, 8),
        "n_kv_heads": (4, 2),
        "hidden": (5632, 704),
        "vocab": (32000, 4000),
        "layers": (4, 2),
        "prompt": (128, 16),
        "decode": (64, 8),
        "prefill": (512, 64),
    },
    TIMING,
)


def build_models(cfg: Config) -> dict[str, lk.Transformer]:
    config = {
        "dim": cfg.dim,
        "n_layers": cfg.layers,
        "n_heads": cfg.n_heads,
        "n_kv_heads": cfg.n_kv_heads,
        "hidden_dim": cfg.hidden,
        "vocab_size": cfg.vocab,
        "max_seq_len": max(cfg.prompt + cfg.decode, cfg.prefill),
    }
    f32 = lk.Transformer(config, seed=0)
    models = {"float32": f32}
    for dtype in DTYPES[1:]:
        with no_random_init():
            m = lk.Transformer(config, dtype=dtype)
        m.load_state_dict(f32.state_dict())
        models[dtype] = m
    if hasattr(f32, "quantize"):  # int8 / int4 (group size 32), from the same float32 weights
        for bits in (8, 4):
            with no_random_init():
                m = lk.Transformer(config)
            m.load_state_dict(f32.state_dict())
            m.quantize(bits=bits, group_size=32)
            models[f"int{bits}"] = m
    return models


def read_bytes_per_token(model: lk.Transformer) -> int:
    """Bytes of every matrix a decode step reads: all but the embedding (one row of it)."""
    sd = model.state_dict()
    total = model.nbytes
    if not model.config.tie_embeddings:
        total -= sd["model.embed_tokens.weight"].nbytes
    return total


def decode_case(model: lk.Transformer, cfg: Config, rng: np.random.Generator) -> tuple[Any, Any]:
    prompt = rng.integers(0, cfg.vocab, (1, cfg.prompt))
    state: dict[str, Any] = {}

    def setup() -> None:
        cache = model.new_cache(1, cfg.prompt + cfg.decode)
        logits = model(prompt, cache=cache, last_only=True)
        state["cache"], state["tok"] = cache, logits[:, -1].argmax(-1)[:, None]

    def run() -> None:
        cache, tok = state["cache"], state["tok"]
        for _ in range(cfg.decode):
            tok = model(tok, cache=cache, last_only=True)[:, -1].argmax(-1)[:, None]

    return setup, run


def prefill_case(model: lk.Transformer, cfg: Config, rng: np.random.Generator) -> Any:
    ids = rng.integers(0, cfg.vocab, (1, cfg.prefill))
    return lambda: model(ids, last_only=True)


# the llama.cpp type each of our weight dtypes is compared with (same bytes per weight, or the
# nearest: llama.cpp has no CPU-fast BF16 on AVX2, F16 is its 16-bit format there; where the CPU
# has AVX512_BF16 its BF16 runs vdpbf16ps, as ours does, and is the bf16 peer)
HAS_AVX512_BF16 = bool(lk._core.cpu_has_avx512_bf16)
LLAMACPP_TYPES = ("F32", "F16", "Q8_0", "Q4_0") + (("BF16",) if HAS_AVX512_BF16 else ())
PEER_OF = {
    "float32": "F32",
    "bfloat16": "BF16" if HAS_AVX512_BF16 else "F16",
    "float16": "F16",
    "int8": "Q8_0",
    "int4": "Q4_0",
}


def dot_probes(threads: Iterable[int]) -> dict[str, dict[int, float]]:
    """The limits of the low-precision kernels, beside the FMA / triad probe: the peaks of the
    dot-product instructions the bf16 (vdpbf16ps, AMX tdpbf16ps) and int8 / int4 (vpdpbusd, AMX
    tdpbssd, AVX2's vpmaddubsw mix) prefill run where the CPU has them (G operations/s), and
    read-only bandwidth (decode reads its weights once)."""
    core = lk._core
    out: dict[str, dict[int, float]] = {"read_gbs": {}}
    for t in threads:
        out["read_gbs"][t] = core._probe_read_gbs(t, 1 << 26, 5)
        if core.cpu_has_avx512_vnni:
            out.setdefault("vpdpbusd_gops", {})[t] = core._probe_dot_gops("vpdpbusd", t, 50_000_000)
        if core.int8_dot() == "avx2":  # no VNNI: the int8 kernels' sign + maddubs + madd mix
            out.setdefault("vpmaddubsw_gops", {})[t] = core._probe_dot_gops(
                "vpmaddubsw", t, 50_000_000
            )
        if HAS_AVX512_BF16:
            out.setdefault("vdpbf16ps_gflops", {})[t] = core._probe_dot_gops(
                "vdpbf16ps", t, 50_000_000
            )
        if core.cpu_has_amx:  # AMX tiles: the kernels' instructions there
            for name, key in (("tdpbssd", "tdpbssd_gops"), ("tdpbf16ps", "tdpbf16ps_gflops")):
                out.setdefault(key, {})[t] = core._probe_dot_gops(name, t, 2_000_000)
    return out


def llamacpp_models(
    f32: lk.Transformer, cfg: Config, workdir: Any, run: harness.Run
) -> tuple[dict[str, Any], dict[str, Any]]:
    """GGUF models of ``f32``'s weights in llama.cpp, validated; ({type: LlamaCpp}, info)."""
    from pathlib import Path

    why = llamacpp_peer.unavailable()
    if why:
        return {}, {"skipped": why}
    d = Path(workdir)
    f32.save_pretrained(d / "hf")
    llamacpp_peer.write_tokenizer(d / "hf")
    n_ctx = max(cfg.prompt + cfg.decode, cfg.prefill) + 8
    rng = np.random.default_rng(1)
    ids = [int(t) for t in rng.integers(3, cfg.vocab, 64)]
    ours = f32(np.array([ids]), last_only=True)[0, -1].astype(np.float64)
    info: dict[str, Any] = {}
    peers = {}
    for ptype in LLAMACPP_TYPES:
        run.log(f"llama.cpp: GGUF {ptype}")
        path = llamacpp_peer.make_gguf(d / "hf", d / "gguf", ptype)
        if ptype == "F32":  # validate the conversion: F32 weights and an F32 KV cache
            check = llamacpp_peer.LlamaCpp(path, n_ctx, 1, f32_kv=True)
            theirs = check.logits(ids).astype(np.float64)
            del check
            info["validation"] = {
                "max_abs_diff": float(np.max(np.abs(theirs - ours))),
                "max_abs_logit": float(np.max(np.abs(ours))),
                "argmax_equal": bool(np.argmax(theirs) == np.argmax(ours)),
            }
            run.log(f"llama.cpp F32 logits vs ours: {info['validation']}")
            v = info["validation"]
            if v["max_abs_diff"] > 1e-3 * max(1.0, v["max_abs_logit"]):
                raise RuntimeError(f"llama.cpp logits differ from ours: {v}")
        try:  # what its decode reads (for its GB/s beside ours)
            info.setdefault("read", {})[ptype] = llamacpp_peer.read_bytes_per_token(path)
        except Exception as exc:  # noqa: BLE001 -- an old gguf-py: the GB/s column stays empty
            run.log(f"llama.cpp: could not read {path.name}'s tensor table ({exc})")
        peers[ptype] = llamacpp_peer.LlamaCpp(path, n_ctx, 1)
    return peers, info


def llamacpp_cases(peer: Any, cfg: Config, rng: np.random.Generator) -> tuple[Any, Any, Any]:
    prompt = [int(t) for t in rng.integers(3, cfg.vocab, cfg.prompt)]
    ids = [int(t) for t in rng.integers(3, cfg.vocab, cfg.prefill)]
    state: dict[str, int] = {}

    def setup() -> None:
        peer.llm.reset()
        peer.llm.eval(prompt)
        state["tok"] = int(np.argmax(peer.last_logits()))

    def decode() -> None:
        tok = state["tok"]
        for _ in range(cfg.decode):
            peer.llm.eval([tok])
            tok = int(np.argmax(peer.last_logits()))

    def prefill() -> None:
        peer.llm.reset()
        peer.llm.eval(ids)
        peer.last_logits()

    return setup, decode, prefill


def run_cases(
    models: dict[str, lk.Transformer],
    cfg: Config,
    run: harness.Run,
    peers: dict[str, Any] | None = None,
) -> dict:
    rng = np.random.default_rng(0)
    results: dict[str, Any] = {}
    for t in cfg.threads:
        set_threads(t)
        cases, setup = {}, {}
        for dtype, model in models.items():
            s, r = decode_case(model, cfg, rng)
            cases[f"decode {dtype}"], setup[f"decode {dtype}"] = r, s
            cases[f"prefill {dtype}"] = prefill_case(model, cfg, rng)
        for ptype, peer in (peers or {}).items():
            peer.set_threads(t)
            s, d, p = llamacpp_cases(peer, cfg, rng)
            cases[f"decode llama.cpp {ptype}"], setup[f"decode llama.cpp {ptype}"] = d, s
            cases[f"prefill llama.cpp {ptype}"] = p
        impls = {k: cases[k] for k in case_order(cases)}
        run.log(f"{t} thread(s): {len(impls)} cases x {cfg.rounds} rounds")
        per_round = max(1, cfg.repeats // cfg.rounds)
        samples, other = harness.measure_quietly(
            impls,
            cfg.rounds,
            per_round,
            quiet_wait=cfg.quiet_wait,
            retry_max_s=120.0,  # a busy shared host: no second attempt of a long measurement
            warmup=cfg.warmup,
            setup=setup,
        )
        results[str(t)] = {
            "seconds": {k: statistics.median(v) for k, v in samples.items()},
            "samples": samples,
            "other_processes_cpus": other,
        }
    return results


def case_order(cases: Iterable[str]) -> list[str]:
    """Decode cases, then prefill cases, each of ours followed by its llama.cpp peer (float32,
    F32, bfloat16, F16, float16, int8, Q8_0, ...): a round takes minutes and the host slows down
    in phases of seconds, so the samples that a ratio pairs (:func:`harness.paired_ratio`) are
    taken side by side."""
    names = list(cases)
    order: list[str] = []
    for kind in ("decode", "prefill"):
        for name in names:
            if name.startswith(f"{kind} ") and "llama.cpp" not in name:
                order.append(name)
                peer = f"{kind} llama.cpp {PEER_OF.get(name.split(' ', 1)[1])}"
                if peer in names and peer not in order:
                    order.append(peer)
    return order + [n for n in names if n not in order]


def prefill_flops(cfg: Config, peer: bool = False) -> float:
    """FLOPs of the timed prefill (last position's logits) as each side computes it: every
    projection for each of the T tokens and causal attention (QK^T and PV over T (T + 1) / 2
    query-key pairs per head) in every layer but the last; the LM head for the last token only.
    The last layer: ours (``last_only``) computes k and v for every token, and q, one attention
    row, o and the MLP for the last token only; llama.cpp (``peer``) computes q, k, v, attention
    and o for every token and the MLP for the last (``inp_out_ids``: it skips the last layer's
    unused MLP rows)."""
    hd = cfg.dim // cfg.n_heads
    t = cfg.prefill
    q_o = 2 * cfg.dim * cfg.dim
    kv = 2 * cfg.dim * cfg.n_kv_heads * hd
    mlp = 3 * cfg.dim * cfg.hidden
    pairs = t * (t + 1) // 2
    attn = 2 * cfg.n_heads * hd * pairs  # one layer's
    full = t * (q_o + kv + mlp) + attn
    if peer:
        last = t * (q_o + kv) + attn + mlp
    else:
        last = t * kv + q_o + mlp + 2 * cfg.n_heads * hd * t
    return 2.0 * ((cfg.layers - 1) * full + last + cfg.dim * cfg.vocab)


def summarise(
    models: dict[str, lk.Transformer], cfg: Config, res: dict, probe: dict, peer: dict
) -> list:
    rows = []
    flops, peer_flops = prefill_flops(cfg), prefill_flops(cfg, peer=True)
    peer_read = peer.get("read", {})
    for t in cfg.threads:
        sec = res[str(t)]["seconds"]
        smp = res[str(t)]["samples"]

        def paired(num: str, den: str, sec: dict = sec, smp: dict = smp) -> float:
            # a time ratio num / den from side-by-side samples (ratio of medians without them)
            if num in smp and den in smp:
                return harness.paired_ratio(smp[num], smp[den])
            return sec[num] / sec[den]

        triad = harness.roof(probe, "GB/s", t)
        fma = harness.roof(probe, "GFLOP/s", t)
        for dtype, model in models.items():
            dec = cfg.decode / sec[f"decode {dtype}"]
            pre = cfg.prefill / sec[f"prefill {dtype}"]
            nbytes = read_bytes_per_token(model)
            gbs = nbytes * dec / 1e9
            rows.append(
                {
                    "threads": t,
                    "dtype": dtype,
                    "decode_tok_s": dec,
                    "decode_vs_f32": paired("decode float32", f"decode {dtype}"),
                    "prefill_tok_s": pre,
                    "prefill_s": sec[f"prefill {dtype}"],
                    "prefill_vs_f32": paired("prefill float32", f"prefill {dtype}"),
                    "bytes_per_token": nbytes,
                    "weight_gbs": gbs,
                    "triad_gbs": triad,
                    "of_triad": gbs / triad,
                    "prefill_gflops": flops / sec[f"prefill {dtype}"] / 1e9,
                    "fma_gflops": fma,
                    "prefill_of_fma": flops / sec[f"prefill {dtype}"] / 1e9 / fma,
                }
            )
            peer = PEER_OF.get(dtype)
            if f"decode llama.cpp {peer}" in sec:
                rows[-1].update(
                    {
                        "peer": peer,
                        "peer_decode_tok_s": cfg.decode / sec[f"decode llama.cpp {peer}"],
                        "decode_vs_peer": paired(f"decode llama.cpp {peer}", f"decode {dtype}"),
                        "peer_prefill_tok_s": cfg.prefill / sec[f"prefill llama.cpp {peer}"],
                        "prefill_vs_peer": paired(f"prefill llama.cpp {peer}", f"prefill {dtype}"),
                        "peer_prefill_of_fma": peer_flops
                        / sec[f"prefill llama.cpp {peer}"]
                        / 1e9
                        / fma,
                    }
                )
                if peer in peer_read:
                    pgbs = peer_read[peer]["bytes"] * rows[-1]["peer_decode_tok_s"] / 1e9
                    rows[-1].update(
                        {
                            "peer_bytes_per_token": peer_read[peer]["bytes"],
                            "peer_weight_gbs": pgbs,
                            "peer_of_triad": pgbs / triad,
                        }
                    )
    return rows


def peer_rows(cfg: Config, res: dict) -> list[dict[str, Any]]:
    """llama.cpp's own figures at every type it was timed at."""
    rows = []
    for t in cfg.threads:
        sec = res[str(t)]["seconds"]
        for ptype in LLAMACPP_TYPES:
            if f"decode llama.cpp {ptype}" in sec:
                rows.append(
                    {
                        "threads": t,
                        "type": ptype,
                        "decode_tok_s": cfg.decode / sec[f"decode llama.cpp {ptype}"],
                        "prefill_tok_s": cfg.prefill / sec[f"prefill llama.cpp {ptype}"],
                    }
                )
    return rows


def render(report: dict[str, Any]) -> str:
    cfg = report["config"]
    lines = [
        "# Weight precision: float32 vs bfloat16 vs float16",
        "",
        f"Model: dim {cfg['dim']}, {cfg['n_heads']}/{cfg['n_kv_heads']} heads, hidden "
        f"{cfg['hidden']}, vocab {cfg['vocab']}, {cfg['layers']} layers, random weights. "
        f"Decode: {cfg['decode']} steps after {cfg['prompt']}; prefill: {cfg['prefill']} "
        "tokens (last logits). Tokens/s: medians of interleaved rounds; ratios (x): the median "
        "of the ratios of side-by-side samples (each of ours is timed next to its llama.cpp "
        "peer in every round).",
        "",
        *harness.machine_lines(report["machine"]),
        "",
    ]
    if report.get("dot_probes"):
        lines += [
            "Dot-product peaks and read-only bandwidth (same run): "
            + "; ".join(
                f"{name} " + ", ".join(f"{v:.0f} at {t}" for t, v in per_t.items())
                for name, per_t in report["dot_probes"].items()
            ),
            "",
        ]
    header = [
        "threads",
        "weights",
        "decode tok/s",
        "vs f32",
        "prefill tok/s",
        "vs f32",
        "MB/token",
        "weight GB/s",
        "of triad",
    ]
    rows = [
        [
            str(r["threads"]),
            r["dtype"],
            fmt(r["decode_tok_s"], 1),
            fmt(r["decode_vs_f32"]) + "x",
            fmt(r["prefill_tok_s"], 0),
            fmt(r["prefill_vs_f32"]) + "x",
            fmt(r["bytes_per_token"] / 1e6, 0),
            fmt(r["weight_gbs"], 1),
            f"{100 * r['of_triad']:.0f}%",
        ]
        for r in report["rows"]
    ]
    lines += md_table(header, rows)
    peer = report.get("llamacpp", {})
    if peer.get("skipped"):
        lines += ["", f"llama.cpp: skipped ({peer['skipped']})."]
    elif report.get("peer_rows"):
        v = peer["validation"]
        lines += [
            "",
            "## Against llama.cpp (llama-cpp-python, same weights via its GGUF converter)",
            "",
            f"Validated before timing: F32 GGUF with an F32 KV cache vs our float32 logits, max "
            f"|diff| {v['max_abs_diff']:.2g} (logits up to {v['max_abs_logit']:.2g}), argmax "
            f"{'equal' if v['argmax_equal'] else 'DIFFERENT'}. Ratio = llama.cpp time / ours.",
            "",
        ]

        def pct(r: dict[str, Any], key: str) -> str:
            return f"{100 * r[key]:.0f}%" if key in r else "-"

        lines += md_table(
            ["threads", "ours", "decode tok/s", "llama.cpp", "decode tok/s", "ratio",
             "of triad (ours / llama.cpp)", "prefill tok/s", "llama.cpp prefill tok/s", "ratio",
             "of FMA peak (ours / llama.cpp)"],
            [
                [str(r["threads"]), r["dtype"], fmt(r["decode_tok_s"], 1), r["peer"],
                 fmt(r["peer_decode_tok_s"], 1), fmt(r["decode_vs_peer"]) + "x",
                 f"{pct(r, 'of_triad')} / {pct(r, 'peer_of_triad')}",
                 fmt(r["prefill_tok_s"], 0), fmt(r["peer_prefill_tok_s"], 0),
                 fmt(r["prefill_vs_peer"]) + "x",
                 f"{pct(r, 'prefill_of_fma')} / {pct(r, 'peer_prefill_of_fma')}"]
                for r in report["rows"] if "peer" in r
            ],
        )  # fmt: skip
        read = peer.get("read", {})
        if read:
            lines += ["", "llama.cpp's bytes per decode step (its GGUF tensor table, without the "
                      "token embedding): " + "; ".join(
                          f"{k} {v['bytes'] / 1e6:.0f} MB (" + ", ".join(
                              f"{kind} {ty}" for kind, ty in v["types"].items()
                              if kind in ("attn_q", "ffn_down", "output")) + ")"
                          for k, v in read.items())]  # fmt: skip
        lines += [""] + md_table(
            ["threads", "llama.cpp type", "decode tok/s", "prefill tok/s"],
            [
                [str(r["threads"]), r["type"], fmt(r["decode_tok_s"], 1),
                 fmt(r["prefill_tok_s"], 0)]
                for r in report["peer_rows"]
            ],
        )  # fmt: skip
    lines += ["", *target_lines(report)]
    lines.append("")
    return "\n".join(lines)


# the precision targets: decode against our float32 and against llama.cpp, prefill against
# llama.cpp (every precision)
F32_TARGETS = {"bfloat16": 1.8, "int8": 3.0, "int4": 4.5}
PEER_TARGETS = {"bfloat16": 1.15, "int8": 1.3, "int4": 1.0}
PREFILL_TARGET = 1.1
TRIAD_TARGET = 0.8  # below float32: decode reads its weights at >= 80% of the triad


def target_lines(report: dict[str, Any]) -> list[str]:
    """Each target, met or not; when not, what it needs of this machine -- the weight GB/s as a
    fraction of the triad (decode), the GFLOP/s as a fraction of the FMA peak (prefill) --
    beside the most any case (ours or llama.cpp's) reached in the same run: the paired
    measurement that says whether the machine could show it."""
    rows = report["rows"]
    out = []
    for t in sorted({r["threads"] for r in rows}):
        rt = [r for r in rows if r["threads"] == t]
        f32 = next((r for r in rt if r["dtype"] == "float32"), None)
        best_bw = max([r["of_triad"] for r in rt] + [r["peer_of_triad"] for r in rt
                                                       if "peer_of_triad" in r])  # fmt: skip
        best_fma = max([r["prefill_of_fma"] for r in rt if "prefill_of_fma" in r]
                       + [r["peer_prefill_of_fma"] for r in rt if "peer_prefill_of_fma" in r],
                       default=0.0)  # fmt: skip

        def decode_need(r: dict[str, Any], tok_s: float) -> str:
            gbs = tok_s * r["bytes_per_token"] / 1e9
            frac = 100 * gbs / r["triad_gbs"]
            return f"{tok_s:.1f} tok/s = {gbs:.1f} GB/s, {frac:.0f}% of the triad"

        for r in rt:
            d = r["dtype"]
            cases = []
            if d in F32_TARGETS and f32 is not None:
                cases.append((f"decode >= {F32_TARGETS[d]}x our float32", r["decode_vs_f32"],
                              F32_TARGETS[d], decode_need(r, F32_TARGETS[d] * f32["decode_tok_s"]),
                              f"{100 * best_bw:.0f}% of the triad"))  # fmt: skip
            if d in PEER_TARGETS and "peer" in r:
                cases.append((f"decode >= {PEER_TARGETS[d]}x llama.cpp {r['peer']}",
                              r["decode_vs_peer"], PEER_TARGETS[d],
                              decode_need(r, PEER_TARGETS[d] * r["peer_decode_tok_s"]),
                              f"{100 * best_bw:.0f}% of the triad"))  # fmt: skip
            if d != "float32":
                cases.append((f"decode reads >= {TRIAD_TARGET:.0%} of the triad",
                              r["of_triad"], TRIAD_TARGET,
                              decode_need(r, TRIAD_TARGET * r["triad_gbs"] * 1e9
                                          / r["bytes_per_token"]),
                              f"{100 * best_bw:.0f}% of the triad"))  # fmt: skip
            if "peer" in r and "prefill_of_fma" in r:
                need = PREFILL_TARGET * r["peer_prefill_tok_s"]
                gf = need * r["prefill_gflops"] / r["prefill_tok_s"]
                cases.append((f"prefill >= {PREFILL_TARGET}x llama.cpp {r['peer']}",
                              r["prefill_vs_peer"], PREFILL_TARGET,
                              f"{need:.0f} tok/s = {gf:.0f} GFLOP/s, "
                              f"{100 * gf / r['fma_gflops']:.0f}% of the FMA peak",
                              f"{100 * best_fma:.0f}% of the FMA peak"))  # fmt: skip
            for what, got, target, needs, best in cases:
                met = got >= target
                shown = f"{got:.0%}" if what.startswith("decode reads") else f"{got:.2f}x"
                out.append([str(t), d, what, shown, "met" if met else "not met",
                            "" if met else needs, "" if met else best])  # fmt: skip
    if not out:
        return []
    return [
        "## The targets, and what an unmet one needs of this machine",
        "",
        "Needs: the rate the target asks for, as weight bytes read per second (decode) or "
        "arithmetic (prefill; float32 FMA peak of the probe), beside the highest fraction any "
        "case -- ours or llama.cpp's -- reached at that thread count in this run.",
        "",
        *md_table(
            ["threads", "weights", "target", "measured", "", "needs", "best reached in this run"],
            out,
        ),  # fmt: skip
    ]


def main(argv: list[str] | None = None) -> int:
    parser = harness.arg_parser(__doc__, "60")
    parser.add_argument("--no-llamacpp", action="store_true", help="skip the llama.cpp peer")
    parser.add_argument(
        "--real-size",
        action="store_true",
        help="then TinyLlama-1.1B's full 22 layers (bench_real_size.py: one process per case, "
        "the 4-layer model's weights partly fit in the last-level cache) into the same --out",
    )
    args, cfg, run = harness.parse_and_start(parser, argv, FULL, QUICK)
    report = harness.new_report(cfg)
    run.log("building the models")
    models = build_models(cfg)
    gc.collect()
    with tempfile.TemporaryDirectory() as workdir:
        if args.no_llamacpp:
            peers, report["llamacpp"] = {}, {"skipped": "--no-llamacpp"}
        else:
            peers, report["llamacpp"] = llamacpp_models(models["float32"], cfg, workdir, run)
        probe = run.probe(cfg)
        report["probe"] = probe
        report["dot_probes"] = dot_probes(cfg.threads)
        res = run_cases(models, cfg, run, peers)
        del peers
    report["timings"] = {t: {"seconds": v["seconds"]} for t, v in res.items()}
    report["rows"] = summarise(models, cfg, res, probe, report["llamacpp"])
    report["peer_rows"] = peer_rows(cfg, res)
    status = run.report(report, render, args.out, "precision")
    if args.real_size:
        import subprocess
        import sys
        from pathlib import Path

        cmd = [sys.executable, str(Path(__file__).with_name("bench_real_size.py")), "--out",
               str(args.out), "--workdir", str(Path(tempfile.gettempdir()) / "llmk-real-size")]
        if args.no_llamacpp:
            cmd.append("--no-llamacpp")
        if args.quick:
            cmd += ["--layers", "1", "--rounds", "1", "--repeats", "1", "--threads", "1"]
        status = status or subprocess.run(cmd, check=False).returncode  # fmt: skip
    return status


if __name__ == "__main__":
    raise SystemExit(main())
