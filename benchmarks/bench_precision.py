"""Weight precision: decode and prefill tokens/s with float32, bfloat16 and float16 weights
(issue 13 item 9, the bf16 / f16 rows), and the weight-read bandwidth of decode as a fraction of
the STREAM-triad bandwidth measured in the same run.

One random model at TinyLlama's layer shape (dim 2048, 32 / 4 heads, hidden 5632, vocab 32000,
4 layers: 307 M parameters) is built in float32; the bf16 and f16 models are the same weights
rounded (``Transformer.to``-style conversion through ``load_state_dict``). Cases, at 1 and 2
threads, interleaved round by round (medians):

* decode: 64 greedy steps through the KV cache after a 128-token prompt (the prompt's prefill
  is untimed setup); tokens/s = 64 / time. Bytes per token = every matrix the step reads (the
  projections and the LM head; one embedding row is negligible); GB/s = bytes x tokens/s.
* prefill: 512 tokens, last position's logits (as a generation needs); tokens/s = 512 / time.

Target (issue 13): bf16 decode >= 1.8x our float32.

    python benchmarks/bench_precision.py [--quick] [--out benchmarks/results]
"""

from __future__ import annotations

import dataclasses
import gc
import statistics
from typing import Any

import harness
import llmkernels as lk
import numpy as np
from harness import fmt, md_table, set_threads
from llmkernels.modules import _no_random_init

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
        with _no_random_init():
            m = lk.Transformer(config, dtype=dtype)
        m.load_state_dict(f32.state_dict())
        models[dtype] = m
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


def run_cases(models: dict[str, lk.Transformer], cfg: Config, run: harness.Run) -> dict:
    rng = np.random.default_rng(0)
    results: dict[str, Any] = {}
    for t in cfg.threads:
        set_threads(t)
        impls, setup = {}, {}
        for dtype, model in models.items():
            s, r = decode_case(model, cfg, rng)
            impls[f"decode {dtype}"], setup[f"decode {dtype}"] = r, s
            impls[f"prefill {dtype}"] = prefill_case(model, cfg, rng)
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


def summarise(models: dict[str, lk.Transformer], cfg: Config, res: dict, probe: dict) -> list:
    rows = []
    for t in cfg.threads:
        sec = res[str(t)]["seconds"]
        triad = harness.roof(probe, "GB/s", t)
        base = cfg.decode / sec["decode float32"]
        base_pre = cfg.prefill / sec["prefill float32"]
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
                    "decode_vs_f32": dec / base,
                    "prefill_tok_s": pre,
                    "prefill_s": sec[f"prefill {dtype}"],
                    "prefill_vs_f32": pre / base_pre,
                    "bytes_per_token": nbytes,
                    "weight_gbs": gbs,
                    "triad_gbs": triad,
                    "of_triad": gbs / triad,
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
        "tokens (last logits). Medians of interleaved rounds.",
        "",
        *harness.machine_lines(report["machine"]),
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
    bf16 = [r for r in report["rows"] if r["dtype"] == "bfloat16"]
    lines += [
        "",
        "Target: bf16 decode >= 1.8x float32 -- "
        + ", ".join(
            f"{r['threads']}T {r['decode_vs_f32']:.2f}x "
            f"({'met' if r['decode_vs_f32'] >= 1.8 else 'not met'})"
            for r in bf16
        ),
        "",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = harness.arg_parser(__doc__, "60")
    args = parser.parse_args(argv)
    cfg, run = harness.start(QUICK if args.quick else FULL, args.quiet_wait, torch_thp=False)
    report = harness.new_report(cfg)
    run.log("building the models")
    models = build_models(cfg)
    gc.collect()
    probe = run.probe(cfg)
    report["probe"] = probe
    res = run_cases(models, cfg, run)
    report["timings"] = {t: {"seconds": v["seconds"]} for t, v in res.items()}
    report["rows"] = summarise(models, cfg, res, probe)
    return run.report(report, render, args.out, "precision")


if __name__ == "__main__":
    raise SystemExit(main())
