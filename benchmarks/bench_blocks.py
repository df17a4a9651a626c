#!/usr/bin/env python
"""Transformer blocks and a whole model: llmkernels vs HF ``transformers`` (torch CPU) vs NumPy.

Usage::

    python benchmarks/bench_blocks.py [--quick] [--out benchmarks/results]

or, from Python, ``bench_blocks.run(quick=True)`` (returns the results dict; its
``"markdown"`` entry is the printed report).

What it measures (float32, every peer in this process and run, 1 and 2 threads, medians of
repeated ``time.perf_counter`` timings after warm-up):

1. One LLaMA decoder block at a TinyLlama-like shape (dim 2048, 32 query heads, 4 KV heads,
   head_dim 64, hidden 5632), the same random weights in ``lk.TransformerBlock`` and HF's
   ``LlamaDecoderLayer`` (SDPA attention):

   - prefill, B = 1, T = 512: GFLOP/s and fraction of the FMA peak, next to HF, the same block
     written in NumPy (float32, NumPy's OpenBLAS for the matmuls) and the block's four GEMMs
     alone (fused QKV, O, fused gate/up, down) through NumPy's and torch's BLAS; the block's
     non-GEMM share is (block − GEMMs) / block. A breakdown times the block's parts through
     the module classes (norms, attention module, attention kernel alone, feed-forward) for
     llmkernels and HF.
   - one decode step against a KV cache of 1024 tokens (consecutive steps 1025, 1026, ...):
     GB/s of the block's weights plus the K/V read, fraction of the triad bandwidth; HF with a
     ``DynamicCache``; the projections alone as NumPy GEMVs; a breakdown of the step (attention
     module with its cache, attention kernel alone, feed-forward), each part called after an
     untimed flush of the last-level cache.
2. One block at a small shape (dim 512, 8 heads, 8 KV heads, hidden 1408): prefill T = 64 and
   decode from 128 cached tokens, consecutive steps as in generation (129, 130, ...; the report
   gives the mean cache length). The cache is not rebuilt between timed steps: on a shared
   host the last-level cache loses the block's 12.6 MB of weights during any pause of a few
   milliseconds, and the first ~8 steps after one run up to 2.5x slower for both peers.
3. Whole-model greedy decoding (vocab 32000, dim 512, 8 layers, 8 heads, 4 KV heads, hidden
   1408; prompt 32, 64 new tokens): ``lk.Transformer.generate`` vs HF
   ``LlamaForCausalLM.generate(do_sample=False)`` with the same weights; the tokens must be
   equal. Tokens/s end to end, and per decode step (excluding the prefill) from the difference
   to a 1-token generate.

Results go to ``<out>/blocks.md`` and ``<out>/blocks.json``. ``--quick`` (shorter sequences,
fewer repeats) is a smoke test of well under a minute; the full run takes about 1.5 minutes on
a quiet machine. The OpenBLAS kernel set (``OPENBLAS_CORETYPE``, see the report's header)
decides most of the prefill numbers.
"""

from __future__ import annotations

import gc
import math
import statistics
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import harness
import llmkernels as lk
import numpy as np
from harness import LK, Impls, fmt, fmt_cpus, fmt_time, hf_cache, md_table, peers

# the optional peers (harness.load_peers): torch, torch.nn.functional, transformers classes
torch: Any = None
F: Any = None
hf: Any = None

HF = "HF transformers"
NUMPY = "NumPy block"
NP_GEMM = "GEMMs only (NumPy BLAS)"
TORCH_GEMM = "GEMMs only (torch BLAS)"


# --------------------------------------------------------------------------------------
# configuration
# --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class BlockShape:
    dim: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    hidden: int

    @property
    def params(self) -> int:
        """Projection weights (the norms' 2·dim are left out of the FLOP and byte counts)."""
        d, hq, hkv, hd = self.dim, self.n_heads, self.n_kv_heads, self.head_dim
        return d * (hq + 2 * hkv) * hd + hq * hd * d + 3 * d * self.hidden

    def label(self) -> str:
        return (
            f"dim {self.dim}, {self.n_heads} heads, {self.n_kv_heads} KV heads, "
            f"head_dim {self.head_dim}, hidden {self.hidden}"
        )


@dataclass(frozen=True)
class Config:
    quick: bool
    threads: tuple[int, ...]
    quiet_wait: float  # max seconds to wait for other processes to go idle before timing
    cap_s: float  # a peer's timed calls in one round stop after this many seconds (>= 2 calls)
    retry_max_s: float  # a measurement disturbed by other processes is repeated if it took less
    probe_repeats: int
    probe_n: int
    big: BlockShape
    big_prefill_t: int
    big_prefill_rounds: int
    big_prefill_per_round: int
    big_decode_cache: int
    big_decode_steps: int  # timed steps per peer and thread count
    small: BlockShape
    small_prefill_t: int
    small_prefill_repeats: int
    small_decode_cache: int
    small_decode_steps: int
    small_decode_window: int | None  # steps before the cache is rebuilt (None: never)
    model_layers: int
    model_prompt: int
    model_new_tokens: int
    model_repeats: int


TINYLLAMA = BlockShape(dim=2048, n_heads=32, n_kv_heads=4, head_dim=64, hidden=5632)
SMALL = BlockShape(dim=512, n_heads=8, n_kv_heads=8, head_dim=64, hidden=1408)

# the same in both runs
_BOTH: dict[str, Any] = {
    "threads": (1, 2),
    "big": TINYLLAMA,
    "big_prefill_per_round": 2,
    "small": SMALL,
    "small_prefill_t": 64,
    "small_decode_cache": 128,
    "small_decode_window": None,
}
# field: (full run, --quick run)
FULL, QUICK = harness.full_and_quick(
    Config,
    {
        "quick": (False, True),
        "quiet_wait": (3.0, 0.0),
        "cap_s": (2.5, 1.0),
        "retry_max_s": (15.0, 0.0),
        "probe_repeats": (5, 1),
        "probe_n": (50_000_000, 10_000_000),
        "big_prefill_t": (512, 128),
        "big_prefill_rounds": (2, 1),
        "big_decode_cache": (1024, 256),
        "big_decode_steps": (30, 6),
        "small_prefill_repeats": (24, 6),
        "small_decode_steps": (80, 16),
        "model_layers": (8, 2),
        "model_prompt": (32, 16),
        "model_new_tokens": (64, 8),
        "model_repeats": (3, 1),
    },
    timing=(_BOTH, _BOTH),
)


# --------------------------------------------------------------------------------------
# models: HF config, weights, the NumPy block
# --------------------------------------------------------------------------------------


def hf_config(shape: BlockShape, *, n_layers: int = 1, vocab: int = 32000, max_pos: int = 4096):
    config = hf.LlamaConfig(
        hidden_size=shape.dim,
        num_attention_heads=shape.n_heads,
        num_key_value_heads=shape.n_kv_heads,
        head_dim=shape.head_dim,
        intermediate_size=shape.hidden,
        num_hidden_layers=n_layers,
        vocab_size=vocab,
        rms_norm_eps=1e-5,
        max_position_embeddings=max_pos,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        tie_word_embeddings=False,
        bos_token_id=None,
        eos_token_id=None,  # generate() must not stop on a random "end" token
        pad_token_id=None,
    )
    # A standalone LlamaDecoderLayer reads the attention implementation from its config
    # (None falls back to eager, which without a mask is not causal).
    config._attn_implementation = "sdpa"
    return config


def canonical_config(shape: BlockShape, *, n_layers: int = 1, vocab: int = 1) -> dict[str, Any]:
    return {
        "dim": shape.dim,
        "n_heads": shape.n_heads,
        "n_kv_heads": shape.n_kv_heads,
        "head_dim": shape.head_dim,
        "hidden_dim": shape.hidden,
        "n_layers": n_layers,
        "vocab_size": vocab,
        "norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "max_seq_len": 4096,
    }


def random_state(shapes: dict[str, tuple[int, ...]], seed: int) -> dict[str, np.ndarray]:
    """float32 weights with O(1) outputs: projections N(0, 1/fan_in), norms 1 + N(0, 0.1²),
    embeddings N(0, 1). (HF's own init, std 0.02, makes a block nearly the identity.)"""
    rng = np.random.default_rng(seed)
    out = {}
    for key, shape in shapes.items():
        if "norm" in key:
            arr = 1.0 + 0.1 * rng.standard_normal(shape, dtype=np.float32)
        elif "embed_tokens" in key:
            arr = rng.standard_normal(shape, dtype=np.float32)
        else:
            arr = rng.standard_normal(shape, dtype=np.float32) / np.float32(math.sqrt(shape[1]))
        out[key] = arr.astype(np.float32)
    return out


class Weights:
    """A block's weights for the NumPy peers: the fused matrices llmkernels uses, ``(out, in)``
    as stored (``x @ W.T`` reads them transposed without a copy)."""

    def __init__(self, state: dict[str, np.ndarray], shape: BlockShape) -> None:
        s = state
        self.wqkv = np.ascontiguousarray(
            np.concatenate(
                [
                    s["self_attn.q_proj.weight"],
                    s["self_attn.k_proj.weight"],
                    s["self_attn.v_proj.weight"],
                ]
            )
        )
        self.wo = np.ascontiguousarray(s["self_attn.o_proj.weight"])
        self.wgu = np.ascontiguousarray(
            np.concatenate([s["mlp.gate_proj.weight"], s["mlp.up_proj.weight"]])
        )
        self.wd = np.ascontiguousarray(s["mlp.down_proj.weight"])
        self.n1 = np.ascontiguousarray(s["input_layernorm.weight"])
        self.n2 = np.ascontiguousarray(s["post_attention_layernorm.weight"])
        self.shape = shape
        if torch is not None:
            self.t = {
                k: torch.from_numpy(v) for k, v in vars(self).items() if isinstance(v, np.ndarray)
            }


def numpy_block(
    x: np.ndarray, w: Weights, cos: np.ndarray, sin: np.ndarray, mask: np.ndarray
) -> np.ndarray:
    """One pre-norm LLaMA block in float32 NumPy for ``x (T, dim)`` (B = 1): fused QKV and
    gate/up matmuls on NumPy's BLAS, half-split RoPE with precomputed ``cos``/``sin``
    ``(T, hd/2)``, GQA softmax attention with an additive causal ``mask (T, T)``, SwiGLU."""
    s = w.shape
    t = x.shape[0]
    hq, hkv, hd = s.n_heads, s.n_kv_heads, s.head_dim
    qkv = harness.numpy_rms_norm(x, w.n1, 1e-5) @ w.wqkv.T
    q = qkv[:, : hq * hd].reshape(t, hq, hd).transpose(1, 0, 2)
    k = qkv[:, hq * hd : (hq + hkv) * hd].reshape(t, hkv, hd).transpose(1, 0, 2)
    v = qkv[:, (hq + hkv) * hd :].reshape(t, hkv, hd).transpose(1, 0, 2)
    half = hd // 2

    def rot(z: np.ndarray) -> np.ndarray:
        z1, z2 = z[..., :half], z[..., half:]
        return np.concatenate((z1 * cos - z2 * sin, z2 * cos + z1 * sin), axis=-1)

    q, k = rot(q), rot(k)
    g = hq // hkv
    qg = q.reshape(hkv, g, t, hd) * np.float32(hd**-0.5)
    sc = qg @ k[:, None].transpose(0, 1, 3, 2)  # (Hkv, g, T, T)
    sc += mask
    sc -= sc.max(-1, keepdims=True)
    p = np.exp(sc, out=sc)
    p /= p.sum(-1, keepdims=True)
    o = (p @ v[:, None]).reshape(hq, t, hd).transpose(1, 0, 2).reshape(t, hq * hd)
    h = x + o @ w.wo.T
    gu = harness.numpy_rms_norm(h, w.n2, 1e-5) @ w.wgu.T
    gate, up = gu[:, : s.hidden], gu[:, s.hidden :]
    return h + (gate / (1 + np.exp(-gate)) * up) @ w.wd.T


def numpy_gemms(x: np.ndarray, w: Weights, bufs: dict[str, np.ndarray]) -> None:
    """The block's four projections alone, NumPy's BLAS, on inputs of the right shapes."""
    np.matmul(x, w.wqkv.T, out=bufs["qkv"])
    np.matmul(bufs["attn"], w.wo.T, out=bufs["o"])
    np.matmul(x, w.wgu.T, out=bufs["gu"])
    np.matmul(bufs["act"], w.wd.T, out=bufs["o"])


def torch_gemms(xt: Any, w: Weights, bufs: dict[str, Any]) -> None:
    """The same four projections through torch (what HF's ``nn.Linear`` calls)."""
    torch.matmul(xt, w.t["wqkv"].T, out=bufs["qkv"])
    torch.matmul(bufs["attn"], w.t["wo"].T, out=bufs["o"])
    torch.matmul(xt, w.t["wgu"].T, out=bufs["gu"])
    torch.matmul(bufs["act"], w.t["wd"].T, out=bufs["o"])


def gemm_buffers(t: int, shape: BlockShape, rng: np.random.Generator) -> dict[str, np.ndarray]:
    s = shape
    return {
        "qkv": np.empty((t, (s.n_heads + 2 * s.n_kv_heads) * s.head_dim), np.float32),
        "attn": rng.standard_normal((t, s.n_heads * s.head_dim), dtype=np.float32),
        "o": np.empty((t, s.dim), np.float32),
        "gu": np.empty((t, 2 * s.hidden), np.float32),
        "act": rng.standard_normal((t, s.hidden), dtype=np.float32),
    }


class BlockPeers:
    """One block's weights in llmkernels, HF (when installed) and NumPy."""

    def __init__(self, shape: BlockShape, seed: int) -> None:
        self.shape = shape
        self.block = lk.TransformerBlock.from_config(canonical_config(shape), seed=seed)
        shapes = {k: v.shape for k, v in self.block.state_dict().items()}
        state = random_state(shapes, seed)
        self.layer = None
        self.rotary = None
        if hf is not None:
            self.layer = hf.LlamaDecoderLayer(hf_config(shape), layer_idx=0).eval()
            with torch.no_grad():
                for k, p in self.layer.named_parameters():
                    p.copy_(torch.from_numpy(state[k]))
            self.rotary = hf.LlamaRotaryEmbedding(self.layer.self_attn.config)
            # as the brief says: the HF state dict goes into the llmkernels block
            self.block.load_state_dict({k: v.numpy() for k, v in self.layer.state_dict().items()})
        else:
            self.block.load_state_dict(state)
        self.w = Weights({k: v.copy() for k, v in self.block.state_dict().items()}, shape)

    def hf_rope(self, x: Any, start: int, t: int) -> tuple[Any, Any]:
        with torch.no_grad():
            return self.rotary(x, torch.arange(start, start + t)[None])


def block_flops(shape: BlockShape, t: int) -> tuple[float, float]:
    """(projection FLOPs, causal attention FLOPs) for a prefill of ``t`` tokens (B = 1)."""
    proj = 2.0 * t * shape.params
    attn = 2.0 * shape.n_heads * t * t * shape.head_dim  # QK^T and PV, each halved by causality
    return proj, attn


# --------------------------------------------------------------------------------------
# cases
# --------------------------------------------------------------------------------------


def measure_quietly(
    impls: Impls,
    cfg: Config,
    rounds: int,
    per_round: int,
    warmup: int = 1,
    setup: dict[str, Callable[[], Any]] | None = None,
) -> tuple[dict[str, list[float]], float | None]:
    """:func:`harness.measure_quietly` with this run's waiting, retry and per-round time cap,
    under ``torch.inference_mode`` (as HF's generate runs)."""
    return harness.measure_quietly(
        impls,
        rounds,
        per_round,
        quiet_wait=cfg.quiet_wait,
        retry_max_s=cfg.retry_max_s,
        warmup=warmup,
        setup=setup,
        cap_s=cfg.cap_s,
        torch_inference=True,
    )


def case_prefill(
    peers: BlockPeers,
    t: int,
    cfg: Config,
    probe: dict,
    rounds: int,
    per_round: int,
    *,
    gemms: bool,
    parts: bool,
    rng: np.random.Generator,
) -> dict[str, Any]:
    """Prefill of ``t`` tokens (B = 1): the block in each peer, the GEMMs alone, the parts."""
    shape = peers.shape
    x = rng.standard_normal((1, t, shape.dim), dtype=np.float32)
    x2 = x[0]
    cos, sin = harness.rope_cos_sin(shape.head_dim, np.arange(t))
    mask = np.triu(np.full((t, t), -np.inf, dtype=np.float32), 1)
    block, w = peers.block, peers.w
    impls: Impls = {LK: lambda: block(x)}
    results = {LK: block(x)}
    if peers.layer is not None:
        xt = torch.from_numpy(x)
        pe = peers.hf_rope(xt, 0, t)
        layer = peers.layer
        impls[HF] = lambda: layer(xt, position_embeddings=pe)
        with torch.no_grad():
            results[HF] = impls[HF]()
    impls[NUMPY] = lambda: numpy_block(x2, w, cos, sin, mask)
    results[NUMPY] = impls[NUMPY]()[None]
    if gemms:
        bufs = gemm_buffers(t, shape, rng)
        impls[NP_GEMM] = lambda: numpy_gemms(x2, w, bufs)
        if torch is not None:
            tbufs = {k: torch.from_numpy(v.copy()) for k, v in bufs.items()}
            xt2 = torch.from_numpy(x2)
            impls[TORCH_GEMM] = lambda: torch_gemms(xt2, w, tbufs)
    ref = results[LK]
    diffs = {k: harness.max_rel_diff(v, ref) for k, v in results.items() if k != LK}
    # the residual dominates y; compare the block's contribution y - x as well
    diffs_delta = {
        k: harness.max_rel_diff(np.asarray(v) - x, ref - x) for k, v in results.items() if k != LK
    }
    harness.check_outputs(f"prefill T={t}", diffs)
    harness.check_outputs(f"prefill T={t} (y - x)", diffs_delta)
    del results

    proj, attn = block_flops(shape, t)
    flops = proj + attn
    out: dict[str, Any] = {
        "T": t,
        "B": 1,
        "flops": flops,
        "projection_flops": proj,
        "attention_flops": attn,
        "max_rel_diff_vs_llmkernels": diffs,
        "max_rel_diff_of_y_minus_x": diffs_delta,
        "threads": {},
    }
    for n in cfg.threads:
        harness.set_threads(n)
        samples, others = measure_quietly(impls, cfg, rounds, per_round)
        st = harness.peer_stats(samples, flops / 1e0, probe["fma_gflops"][str(n)])
        for name in (NP_GEMM, TORCH_GEMM):  # GEMMs: their own FLOPs (projections only)
            if name in st:
                st[name]["rate"] = proj / st[name]["median_s"] / 1e9
                st[name]["fraction_of_roof"] = st[name]["rate"] / probe["fma_gflops"][str(n)]
        entry: dict[str, Any] = {"impls": st, "other_processes_cpus": others}
        if NP_GEMM in st:
            g = st[NP_GEMM]["median_s"]
            entry["non_gemm_share_vs_numpy_gemms"] = {
                k: (st[k]["median_s"] - g) / st[k]["median_s"] for k in (LK, HF, NUMPY) if k in st
            }
        if TORCH_GEMM in st and HF in st:
            g = st[TORCH_GEMM]["median_s"]
            hf_s = st[HF]["median_s"]
            entry["hf_non_gemm_share_vs_torch_gemms"] = (hf_s - g) / hf_s
        if parts:
            with harness.OtherLoad() as load:
                entry["parts"] = prefill_parts(peers, x, cfg, 1, per_round)
            entry["parts_other_processes_cpus"] = load.cpus
        out["threads"][str(n)] = entry
    return out


def prefill_parts(
    peers: BlockPeers, x: np.ndarray, cfg: Config, rounds: int, per_round: int
) -> dict[str, dict[str, float]]:
    """Median seconds of the block's parts, called one by one through the module classes
    (llmkernels) and the submodules (HF), at the current thread count. Each part gets the
    input it sees inside the block."""
    shape, block = peers.shape, peers.block
    t = x.shape[1]
    h1 = block.attention_norm(x)
    a = block.attention(h1)
    h = x + a
    h2 = block.ffn_norm(h)
    hq, hkv, hd = shape.n_heads, shape.n_kv_heads, shape.head_dim
    rng = np.random.default_rng(1)
    q = rng.standard_normal((1, hq, t, hd), dtype=np.float32)
    k = rng.standard_normal((1, hkv, t, hd), dtype=np.float32)
    v = rng.standard_normal((1, hkv, t, hd), dtype=np.float32)
    aout = np.empty_like(q)
    w = peers.w
    h12, h22 = h1[0], h2[0]
    bufs = gemm_buffers(t, shape, rng)
    table: dict[str, dict[str, Callable[[], Any]]] = {
        "attention norm": {LK: lambda: block.attention_norm(x)},
        "attention module (QKV, RoPE, attention, O)": {LK: lambda: block.attention(h1)},
        "  attention kernel alone (causal, GQA)": {
            LK: lambda: lk.attention(q, k, v, causal=True, out=aout)
        },
        "  QKV + O GEMMs (NumPy BLAS)": {
            NUMPY: lambda: (
                np.matmul(h12, w.wqkv.T, out=bufs["qkv"]),
                np.matmul(bufs["attn"], w.wo.T, out=bufs["o"]),
            )
        },
        "FFN norm": {LK: lambda: block.ffn_norm(h)},
        "feed-forward module": {LK: lambda: block.feed_forward(h2)},
        "  gate/up + down GEMMs (NumPy BLAS)": {
            NUMPY: lambda: (
                np.matmul(h22, w.wgu.T, out=bufs["gu"]),
                np.matmul(bufs["act"], w.wd.T, out=bufs["o"]),
            )
        },
        "  lk.swiglu_ffn (extension BLAS)": {},
        "whole block": {LK: lambda: block(x)},
    }
    wg = np.ascontiguousarray(w.wgu[: shape.hidden].T)
    wu = np.ascontiguousarray(w.wgu[shape.hidden :].T)
    wdT = np.ascontiguousarray(w.wd.T)
    table["  lk.swiglu_ffn (extension BLAS)"][LK] = lambda: lk.swiglu_ffn(h22, wg, wu, wdT)
    if peers.layer is not None:
        layer = peers.layer
        xt, h1t, ht, h2t = (torch.from_numpy(np.ascontiguousarray(a_)) for a_ in (x, h1, h, h2))
        pe = peers.hf_rope(xt, 0, t)
        qt, kt, vt = (torch.from_numpy(a_) for a_ in (q, k, v))
        table["attention norm"][HF] = lambda: layer.input_layernorm(xt)
        table["attention module (QKV, RoPE, attention, O)"][HF] = lambda: layer.self_attn(
            hidden_states=h1t, position_embeddings=pe
        )
        table["  attention kernel alone (causal, GQA)"][HF] = lambda: (
            F.scaled_dot_product_attention(qt, kt, vt, is_causal=True, enable_gqa=True)
        )
        table["FFN norm"][HF] = lambda: layer.post_attention_layernorm(ht)
        table["feed-forward module"][HF] = lambda: layer.mlp(h2t)
        table["whole block"][HF] = lambda: layer(xt, position_embeddings=pe)
    out: dict[str, dict[str, float]] = {}
    flat: Impls = {}
    for part, impls in table.items():
        for name, fn in impls.items():
            flat[f"{part}\0{name}"] = fn
    samples = harness.measure(
        flat, rounds, per_round, cap_s=min(cfg.cap_s, 1.0), torch_inference=True
    )
    for key, s in samples.items():
        part, name = key.split("\0")
        out.setdefault(part, {})[name] = statistics.median(s)
    return out


class Stepper:
    """Consecutive single-token decode steps of one peer against its own cache; ``prepare``
    (untimed) rebuilds the cache by a prefill after ``window`` steps."""

    def __init__(self, prefill: Callable[[], Any], step: Callable[[], Any], window: int) -> None:
        self._prefill, self._step, self.window = prefill, step, window
        self.done = window  # prefill before the first step
        self.lengths: list[int] = []  # cached tokens before each step

    def prepare(self) -> None:
        if self.done >= self.window:
            self._prefill()
            self.done = 0

    def __call__(self) -> Any:
        self.done += 1
        return self._step()


def case_decode(
    peers: BlockPeers,
    cache_len: int,
    steps: int,
    window: int | None,
    cfg: Config,
    probe: dict,
    rng: np.random.Generator,
    *,
    parts: bool = False,
) -> dict[str, Any]:
    """One decode step (B = 1, Tq = 1) against ``cache_len`` cached tokens, consecutive steps
    (the cache grows by one per step; rebuilt, untimed, after ``window`` steps)."""
    shape, block = peers.shape, peers.block
    prompt = rng.standard_normal((1, cache_len, shape.dim), dtype=np.float32)
    tok = rng.standard_normal((1, 1, shape.dim), dtype=np.float32)
    rounds = 2 if steps >= 20 else 1
    per_round = max(1, math.ceil(steps / rounds))
    warmup = 2
    calls = len(cfg.threads) * rounds * (warmup + per_round) + 1  # + the check step
    if window is None:  # never rebuild the cache during the run
        window = calls
    max_len = cache_len + window + 2
    lk_state: dict[str, Any] = {}

    def lk_prefill() -> None:
        lk_state["cache"] = block.new_cache(1, max_len)
        block(prompt, cache=lk_state["cache"])

    def lk_step() -> np.ndarray:
        c = lk_state["cache"]
        lk_stepper.lengths.append(c.length)
        return block(tok, cache=c)

    lk_stepper = Stepper(lk_prefill, lk_step, window)
    steppers = {LK: lk_stepper}
    if peers.layer is not None:
        layer = peers.layer
        prompt_t, tok_t = torch.from_numpy(prompt), torch.from_numpy(tok)
        cos_all, sin_all = peers.hf_rope(prompt_t, 0, max_len)
        hf_state: dict[str, Any] = {}

        def hf_prefill() -> None:
            cache = hf.DynamicCache(config=layer.self_attn.config)
            with torch.no_grad():
                layer(
                    prompt_t,
                    **hf_cache(layer, cache),
                    use_cache=True,
                    position_embeddings=(cos_all[:, :cache_len], sin_all[:, :cache_len]),
                )
            hf_state["cache"] = cache

        def hf_step() -> Any:
            cache = hf_state["cache"]
            p = cache.get_seq_length()
            hf_stepper.lengths.append(p)
            return layer(
                tok_t,
                **hf_cache(layer, cache),
                use_cache=True,
                position_embeddings=(cos_all[:, p : p + 1], sin_all[:, p : p + 1]),
            )

        hf_stepper = Stepper(hf_prefill, hf_step, window)
        steppers[HF] = hf_stepper

    # check: first step of each peer after its prefill, against llmkernels
    first = {}
    with harness.inference():
        for name, s in steppers.items():
            s.prepare()
            first[name] = s()
    diffs = {k: harness.max_rel_diff(v, first[LK]) for k, v in first.items() if k != LK}
    diffs_delta = {
        k: harness.max_rel_diff(np.asarray(v) - tok, first[LK] - tok)
        for k, v in first.items()
        if k != LK
    }
    harness.check_outputs(f"decode (cache {cache_len})", diffs)
    harness.check_outputs(f"decode (cache {cache_len}) (y - x)", diffs_delta)
    for s in steppers.values():
        s.lengths.clear()

    impls: Impls = dict(steppers)
    setup = {name: s.prepare for name, s in steppers.items()}
    # the projections alone as GEMVs (weight read only), NumPy's BLAS
    w = peers.w
    v1 = tok[0]
    bufs = gemm_buffers(1, shape, rng)
    impls["projections only (NumPy GEMV)"] = lambda: numpy_gemms(v1, w, bufs)
    weight_bytes = 4.0 * shape.params
    out: dict[str, Any] = {
        "cache_tokens": cache_len,
        "weight_bytes": weight_bytes,
        "window": window,
        "max_rel_diff_vs_llmkernels": diffs,
        "max_rel_diff_of_y_minus_x": diffs_delta,
        "threads": {},
    }
    part_impls, part_setup = decode_parts(peers, prompt, tok, calls) if parts else ({}, {})
    for n in cfg.threads:
        harness.set_threads(n)
        samples, others = measure_quietly(impls, cfg, rounds, per_round, warmup, setup)
        mean_len = statistics.mean(lk_stepper.lengths) if lk_stepper.lengths else cache_len
        lk_stepper.lengths.clear()
        if HF in steppers:
            steppers[HF].lengths.clear()
        kv_bytes = 2.0 * shape.n_kv_heads * (mean_len + 1) * shape.head_dim * 4
        st = harness.peer_stats(samples, weight_bytes + kv_bytes, probe["triad_gbs"][str(n)])
        name = "projections only (NumPy GEMV)"
        st[name]["rate"] = weight_bytes / st[name]["median_s"] / 1e9
        st[name]["fraction_of_roof"] = st[name]["rate"] / probe["triad_gbs"][str(n)]
        out["threads"][str(n)] = {
            "impls": st,
            "other_processes_cpus": others,
            "mean_cached_tokens": mean_len,
            "kv_bytes": kv_bytes,
        }
        if part_impls:
            with harness.OtherLoad() as load:
                ps = harness.measure(
                    part_impls, rounds, per_round, warmup, part_setup, min(cfg.cap_s, 1.0), True
                )
            out["threads"][str(n)]["parts"] = {k: statistics.median(v) for k, v in ps.items()}
            out["threads"][str(n)]["parts_other_processes_cpus"] = load.cpus
    return out


def decode_parts(
    peers: BlockPeers, prompt: np.ndarray, tok: np.ndarray, window: int
) -> tuple[Impls, dict[str, Callable[[], Any]]]:
    """The decode step's parts, each called alone after the last-level cache was flushed
    (untimed, by reading a buffer of twice its size): inside a block the attention weights
    never stay cached, since the feed-forward's stream evicts them. Keys are
    ``"<part>\\0<peer>"``."""
    shape, block = peers.shape, peers.block
    cache_len = prompt.shape[1]
    max_len = cache_len + window + 2
    flush_buf = np.ones(2 * harness.llc_bytes() // 4, np.float32)

    def flush() -> None:
        flush_buf.sum()

    impls: Impls = {}
    setup: dict[str, Callable[[], Any]] = {}

    def add(key: str, fn: Callable[[], Any], prep: Callable[[], Any] | None = None) -> None:
        impls[key] = fn
        if prep is None:
            setup[key] = flush
        else:
            setup[key] = lambda: (prep(), flush())

    attn = block.attention
    st: dict[str, Any] = {}

    def lk_attn_prefill() -> None:
        st["lk"] = attn.new_cache(1, max_len)
        attn(prompt, cache=st["lk"])

    lk_attn = Stepper(lk_attn_prefill, lambda: attn(tok, cache=st["lk"]), window)
    add(f"attention module (with cache)\0{LK}", lk_attn, lk_attn.prepare)
    w, v1 = peers.w, tok[0]
    bufs = gemm_buffers(1, shape, np.random.default_rng(3))
    add(
        "attention module (with cache)\0NumPy GEMV (QKV + O)",
        lambda: (
            np.matmul(v1, w.wqkv.T, out=bufs["qkv"]),
            np.matmul(bufs["attn"], w.wo.T, out=bufs["o"]),
        ),
    )
    # the attention kernel alone, one query token against K/V of the cache's length
    kernel = "  attention kernel alone (Tq = 1, GQA, K/V of the cache length)"
    krng = np.random.default_rng(4)
    hq, hkv, hd = shape.n_heads, shape.n_kv_heads, shape.head_dim
    kq = krng.standard_normal((1, hq, 1, hd), dtype=np.float32)
    kk = krng.standard_normal((1, hkv, cache_len, hd), dtype=np.float32)
    kv = krng.standard_normal((1, hkv, cache_len, hd), dtype=np.float32)
    kout = np.empty_like(kq)
    add(f"{kernel}\0{LK}", lambda: lk.attention(kq, kk, kv, out=kout))
    if torch is not None:
        kqt, kkt, kvt = (torch.from_numpy(a) for a in (kq, kk, kv))
        add(
            f"{kernel}\0torch SDPA",
            lambda: F.scaled_dot_product_attention(kqt, kkt, kvt, enable_gqa=True),
        )
    add(f"feed-forward module\0{LK}", lambda: block.feed_forward(tok))
    add(
        "feed-forward module\0NumPy GEMV (gate/up + down)",
        lambda: (
            np.matmul(v1, w.wgu.T, out=bufs["gu"]),
            np.matmul(bufs["act"], w.wd.T, out=bufs["o"]),
        ),
    )
    if peers.layer is not None:
        layer = peers.layer
        sa, mlp = layer.self_attn, layer.mlp
        prompt_t, tok_t = torch.from_numpy(prompt), torch.from_numpy(tok)
        cos_all, sin_all = peers.hf_rope(prompt_t, 0, max_len)

        def hf_attn_prefill() -> None:
            st["hf"] = hf.DynamicCache(config=sa.config)
            with torch.no_grad():
                sa(
                    hidden_states=prompt_t,
                    **hf_cache(sa, st["hf"]),
                    position_embeddings=(cos_all[:, :cache_len], sin_all[:, :cache_len]),
                )

        def hf_attn_step() -> Any:
            p = st["hf"].get_seq_length()
            return sa(
                hidden_states=tok_t,
                **hf_cache(sa, st["hf"]),
                position_embeddings=(cos_all[:, p : p + 1], sin_all[:, p : p + 1]),
            )

        hf_attn = Stepper(hf_attn_prefill, hf_attn_step, window)
        add(f"attention module (with cache)\0{HF}", hf_attn, hf_attn.prepare)
        add(f"feed-forward module\0{HF}", lambda: mlp(tok_t))
    return impls, setup


def case_model(cfg: Config, rng: np.random.Generator) -> dict[str, Any] | None:
    """Greedy decoding of a small random LLaMA, llmkernels vs HF generate, same weights."""
    shape = BlockShape(dim=512, n_heads=8, n_kv_heads=4, head_dim=64, hidden=1408)
    vocab = 32000
    conf = canonical_config(shape, n_layers=cfg.model_layers, vocab=vocab)
    model = lk.Transformer(conf, seed=0)
    state = random_state({k: v.shape for k, v in model.state_dict().items()}, seed=0)
    model.load_state_dict(state)
    ids = rng.integers(0, vocab, (1, cfg.model_prompt))
    new = cfg.model_new_tokens
    out: dict[str, Any] = {
        "config": {**conf, "prompt": cfg.model_prompt, "new_tokens": new},
        "threads": {},
    }
    impls: Impls = {LK: lambda: model.generate(ids, new, progress=False)}
    impls[LK + " (1 token)"] = lambda: model.generate(ids, 1, progress=False)
    hf_model = None
    if hf is not None:
        hf_model = hf.LlamaForCausalLM(hf_config(shape, n_layers=cfg.model_layers, vocab=vocab))
        hf_model.eval()
        # HF's state dict goes into llmkernels (the brief's direction); same weights either way
        with torch.no_grad():
            for k, p in hf_model.state_dict().items():
                p.copy_(torch.from_numpy(state[k]))
        model.load_state_dict({k: v.numpy() for k, v in hf_model.state_dict().items()})
        ids_t = torch.from_numpy(ids)
        am = torch.ones_like(ids_t)

        def hf_generate(n_new: int) -> Any:
            return hf_model.generate(
                ids_t, attention_mask=am, max_new_tokens=n_new, do_sample=False
            )

        impls[HF] = lambda: hf_generate(new)
        impls[HF + " (1 token)"] = lambda: hf_generate(1)
        with harness.inference():
            expected = hf_generate(new).numpy()
        got = impls[LK]()
        out["tokens_equal"] = bool(np.array_equal(got, expected))
        out["first_mismatch"] = (
            None
            if out["tokens_equal"]
            else int(np.argmax(got[0] != expected[0]))
            if got.shape == expected.shape
            else -1
        )
        if not out["tokens_equal"]:
            print(
                f"WARNING: model: greedy tokens differ from HF (first at {out['first_mismatch']})",
                file=sys.stderr,
            )
    for n in cfg.threads:
        harness.set_threads(n)
        samples, others = measure_quietly(impls, cfg, cfg.model_repeats, 1)
        med = {k: statistics.median(v) for k, v in samples.items()}
        entry: dict[str, Any] = {"other_processes_cpus": others, "impls": {}}
        for name in (LK, HF):
            if name not in med:
                continue
            full, one = med[name], med[name + " (1 token)"]
            entry["impls"][name] = {
                "median_s": full,
                "samples_s": samples[name],
                "one_token_median_s": one,
                "tokens_per_s": new / full,
                "decode_tokens_per_s": (new - 1) / (full - one) if full > one else None,
            }
        out["threads"][str(n)] = entry
    return out


# --------------------------------------------------------------------------------------
# report
# --------------------------------------------------------------------------------------


def others_cell(case: dict[str, Any], threads: Sequence[int], key: str = "") -> str:
    """CPUs other processes used while ``case`` (or its ``parts``) was measured, 1T / 2T."""
    name = f"{key}other_processes_cpus"
    return fmt_cpus([case["threads"][str(t)].get(name) for t in threads])


def impl_rows(
    case: dict[str, Any], threads: Sequence[int], cells: Callable[[dict[str, Any]], list[str]]
) -> list[list[str]]:
    """One table row per implementation of ``case``: its name, then ``cells(its stats)`` for
    each thread count."""
    names = list(case["threads"][str(threads[0])]["impls"])
    by_t = [case["threads"][str(t)]["impls"] for t in threads]
    return [[name, *(c for impls in by_t for c in cells(impls[name]))] for name in names]


def peer_table(case: dict[str, Any], threads: Sequence[int], unit: str) -> list[str]:
    rows = impl_rows(
        case,
        threads,
        lambda s: [
            fmt_time(s["median_s"]),
            fmt(s.get("rate"), 1),
            f"{100 * s['fraction_of_roof']:.0f}%" if "fraction_of_roof" in s else "-",
            fmt(s.get("time_vs_llmkernels")),
        ],
    )
    lo, hi = case["threads"][str(min(threads))], case["threads"][str(max(threads))]
    for row in rows:
        row.append(fmt(lo["impls"][row[0]]["median_s"] / hi["impls"][row[0]]["median_s"]))
    header = ["impl"]
    for t in threads:
        header += [f"{t}T time", f"{t}T {unit}", f"{t}T roof", f"{t}T x lk"]
    header.append("1T/2T")
    return md_table(header, rows)


def render(report: dict[str, Any]) -> str:
    """The markdown report (from the results alone)."""
    m, p, cfg = report["machine"], report["probe"], report["config"]
    th = list(cfg["threads"])
    out = [
        f"# llmkernels blocks{' (--quick)' if cfg['quick'] else ''}",
        "",
        *harness.machine_lines(m),
        "- `Haswell` is the AVX2 OpenBLAS kernel set, at most half the AVX-512 FMA peak",
        f"- roofline (best of {cfg['probe_repeats']}): FMA peak "
        f"{' / '.join(fmt(p['fma_gflops'][str(t)], 1) for t in th)} "
        f"GFLOP/s, triad {' / '.join(fmt(p['triad_gbs'][str(t)], 1) for t in th)} GB/s "
        f"({' / '.join(f'{t}T' for t in th)}); other processes "
        f"{fmt(p['other_processes_cpus'], 1)} CPUs meanwhile",
        f"- total run time {report['elapsed_s']:.0f} s",
        "",
        "`x lk` is the peer's median time over llmkernels' (above 1: llmkernels is faster); "
        "`roof` is the rate as a fraction of the FMA peak (prefill) or triad bandwidth (decode) "
        "at that thread count; `others` is how many CPUs other processes kept busy meanwhile "
        "(1T / 2T) — the machine is shared and a busy second core spoils 2-thread timings.",
    ]
    for key, title in (("big", "TinyLlama-like block"), ("small", "small block")):
        sec = report.get(key)
        if not sec:
            continue
        out += ["", f"## {title}: {sec['shape']}"]
        pre = sec["prefill"]
        out += [
            "",
            f"### Prefill, B = 1, T = {pre['T']} ({fmt(pre['flops'] / 1e9, 1)} GFLOP: "
            f"projections {fmt(pre['projection_flops'] / 1e9, 1)} + causal attention "
            f"{fmt(pre['attention_flops'] / 1e9, 2)}; others {others_cell(pre, th)})",
            "",
            "GFLOP/s counts the block's FLOPs for every block peer and the projections' FLOPs "
            "for the GEMM-only rows. Outputs checked first: max rel. diff vs llmkernels "
            + ", ".join(f"{k} {v:.1e}" for k, v in pre["max_rel_diff_vs_llmkernels"].items())
            + " (of y − x: "
            + ", ".join(f"{v:.1e}" for v in pre["max_rel_diff_of_y_minus_x"].values())
            + ").",
            "",
        ]
        out += peer_table(pre, th, "GFLOP/s")
        shares = [
            (
                t,
                pre["threads"][str(t)].get("non_gemm_share_vs_numpy_gemms"),
                pre["threads"][str(t)].get("hf_non_gemm_share_vs_torch_gemms"),
            )
            for t in th
        ]
        if shares[0][1]:
            out += [
                "",
                "Non-GEMM share = (block − the four GEMMs alone) / block, with the GEMMs on "
                "NumPy's BLAS (scipy-openblas; the extension links the system OpenBLAS): "
                + "; ".join(
                    f"{t}T: "
                    + ", ".join(f"{k} {100 * v:.0f}%" for k, v in s.items())
                    + (f", HF vs torch's own GEMMs {100 * h:.0f}%" if h is not None else "")
                    for t, s, h in shares
                )
                + ".",
            ]
        if "parts" in pre["threads"][str(th[0])]:
            out += [
                "",
                "#### Where the time goes (parts called one by one through the module classes; "
                f"median; others {others_cell(pre, th, 'parts_')})",
                "",
            ]
            parts0 = pre["threads"][str(th[0])]["parts"]
            names = [LK, HF, NUMPY]
            header = ["part"] + [f"{n} {t}T" for t in th for n in names]
            rows = []
            for part in parts0:
                row = [part.replace("  ", "↳ ")]
                for t in th:
                    pp = pre["threads"][str(t)]["parts"][part]
                    row += [fmt_time(pp.get(n)) for n in names]
                rows.append(row)
            keep = [i for i in range(1, len(header)) if any(r[i] != "-" for r in rows)]
            out += md_table(
                [header[0]] + [header[i].replace(NUMPY, "NumPy BLAS") for i in keep],
                [[r[0]] + [r[i] for i in keep] for r in rows],
            )
        dec = sec["decode"]
        llc = m.get("llc_bytes") or harness.llc_bytes()
        t0 = dec["threads"][str(th[0])]
        out += [
            "",
            f"### Decode step, B = 1, {dec['cache_tokens']} cached tokens "
            f"(consecutive steps, mean {t0['mean_cached_tokens']:.0f} cached; others "
            f"{others_cell(dec, th)})",
            "",
            f"GB/s counts the block's weights ({dec['weight_bytes'] / 2**20:.1f} MiB) plus the "
            f"K/V read ({t0['kv_bytes'] / 2**20:.2f} MiB); the GEMV row (the four projections "
            "as NumPy matrix-vector products) counts the weights only"
            + (
                f". The weights fit in the last-level cache ({llc / 2**20:.0f} MiB), so "
                "repeated steps of this one block read them from cache: rates above the triad "
                "bandwidth are expected (a model's layers together would not fit)"
                if dec["weight_bytes"] < llc
                else ""
            )
            + ". Outputs checked first: "
            "max rel. diff vs "
            "llmkernels "
            + ", ".join(f"{k} {v:.1e}" for k, v in dec["max_rel_diff_vs_llmkernels"].items())
            + (
                " (of y − x: "
                + ", ".join(f"{v:.1e}" for v in dec["max_rel_diff_of_y_minus_x"].values())
                + ")"
                if dec["max_rel_diff_of_y_minus_x"]
                else ""
            )
            + ".",
            "",
        ]
        out += peer_table(dec, th, "GB/s")
        if "parts" in t0:
            out += [
                "",
                "#### Where the time goes (each part called alone, median, after flushing the "
                "last-level cache untimed — inside the block the feed-forward's weight stream "
                f"evicts the attention weights, so they are never cached; others "
                f"{others_cell(dec, th, 'parts_')})",
                "",
            ]
            keys = list(t0["parts"])
            parts = list(dict.fromkeys(k.split("\0")[0] for k in keys))
            peers_ = list(dict.fromkeys(k.split("\0")[1] for k in keys))
            rows = []
            for part in parts:
                for peer in peers_:
                    key = f"{part}\0{peer}"
                    if key in t0["parts"]:
                        rows.append(
                            [part.replace("  ", "↳ "), peer]
                            + [fmt_time(dec["threads"][str(t)]["parts"][key]) for t in th]
                        )
            out += md_table(["part", "impl"] + [f"{t}T" for t in th], rows)
    mod = report.get("model")
    if mod:
        c = mod["config"]
        out += [
            "",
            f"## Whole model, greedy decoding (vocab {c['vocab_size']}, dim {c['dim']}, "
            f"{c['n_layers']} layers, {c['n_heads']} heads, {c['n_kv_heads']} KV heads, hidden "
            f"{c['hidden_dim']}; prompt {c['prompt']}, {c['new_tokens']} new tokens)",
            "",
            "`tok/s` = new tokens / wall time of the whole `generate` (prefill included); "
            "`decode tok/s` = (new − 1) / (time − time of a 1-token generate), the steady "
            "per-token rate. HF: `LlamaForCausalLM.generate(do_sample=False)` (SDPA, "
            "DynamicCache). "
            + (
                f"Tokens equal to HF's: **{'yes' if mod.get('tokens_equal') else 'NO'}**."
                if "tokens_equal" in mod
                else ""
            ),
            "",
        ]
        rows = impl_rows(
            mod,
            th,
            lambda s: [
                fmt_time(s["median_s"]),
                fmt(s["tokens_per_s"], 1),
                fmt(s["decode_tokens_per_s"], 1),
            ],
        )
        if HF in mod["threads"][str(th[0])]["impls"]:
            row = ["HF time / lk time"]
            for t in th:
                d = mod["threads"][str(t)]["impls"]
                row += [fmt(d[HF]["median_s"] / d[LK]["median_s"]), "", ""]
            rows.append(row)
        header = ["impl"] + [f"{t}T {h}" for t in th for h in ("time", "tok/s", "decode tok/s")]
        out += md_table(header, rows)
        out += ["", f"others: {others_cell(mod, th)}"]
    out.append("")
    return "\n".join(out)


# --------------------------------------------------------------------------------------
# entry points
# --------------------------------------------------------------------------------------


def run(
    quick: bool = False,
    *,
    quiet_wait: float | None = None,
    log: bool = True,
    torch_thp: bool = False,
) -> dict:
    """Run every case; returns the results (JSON-able) with the report under ``"markdown"``."""
    global torch, F, hf
    cfg, run_ = harness.start(QUICK if quick else FULL, quiet_wait, torch_thp=torch_thp, log=log)
    torch, F, hf = peers.torch, peers.F, peers.hf
    rng = np.random.default_rng(0)
    report = harness.new_report(cfg)
    try:
        run_.log("roofline probe")
        probe = harness.roofline_probe(
            cfg.threads,
            fma_iters=cfg.probe_n,
            triad_n=cfg.probe_n,
            triad_inner=5,
            repeats=cfg.probe_repeats,
            quiet_wait=cfg.quiet_wait,
            best=True,
        )
        report["probe"] = probe

        run_.log(f"TinyLlama-like block: prefill T={cfg.big_prefill_t}")
        big = BlockPeers(cfg.big, seed=1)
        report["big"] = {"shape": cfg.big.label()}
        report["big"]["prefill"] = case_prefill(
            big,
            cfg.big_prefill_t,
            cfg,
            probe,
            cfg.big_prefill_rounds,
            cfg.big_prefill_per_round,
            gemms=True,
            parts=True,
            rng=rng,
        )
        run_.log(f"TinyLlama-like block: decode, {cfg.big_decode_cache} cached")
        report["big"]["decode"] = case_decode(
            big, cfg.big_decode_cache, cfg.big_decode_steps, None, cfg, probe, rng, parts=True
        )
        del big
        gc.collect()

        run_.log("small block")
        small = BlockPeers(cfg.small, seed=2)
        report["small"] = {"shape": cfg.small.label()}
        per_round = max(1, cfg.small_prefill_repeats // 2)
        report["small"]["prefill"] = case_prefill(
            small, cfg.small_prefill_t, cfg, probe, 2, per_round, gemms=True, parts=True, rng=rng
        )
        report["small"]["decode"] = case_decode(
            small,
            cfg.small_decode_cache,
            cfg.small_decode_steps,
            cfg.small_decode_window,
            cfg,
            probe,
            rng,
        )
        del small
        gc.collect()

        run_.log("whole model: greedy generate")
        report["model"] = case_model(cfg, rng)
    finally:
        report["elapsed_s"] = run_.finish()
    run_.log("done")
    report["markdown"] = render(report)
    return report


def main(argv: Sequence[str] | None = None) -> int:
    """Run the benchmarks; print the markdown report and write blocks.md / blocks.json."""
    args = harness.arg_parser(__doc__, quiet_default="3").parse_args(argv)
    report = run(args.quick, quiet_wait=args.quiet_wait, torch_thp=args.torch_thp)
    print(report["markdown"])
    harness.write_report(args.out, "blocks", report, report["markdown"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
