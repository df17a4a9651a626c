#!/usr/bin/env python
"""Accuracy of int8 / int4 Transformers against the float32 model they were quantized from,
per group size, and (``--speed``) their decode speed.

Usage::

    python benchmarks/bench_quant_accuracy.py [--quick] [--speed] [--out benchmarks/results]

Accuracy: two float32 models, each quantized with ``model.quantize(bits, group_size)`` for bits
8 / 4 and group sizes 32 / 64 / 128:

* ``trained``: tests/data/quant_lm, a small LLaMA (dim 128, 2 layers, vocab 512) trained on a
  Markov-chain language (peaked next-token distributions, as a real LM's; see its
  generate.py), with its 64 prompts of 16 tokens of that language;
* ``example``: the example model that ships with the package (``lk.example_model()``: dim 256,
  6 layers, vocab 4096, trained on the prose of the Python documentation), its weights widened
  from bfloat16, with 64 prompts of 16 tokens it wrote itself (sampled from ``<|bos|>``,
  temperature 1, seed 7): English text, in distribution;
* ``random``: HF's initialisation (every matrix normal with std 0.02, norms 1) at dim 512, 4
  layers, vocab 4096, 64 prompts of 16 random tokens -- near-uniform predictions, where top-1
  agreement measures ties rather than accuracy (only its KL divergence is meaningful).

For each prompt, the next-token distribution

* ``prefill``: at every position of the batched forward (m > 8 tokens: the tile GEMM, float
  activations), 64 x 16 distributions;
* ``decode``: at the last position, computed by a decode step after a prefill of the rest (8
  sequences a step: the GEMV kernels with per-token int8 activations), 64 distributions;

mean KL(p_float32 || p_quantized) (natural log) and top-1 agreement. The same formulas are
asserted in tests/models/test_quant_models.py (int8: KL <= 1e-3, top-1 >= 98%).

Speed (``--speed``): a random 4-layer model at TinyLlama's layer shape (dim 2048, 32 / 4
heads, hidden 5632, vocab 32000), 128 prompt tokens then 64 greedy decode steps, float32 /
int8 / int4 (group 32), 1 and 2 threads, median tokens/s of the decode steps over interleaved
rounds. No peer here: benchmarks/llamacpp_peer.py is llama.cpp's.

Writes ``<out>/quant_accuracy.md`` and ``<out>/quant_accuracy.json``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import llmkernels as lk
import numpy as np

TRAINED = Path(__file__).resolve().parents[1] / "tests" / "data" / "quant_lm"
RANDOM = {
    "dim": 512, "n_layers": 4, "n_heads": 8, "n_kv_heads": 4, "hidden_dim": 1536,
    "vocab_size": 4096, "max_seq_len": 128,
}  # fmt: skip
TINYLLAMA = {
    "dim": 2048, "n_layers": 4, "n_heads": 32, "n_kv_heads": 4, "hidden_dim": 5632,
    "vocab_size": 32000, "max_seq_len": 256,
}  # fmt: skip
N_PROMPTS, PROMPT_LEN = 64, 16


def log_softmax(z: np.ndarray) -> np.ndarray:
    z = np.asarray(z, np.float64)
    z = z - z.max(-1, keepdims=True)
    return z - np.log(np.exp(z).sum(-1, keepdims=True))


def kl_and_top1(ref: np.ndarray, got: np.ndarray) -> tuple[float, float]:
    """mean KL(softmax(ref) || softmax(got)) over rows, and the fraction of equal argmaxes."""
    lp, lq = log_softmax(ref), log_softmax(got)
    kl = (np.exp(lp) * (lp - lq)).sum(-1)
    return float(kl.mean()), float((ref.argmax(-1) == got.argmax(-1)).mean())


def next_token_logits(model: lk.Transformer, ids: np.ndarray) -> dict[str, np.ndarray]:
    full = model(ids)
    last = []
    for r0 in range(0, len(ids), 8):
        part = ids[r0 : r0 + 8]
        cache = model.new_cache(len(part), ids.shape[1])
        model(part[:, :-1], cache=cache)
        last.append(model(part[:, -1:], cache=cache)[:, -1])
    return {"prefill": full.reshape(-1, full.shape[-1]), "decode": np.concatenate(last)}


def models() -> dict[str, tuple[lk.Transformer, np.ndarray]]:
    """name -> (float32 model, prompts (64, 16))"""
    trained = lk.Transformer.from_pretrained(TRAINED, dtype="float32")
    rnd = lk.Transformer(RANDOM, seed=0)
    ids = np.random.default_rng(7).integers(0, RANDOM["vocab_size"], (N_PROMPTS, PROMPT_LEN))
    example = lk.Transformer.from_pretrained(lk.example_model(), dtype="float32")
    bos = np.zeros((N_PROMPTS, 1), np.int64)  # <|bos|> is token 0 of its tokenizer
    own = np.asarray(example.generate(bos, max_new_tokens=PROMPT_LEN - 1, temperature=1.0,
                                      seed=7, progress=False))  # fmt: skip
    return {
        "trained (tests/data/quant_lm: dim 128, 2 layers, vocab 512)": (
            trained,
            np.load(TRAINED / "prompts.npy"),
        ),
        "the example model (English prose: dim 256, 6 layers, vocab 4096)": (example, own),
        "random init, std 0.02 (dim 512, 4 layers, vocab 4096)": (rnd, ids),
    }


def accuracy(base: lk.Transformer, ids: np.ndarray, groups: tuple[int, ...]) -> list[dict]:
    ref = next_token_logits(base, ids)
    rows = []
    for bits in (8, 4):
        for group in groups:
            model = lk.Transformer(base.config, seed=1)
            model.load_state_dict(base.state_dict())
            model.quantize(bits, group)
            got = next_token_logits(model, ids)
            row: dict[str, Any] = {"bits": bits, "group_size": group, "nbytes": model.nbytes}
            for path in ("prefill", "decode"):
                kl, top1 = kl_and_top1(ref[path], got[path])
                row[path] = {"kl": kl, "top1": top1}
            rows.append(row)
            print(f"  int{bits} g{group}: {row}", file=sys.stderr)
    return rows


def decode_speed(rounds: int, steps: int) -> list[dict[str, Any]]:
    base = lk.Transformer(TINYLLAMA, seed=0)
    models = {"float32": base}
    for dtype in ("int8", "int4"):
        m = lk.Transformer(TINYLLAMA, seed=0, dtype=dtype)  # the same floats, quantized
        models[dtype] = m
    prompt = np.random.default_rng(0).integers(0, TINYLLAMA["vocab_size"], (1, 128))
    out = []
    for threads in (1, 2):
        lk.set_num_threads(threads)
        times: dict[str, list[float]] = {k: [] for k in models}
        for _ in range(rounds):
            for name, model in models.items():  # interleaved: drift falls on all alike
                cache = model.new_cache(1, 128 + steps)
                logits = model(prompt, cache=cache, last_only=True)
                tok = np.array([[int(logits[0, -1].argmax())]])
                t0 = time.perf_counter()
                for _ in range(steps):
                    logits = model(tok, cache=cache, last_only=True)
                    tok = np.array([[int(logits[0, -1].argmax())]])
                times[name].append(steps / (time.perf_counter() - t0))
        for name in models:
            tps = statistics.median(times[name])
            out.append({"threads": threads, "dtype": name, "tok_s": tps,
                        "weight_bytes": models[name].nbytes})  # fmt: skip
            print(f"  {threads}T {name}: {tps:.1f} tok/s", file=sys.stderr)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="the small model, group 32 only")
    p.add_argument("--speed", action="store_true", help="also decode tokens/s at dim 2048")
    p.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    args = p.parse_args()
    report: dict[str, Any] = {"machine": {"simd": lk.simd_arch(), "threads": lk.get_num_threads()}}
    lines = ["# Quantized models: accuracy vs float32", "",
             "`python benchmarks/bench_quant_accuracy.py" + (" --quick" if args.quick else "")
             + (" --speed" if args.speed else "") + "`", ""]  # fmt: skip
    chosen = models()
    if args.quick:
        chosen = dict(list(chosen.items())[:1])
    groups = (32,) if args.quick else (32, 64, 128)
    report["accuracy"] = {}
    for name, (base, ids) in chosen.items():
        print(name, file=sys.stderr)
        rows = accuracy(base, ids, groups)
        report["accuracy"][name] = rows
        lines += [f"## {name}", "",
                  f"float32: {base.nbytes / 2**20:.2f} MiB", "",
                  "| weights | group | bytes | prefill KL | prefill top-1 | decode KL | "
                  "decode top-1 |", "| --- | --- | --- | --- | --- | --- | --- |"]  # fmt: skip
        for r in rows:
            lines.append(
                f"| int{r['bits']} | {r['group_size']} | {r['nbytes'] / 2**20:.2f} MiB | "
                f"{r['prefill']['kl']:.2e} | {100 * r['prefill']['top1']:.1f}% | "
                f"{r['decode']['kl']:.2e} | {100 * r['decode']['top1']:.1f}% |"
            )
        lines.append("")
    if args.speed:
        print("decode speed (dim 2048)", file=sys.stderr)
        rows = decode_speed(rounds=3, steps=64)
        report["speed"] = rows
        lines += ["## Decode speed, TinyLlama layer shape (4 layers), 128 + 64 tokens", "",
                  "| threads | weights | weight bytes | tokens/s | vs float32 |",
                  "| --- | --- | --- | --- | --- |"]  # fmt: skip
        for r in rows:
            f32 = next(x for x in rows if x["threads"] == r["threads"] and x["dtype"] == "float32")
            lines.append(
                f"| {r['threads']} | {r['dtype']} | {r['weight_bytes'] / 2**20:.0f} MiB | "
                f"{r['tok_s']:.1f} | {r['tok_s'] / f32['tok_s']:.2f}x |"
            )
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "quant_accuracy.md").write_text("\n".join(lines) + "\n")
    (args.out / "quant_accuracy.json").write_text(json.dumps(report, indent=2))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
