"""The reference LLaMA block and model (``reference.transformer_block``,
``reference.transformer_forward``, ``reference.greedy_generate``, ``pure.transformer_block``)
against Hugging Face ``transformers`` (``LlamaDecoderLayer``, ``LlamaForCausalLM``,
``generate``), a hand-written PyTorch float64 block (post-norm and LayerNorm variants, which
HF LLaMA does not have), each other, and their own KV cache.

HF run in float64 still has two float32 islands: ``LlamaRMSNorm`` casts its input to float32,
and ``LlamaRotaryEmbedding`` computes its inverse frequencies and angles in float32 (the eager
attention also takes its softmax in float32). The strict comparisons (``rtol = atol = 1e-10``)
therefore run HF with the ``hf_float64`` fixture, which replaces those two forwards by the
same formulas in float64 (the rotary one with ``reference.rope_inv_freq``, checked against
HF's own ``inv_freq`` and ``attention_scaling`` first) and use the SDPA attention; the
unpatched HF is checked at a tolerance that float32 rounding explains.
"""

from __future__ import annotations

import copy
from typing import Any

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from _models import hf_block_config, hf_greedy, llama3_scaling, numpy_state, t
from llmkernels import pure
from llmkernels import reference as ref
from transformers import LlamaConfig, LlamaForCausalLM
from transformers.models.llama.modeling_llama import (
    LlamaDecoderLayer,
    LlamaRMSNorm,
    LlamaRotaryEmbedding,
)

STRICT = {"rtol": 1e-10, "atol": 1e-10}
LOOSE = {"rtol": 2e-5, "atol": 2e-5}  # HF's float32 norms/angles/softmax, outputs of O(1)

LLAMA3 = llama3_scaling(16)  # short, so the toy positions cross the bands
ROPES = {"theta1e4": (10000.0, None), "llama3": (500000.0, LLAMA3)}
# (hidden, heads, head_dim, intermediate): LLaMA-like, and one with heads * head_dim != hidden
GEOMETRIES = {"h64": (64, 4, 16, 96), "h60hd10": (60, 4, 10, 77)}


# --- building HF models and the matching reference config ----------------------------------


def hf_config(
    geometry: str = "h64", n_kv_heads: int = 2, rope: str = "theta1e4", **kw: Any
) -> LlamaConfig:
    """``kw``: :func:`_models.hf_block_config`'s (``vocab_size`` 53 by default)."""
    kw.setdefault("vocab_size", 53)
    return hf_block_config(GEOMETRIES[geometry], n_kv_heads, ROPES[rope], **kw)


def ref_config(config: LlamaConfig, **extra: object) -> dict:
    """The reference's canonical config dict for an HF ``LlamaConfig``."""
    params = dict(config.rope_parameters)
    theta = params.pop("rope_theta")
    return {
        "dim": config.hidden_size,
        "n_layers": config.num_hidden_layers,
        "n_heads": config.num_attention_heads,
        "n_kv_heads": config.num_key_value_heads,
        "head_dim": config.head_dim,
        "hidden_dim": config.intermediate_size,
        "vocab_size": config.vocab_size,
        "norm_eps": config.rms_norm_eps,
        "rope_theta": theta,
        "rope_scaling": None if params["rope_type"] == "default" else params,
        "attention_bias": config.attention_bias,
        "mlp_bias": config.mlp_bias,
        "tie_embeddings": config.tie_word_embeddings,
        **extra,
    }


def randomize(module: torch.nn.Module, seed: int) -> None:
    """Replace HF's near-trivial init (std 0.02, norms = 1) by weights of O(1) outputs."""
    rng = np.random.default_rng(seed)
    with torch.no_grad():
        for name, p in module.named_parameters():
            if "norm" in name:
                values = 1.0 + 0.2 * rng.standard_normal(p.shape)
            elif name.endswith("bias"):
                values = 0.2 * rng.standard_normal(p.shape)
            elif "embed_tokens" in name:
                values = rng.standard_normal(p.shape)
            else:  # (out, in): unit-variance outputs
                values = rng.standard_normal(p.shape) / np.sqrt(p.shape[1])
            p.copy_(torch.from_numpy(values))


def _rms_forward_f64(self: LlamaRMSNorm, hidden_states: torch.Tensor) -> torch.Tensor:
    variance = hidden_states.pow(2).mean(-1, keepdim=True)
    return self.weight * (hidden_states * torch.rsqrt(variance + self.variance_epsilon))


def _hf_scaling(config: LlamaConfig) -> tuple[float, dict | None]:
    params = dict(config.rope_parameters)
    theta = params.pop("rope_theta")
    return theta, (None if params["rope_type"] == "default" else params)


def _rotary_forward_f64(
    self: LlamaRotaryEmbedding, x: torch.Tensor, position_ids: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    theta, scaling = _hf_scaling(self.config)
    inv_freq = torch.from_numpy(ref.rope_inv_freq(self.config.head_dim, theta, scaling))
    freqs = position_ids[..., None].to(torch.float64) * inv_freq  # (B, T, hd/2)
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos() * self.attention_scaling, emb.sin() * self.attention_scaling


@pytest.fixture
def hf_float64(monkeypatch: pytest.MonkeyPatch) -> None:
    """HF LLaMA with its float32 RMSNorm and RoPE angles computed in float64 instead."""
    monkeypatch.setattr(LlamaRMSNorm, "forward", _rms_forward_f64)
    monkeypatch.setattr(LlamaRotaryEmbedding, "forward", _rotary_forward_f64)


def hf_layer(config: LlamaConfig, seed: int = 0) -> LlamaDecoderLayer:
    layer = LlamaDecoderLayer(config, layer_idx=0).double().eval()
    randomize(layer, seed)
    return layer


def hf_model(config: LlamaConfig, seed: int = 0) -> LlamaForCausalLM:
    model = LlamaForCausalLM(config).double().eval()
    randomize(model, seed)
    return model


# per-sequence RoPE positions: a plain run and an offset one
POSITIONS = np.stack([np.arange(7), 5 + np.arange(7)]).astype(np.int64)


def run_hf_layer(
    layer: LlamaDecoderLayer, x: np.ndarray, positions: np.ndarray, attention_mask=None
) -> np.ndarray:
    rotary = LlamaRotaryEmbedding(layer.self_attn.config)
    xt = t(x)
    pos = t(positions)
    with torch.no_grad():
        cos, sin = rotary(xt, pos)  # (B, T, head_dim) each
        # LlamaDecoderLayer.forward returns the hidden states tensor itself (no tuple) in 5.x
        out = layer(xt, attention_mask=attention_mask, position_embeddings=(cos, sin))
    assert isinstance(out, torch.Tensor)
    return out.numpy()


# --- the patched HF is HF -------------------------------------------------------------------


@pytest.mark.parametrize("rope", list(ROPES))
def test_float64_rotary_patch_matches_hf_frequencies(rope):
    config = hf_config("h64", 2, rope)
    rotary = LlamaRotaryEmbedding(config)  # unpatched: HF's float32 inv_freq
    theta, scaling = _hf_scaling(config)
    np.testing.assert_allclose(
        rotary.inv_freq.numpy(), ref.rope_inv_freq(config.head_dim, theta, scaling), rtol=1e-6
    )
    assert rotary.attention_scaling == ref.rope_attention_factor(scaling)


# --- one block against HF LlamaDecoderLayer -------------------------------------------------


@pytest.mark.parametrize("bias", [False, True], ids=["nobias", "bias"])
@pytest.mark.parametrize("rope", list(ROPES))
@pytest.mark.parametrize("n_kv_heads", [2, 4])
@pytest.mark.parametrize("geometry", list(GEOMETRIES))
def test_block_vs_hf_decoder_layer(geometry, n_kv_heads, rope, bias, hf_float64, rng):
    config = hf_config(geometry, n_kv_heads, rope, bias=bias)
    layer = hf_layer(config)
    x = rng.standard_normal((2, 7, config.hidden_size))
    expected = run_hf_layer(layer, x, POSITIONS)
    got = ref.transformer_block(x, numpy_state(layer), ref_config(config), positions=POSITIONS)
    assert got.dtype == np.float64 and got.shape == x.shape
    np.testing.assert_allclose(got, expected, **STRICT)

    # default positions are arange(T)
    expected0 = run_hf_layer(layer, x, np.broadcast_to(np.arange(7), (2, 7)))
    np.testing.assert_allclose(
        ref.transformer_block(x, numpy_state(layer), ref_config(config)), expected0, **STRICT
    )


def test_block_vs_unpatched_hf_decoder_layer(rng):
    """HF as shipped (float32 RMSNorm and RoPE angles), SDPA with the implicit causal mask and
    eager with an explicit additive 4-D causal mask (eager needs one: without it, it is not
    causal; its softmax is float32)."""
    x = rng.standard_normal((2, 7, 64))
    for attn in ("sdpa", "eager"):
        config = hf_config("h64", 2, "llama3", bias=True, attn=attn)
        layer = hf_layer(config)
        mask = None
        if attn == "eager":
            causal = torch.ones(7, 7, dtype=torch.bool).tril()
            mask = torch.zeros(2, 1, 7, 7, dtype=torch.float64)
            mask = mask.masked_fill(~causal, torch.finfo(torch.float64).min)
        expected = run_hf_layer(layer, x, POSITIONS, attention_mask=mask)
        got = ref.transformer_block(x, numpy_state(layer), ref_config(config), positions=POSITIONS)
        np.testing.assert_allclose(got, expected, **LOOSE)


# --- the whole model against HF LlamaForCausalLM ---------------------------------------------


@pytest.mark.parametrize("tie", [False, True], ids=["untied", "tied"])
@pytest.mark.parametrize("rope", list(ROPES))
def test_forward_vs_hf_causal_lm(rope, tie, hf_float64, rng):
    config = hf_config("h60hd10", 2, rope, n_layers=3, tie=tie, bias=True)
    model = hf_model(config)
    ids = rng.integers(0, config.vocab_size, (2, 9))
    with torch.no_grad():
        expected = model(t(ids)).logits.numpy()
    state = numpy_state(model)
    cfg = ref_config(config)
    got = ref.transformer_forward(ids, state, cfg)
    assert got.shape == (2, 9, config.vocab_size)
    np.testing.assert_allclose(got, expected, **STRICT)
    if tie:
        assert np.array_equal(state["lm_head.weight"], state["model.embed_tokens.weight"])
        # tied: lm_head.weight may be absent, with or without the config flag
        del state["lm_head.weight"]
        np.testing.assert_allclose(ref.transformer_forward(ids, state, cfg), expected, **STRICT)
        cfg["tie_embeddings"] = False
        np.testing.assert_allclose(ref.transformer_forward(ids, state, cfg), expected, **STRICT)
    else:
        assert not np.array_equal(state["lm_head.weight"], state["model.embed_tokens.weight"])
        # the config flag forces the tie even when an lm_head.weight is present
        cfg["tie_embeddings"] = True
        tied = ref.transformer_forward(ids, state, cfg)
        state_tied = dict(state, **{"lm_head.weight": state["model.embed_tokens.weight"]})
        np.testing.assert_allclose(
            tied, ref.transformer_forward(ids, state_tied, ref_config(config))
        )


def test_forward_vs_unpatched_hf_causal_lm(rng):
    config = hf_config("h64", 2, "llama3", n_layers=2)
    model = hf_model(config)
    ids = rng.integers(0, config.vocab_size, (2, 9))
    with torch.no_grad():
        expected = model(t(ids)).logits.numpy()
    got = ref.transformer_forward(ids, numpy_state(model), ref_config(config))
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-4)


def test_forward_padding_mask_vs_hf(hf_float64, rng):
    """A 2-D key-padding mask (HF ``attention_mask``): right padding with the default
    positions, left padding with positions counted from the first real token (as HF
    ``generate`` does). Only the real tokens' logits are compared (HF's padded rows are
    unspecified)."""
    config = hf_config("h64", 2, "theta1e4", n_layers=2)
    model = hf_model(config)
    state, cfg = numpy_state(model), ref_config(config)
    ids = rng.integers(0, config.vocab_size, (2, 8))
    mask = np.array([[1, 1, 1, 1, 1, 1, 1, 1], [1, 1, 1, 1, 1, 0, 0, 0]], dtype=bool)
    with torch.no_grad():
        expected = model(t(ids), attention_mask=t(mask.astype(np.int64))).logits.numpy()
    got = ref.transformer_forward(ids, state, cfg, mask=mask)
    np.testing.assert_allclose(got[mask], expected[mask], **STRICT)
    # the padding changes nothing for the real tokens: row 1 alone, unpadded
    alone = ref.transformer_forward(ids[1:, :5], state, cfg)
    np.testing.assert_allclose(got[1, :5], alone[0], rtol=1e-12, atol=1e-12)

    left = mask[:, ::-1].copy()
    positions = np.maximum(np.cumsum(left, axis=1) - 1, 0)
    with torch.no_grad():
        expected = model(
            t(ids), attention_mask=t(left.astype(np.int64)), position_ids=t(positions)
        ).logits.numpy()
    got = ref.transformer_forward(ids, state, cfg, positions=positions, mask=left)
    np.testing.assert_allclose(got[left], expected[left], **STRICT)
    alone = ref.transformer_forward(ids[1:, 3:], state, cfg)
    np.testing.assert_allclose(got[1, 3:], alone[0], rtol=1e-12, atol=1e-12)


def test_greedy_generate_vs_hf(hf_float64, rng):
    config = hf_config("h64", 2, "llama3", n_layers=2, tie=True)
    model = hf_model(config, seed=3)
    ids = rng.integers(0, config.vocab_size, (2, 5))
    expected = hf_greedy(model, ids, 8)
    got = ref.greedy_generate(ids, numpy_state(model), ref_config(config), 8)
    assert got.dtype == np.int64 and got.shape == (2, 13)
    np.testing.assert_array_equal(got, expected)
    # a single unbatched prompt
    one = ref.greedy_generate(ids[0], numpy_state(model), ref_config(config), 8)
    np.testing.assert_array_equal(one, expected[0])


# --- post-norm and LayerNorm variants against a hand-written PyTorch block -------------------


def torch_block(x, w, cfg, positions):
    """An independent float64 PyTorch block: F.linear, F.rms_norm/F.layer_norm, rotate_half
    RoPE, F.scaled_dot_product_attention (GQA, causal), F.silu."""
    dim, n_heads, n_kv, hd = cfg["dim"], cfg["n_heads"], cfg["n_kv_heads"], cfg["head_dim"]
    eps, ab, mb = cfg["norm_eps"], cfg["attention_bias"], cfg["mlp_bias"]

    def lin(u, name, bias):
        return F.linear(u, w[name + ".weight"], w[name + ".bias"] if bias else None)

    def norm(u, name):
        if cfg["norm"] == "rms":
            return F.rms_norm(u, (dim,), w[name + ".weight"], eps)
        return F.layer_norm(u, (dim,), w[name + ".weight"], w[name + ".bias"], eps)

    def attn(u):
        b, n, _ = u.shape
        q = lin(u, "self_attn.q_proj", ab).view(b, n, n_heads, hd).transpose(1, 2)
        k = lin(u, "self_attn.k_proj", ab).view(b, n, n_kv, hd).transpose(1, 2)
        v = lin(u, "self_attn.v_proj", ab).view(b, n, n_kv, hd).transpose(1, 2)
        inv = 1.0 / cfg["rope_theta"] ** (torch.arange(0, hd, 2, dtype=torch.float64) / hd)
        ang = positions[:, None, :, None].to(torch.float64) * inv  # (B, 1, T, hd/2)
        cos, sin = torch.cat([ang.cos()] * 2, -1), torch.cat([ang.sin()] * 2, -1)

        def rot(z):
            return z * cos + torch.cat([-z[..., hd // 2 :], z[..., : hd // 2]], -1) * sin

        o = F.scaled_dot_product_attention(rot(q), rot(k), v, is_causal=True, enable_gqa=True)
        return lin(o.transpose(1, 2).reshape(b, n, n_heads * hd), "self_attn.o_proj", ab)

    def ffn(u):
        gate, up = lin(u, "mlp.gate_proj", mb), lin(u, "mlp.up_proj", mb)
        return lin(F.silu(gate) * up, "mlp.down_proj", mb)

    if cfg["norm_position"] == "pre":
        h = x + attn(norm(x, "input_layernorm"))
        return h + ffn(norm(h, "post_attention_layernorm"))
    h = norm(x + attn(x), "input_layernorm")
    return norm(h + ffn(h), "post_attention_layernorm")


def random_weights(cfg: dict, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """A layer's HF-named weights for ``cfg`` (norm biases for LayerNorm, projection biases
    when enabled)."""
    dim, hd, hidden = cfg["dim"], cfg["head_dim"], cfg["hidden_dim"]
    shapes = {
        "self_attn.q_proj": (cfg["n_heads"] * hd, dim),
        "self_attn.k_proj": (cfg["n_kv_heads"] * hd, dim),
        "self_attn.v_proj": (cfg["n_kv_heads"] * hd, dim),
        "self_attn.o_proj": (dim, cfg["n_heads"] * hd),
        "mlp.gate_proj": (hidden, dim),
        "mlp.up_proj": (hidden, dim),
        "mlp.down_proj": (dim, hidden),
    }
    w = {}
    for name, (n_out, n_in) in shapes.items():
        w[name + ".weight"] = rng.standard_normal((n_out, n_in)) / np.sqrt(n_in)
        bias = cfg["attention_bias"] if name.startswith("self_attn") else cfg["mlp_bias"]
        if bias:
            w[name + ".bias"] = 0.2 * rng.standard_normal(n_out)
    for name in ("input_layernorm", "post_attention_layernorm"):
        w[name + ".weight"] = 1.0 + 0.2 * rng.standard_normal(dim)
        if cfg["norm"] == "layer":
            w[name + ".bias"] = 0.2 * rng.standard_normal(dim)
    return w


def toy_config(**overrides: object) -> dict:
    cfg = {
        "dim": 24,
        "n_layers": 2,
        "n_heads": 6,
        "n_kv_heads": 2,
        "head_dim": 6,
        "hidden_dim": 38,
        "vocab_size": 31,
        "norm_eps": 1e-5,
        # the reference's defaults, written out (torch_block reads every key): RoPE theta 1e4
        # without scaling, pre-norm RMSNorm, no biases, untied embeddings
        **ref._CONFIG_DEFAULTS,
    }
    cfg.update(overrides)
    return cfg


@pytest.mark.parametrize("bias", [False, True], ids=["nobias", "bias"])
@pytest.mark.parametrize("position", ["pre", "post"])
@pytest.mark.parametrize("norm", ["rms", "layer"])
def test_block_variants_vs_torch(norm, position, bias, rng):
    cfg = toy_config(norm=norm, norm_position=position, attention_bias=bias, mlp_bias=bias)
    w = random_weights(cfg, rng)
    x = rng.standard_normal((2, 7, cfg["dim"]))
    with torch.no_grad():
        expected = torch_block(t(x), {k: t(v) for k, v in w.items()}, cfg, t(POSITIONS)).numpy()
    got = ref.transformer_block(x, w, cfg, positions=POSITIONS)
    np.testing.assert_allclose(got, expected, **STRICT)
    if position == "post":  # y = norm2(...): without norm2's affine part, rows are unit
        unit = got - w.get("post_attention_layernorm.bias", 0.0)
        unit = unit / w["post_attention_layernorm.weight"]
        if norm == "layer":
            np.testing.assert_allclose(unit.mean(-1), 0.0, atol=1e-12)
            np.testing.assert_allclose(unit.var(-1), 1.0, rtol=1e-3)
        else:
            np.testing.assert_allclose(np.mean(unit**2, -1), 1.0, rtol=1e-3)


# --- pure Python against the reference ------------------------------------------------------


@pytest.mark.parametrize("bias", [False, True], ids=["nobias", "bias"])
@pytest.mark.parametrize("position", ["pre", "post"])
@pytest.mark.parametrize("norm", ["rms", "layer"])
def test_pure_block_vs_reference(norm, position, bias, rng):
    cfg = toy_config(
        dim=12, n_heads=3, n_kv_heads=1, head_dim=4, hidden_dim=10, norm=norm,
        norm_position=position, attention_bias=bias, mlp_bias=bias,
    )  # fmt: skip
    w = random_weights(cfg, rng)
    x = rng.standard_normal((5, cfg["dim"]))
    expected = ref.transformer_block(x[None], w, cfg)[0]
    got = pure.transformer_block(x.tolist(), {k: v.tolist() for k, v in w.items()}, cfg)
    np.testing.assert_allclose(np.array(got), expected, rtol=1e-12, atol=1e-12)
    positions = [3.0, 4.0, 9.0, 10.0, 11.0]
    expected = ref.transformer_block(x[None], w, cfg, positions=positions)[0]
    got = pure.transformer_block(
        x.tolist(), {k: v.tolist() for k, v in w.items()}, cfg, positions=positions
    )
    np.testing.assert_allclose(np.array(got), expected, rtol=1e-12, atol=1e-12)


# --- KV cache: prefill + decode steps == the full forward -------------------------------------


@pytest.mark.parametrize("position", ["pre", "post"])
@pytest.mark.parametrize("rope", ["default", "llama3"])
def test_block_cache_prefill_then_decode(rope, position, rng):
    cfg = toy_config(norm_position=position, rope_scaling=LLAMA3 if rope == "llama3" else None)
    w = random_weights(cfg, rng)
    x = rng.standard_normal((2, 9, cfg["dim"]))
    full = ref.transformer_block(x, w, cfg)

    cache: dict = {}
    before = copy.deepcopy(cache)
    outs = []
    for start, stop in [(0, 4), (4, 5), (5, 7), (7, 8), (8, 9)]:  # prefill, 1, 2, 1, 1 tokens
        y, new_cache = ref.transformer_block(x[:, start:stop], w, cfg, cache=cache)
        assert cache.keys() == before.keys()  # the input cache is left as it was
        assert new_cache["k"].shape == (2, cfg["n_kv_heads"], stop, cfg["head_dim"])
        assert new_cache["v"].shape == (2, cfg["n_kv_heads"], stop, cfg["head_dim"])
        outs.append(y)
        cache, before = new_cache, copy.deepcopy(new_cache)
    np.testing.assert_allclose(np.concatenate(outs, axis=1), full, rtol=1e-12, atol=1e-12)

    # with a key-padding mask, passed for all L + T keys at each step
    mask = np.ones((2, 9), dtype=bool)
    mask[1, 6:] = False
    full = ref.transformer_block(x, w, cfg, mask=mask)
    y0, cache = ref.transformer_block(x[:, :6], w, cfg, mask=mask[:, :6], cache={})
    outs = [y0]
    for step in range(6, 9):
        y, cache = ref.transformer_block(
            x[:, step : step + 1], w, cfg, mask=mask[:, : step + 1], cache=cache
        )
        outs.append(y)
    np.testing.assert_allclose(np.concatenate(outs, axis=1), full, rtol=1e-12, atol=1e-12)


def test_forward_cache_vs_hf_cache_and_full_forward(hf_float64, rng):
    config = hf_config("h64", 2, "llama3", n_layers=2)
    model = hf_model(config)
    state, cfg = numpy_state(model), ref_config(config)
    ids = rng.integers(0, config.vocab_size, (2, 8))
    full = ref.transformer_forward(ids, state, cfg)

    logits, cache = ref.transformer_forward(ids[:, :5], state, cfg, cache=[])
    assert len(cache) == config.num_hidden_layers
    # the cached keys are HF's (DynamicCache.layers[i].keys, already rotated)
    with torch.no_grad():
        past = model(t(ids[:, :5]), use_cache=True).past_key_values
    for i in range(config.num_hidden_layers):
        np.testing.assert_allclose(cache[i]["k"], past.layers[i].keys.numpy(), **STRICT)
        np.testing.assert_allclose(cache[i]["v"], past.layers[i].values.numpy(), **STRICT)

    outs = [logits]
    for step in range(5, 8):
        logits, cache = ref.transformer_forward(ids[:, step : step + 1], state, cfg, cache=cache)
        outs.append(logits)
    np.testing.assert_allclose(np.concatenate(outs, axis=1), full, rtol=1e-12, atol=1e-12)


# --- config defaults ------------------------------------------------------------------------


def test_config_defaults(rng):
    full = toy_config(n_kv_heads=6, head_dim=4, norm_eps=1e-6)
    minimal = {"dim": 24, "n_heads": 6}
    for key in ("n_kv_heads", "head_dim", "norm", "norm_position", "norm_eps", "rope_theta"):
        assert ref._cfg_get(minimal, key) == full[key]
    for key in ("attention_bias", "mlp_bias", "tie_embeddings"):
        assert ref._cfg_get(minimal, key) is False
    assert ref._cfg_get(minimal, "rope_scaling") is None
    assert ref._cfg_get(dict(minimal, norm="layer"), "norm_eps") == 1e-5
    with pytest.raises(KeyError, match="n_layers"):
        ref._cfg_get(minimal, "n_layers")
    w = random_weights(full, rng)
    x = rng.standard_normal((1, 3, 24))
    np.testing.assert_array_equal(
        ref.transformer_block(x, w, minimal), ref.transformer_block(x, w, full)
    )
    with pytest.raises(ValueError, match="norm_position"):
        ref.transformer_block(x, w, dict(minimal, norm_position="sandwich"))
    with pytest.raises(ValueError, match="norm"):
        ref.transformer_block(x, w, dict(minimal, norm="batch"))
