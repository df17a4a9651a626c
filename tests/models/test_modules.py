"""The C++ modules (``RMSNorm``, ``LayerNorm``, ``FeedForward``, ``MultiHeadAttention``,
``TransformerBlock``, ``Transformer``, ``KVCache``/``ModelCache``) against their NumPy reference
twins (``llmkernels.reference``) and against Hugging Face ``transformers`` (``LlamaDecoderLayer``,
``LlamaForCausalLM`` saved with ``save_pretrained`` and read back with
``Transformer.from_pretrained``, ``generate``).

Tolerances (conftest.py): the modules compute in float32 and are compared with the float64
reference fed the same float32 weights at ``rtol=2e-5, atol=1e-6`` (norms) and
``rtol=1e-4, atol=1e-5`` (attention, feed-forward and block outputs). Logits are compared with
an absolute tolerance relative to the logit scale (``max |logit|``), greedy tokens must be equal.

HF details for transformers 5.x used here:

- ``LlamaDecoderLayer(config, layer_idx=0)`` returns a tensor (no tuple) and needs
  ``position_embeddings=(cos, sin)`` from ``LlamaRotaryEmbedding(config)(x, position_ids)``.
  Its attention implementation is read from ``config._attn_implementation``: left ``None`` it
  falls back to eager, which with ``attention_mask=None`` is *not* causal, so it is set to
  ``"sdpa"`` (causal when no mask is given).
- ``LlamaConfig(rope_parameters={"rope_type": ..., "rope_theta": ..., ...})`` is the 5.x
  spelling of ``rope_theta``/``rope_scaling``; ``config.to_dict()`` is what
  ``TransformerBlock.from_config`` / ``ModelConfig.from_dict`` read.
- ``save_pretrained`` always writes safetensors in 5.x (``safe_serialization`` is gone; it
  would be swallowed by ``**kwargs``); ``max_shard_size="30KB"`` shards with an index.
- ``generate(do_sample=False, max_new_tokens=n, attention_mask=...)`` stops early on
  ``eos_token_id``; the configs set ``bos/eos/pad_token_id=None`` so it never does.
- ``model(ids, use_cache=True).past_key_values`` is a ``DynamicCache`` whose
  ``.layers[i].keys`` / ``.values`` are ``(B, Hkv, T, head_dim)`` (keys already rotated).
"""

from __future__ import annotations

import json
import os
import re
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import llmkernels as lk
import numpy as np
import pytest
import torch
from _models import hf_block_config, hf_greedy, llama3_scaling, numpy_state, t
from llmkernels import reference as ref
from transformers import LlamaConfig, LlamaForCausalLM
from transformers.models.llama.modeling_llama import LlamaDecoderLayer, LlamaRotaryEmbedding

NORM_TOL = {"rtol": 2e-5, "atol": 1e-6}
BLOCK_TOL = {"rtol": 1e-4, "atol": 1e-5}
LOGIT_RTOL = 2e-5  # atol = LOGIT_RTOL * max |logit| (measured errors: ~5e-7 of the scale)

LLAMA3 = llama3_scaling(16)  # short, so the test positions cross the bands
ROPES: dict[str, tuple[float, dict | None]] = {
    "theta1e4": (10000.0, None),
    "llama3": (500000.0, LLAMA3),
}
# (dim, n_heads, head_dim, hidden): odd sizes with dim != n_heads * head_dim, and LLaMA-like
GEOMETRIES = {"d48hd16": (48, 4, 16, 70), "d64": (64, 4, 16, 96)}


# --------------------------------------------------------------------------------------------
# helpers
# --------------------------------------------------------------------------------------------


def _values(key: str, shape: tuple[int, ...], rng: np.random.Generator) -> np.ndarray:
    """O(1)-output weights (HF's std-0.02 init makes every layer nearly the identity)."""
    if len(shape) == 1:
        if key.endswith("bias"):
            return 0.2 * rng.standard_normal(shape)
        return 1.0 + 0.2 * rng.standard_normal(shape)  # norm weights
    if "embed_tokens" in key:
        return rng.standard_normal(shape)
    return rng.standard_normal(shape) / np.sqrt(shape[1])  # (out, in)


def randomize(module: Any, seed: int) -> None:
    """Fill an llmkernels module's weights in place through its zero-copy state_dict."""
    rng = np.random.default_rng(seed)
    for key, arr in module.state_dict().items():
        arr[...] = _values(key, arr.shape, rng)


def randomize_torch(module: torch.nn.Module, seed: int) -> None:
    rng = np.random.default_rng(seed)
    with torch.no_grad():
        for key, p in module.named_parameters():
            p.copy_(torch.from_numpy(_values(key, tuple(p.shape), rng)))


def snapshot(module: Any) -> dict[str, np.ndarray]:
    return {k: v.copy() for k, v in module.state_dict().items()}


def assert_logits_close(got: np.ndarray, expected: np.ndarray) -> None:
    assert got.shape == expected.shape
    scale = float(np.abs(expected).max())
    np.testing.assert_allclose(got, expected, rtol=LOGIT_RTOL, atol=LOGIT_RTOL * scale)


def block_config(
    geometry: str = "d48hd16",
    n_kv_heads: int = 2,
    rope: str = "theta1e4",
    **extra: Any,
) -> dict[str, Any]:
    """A canonical config dict (ModelConfig names, also what the reference reads)."""
    dim, n_heads, head_dim, hidden = GEOMETRIES[geometry]
    theta, scaling = ROPES[rope]
    cfg = {
        "dim": dim,
        "n_heads": n_heads,
        "n_kv_heads": n_kv_heads,
        "head_dim": head_dim,
        "hidden_dim": hidden,
        "norm_eps": 1e-5,
        "rope_theta": theta,
        "rope_scaling": scaling,
    }
    cfg.update(extra)
    return cfg


def make_block(cfg: Mapping[str, Any], seed: int = 0) -> lk.TransformerBlock:
    block = lk.TransformerBlock.from_config(cfg, seed=seed)
    randomize(block, seed + 100)
    return block


def model_config(**extra: Any) -> dict[str, Any]:
    cfg = block_config("d48hd16", 2, "llama3", n_layers=2, vocab_size=211)
    cfg.update(extra)
    return cfg


def make_model(cfg: Mapping[str, Any], seed: int = 0) -> lk.Transformer:
    model = lk.Transformer(cfg, seed=seed)
    randomize(model, seed + 100)
    return model


def ref_attention(
    x: np.ndarray,
    w: Mapping[str, np.ndarray],
    n_heads: int,
    n_kv_heads: int,
    head_dim: int,
    *,
    theta: float = 10000.0,
    scaling: dict | None = None,
    bias: bool = False,
    positions: np.ndarray | None = None,
) -> np.ndarray:
    """Causal LLaMA self-attention from the public reference formulas (float64)."""
    b, n, _ = x.shape

    def lin(u: np.ndarray, name: str) -> np.ndarray:
        y = u @ w[name + ".weight"].astype(np.float64).T
        return y + w[name + ".bias"] if bias else y

    def heads(u: np.ndarray, h: int) -> np.ndarray:
        return u.reshape(b, n, h, head_dim).transpose(0, 2, 1, 3)

    q = heads(lin(x, "q_proj"), n_heads)
    k = heads(lin(x, "k_proj"), n_kv_heads)
    v = heads(lin(x, "v_proj"), n_kv_heads)
    inv_freq = ref.rope_inv_freq(head_dim, theta, scaling)
    factor = ref.rope_attention_factor(scaling)
    pos = np.arange(n) if positions is None else positions[:, None, :]
    q = ref.rope(q, pos, inv_freq=inv_freq, attention_factor=factor)
    k = ref.rope(k, pos, inv_freq=inv_freq, attention_factor=factor)
    o = ref.attention(q, k, v, causal=True)
    return lin(o.transpose(0, 2, 1, 3).reshape(b, n, n_heads * head_dim), "o_proj")


# --------------------------------------------------------------------------------------------
# 1. each module against its reference twin
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dim", [1, 7, 48, 67])
def test_rms_norm_module(dim, isa, rng):
    norm = lk.RMSNorm(dim, eps=1e-5)
    assert norm.dim == dim and norm.eps == pytest.approx(1e-5)
    np.testing.assert_array_equal(norm.state_dict()["weight"], np.ones(dim, np.float32))
    randomize(norm, 1)
    x = rng.standard_normal((3, 5, dim))
    y = norm(x)
    assert y.dtype == np.float32 and y.shape == x.shape
    expected = ref.rms_norm(x.astype(np.float32), norm.state_dict()["weight"], 1e-5)
    np.testing.assert_allclose(y, expected, **NORM_TOL)
    np.testing.assert_allclose(norm(x[0, 0]), expected[0, 0], **NORM_TOL)  # 1-D input


@pytest.mark.parametrize("bias", [True, False], ids=["bias", "nobias"])
@pytest.mark.parametrize("dim", [1, 7, 48, 67])
def test_layer_norm_module(dim, bias, isa, rng):
    norm = lk.LayerNorm(dim, eps=1e-5, bias=bias)
    assert set(norm.state_dict()) == ({"weight", "bias"} if bias else {"weight"})
    randomize(norm, 2)
    x = rng.standard_normal((3, 5, dim)).astype(np.float32) + 3.0  # a mean to remove
    w = norm.state_dict()
    expected = ref.layer_norm(x, w["weight"], w.get("bias"), 1e-5)
    y = norm(x)
    assert y.dtype == np.float32
    np.testing.assert_allclose(y, expected, **NORM_TOL)


@pytest.mark.parametrize("bias", [False, True], ids=["nobias", "bias"])
@pytest.mark.parametrize(("dim", "hidden"), [(48, 70), (64, 96), (5, 3)])
def test_feed_forward_module(dim, hidden, bias, isa, rng):
    ff = lk.FeedForward(dim, hidden, bias=bias, seed=0)
    assert (ff.dim, ff.hidden_dim) == (dim, hidden)
    w = ff.state_dict()
    assert w["gate_proj.weight"].shape == (hidden, dim)
    assert w["down_proj.weight"].shape == (dim, hidden)
    randomize(ff, 3)
    x = rng.standard_normal((2, 9, dim)).astype(np.float32)
    kw = {}
    if bias:
        kw = {
            "b_gate": w["gate_proj.bias"],
            "b_up": w["up_proj.bias"],
            "b_down": w["down_proj.bias"],
        }
    expected = ref.swiglu_ffn(
        x, w["gate_proj.weight"].T, w["up_proj.weight"].T, w["down_proj.weight"].T, **kw
    )
    y = ff(x)
    assert y.dtype == np.float32 and y.shape == x.shape
    np.testing.assert_allclose(y, expected, **BLOCK_TOL)
    np.testing.assert_allclose(ff(x[1, 3]), expected[1, 3], **BLOCK_TOL)  # any leading shape


def feed_forward_across_threads(dim, hidden, shape, rng):
    """A randomized FeedForward on x of `shape`: against the reference, and bitwise equal for 1
    and 2 threads. Returns (module, x, expected)."""
    ff = lk.FeedForward(dim, hidden, seed=0)
    randomize(ff, 4)
    w = ff.state_dict()
    x = rng.standard_normal(shape).astype(np.float32)
    expected = ref.swiglu_ffn(
        x, w["gate_proj.weight"].T, w["up_proj.weight"].T, w["down_proj.weight"].T
    )
    results = []
    for n in (1, 2):
        lk.set_num_threads(n)
        results.append(ff(x))
    np.testing.assert_allclose(results[0], expected, **BLOCK_TOL)
    np.testing.assert_array_equal(results[0], results[1])
    return ff, x, expected


@pytest.mark.parametrize(("dim", "hidden"), [(1, 7), (7, 31), (31, 33), (33, 1), (1025, 67)])
def test_feed_forward_single_token_tails(dim, hidden, isa, threads, rng):
    """One token takes the matrix-vector path (the decode projections): every SIMD tail of the
    input length and of the row count, against the reference, bitwise equal for 1 and 2 threads."""
    ff, x, expected = feed_forward_across_threads(dim, hidden, (dim,), rng)
    # the same token inside a batch goes through the matrix-matrix path
    np.testing.assert_allclose(ff(np.stack([x, x]))[1], expected, **BLOCK_TOL)


# Token counts around each projection path's edges: matrix-vector groups of 4 tokens (1-8),
# packed tokens in vectors of 4/8/16 and panels of 64 (9-511), the BLAS (>= 512).
PROJECTION_TOKENS = [2, 3, 4, 5, 8, 9, 15, 16, 17, 33, 63, 64, 65, 100, 511, 512]


@pytest.mark.parametrize("tokens", PROJECTION_TOKENS)
@pytest.mark.parametrize(("dim", "hidden"), [(7, 31), (33, 2049)])
def test_feed_forward_token_counts(tokens, dim, hidden, isa, threads, rng):
    """Every projection path and its tails (tokens, features not a multiple of the register
    block, an input length past the k chunk of 2048) against the reference, bitwise equal for 1
    and 2 threads."""
    feed_forward_across_threads(dim, hidden, (tokens, dim), rng)


@pytest.mark.parametrize("tokens", [5, 9, 33, 65, 130])
def test_block_token_counts(tokens, isa, rng):
    """The residual adds fused into the output projections (accumulating into y) on every
    projection path."""
    cfg = block_config("d48hd16", 2, "llama3", attention_bias=True, mlp_bias=True)
    block = make_block(cfg)
    x = rng.standard_normal((1, tokens, cfg["dim"])).astype(np.float32)
    expected = ref.transformer_block(x, block.state_dict(), cfg)
    np.testing.assert_allclose(block(x), expected, **BLOCK_TOL)


@pytest.mark.parametrize("bias", [False, True], ids=["nobias", "bias"])
@pytest.mark.parametrize("rope", list(ROPES))
@pytest.mark.parametrize("n_kv_heads", [1, 2, 4])
@pytest.mark.parametrize("geometry", list(GEOMETRIES))
def test_multi_head_attention_module(geometry, n_kv_heads, rope, bias, isa, rng):
    dim, n_heads, head_dim, _ = GEOMETRIES[geometry]
    theta, scaling = ROPES[rope]
    attn = lk.MultiHeadAttention(
        dim, n_heads, n_kv_heads, head_dim, rope_theta=theta, rope_scaling=scaling, bias=bias,
        seed=0,
    )  # fmt: skip
    assert (attn.n_heads, attn.n_kv_heads, attn.head_dim) == (n_heads, n_kv_heads, head_dim)
    randomize(attn, 4)
    w = attn.state_dict()
    assert w["q_proj.weight"].shape == (n_heads * head_dim, dim)
    assert w["k_proj.weight"].shape == (n_kv_heads * head_dim, dim)
    assert w["o_proj.weight"].shape == (dim, n_heads * head_dim)
    assert ("q_proj.bias" in w) == bias

    x = rng.standard_normal((2, 23, dim)).astype(np.float32)
    kw = {"theta": theta, "scaling": scaling, "bias": bias}
    expected = ref_attention(x, w, n_heads, n_kv_heads, head_dim, **kw)
    y = attn(x)
    assert y.dtype == np.float32 and y.shape == x.shape
    np.testing.assert_allclose(y, expected, **BLOCK_TOL)

    # explicit per-sequence positions
    positions = np.stack([np.arange(23), 40 + np.arange(23)])
    expected = ref_attention(x, w, n_heads, n_kv_heads, head_dim, positions=positions, **kw)
    np.testing.assert_allclose(attn(x, positions=positions), expected, **BLOCK_TOL)


@pytest.mark.parametrize("bias", [False, True], ids=["nobias", "bias"])
@pytest.mark.parametrize("rope", list(ROPES))
@pytest.mark.parametrize("n_kv_heads", [1, 2, 4])
@pytest.mark.parametrize("position", ["pre", "post"])
@pytest.mark.parametrize("norm", ["rms", "layer"])
def test_transformer_block_vs_reference(norm, position, n_kv_heads, rope, bias, isa, rng):
    cfg = block_config(
        "d48hd16", n_kv_heads, rope, norm=norm, norm_position=position, attention_bias=bias,
        mlp_bias=bias,
    )  # fmt: skip
    block = make_block(cfg)
    assert isinstance(block.attention_norm, lk.RMSNorm if norm == "rms" else lk.LayerNorm)
    assert block.norm_position == position
    x = rng.standard_normal((2, 19, cfg["dim"]))
    y = block(x)
    assert y.dtype == np.float32 and y.shape == x.shape
    expected = ref.transformer_block(x.astype(np.float32), block.state_dict(), cfg)
    np.testing.assert_allclose(y, expected, **BLOCK_TOL)

    # non-contiguous input, explicit positions
    xs = rng.standard_normal((2, 38, cfg["dim"])).astype(np.float32)[:, ::2]
    positions = np.stack([np.arange(19), 7 + np.arange(19)])
    expected = ref.transformer_block(xs, block.state_dict(), cfg, positions=positions)
    np.testing.assert_allclose(block(xs, positions=positions), expected, **BLOCK_TOL)


@pytest.mark.parametrize("geometry", list(GEOMETRIES))
def test_block_single_token_and_batch_one(geometry, isa, rng):
    cfg = block_config(geometry, 1, "llama3")
    block = make_block(cfg, seed=5)
    for shape in [(1, 1, cfg["dim"]), (3, 1, cfg["dim"]), (1, 40, cfg["dim"])]:
        x = rng.standard_normal(shape).astype(np.float32)
        expected = ref.transformer_block(x, block.state_dict(), cfg)
        np.testing.assert_allclose(block(x), expected, **BLOCK_TOL)


# --------------------------------------------------------------------------------------------
# 2. against HF transformers
# --------------------------------------------------------------------------------------------


def hf_config(
    geometry: str = "d48hd16", n_kv_heads: int = 2, rope: str = "theta1e4", **kw: Any
) -> LlamaConfig:
    """``kw``: :func:`_models.hf_block_config`'s (``vocab_size`` 211 by default)."""
    kw.setdefault("vocab_size", 211)
    return hf_block_config(GEOMETRIES[geometry], n_kv_heads, ROPES[rope], **kw)


def run_hf_layer(layer: LlamaDecoderLayer, x: np.ndarray, positions: np.ndarray) -> np.ndarray:
    rotary = LlamaRotaryEmbedding(layer.self_attn.config)
    xt = t(x)
    with torch.no_grad():
        cos, sin = rotary(xt, t(positions))
        out = layer(xt, attention_mask=None, position_embeddings=(cos, sin))
    assert isinstance(out, torch.Tensor)
    return out.numpy()


HF_LAYERS = {
    "mha": ("d64", 4, "theta1e4", False),
    "gqa2": ("d64", 2, "theta1e4", False),
    "mqa-odd": ("d48hd16", 1, "theta1e4", False),
    "gqa-odd-llama3": ("d48hd16", 2, "llama3", False),
    "mha-odd-llama3-bias": ("d48hd16", 4, "llama3", True),
}


@pytest.mark.parametrize("case", list(HF_LAYERS))
def test_block_vs_hf_decoder_layer(case, rng):
    geometry, n_kv, rope, bias = HF_LAYERS[case]
    config = hf_config(geometry, n_kv, rope, bias=bias)
    layer = LlamaDecoderLayer(config, layer_idx=0).eval()
    randomize_torch(layer, 7)  # float32 weights; the HF run below is float64 on the same values

    block = lk.TransformerBlock.from_config(config.to_dict())
    assert set(block.state_dict()) == set(layer.state_dict())
    for key, value in layer.state_dict().items():
        assert block.state_dict()[key].shape == tuple(value.shape), key
    block.load_state_dict({k: v.numpy() for k, v in layer.state_dict().items()})
    for key, value in layer.state_dict().items():
        np.testing.assert_array_equal(block.state_dict()[key], value.numpy())

    x = rng.standard_normal((2, 21, config.hidden_size)).astype(np.float32)
    positions = np.stack([np.arange(21), 9 + np.arange(21)])
    expected = run_hf_layer(layer.double(), x.astype(np.float64), positions)
    np.testing.assert_allclose(block(x, positions=positions), expected, **BLOCK_TOL)
    expected0 = run_hf_layer(layer, x.astype(np.float64), np.broadcast_to(np.arange(21), (2, 21)))
    np.testing.assert_allclose(block(x), expected0, **BLOCK_TOL)


# RoPE types whose frequencies depend on the sequence length (HF recomputes them from
# max(position_ids) + 1 when it exceeds the original context; so does reference.transformer_block)
SEQ_LEN_ROPES = {
    "dynamic": {"rope_type": "dynamic", "factor": 2.0},
    "longrope": {
        "rope_type": "longrope",
        "factor": 2.0,
        "short_factor": [1.0] * 8,
        "long_factor": [3.0] * 8,
        "original_max_position_embeddings": 8,
    },
}


@pytest.mark.parametrize("rope", list(SEQ_LEN_ROPES))
def test_block_vs_hf_seq_len_dependent_rope(rope, rng):
    """An HF config with dynamic-NTK / longrope scaling (``max_position_embeddings=16``): the
    block builds from ``config.to_dict()`` and matches HF within and beyond the original
    context."""
    config = hf_config("d64", 2)
    config.rope_parameters = dict(SEQ_LEN_ROPES[rope], rope_theta=10000.0)
    config.max_position_embeddings = 16
    layer = LlamaDecoderLayer(config, layer_idx=0).eval()
    randomize_torch(layer, 8)
    block = lk.TransformerBlock.from_config(config.to_dict())
    block.load_state_dict({k: v.numpy() for k, v in layer.state_dict().items()})
    layer.double()
    for n in (6, 40):
        x = rng.standard_normal((1, n, 64)).astype(np.float32)
        expected = run_hf_layer(layer, x.astype(np.float64), np.arange(n)[None])
        np.testing.assert_allclose(block(x), expected, **BLOCK_TOL, err_msg=f"T={n}")


HF_MODELS = {
    "untied-gqa-llama3": dict(geometry="d48hd16", n_kv_heads=2, rope="llama3", n_layers=3),
    "tied-mqa-llama3-bias": dict(
        geometry="d48hd16", n_kv_heads=1, rope="llama3", n_layers=2, tie=True, bias=True
    ),
    "tied-mha": dict(geometry="d64", n_kv_heads=4, rope="theta1e4", n_layers=2, tie=True),
}


def hf_causal_lm(case: str, seed: int = 11) -> LlamaForCausalLM:
    kw = dict(HF_MODELS[case])
    config = hf_config(kw.pop("geometry"), kw.pop("n_kv_heads"), kw.pop("rope"), **kw)
    model = LlamaForCausalLM(config).eval()
    randomize_torch(model, seed)
    return model


@pytest.fixture(scope="module")
def saved_models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, Path]]:
    """Each HF model saved twice (float32 safetensors): one file, and sharded with an index."""
    out = {}
    for case in HF_MODELS:
        model = hf_causal_lm(case)
        single = tmp_path_factory.mktemp(case + "-single")
        sharded = tmp_path_factory.mktemp(case + "-sharded")
        model.save_pretrained(single)
        model.save_pretrained(sharded, max_shard_size="30KB")
        out[case] = (single, sharded)
    return out


@pytest.mark.parametrize("case", list(HF_MODELS))
def test_from_pretrained_logits_vs_hf(case, saved_models, rng):
    single, sharded = saved_models[case]
    assert (single / "model.safetensors").exists()
    assert (sharded / "model.safetensors.index.json").exists()
    assert len(list(sharded.glob("model-*.safetensors"))) > 1
    hf = hf_causal_lm(case)
    config = hf.config

    model = lk.Transformer.from_pretrained(single)
    assert model.config.tie_embeddings == config.tie_word_embeddings
    assert model.config.rope_scaling == (
        None if config.rope_parameters["rope_type"] == "default" else LLAMA3
    )
    hf_state = numpy_state(hf)
    for key, value in model.state_dict().items():
        np.testing.assert_array_equal(value, hf_state[key], err_msg=key)

    ids = rng.integers(0, config.vocab_size, (2, 13))
    with torch.no_grad():
        expected = hf.double()(t(ids)).logits.numpy()
    got = model(ids)
    assert got.dtype == np.float32 and got.shape == (2, 13, config.vocab_size)
    assert_logits_close(got, expected)
    assert_logits_close(model(ids, last_only=True), expected[:, -1:])
    assert_logits_close(model(ids[0]), expected[:1])  # (T,) ids

    sharded_model = lk.Transformer.from_pretrained(sharded)
    for key, value in model.state_dict().items():
        np.testing.assert_array_equal(sharded_model.state_dict()[key], value, err_msg=key)
    np.testing.assert_array_equal(sharded_model(ids), got)


@pytest.mark.parametrize("case", list(HF_MODELS))
def test_greedy_generate_vs_hf(case, saved_models, rng):
    model = lk.Transformer.from_pretrained(saved_models[case][0])
    hf = hf_causal_lm(case).double()
    ids = rng.integers(0, hf.config.vocab_size, (2, 6))
    expected = hf_greedy(hf, ids, 32)
    assert expected.shape == (2, 38)  # HF did not stop early
    got = model.generate(ids, 32)
    assert got.dtype == np.int64 and got.shape == (2, 38)
    np.testing.assert_array_equal(got, expected)
    # the reference twin agrees (float64, no cache)
    ref_cfg = model.config.to_dict()
    np.testing.assert_array_equal(
        ref.greedy_generate(ids, model.state_dict(), ref_cfg, 32), expected
    )


def test_model_cache_vs_hf_past_key_values(saved_models, rng):
    case = "untied-gqa-llama3"
    model = lk.Transformer.from_pretrained(saved_models[case][0])
    hf = hf_causal_lm(case).double()
    ids = rng.integers(0, hf.config.vocab_size, (2, 7))
    cache = model.new_cache(2, 16)
    model(ids, cache=cache)
    with torch.no_grad():
        past = hf(t(ids), use_cache=True).past_key_values
    assert len(cache.layers) == hf.config.num_hidden_layers
    for i, layer_cache in enumerate(cache.layers):
        assert layer_cache.keys().shape == (2, 2, 7, 16)
        np.testing.assert_allclose(layer_cache.keys(), past.layers[i].keys.numpy(), **BLOCK_TOL)
        np.testing.assert_allclose(layer_cache.values(), past.layers[i].values.numpy(), **BLOCK_TOL)


# --------------------------------------------------------------------------------------------
# 3. prefill + decode == the full forward
# --------------------------------------------------------------------------------------------

SPLITS = {
    "prefill-then-tokens": [(0, 5)] + [(i, i + 1) for i in range(5, 12)],
    "chunks": [(0, 3), (3, 4), (4, 7), (7, 8), (8, 12)],
}


@pytest.mark.parametrize("split", list(SPLITS))
@pytest.mark.parametrize("position", ["pre", "post"])
@pytest.mark.parametrize("rope", list(ROPES))
def test_block_cache_prefill_decode(rope, position, split, isa, rng):
    cfg = block_config("d48hd16", 2, rope, norm_position=position, attention_bias=True)
    block = make_block(cfg, seed=3)
    x = rng.standard_normal((3, 12, cfg["dim"])).astype(np.float32)
    full = block(x)
    np.testing.assert_allclose(full, ref.transformer_block(x, block.state_dict(), cfg), **BLOCK_TOL)

    cache = block.new_cache(3, 16)
    assert (cache.batch, cache.max_seq_len, cache.length) == (3, 16, 0)
    outs = []
    for start, stop in SPLITS[split]:
        outs.append(block(x[:, start:stop], cache=cache))
        assert cache.length == stop
        np.testing.assert_array_equal(cache.next_positions, [stop] * 3)
    np.testing.assert_allclose(np.concatenate(outs, axis=1), full, **BLOCK_TOL)
    assert cache.keys().shape == (3, 2, 12, 16) and cache.values().shape == (3, 2, 12, 16)

    # reset: the cache is reusable
    cache.reset()
    assert cache.length == 0
    np.testing.assert_allclose(block(x[:, :4], cache=cache), full[:, :4], **BLOCK_TOL)

    # the attention module alone with its own cache
    attn = block.attention
    a_full = attn(x)
    a_cache = attn.new_cache(3, 12)
    a_outs = [attn(x[:, s:e], cache=a_cache) for s, e in SPLITS[split]]
    np.testing.assert_allclose(np.concatenate(a_outs, axis=1), a_full, **BLOCK_TOL)


def test_transformer_cache_prefill_decode(rng):
    model = make_model(model_config(attention_bias=True), seed=1)
    ids = rng.integers(0, 211, (2, 14))
    full = model(ids)
    for split in ([(0, 6)] + [(i, i + 1) for i in range(6, 14)], [(0, 1), (1, 5), (5, 14)]):
        cache = model.new_cache(2, 20)
        assert len(cache.layers) == 2
        outs = []
        for start, stop in split:
            outs.append(model(ids[:, start:stop], cache=cache))
            assert cache.length == stop
        assert_logits_close(np.concatenate(outs, axis=1), full)
    cache = model.new_cache(2, 20)
    last = [model(ids[:, :6], cache=cache, last_only=True)]
    last += [model(ids[:, i : i + 1], cache=cache, last_only=True) for i in range(6, 14)]
    assert last[0].shape == (2, 1, 211)
    assert_logits_close(np.concatenate(last, axis=1), full[:, 5:])


def left_pad(prompts: list[np.ndarray], pad_id: int = 0) -> tuple[np.ndarray, np.ndarray]:
    width = max(len(p) for p in prompts)
    ids = np.full((len(prompts), width), pad_id, dtype=np.int64)
    mask = np.zeros((len(prompts), width), dtype=bool)
    for i, p in enumerate(prompts):
        ids[i, width - len(p) :] = p
        mask[i, width - len(p) :] = True
    return ids, mask


def test_transformer_left_padding_mask(rng):
    """Each sequence of a left-padded batch (``mask``) gets the logits it gets alone, in the
    full forward and with prefill + decode (positions per sequence, from the mask)."""
    model = make_model(model_config(), seed=2)
    prompts = [rng.integers(1, 211, n) for n in (9, 4, 7)]
    extra = rng.integers(1, 211, (3, 5))  # tokens decoded after the prompts
    ids, mask = left_pad(prompts, pad_id=7)
    alone = [model(np.concatenate([p, e]))[0] for p, e in zip(prompts, extra, strict=True)]

    full = model(
        np.concatenate([ids, extra], axis=1),
        mask=np.pad(mask, ((0, 0), (0, 5)), constant_values=True),
    )
    for i, p in enumerate(prompts):
        assert_logits_close(full[i, 9 - len(p) :], alone[i])

    cache = model.new_cache(3, 20)
    prefill = model(ids, mask=mask, cache=cache)
    np.testing.assert_array_equal(cache.next_positions, [9, 4, 7])
    steps = [model(extra[:, j : j + 1], cache=cache) for j in range(5)]
    np.testing.assert_array_equal(cache.next_positions, [14, 9, 12])
    got = np.concatenate([prefill, *steps], axis=1)
    for i, p in enumerate(prompts):
        assert_logits_close(got[i, 9 - len(p) :], alone[i])

    # the pad token id does not matter
    ids2 = np.where(mask, ids, 123)
    np.testing.assert_array_equal(model(ids2, mask=mask)[mask], model(ids, mask=mask)[mask])


def test_block_left_padding_mask(rng):
    cfg = block_config("d48hd16", 2, "llama3")
    block = make_block(cfg, seed=4)
    x = rng.standard_normal((2, 10, cfg["dim"])).astype(np.float32)
    mask = np.ones((2, 10), dtype=bool)
    mask[1, :4] = False
    y = block(x, mask=mask)
    np.testing.assert_allclose(y[0], block(x[:1])[0], **BLOCK_TOL)
    np.testing.assert_allclose(y[1, 4:], block(x[1:, 4:])[0], **BLOCK_TOL)
    cache = block.new_cache(2, 10)
    outs = [block(x[:, :6], mask=mask[:, :6], cache=cache)]
    outs += [block(x[:, i : i + 1], cache=cache) for i in range(6, 10)]
    got = np.concatenate(outs, axis=1)
    np.testing.assert_allclose(got[mask], y[mask], **BLOCK_TOL)


# --------------------------------------------------------------------------------------------
# 4. cache errors
# --------------------------------------------------------------------------------------------


def test_kv_cache_full_and_wrong_batch(rng):
    cfg = block_config()
    block = make_block(cfg)
    x = rng.standard_normal((2, 4, cfg["dim"])).astype(np.float32)
    cache = block.new_cache(2, 6)
    block(x, cache=cache)
    block(x[:, :1], cache=cache)
    with pytest.raises(ValueError, match=r"\[TransformerBlock\] KV cache is full"):
        block(x[:, :2], cache=cache)
    assert cache.length == 5  # the refused call changed nothing
    block(x[:, :1], cache=cache)
    with pytest.raises(ValueError, match="KV cache is full"):
        block(x[:, :1], cache=cache)
    with pytest.raises(ValueError, match=r"\[MultiHeadAttention\] KV cache is full"):
        block.attention(x[:, :1], cache=cache)
    with pytest.raises(ValueError, match="cache holds 3 sequences"):
        block(x, cache=block.new_cache(3, 8))
    with pytest.raises(ValueError, match="cache holds 1 sequences"):
        block.attention(x, cache=block.new_cache(1, 8))
    other = lk.MultiHeadAttention(cfg["dim"], 4, 1, 16)  # another KV geometry
    with pytest.raises(ValueError, match="cache"):
        block(x, cache=other.new_cache(2, 8))
    with pytest.raises(TypeError, match="KVCache"):
        block(x, cache={})

    model = make_model(model_config())
    ids = rng.integers(0, 211, (2, 5))
    mcache = model.new_cache(2, 6)
    model(ids, cache=mcache)
    with pytest.raises(ValueError, match=r"\[Transformer\] KV cache is full"):
        model(ids[:, :2], cache=mcache)
    assert mcache.length == 5
    with pytest.raises(ValueError, match="cache holds 2 sequences"):
        model(ids[:1], cache=mcache)
    with pytest.raises(TypeError, match="cache"):
        model(ids, cache=make_model(model_config(n_layers=1)).new_cache(2, 8))
    with pytest.raises(TypeError, match="cache"):
        model(ids, cache=block.new_cache(2, 8))


# --------------------------------------------------------------------------------------------
# 5. state_dict / load_state_dict
# --------------------------------------------------------------------------------------------


def test_state_dict_is_zero_copy(rng):
    cfg = block_config(attention_bias=True)
    block = make_block(cfg)
    x = rng.standard_normal((1, 5, cfg["dim"])).astype(np.float32)
    before = block(x)
    sd = block.state_dict()
    assert all(v.dtype == np.float32 for v in sd.values())
    assert np.shares_memory(sd["mlp.up_proj.weight"], block.state_dict()["mlp.up_proj.weight"])
    assert np.shares_memory(
        sd["mlp.up_proj.weight"], block.feed_forward.state_dict()["up_proj.weight"]
    )
    sd["mlp.down_proj.weight"][...] = 0.0
    after = block(x)
    assert not np.allclose(after, before)
    # with the FFN zeroed, a pre-norm block is x + attn(norm1(x))
    h = x + block.attention(block.attention_norm(x))
    np.testing.assert_allclose(after, h, **BLOCK_TOL)
    sd["self_attn.o_proj.bias"][...] = 1.0
    assert not np.allclose(block(x), after)

    model = make_model(model_config(tie_embeddings=True))
    ids = rng.integers(0, 211, (1, 4))
    logits = model(ids)
    model.state_dict()["model.embed_tokens.weight"][5] += 1.0
    assert not np.array_equal(model(ids), logits)  # the tied head changed (every logit of token 5)
    model.state_dict()["model.layers.1.mlp.gate_proj.weight"][...] *= 2.0
    assert not np.array_equal(model(ids), logits)


def _shapes(sd: Mapping[str, Any]) -> dict[str, tuple[int, ...]]:
    return {k: tuple(v.shape) for k, v in sd.items()}


@pytest.mark.parametrize("case", list(HF_LAYERS))
def test_block_state_dict_matches_hf_layer(case):
    geometry, n_kv, rope, bias = HF_LAYERS[case]
    config = hf_config(geometry, n_kv, rope, bias=bias)
    layer = LlamaDecoderLayer(config, layer_idx=0)
    block = lk.TransformerBlock.from_config(config.to_dict())
    assert _shapes(block.state_dict()) == _shapes(layer.state_dict())


@pytest.mark.parametrize("tie", [False, True], ids=["untied", "tied"])
def test_model_state_dict_matches_hf(tie):
    config = hf_config("d48hd16", 2, "llama3", n_layers=2, tie=tie, bias=True)
    hf = LlamaForCausalLM(config)
    model = lk.Transformer(config.to_dict())
    hf_shapes = _shapes(hf.state_dict())
    assert _shapes(model.state_dict()) == hf_shapes


@pytest.mark.parametrize("tie", [False, True], ids=["untied", "tied"])
def test_model_loads_hf_state_dict(tie, rng):
    """``Transformer.load_state_dict`` takes HF's ``LlamaForCausalLM.state_dict()`` as is (for
    a tied model HF lists ``lm_head.weight``, the embedding under a second name)."""
    config = hf_config("d48hd16", 2, "llama3", n_layers=2, tie=tie)
    hf = LlamaForCausalLM(config).eval()
    randomize_torch(hf, 5)
    model = lk.Transformer(config.to_dict())
    model.load_state_dict({k: v.numpy() for k, v in hf.state_dict().items()})
    ids = rng.integers(0, config.vocab_size, (1, 6))
    with torch.no_grad():
        expected = hf.double()(t(ids)).logits.numpy()
    assert_logits_close(model(ids), expected)


def test_load_state_dict_strict_errors_change_nothing(rng):
    cfg = block_config(attention_bias=True)
    block = make_block(cfg, seed=1)
    x = rng.standard_normal((2, 6, cfg["dim"])).astype(np.float32)
    y0 = block(x)
    weights0 = snapshot(block)
    donor = make_block(cfg, seed=2)
    new = snapshot(donor)

    def unchanged() -> None:
        for key, value in block.state_dict().items():
            np.testing.assert_array_equal(value, weights0[key], err_msg=key)
        np.testing.assert_array_equal(block(x), y0)

    missing = dict(new)
    del missing["mlp.up_proj.weight"]
    with pytest.raises(
        KeyError, match=r"\[TransformerBlock.load_state_dict\].*mlp\.up_proj\.weight"
    ):
        block.load_state_dict(missing)
    unchanged()

    extra = dict(new, **{"self_attn.rotary_emb.inv_freq": np.ones(8)})
    with pytest.raises(KeyError, match=r"unexpected.*self_attn\.rotary_emb\.inv_freq"):
        block.load_state_dict(extra)
    unchanged()

    # a misshaped tensor after valid ones (dict order): nothing is half-loaded
    bad = dict(new)
    del bad["self_attn.k_proj.weight"]
    bad["self_attn.k_proj.weight"] = np.zeros((16, 48), np.float32)
    assert list(bad)[-1] == "self_attn.k_proj.weight"
    with pytest.raises(
        ValueError,
        match=re.escape("self_attn.k_proj.weight: expected shape (32, 48), got (16, 48)"),
    ):
        block.load_state_dict(bad)
    unchanged()
    with pytest.raises(ValueError, match=re.escape("expected shape (32, 48)")):
        block.load_state_dict({"self_attn.k_proj.weight": np.zeros((48, 32))}, strict=False)
    unchanged()
    with pytest.raises(ValueError, match=re.escape("expected shape (48,)")):
        block.load_state_dict({"input_layernorm.weight": np.ones((1, 48))}, strict=False)
    unchanged()
    with pytest.raises(TypeError, match="self_attn.q_proj.weight"):
        block.load_state_dict(
            dict(new, **{"self_attn.q_proj.weight": new["self_attn.q_proj.weight"] * 1j})
        )
    unchanged()

    # strict=False: extras are ignored, a partial dict loads just its keys
    block.load_state_dict(dict(new, extra_key=np.zeros(3)), strict=False)
    for key, value in block.state_dict().items():
        np.testing.assert_array_equal(value, new[key])
    np.testing.assert_array_equal(block(x), donor(x))
    block.load_state_dict({"mlp.down_proj.weight": weights0["mlp.down_proj.weight"]}, strict=False)
    np.testing.assert_array_equal(
        block.state_dict()["mlp.down_proj.weight"], weights0["mlp.down_proj.weight"]
    )
    np.testing.assert_array_equal(
        block.state_dict()["mlp.up_proj.weight"], new["mlp.up_proj.weight"]
    )

    # torch tensors and float64 arrays load directly; the module keeps its own (float32) storage
    block.load_state_dict({k: torch.from_numpy(v.astype(np.float64)) for k, v in weights0.items()})
    np.testing.assert_array_equal(block(x), y0)


def test_model_load_state_dict_errors(rng):
    model = make_model(model_config())
    ids = rng.integers(0, 211, (1, 5))
    logits = model(ids)
    sd = snapshot(make_model(model_config(), seed=9))
    bad = dict(sd, **{"model.layers.1.mlp.down_proj.weight": np.zeros((70, 48))})
    with pytest.raises(
        ValueError,
        match=re.escape(
            "model.layers.1.mlp.down_proj.weight: expected shape (48, 70), got (70, 48)"
        ),
    ):
        model.load_state_dict(bad)
    np.testing.assert_array_equal(model(ids), logits)
    missing = dict(sd)
    del missing["lm_head.weight"]
    with pytest.raises(KeyError, match=r"\[Transformer.load_state_dict\].*lm_head\.weight"):
        model.load_state_dict(missing)
    np.testing.assert_array_equal(model(ids), logits)


# --------------------------------------------------------------------------------------------
# 6. configuration and input errors
# --------------------------------------------------------------------------------------------


def test_constructor_errors():
    with pytest.raises(ValueError, match=r"\[MultiHeadAttention\] dim \(50\).*divisible"):
        lk.MultiHeadAttention(50, 4)
    with pytest.raises(ValueError, match=r"\[MultiHeadAttention\] n_heads must be a multiple"):
        lk.MultiHeadAttention(48, 4, 3, 16)
    with pytest.raises(ValueError, match=r"\[MultiHeadAttention\] head_dim must be even"):
        lk.MultiHeadAttention(45, 3)
    with pytest.raises(ValueError, match=r"\[MultiHeadAttention\] n_heads"):
        lk.MultiHeadAttention(48, 0)
    with pytest.raises(ValueError, match=r"\[FeedForward\] dim"):
        lk.FeedForward(0, 70)
    with pytest.raises(ValueError, match=r"\[FeedForward\] hidden_dim"):
        lk.FeedForward(48, 2.5)
    with pytest.raises(ValueError, match=r"\[RMSNorm\] dim"):
        lk.RMSNorm(-1)
    with pytest.raises(ValueError, match=r"\[RMSNorm\] eps"):
        lk.RMSNorm(4, eps=-1e-6)
    with pytest.raises(ValueError, match=r"\[LayerNorm\] eps"):
        lk.LayerNorm(4, eps=float("nan"))
    with pytest.raises(ValueError, match=r"\[KVCache\] batch"):
        lk.KVCache(0, 4, 1, 8)

    # the config path reports the config key ("[config] <key>: ...")
    with pytest.raises(ValueError, match=r"\[config\] dim: 50 is not divisible by n_heads"):
        lk.TransformerBlock.from_config({"dim": 50, "n_heads": 4, "hidden_dim": 8})
    with pytest.raises(ValueError, match=r"\[config\] n_heads: 4 is not a multiple"):
        lk.TransformerBlock.from_config({"dim": 48, "n_heads": 4, "n_kv_heads": 3, "hidden_dim": 8})
    with pytest.raises(ValueError, match=r"\[config\] head_dim: must be even"):
        lk.TransformerBlock.from_config({"dim": 45, "n_heads": 3, "hidden_dim": 8})
    with pytest.raises(
        ValueError, match=r"\[config\] hidden_size: 48 is not divisible by num_attention_heads=5"
    ):
        lk.Transformer(
            {
                "hidden_size": 48,
                "num_attention_heads": 5,
                "num_hidden_layers": 1,
                "intermediate_size": 8,
                "vocab_size": 10,
            }  # fmt: skip
        )
    with pytest.raises(ValueError, match=r"\[config\] norm"):
        lk.TransformerBlock.from_config({"dim": 48, "n_heads": 4, "hidden_dim": 8, "norm": "batch"})

    # module composition
    attn, ff = lk.MultiHeadAttention(48, 4, seed=0), lk.FeedForward(48, 70, seed=0)
    with pytest.raises(ValueError, match=r"\[TransformerBlock\] ffn_norm has dim 40"):
        lk.TransformerBlock(
            attention=attn, feed_forward=ff, attention_norm=lk.RMSNorm(48), ffn_norm=lk.RMSNorm(40)
        )
    with pytest.raises(ValueError, match=r"\[TransformerBlock\] feed_forward has dim 32"):
        lk.TransformerBlock(
            attention=attn, feed_forward=lk.FeedForward(32, 8), attention_norm=lk.RMSNorm(48),
            ffn_norm=lk.RMSNorm(48),
        )  # fmt: skip
    with pytest.raises(TypeError, match=r"\[TransformerBlock\] attention"):
        lk.TransformerBlock(
            attention=ff, feed_forward=ff, attention_norm=lk.RMSNorm(48), ffn_norm=lk.RMSNorm(48)
        )
    with pytest.raises(ValueError, match=r"\[TransformerBlock\] norm_position"):
        lk.TransformerBlock(
            attention=attn, feed_forward=ff, attention_norm=lk.RMSNorm(48),
            ffn_norm=lk.RMSNorm(48), norm_position="middle",
        )  # fmt: skip
    # the sandwich layout (Gemma 2) takes both post norms, the others neither
    with pytest.raises(ValueError, match=r"\[TransformerBlock\] post_attention_norm and"):
        lk.TransformerBlock(
            attention=attn, feed_forward=ff, attention_norm=lk.RMSNorm(48),
            ffn_norm=lk.RMSNorm(48), norm_position="sandwich",
        )  # fmt: skip
    with pytest.raises(ValueError, match=r"\[TransformerBlock\] post_attention_norm and"):
        lk.TransformerBlock(
            attention=attn, feed_forward=ff, attention_norm=lk.RMSNorm(48),
            ffn_norm=lk.RMSNorm(48), post_ffn_norm=lk.RMSNorm(48),
        )  # fmt: skip


def test_input_errors(rng):
    block = make_block(block_config())
    x = rng.standard_normal((2, 5, 48)).astype(np.float32)
    with pytest.raises(
        ValueError, match=re.escape("[TransformerBlock] x must have shape (B, T, 48)")
    ):
        block(x[0])
    with pytest.raises(
        ValueError, match=re.escape("[TransformerBlock] x must have shape (..., 48)")
    ):
        block(x[..., :40])
    with pytest.raises(ValueError, match=re.escape("[TransformerBlock]")):
        block(x[None])
    with pytest.raises(TypeError, match=r"\[TransformerBlock\] x has unsupported dtype"):
        block(x.astype(np.complex64))
    with pytest.raises(ValueError, match=r"\[TransformerBlock\] mask must have shape"):
        block(x, mask=np.ones((2, 4), bool))
    with pytest.raises(TypeError, match=r"\[TransformerBlock\] mask must be boolean"):
        block(x, mask=np.ones((2, 5)))
    with pytest.raises(TypeError, match=r"\[TransformerBlock\] positions must be integers"):
        block(x, positions=np.arange(5.0))
    with pytest.raises(ValueError, match=r"\[TransformerBlock\] positions must have shape"):
        block(x, positions=np.arange(4))
    with pytest.raises(ValueError, match=r"\[TransformerBlock\] positions must be >= 0"):
        block(x, positions=np.arange(5) - 1)
    with pytest.raises(
        ValueError, match=re.escape("[MultiHeadAttention] x must have shape (B, T, 48)")
    ):
        block.attention(x[0])
    with pytest.raises(ValueError, match=r"\[FeedForward\] x must have shape \(\.\.\., 48\)"):
        block.feed_forward(x[..., :47])
    with pytest.raises(ValueError, match=r"\[RMSNorm\] x must have shape"):
        block.attention_norm(x[..., :47])
    with pytest.raises(ValueError, match=r"\[LayerNorm\] x must have shape"):
        lk.LayerNorm(48)(np.float32(1.0))
    with pytest.raises(TypeError, match=r"\[RMSNorm\] x has unsupported dtype"):
        block.attention_norm(np.array(["a"] * 48))

    model = make_model(model_config())
    with pytest.raises(
        ValueError, match=re.escape("[Transformer] ids must be in [0, vocab_size=211)")
    ):
        model([[0, 211]])
    with pytest.raises(ValueError, match=r"\[Transformer\] ids must be in"):
        model([[-1, 3]])
    with pytest.raises(TypeError, match=r"\[Transformer\] ids must be integers"):
        model(np.array([[1.0, 2.0]]))
    with pytest.raises(TypeError, match=r"\[Transformer\] ids must be integers"):
        model(np.array([[True, False]]))
    with pytest.raises(ValueError, match=r"\[Transformer\] ids must have shape"):
        model(np.zeros((1, 2, 3), np.int64))
    with pytest.raises(ValueError, match=r"\[Transformer\] mask must have shape"):
        model([[1, 2, 3]], mask=np.ones((1, 2), bool))
    with pytest.raises(TypeError, match=r"\[Transformer\] ids must be integers"):
        model.generate(np.array([[1.5, 2.0]]), 3)
    with pytest.raises(ValueError, match=r"\[generate\] temperature"):
        model.generate([[1, 2]], 3, temperature=-1.0)
    with pytest.raises(ValueError, match=r"\[generate\] top_k"):
        model.generate([[1, 2]], 3, temperature=1.0, top_k=0)
    with pytest.raises(ValueError, match=r"\[generate\] top_p"):
        model.generate([[1, 2]], 3, temperature=1.0, top_p=1.5)
    with pytest.raises(ValueError, match=r"\[generate\] max_new_tokens"):
        model.generate([[1, 2]], -1)


# --------------------------------------------------------------------------------------------
# 7. corrupt checkpoints
# --------------------------------------------------------------------------------------------


def _copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def _read_safetensors(path: Path) -> tuple[dict, bytes]:
    raw = path.read_bytes()
    n = int.from_bytes(raw[:8], "little")
    return json.loads(raw[8 : 8 + n]), raw[8 + n :]


def _write_safetensors(path: Path, header: dict, data: bytes) -> None:
    h = json.dumps(header).encode()
    path.write_bytes(len(h).to_bytes(8, "little") + h + data)


def test_corrupt_checkpoints(saved_models, tmp_path):
    single, sharded = saved_models["untied-gqa-llama3"]
    lk.Transformer.from_pretrained(single)  # the intact one loads

    d = _copy(single, tmp_path / "truncated")
    f = d / "model.safetensors"
    size = f.stat().st_size
    with open(f, "r+b") as fh:
        fh.truncate(size - 1000)
    with pytest.raises(ValueError, match=r"\[from_pretrained\]"):
        lk.Transformer.from_pretrained(d)
    with open(f, "r+b") as fh:
        fh.truncate(100)  # inside the header
    with pytest.raises(ValueError, match=r"\[from_pretrained\].*header length"):
        lk.Transformer.from_pretrained(d)
    f.write_bytes(b"\x01\x02")
    with pytest.raises(ValueError, match=r"\[from_pretrained\]"):
        lk.Transformer.from_pretrained(d)

    # a header whose tensors claim more data than the file holds
    d = _copy(single, tmp_path / "overclaim")
    f = d / "model.safetensors"
    header, data = _read_safetensors(f)
    last = max(
        (k for k in header if k != "__metadata__"), key=lambda k: header[k]["data_offsets"][1]
    )
    begin, end = header[last]["data_offsets"]
    header[last]["shape"] = [header[last]["shape"][0] * 1000] + header[last]["shape"][1:]
    header[last]["data_offsets"] = [begin, begin + (end - begin) * 1000]
    _write_safetensors(f, header, data)
    with pytest.raises(ValueError, match=r"\[from_pretrained\]"):
        lk.Transformer.from_pretrained(d)

    # a header length field larger than the file
    header, data = _read_safetensors(single / "model.safetensors")
    h = json.dumps(header).encode()
    f.write_bytes((len(h) + 10**6).to_bytes(8, "little") + h + data)
    with pytest.raises(ValueError, match=r"\[from_pretrained\].*header length"):
        lk.Transformer.from_pretrained(d)

    # a tensor whose shape does not match its byte range
    header, data = _read_safetensors(single / "model.safetensors")
    header["model.norm.weight"]["shape"] = [47]
    _write_safetensors(f, header, data)
    with pytest.raises(ValueError, match=r"\[from_pretrained\]"):
        lk.Transformer.from_pretrained(d)

    # a shard missing from a sharded checkpoint; a truncated shard
    d = _copy(sharded, tmp_path / "sharded")
    shards = sorted(d.glob("model-*.safetensors"))
    shards[1].unlink()
    with pytest.raises(ValueError, match=r"\[from_pretrained\]"):
        lk.Transformer.from_pretrained(d)
    d = _copy(sharded, tmp_path / "sharded2")
    shard = sorted(d.glob("model-*.safetensors"))[-1]
    with open(shard, "r+b") as fh:
        fh.truncate(shard.stat().st_size - 8)
    with pytest.raises(ValueError, match=r"\[from_pretrained\]"):
        lk.Transformer.from_pretrained(d)

    # config.json inconsistent with the weights / missing
    d = _copy(single, tmp_path / "badconfig")
    cfg = json.loads((d / "config.json").read_text())
    cfg["intermediate_size"] = 71
    (d / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match="mlp.gate_proj.weight"):
        lk.Transformer.from_pretrained(d)
    os.remove(d / "config.json")
    with pytest.raises((ValueError, FileNotFoundError)):
        lk.Transformer.from_pretrained(d)
    with pytest.raises(ValueError, match="not a directory"):
        lk.Transformer.from_pretrained(tmp_path / "nowhere")


# --------------------------------------------------------------------------------------------
# 8. generate
# --------------------------------------------------------------------------------------------


def test_generate_greedy_vs_reference_and_sampling(rng):
    cfg = model_config()
    model = make_model(cfg, seed=3)
    ids = rng.integers(0, 211, (2, 5))
    greedy = model.generate(ids, 16)
    assert greedy.shape == (2, 21) and greedy.dtype == np.int64
    np.testing.assert_array_equal(greedy[:, :5], ids)
    np.testing.assert_array_equal(greedy, ref.greedy_generate(ids, model.state_dict(), cfg, 16))
    np.testing.assert_array_equal(model.generate(ids[0], 16), greedy[:1])
    np.testing.assert_array_equal(model.generate(ids, 0), ids)

    # top_k=1 and a tiny nucleus are greedy whatever the temperature and seed
    np.testing.assert_array_equal(model.generate(ids, 16, temperature=1.5, top_k=1, seed=1), greedy)
    np.testing.assert_array_equal(
        model.generate(ids, 16, temperature=0.7, top_p=1e-6, seed=2), greedy
    )

    # seeded sampling is reproducible, different seeds differ
    kw = {"temperature": 1.0, "top_k": 50, "top_p": 0.95}
    a = model.generate(ids, 24, seed=123, **kw)
    b = model.generate(ids, 24, seed=123, **kw)
    c = model.generate(ids, 24, seed=124, **kw)
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, c)
    assert a.min() >= 0 and a.max() < 211
    assert not np.array_equal(a, model.generate(ids, 24))
    np.testing.assert_array_equal(
        model.generate(ids, 8, temperature=2.0, seed=5),
        model.generate(ids, 8, temperature=2.0, seed=5),
    )

    # every sampled token is among the top_k of the logits it was drawn from
    k = 3
    s = model.generate(ids, 20, temperature=5.0, top_k=k, seed=7)
    logits = model(s[:, :-1])[:, 4:]  # the logits that produced tokens 5 .. 24
    for row in range(2):
        for step in range(20):
            top = np.argsort(logits[row, step])[-k:]
            assert s[row, 5 + step] in top
    assert not np.array_equal(s, model.generate(ids, 20))

    # nucleus: a token outside the smallest set with mass >= top_p is never drawn
    p = 0.5
    s = model.generate(ids, 20, temperature=1.0, top_p=p, seed=8)
    logits = model(s[:, :-1])[:, 4:].astype(np.float64)
    for row in range(2):
        for step in range(20):
            z = logits[row, step]
            probs = np.exp(z - z.max())
            probs /= probs.sum()
            order = np.argsort(-probs)
            keep = order[: int(np.searchsorted(np.cumsum(probs[order]), p)) + 1]
            assert s[row, 5 + step] in keep


def test_generate_left_padded_batch_equals_single(rng):
    model = make_model(model_config(), seed=4)
    prompts = [rng.integers(1, 211, n) for n in (5, 8, 2)]
    ids, mask = left_pad(prompts, pad_id=0)
    out = model.generate(ids, 16, mask=mask)
    assert out.shape == (3, 8 + 16)
    np.testing.assert_array_equal(out[:, :8], ids)
    for i, p in enumerate(prompts):
        alone = model.generate(p, 16)[0]
        np.testing.assert_array_equal(out[i, 8:], alone[len(p) :])
    # seeded sampling of a padded batch is reproducible
    kw = {"temperature": 0.8, "top_k": 20, "seed": 3, "mask": mask}
    np.testing.assert_array_equal(model.generate(ids, 10, **kw), model.generate(ids, 10, **kw))


# --------------------------------------------------------------------------------------------
# 9. composability
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("norm", ["rms", "layer"])
@pytest.mark.parametrize("position", ["pre", "post"])
def test_block_from_modules_equals_from_config(position, norm, rng):
    cfg = block_config("d48hd16", 2, "llama3", norm=norm, norm_position=position, mlp_bias=True)
    configured = make_block(cfg, seed=6)
    Norm = lk.RMSNorm if norm == "rms" else lk.LayerNorm
    composed = lk.TransformerBlock(
        attention=lk.MultiHeadAttention(48, 4, 2, 16, rope_theta=500000.0, rope_scaling=LLAMA3),
        feed_forward=lk.FeedForward(48, 70, bias=True),
        attention_norm=Norm(48, eps=1e-5),
        ffn_norm=Norm(48, eps=1e-5),
        norm_position=position,
    )
    assert _shapes(composed.state_dict()) == _shapes(configured.state_dict())
    composed.load_state_dict(configured.state_dict())
    x = rng.standard_normal((2, 11, 48)).astype(np.float32)
    np.testing.assert_array_equal(composed(x), configured(x))
    # and it is the block formula over the very modules it holds
    if position == "pre":
        h = x + composed.attention(composed.attention_norm(x))
        y = h + composed.feed_forward(composed.ffn_norm(h))
    else:
        h = composed.attention_norm(x + composed.attention(x))
        y = composed.ffn_norm(h + composed.feed_forward(h))
    np.testing.assert_allclose(composed(x), y, **BLOCK_TOL)


def test_blocks_sharing_a_feed_forward_share_weights(rng):
    ff = lk.FeedForward(48, 70, seed=1)
    randomize(ff, 1)

    def block(seed: int) -> lk.TransformerBlock:
        attn = lk.MultiHeadAttention(48, 4, 2, 16, seed=seed)
        randomize(attn, seed)
        return lk.TransformerBlock(
            attention=attn, feed_forward=ff, attention_norm=lk.RMSNorm(48), ffn_norm=lk.RMSNorm(48)
        )

    b1, b2 = block(2), block(3)
    assert b1.feed_forward is ff and b2.feed_forward is ff
    assert np.shares_memory(
        b1.state_dict()["mlp.up_proj.weight"], b2.state_dict()["mlp.up_proj.weight"]
    )
    x = rng.standard_normal((1, 6, 48)).astype(np.float32)
    y1, y2 = b1(x), b2(x)
    b1.state_dict()["mlp.gate_proj.weight"][...] *= -1.0  # through block 1 ...
    np.testing.assert_array_equal(
        ff.state_dict()["gate_proj.weight"], b2.state_dict()["mlp.gate_proj.weight"]
    )
    assert not np.allclose(b2(x), y2)  # ... block 2 changes too
    assert not np.allclose(b1(x), y1)
    b2.load_state_dict(
        {"mlp.gate_proj.weight": -b2.state_dict()["mlp.gate_proj.weight"]}, strict=False
    )
    np.testing.assert_array_equal(b1(x), y1)
    np.testing.assert_array_equal(b2(x), y2)


# --------------------------------------------------------------------------------------------
# 10. thread determinism
# --------------------------------------------------------------------------------------------


def test_forward_bitwise_equal_across_thread_counts(threads, rng):
    cfg = block_config(
        "d64", 2, "llama3", dim=128, head_dim=32, hidden_dim=344, attention_bias=True
    )
    block = make_block(cfg, seed=8)
    x = rng.standard_normal((3, 97, 128)).astype(np.float32)
    model = make_model(dict(cfg, n_layers=2, vocab_size=301), seed=8)
    ids = rng.integers(0, 301, (2, 61))
    results = {}
    for n in (1, 2, 1):
        lk.set_num_threads(n)
        assert lk.get_num_threads() == n
        cache = block.new_cache(3, 100)
        prefill = block(x[:, :90], cache=cache)
        step = block(x[:, 90:], cache=cache)
        results.setdefault(n, []).append(
            (block(x), prefill, step, model(ids), model.generate(ids[:, :7], 6))
        )
    for a, b in zip(results[1][0], results[2][0], strict=True):
        np.testing.assert_array_equal(a, b)
    for a, b in zip(results[1][0], results[1][1], strict=True):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "int8", "int4"])
@pytest.mark.parametrize("position", ["pre", "post"])
def test_last_only_skips_the_last_blocks_other_positions(
    rng, position: str, dtype: str, exact_bf16: None
) -> None:
    """``last_only``: the last block computes the last position of each sequence only (its
    query, output projection and MLP; every position's key and value still). Its logits are the
    full forward's last row (a GEMV instead of a GEMM row: within rounding), and a cache it fills
    holds the same keys and values: the decode steps after it match. (int8 / int4: those
    rows take the decode kernels, with activations rounded to int8 per token, where the
    prefill GEMM multiplies float ones: within the activations' rounding, and the same argmax.)"""
    cfg = block_config("d64", 2, "llama3", n_layers=2, vocab_size=211, norm_position=position)
    model = make_model(cfg, seed=4)
    if dtype in ("int8", "int4"):
        model.quantize(bits=int(dtype[3:]), group_size=32)
    elif dtype != "float32":
        model = model.to(dtype)
    ids, mask = left_pad([rng.integers(1, 211, n) for n in (11, 6)])
    full = model(ids, mask=mask)
    tol = {"rtol": 5e-2, "atol": 5e-2} if dtype.startswith("int") else {"rtol": 1e-5, "atol": 1e-5}
    last = model(ids, mask=mask, last_only=True)
    np.testing.assert_allclose(last, full[:, -1:], **tol)
    np.testing.assert_array_equal(last.argmax(-1), full[:, -1:].argmax(-1))
    a, b = model.new_cache(2, 16), model.new_cache(2, 16)
    model(ids, mask=mask, cache=a)
    np.testing.assert_allclose(model(ids, mask=mask, cache=b, last_only=True), full[:, -1:], **tol)
    for la, lb in zip(a.layers, b.layers, strict=True):
        np.testing.assert_array_equal(la.keys(), lb.keys())
        np.testing.assert_array_equal(la.values(), lb.values())
    nxt = rng.integers(1, 211, (2, 1))
    np.testing.assert_array_equal(model(nxt, cache=a), model(nxt, cache=b, last_only=True))


def test_mask_free_paths_give_the_masked_answers(rng) -> None:
    """Attention skips the padding mask where it masks nothing: an all-true ``mask`` (what a
    tokenizer gives for unpadded prompts), and a cache none of whose tokens since its last
    reset was padding. Bitwise the answers of the masked paths; a cache that held padding
    before ``reset`` answers as a fresh one."""
    model = make_model(model_config(), seed=5)
    ids = rng.integers(1, 211, (2, 9))
    ones = np.ones(ids.shape, dtype=bool)
    np.testing.assert_array_equal(model(ids, mask=ones), model(ids))
    fresh = model.new_cache(2, 12)
    want = [model(ids, cache=fresh), model(ids[:, :1], cache=fresh)]
    used = model.new_cache(2, 12)
    padded, mask = left_pad([ids[0, :5], ids[1]])
    model(padded, mask=mask, cache=used)  # padding in the cache
    nxt = model(ids[:, :1], cache=used)  # its mask still applies: the padded slots stay out
    alone = model.new_cache(1, 12)
    model(ids[:1, :5], cache=alone)
    np.testing.assert_allclose(nxt[0], model(ids[:1, :1], cache=alone)[0], rtol=1e-4, atol=1e-4)
    used.reset()
    got = [model(ids, cache=used), model(ids[:, :1], cache=used)]
    for g, w in zip(got, want, strict=True):
        np.testing.assert_array_equal(g, w)
