"""The LLaMA family beyond ``model_type: llama``: Mistral (sliding-window
attention), Qwen2 (biases on q/k/v only), Qwen3 (per-head q/k RMSNorm) and Phi-3 (fused
qkv_proj / gate_up_proj, longrope) and Gemma (GeGLU, 1 + weight norms, sqrt(dim) embedding
scale, tied head) and Gemma 2 (sandwich norms, attention and final soft-capping, alternating
sliding-window layers, query_pre_attn_scalar), saved by transformers and loaded by
``Transformer.from_pretrained``, against transformers' eager forward and greedy generation.
Types not supported yet are refused with the list of those that are.

Then config keys a checkpoint leaves out, or spells the way older transformers saved them, read as
transformers 5 reads them: each family's own defaults (Gemma ties its head and uses the tanh
GELU, Gemma 2 caps and scales its scores, Mistral slides over 4096 keys, ...), Phi-3's
top-level ``original_max_position_embeddings``, ``partial_rotary_factor`` ignored by the plain
RoPE of the LLaMA-like families, a tied config whose file holds a different head, and
``generation_config.json`` nulls. Each against transformers' eager model on the same files.
A family's tests are all here: adding one is its file in ``llmkernels/families/``, its line in
``FAMILIES`` and its cases below."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import llmkernels as lk
import numpy as np
import pytest
import torch
import transformers
from _models import TWO_LAYERS
from llmkernels._config import ConfigError, ModelConfig
from llmkernels._safetensors import CheckpointError
from safetensors.numpy import load_file, save_file
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

SMALL = {**TWO_LAYERS, "vocab_size": 97, "max_position_embeddings": 128}


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


# ---- defaults and older spellings of config keys ----

TINY = {
    "hidden_size": 32,
    "intermediate_size": 48,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 8,
    "vocab_size": 64,
    "max_position_embeddings": 64,
    "pad_token_id": 0,
    "bos_token_id": 1,
    "eos_token_id": 2,
}
CLASSES = {
    "llama": "Llama",
    "mistral": "Mistral",
    "qwen2": "Qwen2",
    "qwen3": "Qwen3",
    "phi3": "Phi3",
    "gemma": "Gemma",
    "gemma2": "Gemma2",
}


def checkpoint(
    tmp_path: Path, family: str, extra: dict[str, Any], edit: Any = None
) -> tuple[Path, torch.nn.Module]:
    """A random-weight model saved by transformers, its config.json then edited by ``edit``
    (keys dropped or rewritten), and transformers' eager model loaded back from the files."""
    name = CLASSES[family]
    config_cls = getattr(transformers, f"{name}Config")
    model_cls = getattr(transformers, f"{name}ForCausalLM")
    kwargs = {**TINY, **extra}
    if family in ("qwen2", "mistral", "phi3"):
        kwargs.pop("head_dim")
    torch.manual_seed(0)
    d = tmp_path / family
    model_cls(config_cls(**kwargs)).save_pretrained(d, safe_serialization=True)
    if edit is not None:
        cfg = json.loads((d / "config.json").read_text())
        edit(cfg)
        (d / "config.json").write_text(json.dumps(cfg))
    hf = model_cls.from_pretrained(d, attn_implementation="eager").eval()
    return d, hf


def assert_matches(d: Path, hf: torch.nn.Module, length: int = 40) -> None:
    ids = np.random.default_rng(3).integers(3, TINY["vocab_size"], (1, length))
    with torch.no_grad():
        want = hf(torch.from_numpy(ids)).logits.numpy()
    got = lk.Transformer.from_pretrained(d, progress=False)(ids)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=2e-4)


def drop(*keys: str) -> Any:
    def edit(cfg: dict[str, Any]) -> None:
        for k in keys:
            cfg.pop(k, None)

    return edit


GEMMA2 = {"sliding_window": 6, "query_pre_attn_scalar": 24}
# (family, config of the saved model, keys dropped from its config.json)
MISSING = {
    "gemma_tie": ("gemma", {}, ("tie_word_embeddings",)),
    "gemma_act": ("gemma", {}, ("hidden_act",)),
    "gemma_kv_heads": (
        "gemma",
        {"num_attention_heads": 16, "num_key_value_heads": 16},
        ("num_key_value_heads",),
    ),
    "gemma2_tie": ("gemma2", GEMMA2, ("tie_word_embeddings",)),
    "gemma2_act": ("gemma2", GEMMA2, ("hidden_activation", "hidden_act")),
    "gemma2_scalar": ("gemma2", GEMMA2, ("query_pre_attn_scalar",)),
    "gemma2_caps": (
        "gemma2",
        {**GEMMA2, "attn_logit_softcapping": 50.0, "final_logit_softcapping": 30.0},
        ("attn_logit_softcapping", "final_logit_softcapping"),
    ),
    "mistral_window": ("mistral", {"sliding_window": 4096}, ("sliding_window",)),
    "phi3_eps": ("phi3", {"rms_norm_eps": 1e-5}, ("rms_norm_eps",)),
    "qwen3_head_dim": ("qwen3", {"head_dim": 128}, ("head_dim",)),
}


@pytest.mark.parametrize("case", list(MISSING))
def test_a_missing_key_takes_the_familys_default(tmp_path: Path, case: str) -> None:
    family, extra, keys = MISSING[case]
    d, hf = checkpoint(tmp_path, family, extra, drop(*keys))
    assert_matches(d, hf)


def test_gemma2_defaults_are_transformers(tmp_path: Path) -> None:
    """A Gemma 2 config.json naming only the sizes: tied head, tanh GELU, scores scaled by
    256 ** -0.5 and capped at 50, logits at 30, even layers sliding over 4096 keys."""
    d, _ = checkpoint(tmp_path, "gemma2", GEMMA2)
    keep = {*TINY, "model_type", "architectures"}
    cfg = {k: v for k, v in json.loads((d / "config.json").read_text()).items() if k in keep}
    c = ModelConfig.from_dict(cfg)
    assert c.tie_embeddings and c.activation == "gelu_tanh"
    assert (c.attn_scale, c.attn_softcap, c.final_softcap) == (256**-0.5, 50.0, 30.0)
    assert c.sliding_window == 4096 and c.layer_types == ("sliding_attention", "full_attention")


def test_gemma1_reads_hidden_act_only(tmp_path: Path) -> None:
    """transformers' Gemma (1) builds its MLP from hidden_act; a hidden_activation beside it is
    not read (Gemma 2 reads hidden_activation only)."""

    def edit(cfg: dict[str, Any]) -> None:
        cfg.update(hidden_act="silu", hidden_activation="gelu_pytorch_tanh")

    d, hf = checkpoint(tmp_path, "gemma", {"hidden_act": "silu"}, edit)
    assert ModelConfig.from_dict(json.loads((d / "config.json").read_text())).activation == "silu"
    assert_matches(d, hf)


@pytest.mark.parametrize("value", ["relu", 5, None, "gelu"])
def test_gemma2_activation_is_checked(value: Any) -> None:
    base = {**TINY, "model_type": "gemma2", "hidden_activation": value}
    # "gelu" is the exact GELU for Gemma 2 (only Gemma 1 maps it to the tanh one); null has no
    # activation (transformers fails building the MLP)
    with pytest.raises(ConfigError, match=r"hidden_activation: only 'silu'"):
        ModelConfig.from_dict(base)


@pytest.mark.parametrize(
    ("value", "match"),
    [
        (0, "must be > 0"),
        (-4, "must be > 0"),
        ("256", "must be a real number"),
        (True, "must be a real number"),
        ([1], "must be a real number"),
        (10**400, "must be finite"),
        (float("nan"), "must be finite"),
    ],
)
def test_query_pre_attn_scalar_is_checked(value: Any, match: str) -> None:
    cfg = {**TINY, "model_type": "gemma2", "query_pre_attn_scalar": value}
    with pytest.raises(ConfigError, match=rf"\[config\] query_pre_attn_scalar: {match}"):
        ModelConfig.from_dict(cfg)


@pytest.mark.parametrize("value", [["llama"], {"a": 1}, 3])
def test_model_type_of_the_wrong_type(value: Any) -> None:
    with pytest.raises(ConfigError, match=r"\[config\] model_type: .* is not supported"):
        ModelConfig.from_dict({**TINY, "model_type": value})


def test_norm_eps_must_be_below_one() -> None:
    with pytest.raises(ConfigError, match=r"\[config\] rms_norm_eps: must be < 1"):
        ModelConfig.from_dict({**TINY, "rms_norm_eps": 1e308})


def test_gemma2_null_window_with_sliding_layers_is_refused() -> None:
    cfg = {**TINY, "model_type": "gemma2", "sliding_window": None}
    with pytest.raises(ConfigError, match=r"sliding_window: is null but layer_types"):
        ModelConfig.from_dict(cfg)
    full = ModelConfig.from_dict({**cfg, "layer_types": ["full_attention"] * 2})
    assert full.layer_window(0) is None and full.layer_window(1) is None
    # and the HF dict of such a model reads back as itself
    assert ModelConfig.from_dict(full.to_hf_dict()) == full


LONGROPE = {
    "rope_type": "longrope",
    "short_factor": [1.0 + 0.05 * i for i in range(4)],
    "long_factor": [1.0 + 0.3 * i for i in range(4)],
}


@pytest.mark.parametrize("where", ["top_level_only", "both_differ"])
def test_phi3_top_level_original_max_position_embeddings(tmp_path: Path, where: str) -> None:
    """Phi-3-128k's 4.x configs keep original_max_position_embeddings at the top level, beside
    a rope_scaling of factors only; transformers uses that value (over one in the dict). A
    prompt past it (40 > 8) takes the long factors and the attention factor of 64 / 8."""

    def edit(cfg: dict[str, Any]) -> None:
        rope = dict(LONGROPE)
        if where == "both_differ":
            rope["original_max_position_embeddings"] = 32
        cfg.pop("rope_parameters", None)
        cfg.update(rope_scaling=rope, original_max_position_embeddings=8, rope_theta=10000.0)

    d, hf = checkpoint(tmp_path, "phi3", {"rope_parameters": {**LONGROPE, "rope_theta": 1e4}}, edit)
    c = ModelConfig.from_dict(json.loads((d / "config.json").read_text()))
    assert c.rope_scaling is not None and c.rope_scaling["original_max_position_embeddings"] == 8
    assert_matches(d, hf)
    # and an HF dict written by llmkernels says the same to transformers
    assert ModelConfig.from_dict(c.to_hf_dict()) == c


@pytest.mark.parametrize(
    "rope",
    [
        {"rope_type": "yarn", "factor": 4.0},
        {
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
        },
    ],
)
def test_llama_top_level_original_max_position_embeddings(tmp_path: Path, rope: dict) -> None:
    def edit(cfg: dict[str, Any]) -> None:
        cfg.update(original_max_position_embeddings=16)

    extra = {"rope_parameters": {**rope, "rope_theta": 1e4, "original_max_position_embeddings": 32}}
    d, hf = checkpoint(tmp_path, "llama", extra, edit)
    assert_matches(d, hf)


@pytest.mark.parametrize("family", ["llama", "mistral", "qwen2", "qwen3", "gemma", "phi3"])
def test_partial_rotary_factor_as_transformers(tmp_path: Path, family: str) -> None:
    """transformers' plain RoPE of the LLaMA-like families rotates every feature whatever
    partial_rotary_factor says; Phi-3's rotates the first half."""

    def edit(cfg: dict[str, Any]) -> None:
        cfg["partial_rotary_factor"] = 0.5
        if isinstance(cfg.get("rope_parameters"), dict):
            cfg["rope_parameters"]["partial_rotary_factor"] = 0.5

    d, hf = checkpoint(
        tmp_path, family, {"sliding_window": None} if family == "mistral" else {}, edit
    )
    assert_matches(d, hf)


def test_tied_config_with_a_different_saved_head(tmp_path: Path) -> None:
    """tie_word_embeddings true, but the file's lm_head.weight differs from the embedding:
    transformers keeps both (untied, with a warning); so do we."""
    d, _ = checkpoint(tmp_path, "llama", {"tie_word_embeddings": True})
    tensors = load_file(d / "model.safetensors")
    emb = tensors["model.embed_tokens.weight"]
    tensors["lm_head.weight"] = (
        np.random.default_rng(5).standard_normal(emb.shape).astype(np.float32)
    )
    save_file(tensors, d / "model.safetensors", metadata={"format": "pt"})
    hf = transformers.LlamaForCausalLM.from_pretrained(d, attn_implementation="eager").eval()
    assert np.array_equal(hf.lm_head.weight.detach().numpy(), tensors["lm_head.weight"])
    with pytest.warns(UserWarning, match="differs from model.embed_tokens.weight"):
        ours = lk.Transformer.from_pretrained(d, progress=False)
    assert not ours.config.tie_embeddings
    ids = np.arange(3, 30)[None]
    with torch.no_grad():
        want = hf(torch.from_numpy(ids)).logits.numpy()
    np.testing.assert_allclose(ours(ids), want, rtol=1e-4, atol=2e-4)
    # an identical saved head is tied, silently (the usual transformers save)
    tensors["lm_head.weight"] = emb.copy()
    save_file(tensors, d / "model.safetensors", metadata={"format": "pt"})
    assert lk.Transformer.from_pretrained(d, progress=False).config.tie_embeddings


def test_a_huge_layer_number_in_a_key_is_an_unexpected_key(tmp_path: Path) -> None:
    d, _ = checkpoint(tmp_path, "llama", {})
    tensors = load_file(d / "model.safetensors")
    tensors["model.layers." + "9" * 5000 + ".mlp.up_proj.weight"] = np.zeros((2, 2), np.float32)
    save_file(tensors, d / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(CheckpointError, match=r"\[from_pretrained\]"):
        lk.Transformer.from_pretrained(d, progress=False)


def test_gemma2_save_pretrained_loads_in_transformers(tmp_path: Path) -> None:
    """query_pre_attn_scalar is written as an int (transformers' Gemma2Config takes no float)."""
    d, hf = checkpoint(tmp_path, "gemma2", GEMMA2)
    ours = lk.Transformer.from_pretrained(d, progress=False)
    out = tmp_path / "saved"
    ours.save_pretrained(out)
    assert json.loads((out / "config.json").read_text())["query_pre_attn_scalar"] == 24
    again = transformers.Gemma2ForCausalLM.from_pretrained(out, attn_implementation="eager")
    ids = np.arange(3, 40)[None]
    with torch.no_grad():
        want = hf(torch.from_numpy(ids)).logits.numpy()
        got = again.eval()(torch.from_numpy(ids)).logits.numpy()
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_generate_checks_ids_for_zero_new_tokens() -> None:
    model = lk.Transformer(
        {"dim": 16, "n_layers": 1, "n_heads": 2, "hidden_dim": 32, "vocab_size": 50}, seed=0
    )
    for n in (0, 1):
        with pytest.raises(ValueError, match=r"\[generate\] ids must be in \[0, vocab_size=50\)"):
            model.generate([5000, -3], n, progress=False)
