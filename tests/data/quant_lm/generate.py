#!/usr/bin/env python
"""Makes tests/data/quant_lm: a small *trained* LLaMA (dim 128, 2 layers, 4 / 2 heads, hidden
384, vocab 512; bf16 weights, 1 MiB) and 64 prompts of 16 tokens, for the int8 / int4 accuracy
tests (tests/models/test_quant_models.py) and benchmarks/bench_quant_accuracy.py.

Why trained: a randomly initialised model (every matrix normal with std 0.02) predicts almost
uniformly (logit std 0.23 over the vocabulary, top probability ~1%): its top-1 token changes
under any perturbation of a few 1e-3, so "top-1 agreement" measures noise there (98% at int8,
71% at int4 in our runs, with KL divergences of 3e-6 / 8e-4). A trained model's next-token
distributions are peaked like a real LM's (here mean top probability 0.55, logit std 1.5), which
is what the top-1 criterion is about.

The language: a Markov chain over 512 tokens, each token followed by one of 8 successors drawn
with Dirichlet(0.3) probabilities (numpy seed 0). transformers' LlamaForCausalLM (torch seed 0)
trained 300 steps of AdamW (lr 3e-3) on batches of 32 sequences of 32 tokens from the chain
(loss 6.27 -> 1.51; the chain's entropy rate is ~1.2 nats). The prompts are 64 sequences of the
chain (numpy seed 7). Training took ~5 min on the shared 2-core machine; a torch version other
than the one that made the committed files may give other weights (the tests only assert
bounds).

    python tests/data/quant_lm/generate.py   # rewrites config.json, model.safetensors, prompts.npy
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np

V, OUT = 512, Path(__file__).resolve().parent


def chain() -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    succ = rng.integers(0, V, (V, 8))
    probs = rng.dirichlet(np.full(8, 0.3), size=V)
    return succ, probs


def sample(n: int, t: int, rng: np.random.Generator) -> np.ndarray:
    succ, probs = chain()
    out = np.empty((n, t), np.int64)
    out[:, 0] = rng.integers(0, V, n)
    for i in range(1, t):
        prev = out[:, i - 1]
        u = rng.random(n)[:, None]
        j = (u > np.cumsum(probs[prev], 1)).sum(1).clip(max=7)
        out[:, i] = succ[prev, j]
    return out


def train(directory: str) -> None:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    rng = np.random.default_rng(0)
    rng.integers(0, V, (V, 8))  # the chain's draws (chain()) come first from this generator
    rng.dirichlet(np.full(8, 0.3), size=V)
    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=V, hidden_size=128, intermediate_size=384, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
        tie_word_embeddings=False,
    )  # fmt: skip
    model = LlamaForCausalLM(cfg)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    for step in range(300):
        x = torch.from_numpy(sample(32, 32, rng))
        loss = model(input_ids=x, labels=x).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step % 50 == 0:
            print(step, float(loss))
    model.save_pretrained(directory)


def main() -> None:
    import llmkernels as lk

    with tempfile.TemporaryDirectory() as d:
        train(d)
        model = lk.Transformer.from_pretrained(d, dtype="float32")
        model.save_pretrained(OUT, dtype="bfloat16")
    np.save(OUT / "prompts.npy", sample(64, 16, np.random.default_rng(7)))


if __name__ == "__main__":
    main()
