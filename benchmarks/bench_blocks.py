#!/usr/bin/env python
"""Transformer blocks and a whole model: llmkernels vs HF ``transformers`` (torch CPU) vs NumPy.

Usage::

    python benchmarks/bench_blocks.py [--quick] [--out benchmarks/results]

or, from Python, ``bench_blocks.run(quick=True)`` (returns the results dict; its
``"markdown"`` entry is the printed report).

What it measures (float32, every peer in this process and run, 1 and 2 threads, medians of
repeated ``time.perf_counter`` timings after warm-up; DESIGN.md §5):

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

import argparse
import ctypes
import dataclasses
import gc
import json
import math
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import llmkernels as lk
import numpy as np

# Optional peers, imported by import_peers().
torch: Any = None
F: Any = None
hf: Any = None  # namespace of the transformers classes used here

LK = "llmkernels"
HF = "HF transformers"
NUMPY = "NumPy block"
NP_GEMM = "GEMMs only (NumPy BLAS)"
TORCH_GEMM = "GEMMs only (torch BLAS)"

Impls = dict[str, Callable[[], Any]]


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

FULL = Config(
    quick=False,
    threads=(1, 2),
    quiet_wait=3.0,
    cap_s=2.5,
    retry_max_s=15.0,
    probe_repeats=5,
    probe_n=50_000_000,
    big=TINYLLAMA,
    big_prefill_t=512,
    big_prefill_rounds=2,
    big_prefill_per_round=2,
    big_decode_cache=1024,
    big_decode_steps=30,
    small=SMALL,
    small_prefill_t=64,
    small_prefill_repeats=24,
    small_decode_cache=128,
    small_decode_steps=80,
    small_decode_window=None,
    model_layers=8,
    model_prompt=32,
    model_new_tokens=64,
    model_repeats=3,
)

QUICK = Config(
    quick=True,
    threads=(1, 2),
    quiet_wait=0.0,
    cap_s=1.0,
    retry_max_s=0.0,
    probe_repeats=1,
    probe_n=10_000_000,
    big=TINYLLAMA,
    big_prefill_t=128,
    big_prefill_rounds=1,
    big_prefill_per_round=2,
    big_decode_cache=256,
    big_decode_steps=6,
    small=SMALL,
    small_prefill_t=64,
    small_prefill_repeats=6,
    small_decode_cache=128,
    small_decode_steps=16,
    small_decode_window=None,
    model_layers=2,
    model_prompt=16,
    model_new_tokens=8,
    model_repeats=1,
)


def import_peers() -> None:
    """torch and transformers (extra ``bench``); without them only the NumPy peers run."""
    global torch, F, hf
    try:
        import torch as _torch
        import torch.nn.functional as _functional
    except ImportError:
        return
    torch, F = _torch, _functional
    try:
        from transformers import LlamaConfig, LlamaForCausalLM
        from transformers.cache_utils import DynamicCache
        from transformers.models.llama.modeling_llama import (
            LlamaDecoderLayer,
            LlamaRotaryEmbedding,
        )
    except ImportError:
        return

    class _HF:
        pass

    ns = _HF()
    ns.LlamaConfig, ns.LlamaForCausalLM = LlamaConfig, LlamaForCausalLM
    ns.DynamicCache = DynamicCache
    ns.LlamaDecoderLayer, ns.LlamaRotaryEmbedding = LlamaDecoderLayer, LlamaRotaryEmbedding
    hf = ns


# --------------------------------------------------------------------------------------
# threads, load, timing (the conventions of benchmarks/run.py)
# --------------------------------------------------------------------------------------


class NumpyBlasThreads:
    """Set the thread count of NumPy's bundled OpenBLAS via ctypes (no threadpoolctl)."""

    def __init__(self) -> None:
        self._set: Callable[[int], Any] | None = None
        self.path: str | None = None
        np.ones((2, 2), np.float32) @ np.ones((2, 2), np.float32)  # make sure it is loaded
        try:
            with open("/proc/self/maps") as maps:
                paths = {line.split()[-1] for line in maps if "openblas" in line.lower()}
        except OSError:
            paths = set()
        for path in sorted(paths):
            if "numpy" not in path:
                continue  # llmkernels' own OpenBLAS is set by lk.set_num_threads
            lib = ctypes.CDLL(path)
            for symbol in (
                "scipy_openblas_set_num_threads64_",
                "openblas_set_num_threads64_",
                "openblas_set_num_threads",
            ):
                if hasattr(lib, symbol):
                    self._set, self.path = getattr(lib, symbol), path
                    return

    @property
    def controlled(self) -> bool:
        return self._set is not None

    def corename(self) -> str | None:
        """The kernel set NumPy's OpenBLAS chose (``Haswell``, ``SkylakeX``, ...)."""
        if self.path is None:
            return None
        lib = ctypes.CDLL(self.path)
        for symbol in (
            "scipy_openblas_get_corename64_",
            "openblas_get_corename64_",
            "openblas_get_corename",
        ):
            if hasattr(lib, symbol):
                fn = getattr(lib, symbol)
                fn.restype = ctypes.c_char_p
                return fn().decode()
        return None

    def __call__(self, n: int) -> None:
        if self._set is not None:
            self._set(ctypes.c_int(n))


NUMPY_BLAS_THREADS: NumpyBlasThreads | None = None


def set_threads(n: int) -> None:
    """``n`` threads in llmkernels (+ its OpenBLAS), torch and NumPy's BLAS."""
    lk.set_num_threads(n)
    if torch is not None:
        torch.set_num_threads(n)
    if NUMPY_BLAS_THREADS is not None:
        NUMPY_BLAS_THREADS(n)


class OtherLoad:
    """CPUs kept busy by other processes during a ``with`` block (``/proc/stat`` minus own)."""

    def __init__(self) -> None:
        self.cpus: float | None = None

    @staticmethod
    def _system_busy_s() -> float | None:
        try:
            with open("/proc/stat") as f:
                fields = [int(v) for v in f.readline().split()[1:]]
        except (OSError, ValueError):
            return None
        idle = fields[3] + (fields[4] if len(fields) > 4 else 0)
        return (sum(fields[:8]) - idle) / os.sysconf("SC_CLK_TCK")

    @staticmethod
    def _own_s() -> float:
        t = os.times()
        return t.user + t.system

    def __enter__(self) -> OtherLoad:
        self._busy0, self._own0, self._t0 = self._system_busy_s(), self._own_s(), time.time()
        return self

    def __exit__(self, *exc: object) -> None:
        busy1, wall = self._system_busy_s(), time.time() - self._t0
        if busy1 is not None and self._busy0 is not None and wall > 0:
            other = (busy1 - self._busy0) - (self._own_s() - self._own0)
            self.cpus = max(0.0, other / wall)


@contextmanager
def no_gc() -> Iterator[None]:
    enabled = gc.isenabled()
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


@contextmanager
def inference() -> Iterator[None]:
    """``torch.inference_mode`` when torch is there (HF's generate uses it too)."""
    if torch is None:
        yield
    else:
        with torch.inference_mode():
            yield


def wait_for_quiet(max_wait: float, threshold: float = 0.25, window: float = 0.5) -> None:
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < max_wait:
        with OtherLoad() as load:
            time.sleep(window)
        if load.cpus is None or load.cpus < threshold:
            break


def measure(
    impls: Impls,
    rounds: int,
    per_round: int,
    warmup: int = 1,
    setup: dict[str, Callable[[], Any]] | None = None,
    cap_s: float = math.inf,
) -> dict[str, list[float]]:
    """``rounds`` rounds; in each, every peer runs ``warmup`` untimed calls, then
    ``per_round`` timed ones (fewer once they took ``cap_s`` seconds, but at least 2: a peer
    slowed down many times by other processes must not stall the run). ``setup[name]``
    (untimed) runs before each of that peer's calls. Returns seconds per call."""
    setup = setup or {}
    samples: dict[str, list[float]] = {name: [] for name in impls}
    with no_gc(), inference():
        for _ in range(rounds):
            for name, fn in impls.items():
                prep = setup.get(name)
                for _ in range(warmup):
                    if prep is not None:
                        prep()
                    fn()
                spent = 0.0
                for i in range(per_round):
                    if i >= 2 and spent > cap_s:
                        break
                    if prep is not None:
                        prep()
                    t0 = time.perf_counter()
                    fn()
                    dt = time.perf_counter() - t0
                    samples[name].append(dt)
                    spent += dt
    return samples


def measure_quietly(
    impls: Impls,
    cfg: Config,
    rounds: int,
    per_round: int,
    warmup: int = 1,
    setup: dict[str, Callable[[], Any]] | None = None,
) -> tuple[dict[str, list[float]], float | None]:
    """:func:`measure` after waiting (at most ``cfg.quiet_wait`` s) for an idle machine;
    measured once more if other processes kept more than half a CPU busy meanwhile (unless
    ``quiet_wait`` is 0 or the attempt took over ``cfg.retry_max_s``). Returns the quieter
    attempt's samples and the CPUs other processes used during it."""
    best: tuple[dict[str, list[float]], float | None] | None = None
    for _ in range(2 if cfg.quiet_wait > 0 else 1):
        wait_for_quiet(cfg.quiet_wait)
        t0 = time.perf_counter()
        with OtherLoad() as load:
            samples = measure(impls, rounds, per_round, warmup, setup, cfg.cap_s)
        if best is None or (load.cpus or 0.0) < (best[1] or 0.0):
            best = (samples, load.cpus)
        if (load.cpus or 0.0) <= 0.5 or time.perf_counter() - t0 > cfg.retry_max_s:
            break
    assert best is not None
    return best


# --------------------------------------------------------------------------------------
# roofline probe
# --------------------------------------------------------------------------------------


def roofline_probe(cfg: Config) -> dict[str, Any]:
    """fp32 FMA peak (GFLOP/s) and triad bandwidth (GB/s) per thread count, measured by the
    extension (``_probe_fma_gflops``, ``_probe_triad_gbs``)."""
    core = lk._core
    core._probe_fma_gflops(1, cfg.probe_n)  # clock ramp-up
    fma: dict[int, list[float]] = {t: [] for t in cfg.threads}
    triad: dict[int, list[float]] = {t: [] for t in cfg.threads}
    wait_for_quiet(cfg.quiet_wait)
    with OtherLoad() as load:
        for _ in range(cfg.probe_repeats):
            for t in cfg.threads:
                fma[t].append(core._probe_fma_gflops(t, cfg.probe_n))
                triad[t].append(core._probe_triad_gbs(t, cfg.probe_n, 5))
    # The best of the repeats (the triad probe is itself best-of-5): a peak is a maximum, and on
    # this shared machine other processes only ever lower it -- a busy second core makes the
    # 2-thread FMA number fall to the 1-thread one, which would inflate every 2T fraction.
    return {
        "fma_gflops": {str(t): max(v) for t, v in fma.items()},
        "triad_gbs": {str(t): max(v) for t, v in triad.items()},
        "fma_samples": {str(t): v for t, v in fma.items()},
        "triad_samples": {str(t): v for t, v in triad.items()},
        "other_processes_cpus": load.cpus,
    }


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


def rope_tables(head_dim: int, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``cos, sin`` of shape ``(T, head_dim/2)`` (angles in float64, like llmkernels)."""
    inv_freq = lk.rope_inv_freq(head_dim, 10000.0)
    ang = np.outer(positions.astype(np.float64), inv_freq)
    return np.cos(ang).astype(np.float32), np.sin(ang).astype(np.float32)


def numpy_rms(x: np.ndarray, w: np.ndarray, eps: float = 1e-5) -> np.ndarray:
    return x / np.sqrt(np.mean(x * x, -1, keepdims=True) + np.float32(eps)) * w


def numpy_block(
    x: np.ndarray, w: Weights, cos: np.ndarray, sin: np.ndarray, mask: np.ndarray
) -> np.ndarray:
    """One pre-norm LLaMA block in float32 NumPy for ``x (T, dim)`` (B = 1): fused QKV and
    gate/up matmuls on NumPy's BLAS, half-split RoPE with precomputed ``cos``/``sin``
    ``(T, hd/2)``, GQA softmax attention with an additive causal ``mask (T, T)``, SwiGLU."""
    s = w.shape
    t = x.shape[0]
    hq, hkv, hd = s.n_heads, s.n_kv_heads, s.head_dim
    qkv = numpy_rms(x, w.n1) @ w.wqkv.T
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
    gu = numpy_rms(h, w.n2) @ w.wgu.T
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


def rel_diff(a: Any, b: Any) -> float:
    """``max|a - b| / max|b|``."""
    a = a.numpy() if torch is not None and isinstance(a, torch.Tensor) else np.asarray(a)
    b = b.numpy() if torch is not None and isinstance(b, torch.Tensor) else np.asarray(b)
    return float(np.max(np.abs(a.astype(np.float64) - b)) / max(float(np.max(np.abs(b))), 1e-30))


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


def stats_for(
    samples: dict[str, list[float]], work: float | None, roof_value: float | None
) -> dict[str, dict[str, Any]]:
    lk_med = statistics.median(samples[LK]) if LK in samples else None
    out = {}
    for name, s in samples.items():
        med = statistics.median(s)
        entry: dict[str, Any] = {"median_s": med, "min_s": min(s), "samples_s": s}
        if work is not None:
            entry["rate"] = work / med / 1e9
            if roof_value:
                entry["fraction_of_roof"] = entry["rate"] / roof_value
        if lk_med:
            entry["time_vs_llmkernels"] = med / lk_med
        out[name] = entry
    return out


def check(name: str, diffs: dict[str, float], limit: float = 1e-3) -> None:
    for peer, d in diffs.items():
        if not d <= limit:
            print(
                f"WARNING: {name}: {peer} differs from llmkernels by {d:.2e} (rel)", file=sys.stderr
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
    cos, sin = rope_tables(shape.head_dim, np.arange(t))
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
    diffs = {k: rel_diff(v, ref) for k, v in results.items() if k != LK}
    # the residual dominates y; compare the block's contribution y - x as well
    diffs_delta = {k: rel_diff(np.asarray(v) - x, ref - x) for k, v in results.items() if k != LK}
    check(f"prefill T={t}", diffs)
    check(f"prefill T={t} (y - x)", diffs_delta)
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
        set_threads(n)
        samples, others = measure_quietly(impls, cfg, rounds, per_round)
        st = stats_for(samples, flops / 1e0, probe["fma_gflops"][str(n)])
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
            with OtherLoad() as load:
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
    samples = measure(flat, rounds, per_round, cap_s=min(cfg.cap_s, 1.0))
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
                    past_key_values=cache,
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
                past_key_values=cache,
                use_cache=True,
                position_embeddings=(cos_all[:, p : p + 1], sin_all[:, p : p + 1]),
            )

        hf_stepper = Stepper(hf_prefill, hf_step, window)
        steppers[HF] = hf_stepper

    # check: first step of each peer after its prefill, against llmkernels
    first = {}
    with inference():
        for name, s in steppers.items():
            s.prepare()
            first[name] = s()
    diffs = {k: rel_diff(v, first[LK]) for k, v in first.items() if k != LK}
    diffs_delta = {
        k: rel_diff(np.asarray(v) - tok, first[LK] - tok) for k, v in first.items() if k != LK
    }
    check(f"decode (cache {cache_len})", diffs)
    check(f"decode (cache {cache_len}) (y - x)", diffs_delta)
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
        set_threads(n)
        samples, others = measure_quietly(impls, cfg, rounds, per_round, warmup, setup)
        mean_len = statistics.mean(lk_stepper.lengths) if lk_stepper.lengths else cache_len
        lk_stepper.lengths.clear()
        if HF in steppers:
            steppers[HF].lengths.clear()
        kv_bytes = 2.0 * shape.n_kv_heads * (mean_len + 1) * shape.head_dim * 4
        st = stats_for(samples, weight_bytes + kv_bytes, probe["triad_gbs"][str(n)])
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
            with OtherLoad() as load:
                ps = measure(part_impls, rounds, per_round, warmup, part_setup, min(cfg.cap_s, 1.0))
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
    flush_buf = np.ones(2 * llc_bytes() // 4, np.float32)

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
                    past_key_values=st["hf"],
                    position_embeddings=(cos_all[:, :cache_len], sin_all[:, :cache_len]),
                )

        def hf_attn_step() -> Any:
            p = st["hf"].get_seq_length()
            return sa(
                hidden_states=tok_t,
                past_key_values=st["hf"],
                position_embeddings=(cos_all[:, p : p + 1], sin_all[:, p : p + 1]),
            )

        hf_attn = Stepper(hf_attn_prefill, hf_attn_step, window)
        add(f"attention module (with cache)\0{HF}", hf_attn, hf_attn.prepare)
        add(f"feed-forward module\0{HF}", lambda: mlp(tok_t))
    return impls, setup


def llc_bytes() -> int:
    """Size of the largest CPU cache (sysfs), 32 MiB if unknown."""
    best = 0
    for path in Path("/sys/devices/system/cpu/cpu0/cache").glob("index*/size"):
        try:
            text = path.read_text().strip().upper()
            mult = {"K": 1024, "M": 1024**2, "G": 1024**3}.get(text[-1], 1)
            best = max(best, int(text.rstrip("KMG")) * mult)
        except (OSError, ValueError, IndexError):
            continue
    return best or 32 * 1024**2


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
        with inference():
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
        set_threads(n)
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


def fmt(v: float | None, digits: int = 2) -> str:
    if v is None:
        return "-"
    if v != 0 and abs(v) < 10**-digits:
        return f"{v:.1e}"
    return f"{v:.{digits}f}"


def fmt_time(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("us", 1e-6)):
        if abs(seconds) >= scale:
            return f"{seconds / scale:.3g} {unit}"
    return f"{seconds / 1e-9:.3g} ns"


def md_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join(" --- " for _ in header) + "|"]
    return lines + ["| " + " | ".join(r) + " |" for r in rows]


def others_str(case: dict[str, Any], threads: Sequence[int]) -> str:
    vals = [case["threads"][str(t)]["other_processes_cpus"] for t in threads]
    return " / ".join("-" if v is None else f"{v:.1f}" for v in vals)


def parts_others(case: dict[str, Any], threads: Sequence[int]) -> str:
    vals = [case["threads"][str(t)].get("parts_other_processes_cpus") for t in threads]
    return " / ".join("-" if v is None else f"{v:.1f}" for v in vals)


def peer_table(case: dict[str, Any], threads: Sequence[int], unit: str) -> list[str]:
    names = list(case["threads"][str(threads[0])]["impls"])
    rows = []
    for name in names:
        row = [name]
        for t in threads:
            s = case["threads"][str(t)]["impls"][name]
            row += [
                fmt_time(s["median_s"]),
                fmt(s.get("rate"), 1),
                f"{100 * s['fraction_of_roof']:.0f}%" if "fraction_of_roof" in s else "-",
                fmt(s.get("time_vs_llmkernels")),
            ]
        lo, hi = str(min(threads)), str(max(threads))
        row.append(
            fmt(
                case["threads"][lo]["impls"][name]["median_s"]
                / case["threads"][hi]["impls"][name]["median_s"]
            )
        )
        rows.append(row)
    header = ["impl"]
    for t in threads:
        header += [f"{t}T time", f"{t}T {unit}", f"{t}T roof", f"{t}T x lk"]
    header.append("1T/2T")
    return md_table(header, rows)


def render(report: dict[str, Any], cfg: Config) -> str:
    m, p = report["machine"], report["probe"]
    th = list(cfg.threads)
    out = [
        f"# llmkernels blocks{' (--quick)' if cfg.quick else ''}",
        "",
        f"- {m['cpu']}, {m['cpu_count']} CPUs; load average at start "
        f"{', '.join(f'{x:.2f}' for x in m['load_average_at_start'])}; {m['date']}",
        f"- llmkernels {m['build_info']['version']} ({m['build_info']['simd_arch']}, "
        f"{m['build_info']['blas']})",
        f"- Python {m['python']}, NumPy {m['numpy']} ({m['numpy_blas']}), torch {m['torch']} "
        f"({m['torch_blas']}), transformers {m['transformers']}",
        f"- OpenBLAS kernels: llmkernels' {m['llmkernels_openblas_core']}, NumPy's "
        f"{m['numpy_openblas_core']} (OPENBLAS_CORETYPE={m['OPENBLAS_CORETYPE'] or 'unset'}); "
        "`Haswell` is the AVX2 kernel set, at most half the AVX-512 FMA peak",
        f"- roofline (best of {cfg.probe_repeats}): FMA peak "
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
            f"{fmt(pre['attention_flops'] / 1e9, 2)}; others {others_str(pre, th)})",
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
                f"median; others {parts_others(pre, th)})",
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
        t0 = dec["threads"][str(th[0])]
        out += [
            "",
            f"### Decode step, B = 1, {dec['cache_tokens']} cached tokens "
            f"(consecutive steps, mean {t0['mean_cached_tokens']:.0f} cached; others "
            f"{others_str(dec, th)})",
            "",
            f"GB/s counts the block's weights ({dec['weight_bytes'] / 2**20:.1f} MiB) plus the "
            f"K/V read ({t0['kv_bytes'] / 2**20:.2f} MiB); the GEMV row (the four projections "
            "as NumPy matrix-vector products) counts the weights only"
            + (
                f". The weights fit in the last-level cache ({llc_bytes() / 2**20:.0f} MiB), so "
                "repeated steps of this one block read them from cache: rates above the triad "
                "bandwidth are expected (a model's layers together would not fit)"
                if dec["weight_bytes"] < llc_bytes()
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
                f"{parts_others(dec, th)})",
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
        rows = []
        names = list(mod["threads"][str(th[0])]["impls"])
        for name in names:
            row = [name]
            for t in th:
                s = mod["threads"][str(t)]["impls"][name]
                row += [
                    fmt_time(s["median_s"]),
                    fmt(s["tokens_per_s"], 1),
                    fmt(s["decode_tokens_per_s"], 1),
                ]
            rows.append(row)
        if HF in names:
            row = ["HF time / lk time"]
            for t in th:
                d = mod["threads"][str(t)]["impls"]
                row += [fmt(d[HF]["median_s"] / d[LK]["median_s"]), "", ""]
            rows.append(row)
        header = ["impl"] + [f"{t}T {h}" for t in th for h in ("time", "tok/s", "decode tok/s")]
        out += md_table(header, rows)
        out += ["", f"others: {others_str(mod, th)}"]
    out.append("")
    return "\n".join(out)


def _lk_openblas_core() -> str | None:
    """The kernel set of the extension's OpenBLAS (the word before ``MAX_THREADS``)."""
    words = lk.build_info().get("blas", "").split()
    return (
        words[words.index(next(w for w in words if w.startswith("MAX_THREADS"))) - 1]
        if any(w.startswith("MAX_THREADS") for w in words)
        else None
    )


def machine_info() -> dict[str, Any]:
    cpu = platform.processor()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name"))
    except (OSError, StopIteration):
        pass
    numpy_blas = "?"
    try:
        cfg = np.show_config(mode="dicts")  # type: ignore[call-arg]
        b = cfg["Build Dependencies"]["blas"]
        numpy_blas = f"{b.get('name')} {b.get('version')}"
    except Exception:  # noqa: BLE001 - informational only
        pass
    torch_blas = None
    if torch is not None:
        show = torch.__config__.show()
        torch_blas = "MKL" if "BLAS_INFO=mkl" in show else "see torch.__config__.show()"
    transformers_version = None
    try:
        import transformers

        transformers_version = transformers.__version__
    except ImportError:
        pass
    return {
        "build_info": lk.build_info(),
        "cpu": cpu,
        "cpu_count": os.cpu_count(),
        "platform": platform.platform(),
        "python": sys.version.split()[0],
        "numpy": np.__version__,
        "numpy_blas": numpy_blas,
        "numpy_openblas_core": NUMPY_BLAS_THREADS.corename() if NUMPY_BLAS_THREADS else None,
        "llmkernels_openblas_core": _lk_openblas_core(),
        "OPENBLAS_CORETYPE": os.environ.get("OPENBLAS_CORETYPE"),
        "numpy_blas_threads_controlled": bool(NUMPY_BLAS_THREADS and NUMPY_BLAS_THREADS.controlled),
        "torch": torch.__version__ if torch is not None else None,
        "torch_blas": torch_blas,
        "transformers": transformers_version,
        "load_average_at_start": os.getloadavg(),
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
    }


# --------------------------------------------------------------------------------------
# entry points
# --------------------------------------------------------------------------------------


def run(quick: bool = False, *, quiet_wait: float | None = None, log: bool = True) -> dict:
    """Run every case; returns the results (JSON-able) with the report under ``"markdown"``."""
    global NUMPY_BLAS_THREADS
    import_peers()
    if NUMPY_BLAS_THREADS is None:
        NUMPY_BLAS_THREADS = NumpyBlasThreads()
    gc.collect()
    gc.freeze()  # torch/transformers objects: keep gc.collect() in no_gc() cheap
    cfg = QUICK if quick else FULL
    threads = tuple(t for t in cfg.threads if t <= (os.cpu_count() or 1)) or (1,)
    cfg = dataclasses.replace(
        cfg, threads=threads, quiet_wait=cfg.quiet_wait if quiet_wait is None else quiet_wait
    )
    start = time.perf_counter()

    def say(msg: str) -> None:
        if log:
            print(f"[{time.perf_counter() - start:6.1f} s] {msg}", file=sys.stderr, flush=True)

    threads_before = lk.get_num_threads()
    torch_threads_before = torch.get_num_threads() if torch is not None else None
    rng = np.random.default_rng(0)
    report: dict[str, Any] = {"machine": machine_info(), "config": dataclasses.asdict(cfg)}
    try:
        say("roofline probe")
        probe = roofline_probe(cfg)
        report["probe"] = probe

        say(f"TinyLlama-like block: prefill T={cfg.big_prefill_t}")
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
        say(f"TinyLlama-like block: decode, {cfg.big_decode_cache} cached")
        report["big"]["decode"] = case_decode(
            big,
            cfg.big_decode_cache,
            cfg.big_decode_steps,
            None,
            cfg,
            probe,
            rng,
            parts=True,
        )
        del big
        gc.collect()

        say("small block")
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

        say("whole model: greedy generate")
        report["model"] = case_model(cfg, rng)
    finally:
        lk.set_num_threads(threads_before)
        if torch is not None:
            torch.set_num_threads(torch_threads_before)
        NUMPY_BLAS_THREADS(os.cpu_count() or 1)
    report["elapsed_s"] = time.perf_counter() - start
    say("done")
    report["markdown"] = render(report, cfg)
    return report


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="short sequences, few repeats")
    parser.add_argument(
        "--out",
        type=Path,
        default=Path("benchmarks/results"),
        help="output directory (default: benchmarks/results)",
    )
    parser.add_argument(
        "--quiet-wait",
        type=float,
        default=None,
        help="max seconds to wait for other processes to go idle before each "
        "measurement (default: 5, 0 with --quick)",
    )
    args = parser.parse_args(argv)
    report = run(args.quick, quiet_wait=args.quiet_wait)
    text = report["markdown"]
    print(text)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "blocks.md").write_text(text)
    data = {k: v for k, v in report.items() if k != "markdown"}
    (args.out / "blocks.json").write_text(json.dumps(data, indent=1, default=str) + "\n")
    print(f"wrote {args.out / 'blocks.md'} and {args.out / 'blocks.json'}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
