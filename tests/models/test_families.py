"""The LLaMA family beyond ``model_type: llama``: Mistral (sliding-window
attention), Qwen2 (biases on q/k/v only), Qwen3 (per-head q/k RMSNorm) and Phi-3 (fused
qkv_proj / gate_up_proj, longrope) and Gemma (GeGLU, 1 + weight norms, sqrt(dim) embedding
scale, tied head) and Gemma 2 (sandwich norms, attention and final soft-capping, alternating
sliding-window layers, query_pre_attn_scalar), saved by transformers and loaded by
``Transformer.from_pretrained``, against transformers' eager forward and greedy generation.
Types not supported yet are refused with the list of those that are."""

from __future__ import annotations

import json
from pathlib import Path

import llmkernels as lk
import numpy as np
import pytest
import torch
from llmkernels._config import ConfigError, ModelConfig
from transformers import (
    Gemma2Config,
    Gemma2ForCausalLM,
    GemmaConfig,
    GemmaForCausalLM,
    MistralConfig,
    MistralForCausalLM,
    Phi3Config,
    Phi3ForCausalLM,
    Qwen2Config,
    Qwen2ForCausalLM,
    Qwen3Config,
    Qwen3ForCausalLM,
)

SMALL = {
    "hidden_size": 64,
    "intermediate_size": 96,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": 97,
    "max_position_embeddings": 128,
}


# Gemma configs: special tokens inside the small vocabulary, transformers' eager attention
GEMMA_TOKENS = {
    "pad_token_id": 0,
    "eos_token_id": 1,
    "bos_token_id": 2,
    "attn_implementation": "eager",
}


def save(model: torch.nn.Module, directory: Path) -> Path:
    model.save_pretrained(directory, safe_serialization=True)
    return directory


def randomise_biases(model: torch.nn.Module, seed: int) -> None:
    """HF initialises biases to zero: random ones make the test see them."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(".bias"):
                p.copy_(torch.randn(p.shape, generator=g) * 0.5)


def hf_logits(model: torch.nn.Module, ids: np.ndarray) -> np.ndarray:
    with torch.no_grad():
        return model(torch.from_numpy(ids)).logits.numpy()


def compare(
    hf: torch.nn.Module,
    directory: Path,
    prompt_len: int,
    new_tokens: int = 32,
    padded: bool = True,
    decode: bool = True,
) -> None:
    """Logits vs transformers' eager model; 32 greedy tokens through the KV cache (past the
    window) identical to transformers' generate; prefill + token-by-token decode equal to the
    full forward; and (``padded``) a left-padded batch equal to its rows run alone."""
    ours = lk.Transformer.from_pretrained(directory, progress=False)
    ids = np.random.default_rng(1).integers(3, SMALL["vocab_size"], (2, prompt_len))
    full = ours(ids)
    np.testing.assert_allclose(full, hf_logits(hf, ids), rtol=1e-4, atol=2e-4)
    with torch.no_grad():
        want = hf.generate(
            torch.from_numpy(ids[:1]),
            max_new_tokens=new_tokens,
            do_sample=False,
            pad_token_id=0,
            eos_token_id=None,
        ).numpy()
    got = ours.generate(ids[:1], new_tokens, progress=False)
    np.testing.assert_array_equal(got, want)
    if decode:  # prefill of 3 tokens, then one token at a time through the cache
        cache = ours.new_cache(2, prompt_len)
        steps = [ours(ids[:, :3], cache=cache)]
        steps += [ours(ids[:, t : t + 1], cache=cache) for t in range(3, prompt_len)]
        np.testing.assert_allclose(np.concatenate(steps, axis=1), full, rtol=1e-5, atol=1e-5)
    # last_only: the last block computes the last position only (and every position's K/V): the
    # same logits, and a cache filled as by the full forward (chunks of 3, then 5 tokens: past
    # a sliding window's ring)
    # (without ``decode``, RoPE depends on the call's length: chunks differ from the whole)
    np.testing.assert_allclose(ours(ids, last_only=True), full[:, -1:], rtol=1e-5, atol=1e-5)
    cache = ours.new_cache(2, prompt_len)
    chunks = [(0, 3), (3, min(8, prompt_len - 1))] + [(t, t + 1) for t in range(8, prompt_len)]
    for t0, t1 in chunks if decode else []:
        if t0 < t1:
            last = ours(ids[:, t0:t1], cache=cache, last_only=True)
            np.testing.assert_allclose(last, full[:, t1 - 1 : t1], rtol=1e-5, atol=1e-5)
    if padded:  # row 1 shorter by 4, left-padded: its logits are those of the row alone
        batch = ids.copy()
        batch[1, :4] = 0
        mask = np.ones_like(batch, dtype=bool)
        mask[1, :4] = False
        out = ours(batch, mask=mask)
        alone = ours(ids[1:, 4:])
        np.testing.assert_allclose(out[0], full[0], rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(out[1, 4:], alone[0], rtol=1e-4, atol=1e-4)
        last = ours(batch, mask=mask, last_only=True)
        np.testing.assert_allclose(last, out[:, -1:], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("window", [5, None])
def test_mistral_sliding_window_matches_transformers(tmp_path: Path, window: int | None) -> None:
    torch.manual_seed(0)
    cfg = MistralConfig(**SMALL, sliding_window=window, attn_implementation="eager")
    hf = MistralForCausalLM(cfg).eval()
    directory = save(hf, tmp_path / "mistral")
    assert json.loads((directory / "config.json").read_text())["model_type"] == "mistral"
    loaded = ModelConfig.from_dict(json.loads((directory / "config.json").read_text()))
    assert loaded.model_type == "mistral" and loaded.sliding_window == window
    # (with a window, a left-padded row is not its unpadded self in transformers either: its
    # window counts cache slots, pads included -- the padded check runs without a window)
    compare(hf, directory, prompt_len=12, padded=window is None)


def test_mistral_window_changes_the_answer(tmp_path: Path) -> None:
    # the bug this guards: a Mistral loaded as LLaMA (no window) differs once the prompt
    # passes the window
    torch.manual_seed(0)
    hf = MistralForCausalLM(MistralConfig(**SMALL, sliding_window=4)).eval()
    directory = save(hf, tmp_path / "m")
    ids = np.arange(16)[None] % SMALL["vocab_size"]
    windowed = lk.Transformer.from_pretrained(directory, progress=False)(ids)
    cfg = json.loads((directory / "config.json").read_text())
    cfg["sliding_window"] = None
    (directory / "config.json").write_text(json.dumps(cfg))
    full = lk.Transformer.from_pretrained(directory, progress=False)(ids)
    np.testing.assert_array_equal(windowed[:, :4], full[:, :4])
    assert np.abs(windowed[:, 4:] - full[:, 4:]).max() > 1e-3


def test_qwen2_qkv_biases_match_transformers(tmp_path: Path) -> None:
    torch.manual_seed(0)
    cfg = Qwen2Config(**SMALL, use_sliding_window=False, attn_implementation="eager")
    hf = Qwen2ForCausalLM(cfg).eval()
    randomise_biases(hf, 3)
    directory = save(hf, tmp_path / "qwen2")
    loaded = lk.Transformer.from_pretrained(directory, progress=False)
    keys = loaded.state_dict()
    assert "model.layers.0.self_attn.q_proj.bias" in keys
    assert "model.layers.0.self_attn.o_proj.bias" not in keys
    compare(hf, directory, prompt_len=9)


@pytest.mark.parametrize("longrope", [False, True])
def test_phi3_fused_projections_match_transformers(tmp_path: Path, longrope: bool) -> None:
    torch.manual_seed(0)
    extra = {}
    if longrope:  # Phi-3 128k style: longrope factors, prompt past the original length
        extra = {
            "original_max_position_embeddings": 8,
            "rope_scaling": {
                "type": "longrope",
                "long_factor": [1.0 + 0.3 * i for i in range(8)],
                "short_factor": [1.0 + 0.05 * i for i in range(8)],
            },
        }
    cfg = Phi3Config(**SMALL, **extra, pad_token_id=0, eos_token_id=1, attn_implementation="eager")
    hf = Phi3ForCausalLM(cfg).eval()
    directory = save(hf, tmp_path / "phi3")
    loaded = lk.Transformer.from_pretrained(directory, progress=False)
    keys = loaded.state_dict()
    assert keys["model.layers.0.self_attn.qkv_proj.weight"].shape == (64 + 2 * 32, 64)
    assert keys["model.layers.0.mlp.gate_up_proj.weight"].shape == (2 * 96, 64)
    assert "model.layers.0.self_attn.q_proj.weight" not in keys
    # (longrope switches to the long factors once the sequence passes the original length: a
    # decode that starts below it, or a padded row shorter than it, uses other frequencies
    # than the full forward, in transformers too -- those checks run without longrope)
    compare(hf, directory, prompt_len=11, decode=not longrope, padded=not longrope)


def test_qwen3_qk_norms_match_transformers(tmp_path: Path) -> None:
    torch.manual_seed(0)
    cfg = Qwen3Config(**SMALL, head_dim=24, use_sliding_window=False, attn_implementation="eager")
    hf = Qwen3ForCausalLM(cfg).eval()
    with torch.no_grad():  # non-unit norm weights, so the test sees them
        for layer in hf.model.layers:
            layer.self_attn.q_norm.weight.uniform_(0.5, 1.5)
            layer.self_attn.k_norm.weight.uniform_(0.5, 1.5)
    directory = save(hf, tmp_path / "qwen3")
    loaded = lk.Transformer.from_pretrained(directory, progress=False)
    assert loaded.state_dict()["model.layers.1.self_attn.k_norm.weight"].shape == (24,)
    assert loaded.config.head_dim == 24 and loaded.config.qk_norm
    compare(hf, directory, prompt_len=10)


def test_gemma_matches_transformers(tmp_path: Path) -> None:
    torch.manual_seed(0)
    cfg = GemmaConfig(**{**SMALL, "num_key_value_heads": 1}, head_dim=32, **GEMMA_TOKENS)
    hf = GemmaForCausalLM(cfg).eval()
    with torch.no_grad():  # non-zero norm weights (HF initialises them to 0: 1 + 0)
        for name, p in hf.named_parameters():
            if name.endswith("norm.weight"):
                p.uniform_(-0.5, 0.5)
    directory = save(hf, tmp_path / "gemma")
    loaded = lk.Transformer.from_pretrained(directory, progress=False)
    c = loaded.config
    assert (c.activation, c.norm_unit_offset, c.embed_scale, c.tie_embeddings) == (
        "gelu_tanh",
        True,
        True,
        True,
    )
    compare(hf, directory, prompt_len=9)


def test_gemma2_matches_transformers(tmp_path: Path) -> None:
    torch.manual_seed(0)
    cfg = Gemma2Config(
        **{**SMALL, "num_hidden_layers": 3},
        head_dim=16,
        sliding_window=4,  # shorter than the prompt, on layers 0 and 2
        attn_logit_softcapping=0.5,  # scores of O(1): the cap clips
        final_logit_softcapping=0.3,
        query_pre_attn_scalar=24,
        **GEMMA_TOKENS,
    )
    hf = Gemma2ForCausalLM(cfg).eval()
    with torch.no_grad():
        for name, p in hf.named_parameters():
            if name.endswith("norm.weight"):
                p.uniform_(-0.5, 0.5)
            elif "q_proj" in name:
                p.mul_(8.0)  # larger scores, so the attention soft-cap is far from linear
    directory = save(hf, tmp_path / "gemma2")
    loaded = lk.Transformer.from_pretrained(directory, progress=False)
    c = loaded.config
    assert c.norm_position == "sandwich" and c.layer_types == (
        "sliding_attention",
        "full_attention",
        "sliding_attention",
    )
    assert "model.layers.0.pre_feedforward_layernorm.weight" in loaded.state_dict()
    assert [b.attention._impl.window for b in loaded.blocks] == [4, 0, 4]
    # (left-padded rows differ with a window: see test_mistral_sliding_window...)
    compare(hf, directory, prompt_len=11, padded=False)


def test_geglu_feed_forward_matches_torch(rng) -> None:
    ffn = lk.FeedForward(16, 40, activation="gelu_tanh", seed=0)
    w = {k: torch.from_numpy(v.copy()) for k, v in ffn.state_dict().items()}
    x = rng.standard_normal((3, 5, 16)).astype(np.float32) * 4  # GELU's tails too
    xt = torch.from_numpy(x)
    gate = torch.nn.functional.gelu(xt @ w["gate_proj.weight"].T, approximate="tanh")
    want = (gate * (xt @ w["up_proj.weight"].T)) @ w["down_proj.weight"].T
    np.testing.assert_allclose(ffn(x), want.numpy(), rtol=1e-4, atol=1e-4)
    with pytest.raises(ValueError, match=r"^\[FeedForward\] activation must be"):
        lk.FeedForward(16, 40, activation="relu")


def test_config_round_trip_per_family() -> None:
    for model_type, extra in (
        ("mistral", {"sliding_window": 7}),
        ("qwen2", {}),
        ("phi3", {"sliding_window": 9}),
        ("qwen3", {"head_dim": 8}),
        ("gemma", {"hidden_act": "gelu_pytorch_tanh", "tie_word_embeddings": True}),
        (
            "gemma2",
            {
                "hidden_act": "gelu_pytorch_tanh",
                "tie_word_embeddings": True,
                "sliding_window": 5,
                "attn_logit_softcapping": 50.0,
                "final_logit_softcapping": 30.0,
                "query_pre_attn_scalar": 64,
            },
        ),
    ):
        hf = {**SMALL, "model_type": model_type, **extra}
        cfg = ModelConfig.from_dict(hf)
        again = ModelConfig.from_dict(cfg.to_hf_dict())
        assert again == cfg, model_type
        assert ModelConfig.from_dict(cfg.to_dict()) == cfg
    qwen = ModelConfig.from_dict({**SMALL, "model_type": "qwen2"})
    assert (qwen.attention_bias, qwen.o_bias) == (True, False)
    n_biases = 2 * (4 * 16 + 2 * 2 * 16)  # two layers of q, k, v biases; no o bias
    plain = ModelConfig.from_dict({**SMALL, "model_type": "llama"})
    assert qwen.n_params - plain.n_params == n_biases


@pytest.mark.parametrize("model_type", ["gemma3", "gpt_oss", "gpt2", ""])
def test_other_model_types_are_refused_with_the_supported_list(model_type: str) -> None:
    with pytest.raises(ConfigError, match=r"model_type: .* not supported \(supported: llama, "):
        ModelConfig.from_dict({**SMALL, "model_type": model_type})


def test_qwen2_sliding_window_layers_are_refused() -> None:
    with pytest.raises(ConfigError, match="use_sliding_window"):
        ModelConfig.from_dict({**SMALL, "model_type": "qwen2", "use_sliding_window": True})


def test_module_options_are_validated() -> None:
    for kw in ({"window": 0}, {"window": 2.5}, {"softcap": 0.0}, {"scale": -1.0}):
        with pytest.raises(ValueError, match=r"^\[MultiHeadAttention\] "):
            lk.MultiHeadAttention(16, 4, **kw)
    with pytest.raises(ValueError, match=r"^\[MultiHeadAttention\] softcap is too large"):
        lk.MultiHeadAttention(16, 4, softcap=10**400)


def test_windowed_module_decode_equals_the_full_forward() -> None:
    # MultiHeadAttention with window, softcap and sinks: the cached decode, token by token,
    # equals the forward over the whole sequence
    rng = np.random.default_rng(0)
    attn = lk.MultiHeadAttention(32, 4, 2, window=3, softcap=2.0, sinks=True, seed=0)
    attn.load_state_dict({"sinks": rng.standard_normal(4).astype(np.float32)}, strict=False)
    x = rng.standard_normal((2, 9, 32)).astype(np.float32)
    full = attn(x)
    cache = attn.new_cache(2, 16)
    steps = [attn(x[:, :2], cache=cache)] + [
        attn(x[:, t : t + 1], cache=cache) for t in range(2, 9)
    ]
    np.testing.assert_allclose(np.concatenate(steps, axis=1), full, rtol=1e-5, atol=1e-6)
